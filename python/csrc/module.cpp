// attend._C — the native half of the Python package.
//
// Deliberately thin: the Python side maps PyTorch / FlashAttention /
// TransformerEngine conventions onto an AttentionSpec (a dict of its fields) and
// owns autograd; this file turns tensors into views, calls attend::forward /
// attend::backward with the GIL released, keeps the Context (and the tensors it
// views) alive between the two passes, and turns attend::Error into the Python
// exception classes of attend.errors.
#include <torch/extension.h>

#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "kernel/philox.h"
#include "torch_views.h"

namespace py = pybind11;

namespace attend::python {
namespace {

[[noreturn]] void bad_field(const std::string& key, const std::string& value, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, key, value, why);
}

// A Python value as the text set_field parses, chosen by the field's kind, so
// that parsing (and its errors, which name the field) is the C++ one. Text is
// passed through: set_field then says what it expected.
std::string field_text(const SpecField& f, const py::handle& val) {
  const std::string key(f.name);
  if (val.is_none()) {
    if (field_optional(f)) return "";
    bad_field(key, "None", "cannot be unset (only optional fields, e.g. scale, out_dtype, take None)");
  }
  if (py::isinstance<py::str>(val)) return val.cast<std::string>();
  try {
    switch (field_kind(f)) {
      case FieldKind::boolean: return val.cast<bool>() ? "true" : "false";
      case FieldKind::integer: return std::to_string(val.cast<std::int64_t>());
      case FieldKind::unsigned_integer: return std::to_string(val.cast<std::uint64_t>());
      case FieldKind::real: return py::repr(py::float_(py::reinterpret_borrow<py::object>(val))).cast<std::string>();
      case FieldKind::dtype:
      case FieldKind::layout:
      case FieldKind::softmax_type: break;  // names only: a str, handled above
    }
  } catch (const py::error_already_set&) {
  } catch (const py::cast_error&) {
  }
  bad_field(key, std::string(py::str(val)),
            "has the wrong type (" + std::string(py::str(py::type::of(val))) + "; expected " +
                std::string(to_string(field_kind(f))) + ")");
}

// Every AttentionSpec field by its table name; an unknown key is an error (a
// typo would otherwise silently describe a different problem).
AttentionSpec spec_from_dict(const py::dict& d) {
  AttentionSpec s;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    const SpecField* f = find_spec_field(key);
    if (f == nullptr) bad_field(key, "", "not a field of attend::AttentionSpec (attend.spec_fields() lists them)");
    set_field(s, *f, field_text(*f, item.second));
  }
  return s;
}

// A field's value as the Python object spec_from_dict accepts back.
py::object field_value(const AttentionSpec& s, const SpecField& f) {
  return std::visit(
      [&](auto member) -> py::object {
        const auto& v = s.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, DType> || std::is_same_v<T, Layout> || std::is_same_v<T, SoftmaxType>)
          return py::str(std::string(to_string(v)));
        else if constexpr (std::is_same_v<T, std::optional<DType>>) {
          return v ? py::object(py::str(std::string(to_string(*v)))) : py::none();
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          return v ? py::object(py::float_(*v)) : py::none();
        } else {
          return py::cast(v);
        }
      },
      f.member);
}

py::dict spec_dict(const AttentionSpec& s) {
  py::dict d;
  for (const SpecField& f : spec_fields()) d[py::str(std::string(f.name))] = field_value(s, f);
  return d;
}

py::list spec_field_table() {
  const AttentionSpec defaults;
  py::list out;
  for (const SpecField& f : spec_fields()) {
    py::dict row;
    row["name"] = std::string(f.name);
    row["kind"] = std::string(to_string(field_kind(f)));
    row["optional"] = field_optional(f);
    row["help"] = std::string(f.help);
    row["default"] = field_value(defaults, f);
    out.append(row);
  }
  return out;
}

Mode mode_from(const std::string& mode) {
  if (mode == "training") return Mode::training;
  if (mode == "inference") return Mode::inference;
  throw Error(ErrorCode::invalid_argument, "mode", mode, "expected 'training' or 'inference'");
}

// One forward call: the context backward needs plus every tensor it views.
struct Call {
  Context ctx;
  std::vector<at::Tensor> keep_alive;
  // A copy of the verdicts (a few strings) that outlives the call without
  // keeping its tensors alive: what last_selection() reports.
  std::shared_ptr<const Selection> selection;
};

std::optional<at::Tensor> opt_prepare(const std::optional<at::Tensor>& t, const char* name,
                                      std::vector<at::Tensor>& keep, TensorView& view) {
  if (!t || !t->defined()) return std::nullopt;
  at::Tensor p = prepare(*t, name);
  view = view_of(p, name);
  keep.push_back(p);
  return p;
}

py::tuple forward(const py::dict& spec_fields, const std::string& mode, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& cu_seqlens_q,
                  const std::optional<at::Tensor>& cu_seqlens_kv) {
  const AttentionSpec spec = spec_from_dict(spec_fields);
  auto call = std::make_shared<Call>();
  Inputs in;
  const std::optional<at::Tensor> tq(q), tk(k), tv(v);
  opt_prepare(tq, "q", call->keep_alive, in.q);
  opt_prepare(tk, "k", call->keep_alive, in.k);
  opt_prepare(tv, "v", call->keep_alive, in.v);
  opt_prepare(bias, "bias", call->keep_alive, in.bias);
  opt_prepare(alibi_slopes, "alibi_slopes", call->keep_alive, in.alibi_slopes);
  opt_prepare(cu_seqlens_q, "cu_seqlens_q", call->keep_alive, in.cu_seqlens_q);
  opt_prepare(cu_seqlens_kv, "cu_seqlens_kv", call->keep_alive, in.cu_seqlens_kv);
  const Mode m = mode_from(mode);
  ForwardResult r;
  {
    py::gil_scoped_release nogil;
    r = attend::forward(in, spec, m);
  }
  call->ctx = r.ctx;
  call->selection = std::make_shared<const Selection>(r.ctx.selection());
  return py::make_tuple(to_torch(r.out), to_torch(r.lse), call);
}

py::tuple backward(const Call& call, const at::Tensor& dout) {
  const at::Tensor d = prepare(dout, "dout");
  const TensorView dv = view_of(d, "dout");
  const AttentionSpec& spec = call.ctx.spec();
  CallOptions options;
  Gradients g;
  if (spec.accumulate_grads) {
    // Autograd sums gradients itself; accumulate_grads adds into fresh zeros.
    const auto zeros = [&](Role role) {
      return Tensor::zeros(expected_dtype(spec, role), expected_shape(spec, role).span());
    };
    g.dq = zeros(Role::dq);
    g.dk = zeros(Role::dk);
    g.dv = zeros(Role::dv);
    options.grads = {g.dq, g.dk, g.dv};
  }
  {
    py::gil_scoped_release nogil;
    Gradients r = attend::backward(call.ctx, dv, options);
    if (!spec.accumulate_grads)
      g = std::move(r);
    else
      g.dbias = std::move(r.dbias);
  }
  py::object dbias = g.dbias.defined() ? py::cast(to_torch(g.dbias)) : py::none();
  return py::make_tuple(to_torch(g.dq), to_torch(g.dk), to_torch(g.dv), dbias);
}

py::tuple evaluate(const py::dict& spec_fields, const std::string& mode) {
  const Selection sel = attend::evaluate(spec_from_dict(spec_fields), mode_from(mode), current_policy());
  return py::make_tuple(sel.explain(), sel.to_json());
}

// The keep mask of attend's dropout: (H, Sq, Sk) for sequence `b`, computed with
// the same Philox function every backend uses (src/kernel/philox.h).
at::Tensor dropout_keep(std::uint64_t seed, double p, std::int64_t b, std::int64_t heads, std::int64_t sq,
                        std::int64_t sk) {
  if (!(p >= 0.0 && p < 1.0)) {
    throw Error(ErrorCode::invalid_argument, "dropout_p", std::to_string(p), "must be in [0, 1)");
  }
  at::Tensor m = at::empty({heads, sq, sk}, at::TensorOptions().dtype(at::kBool));
  bool* out = m.data_ptr<bool>();
  const detail::DropoutMask mask = detail::DropoutMask::make(seed, p);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t i = 0; i < sq; ++i) {
      for (std::int64_t j = 0; j < sk; ++j) *out++ = mask.keep(b, h, i, j);
    }
  }
  return m;
}

py::dict policy_dict(const Policy& p) {
  py::dict d;
  d["force"] = p.force ? py::cast(*p.force) : py::none();
  d["disable"] = p.disabled;
  d["log"] = p.log == LogLevel::off ? "off" : p.log == LogLevel::info ? "info" : "debug";
  return d;
}

void set_policy_from(const std::optional<std::string>& force, const std::vector<std::string>& disable,
                     const std::string& log) {
  Policy p;
  p.force = force;
  p.disabled = disable;
  // Errors name the keyword the caller used; ATTEND_ISA stays as the environment set it.
  p.force_source = "force";
  p.disabled_source = "disable";
  const Policy now = current_policy();
  p.isa = now.isa;
  p.isa_source = now.isa_source;
  if (log == "off") p.log = LogLevel::off;
  else if (log == "info") p.log = LogLevel::info;
  else if (log == "debug") p.log = LogLevel::debug;
  else throw Error(ErrorCode::invalid_argument, "log", log, "expected off, info or debug");
  set_policy(std::move(p));  // unknown backend names fail here, not at the next call
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const auto& b : Registry::global().backends()) out.emplace_back(b.backend->name());
  return out;
}

// attend::Error -> attend.errors.<class>(message, code, field, value, limit, detail).
void raise_attend_error(const Error& e) {
  try {
    py::object make = py::module_::import("attend.errors").attr("_from_native");
    py::object exc = make(std::string(to_string(e.code())), e.what(), e.field(), e.value(), e.limit(), e.detail());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (const py::error_already_set&) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace
}  // namespace attend::python

PYBIND11_MODULE(_C, m) {
  using namespace attend::python;
  m.doc() = "attend native extension (use the attend and attend.torch modules)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attend::Error& e) {
      raise_attend_error(e);
    }
  });

  py::class_<attend::Selection, std::shared_ptr<attend::Selection>>(m, "Selection", "Every backend's verdict for one call.")
      .def_property_readonly("backend", [](const attend::Selection& s) { return std::string(s.backend->name()); })
      .def_property_readonly("mode", [](const attend::Selection& s) { return std::string(attend::to_string(s.mode)); })
      .def("explain", &attend::Selection::explain)
      .def("to_json", &attend::Selection::to_json);
  py::class_<Call, std::shared_ptr<Call>>(m, "Call", "The state one forward leaves for its backward.")
      .def_property_readonly("selection", [](const Call& c) { return std::const_pointer_cast<attend::Selection>(c.selection); })
      .def("backward", &backward, py::arg("dout"));

  m.def("forward", &forward, py::arg("spec"), py::arg("mode"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("bias") = py::none(), py::arg("alibi_slopes") = py::none(), py::arg("cu_seqlens_q") = py::none(),
        py::arg("cu_seqlens_kv") = py::none());
  m.def("evaluate", &evaluate, py::arg("spec"), py::arg("mode"),
        "(table, json) of every backend's verdict; never raises for 'nothing fits'");
  m.def("describe", [](const py::dict& d) { return attend::describe(spec_from_dict(d)); });
  m.def("spec_fields", &spec_field_table,
        "The AttentionSpec field table: a dict per field (name, kind, optional, help, default)");
  m.def(
      "spec_from_fields", [](const py::dict& d) { return spec_dict(spec_from_dict(d)); }, py::arg("fields"),
      "Every field of the spec these fields describe (the rest at their defaults); an unknown or malformed "
      "field is an attend error naming it");
  m.def("dropout_keep", &dropout_keep, py::arg("seed"), py::arg("p"), py::arg("batch_index"), py::arg("heads"),
        py::arg("seqlen_q"), py::arg("seqlen_kv"));
  m.def("get_policy", [] { return policy_dict(attend::current_policy()); });
  m.def("policy_from_env", [] { return policy_dict(attend::Policy::from_env()); });
  m.def("set_policy", &set_policy_from, py::arg("force"), py::arg("disable"), py::arg("log"));
  m.def("backends", &backend_names);
  m.def("flash_isa", [] { return std::string(attend::flash_active_isa()); });
}

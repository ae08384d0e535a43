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
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "kernel/philox.h"
#include "torch_views.h"

namespace py = pybind11;

namespace attend::python {
namespace {

[[noreturn]] void bad_field(const std::string& key, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "spec." + key, "", why);
}

// Every AttentionSpec field by name; unknown keys are errors (a typo would
// otherwise silently describe a different problem).
AttentionSpec spec_from_dict(const py::dict& d) {
  AttentionSpec s;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    const py::handle val = item.second;
    const auto i64 = [&] { return val.cast<std::int64_t>(); };
    const auto f64 = [&] { return val.cast<double>(); };
    const auto flag = [&] { return val.cast<bool>(); };
    try {
      if (key == "batch") s.batch = i64();
      else if (key == "seqlen_q") s.seqlen_q = i64();
      else if (key == "seqlen_kv") s.seqlen_kv = i64();
      else if (key == "heads_q") s.heads_q = i64();
      else if (key == "heads_kv") s.heads_kv = i64();
      else if (key == "head_dim_qk") s.head_dim_qk = i64();
      else if (key == "head_dim_v") s.head_dim_v = i64();
      else if (key == "total_q") s.total_q = i64();
      else if (key == "total_kv") s.total_kv = i64();
      else if (key == "dtype") s.dtype = parse_dtype(val.cast<std::string>(), "spec.dtype");
      else if (key == "layout") s.layout = parse_layout(val.cast<std::string>());
      else if (key == "scale") s.scale = val.is_none() ? std::nullopt : std::optional<double>(f64());
      else if (key == "softcap") s.softcap = f64();
      else if (key == "alibi") s.alibi = flag();
      else if (key == "has_bias") s.has_bias = flag();
      else if (key == "bias_requires_grad") s.bias_requires_grad = flag();
      else if (key == "causal") s.causal = flag();
      else if (key == "window_left") s.window_left = i64();
      else if (key == "window_right") s.window_right = i64();
      else if (key == "dropout_p") s.dropout_p = f64();
      else if (key == "dropout_seed") s.dropout_seed = val.cast<std::uint64_t>();
      else if (key == "need_lse") s.need_lse = flag();
      else if (key == "deterministic") s.deterministic = flag();
      else bad_field(key, "not a field of attend::AttentionSpec");
    } catch (const py::cast_error&) {
      bad_field(key, "has the wrong type (" + std::string(py::str(py::type::of(val))) + ")");
    }
  }
  return s;
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
  Gradients g;
  {
    py::gil_scoped_release nogil;
    g = attend::backward(call.ctx, dv);
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
  m.def("dropout_keep", &dropout_keep, py::arg("seed"), py::arg("p"), py::arg("batch_index"), py::arg("heads"),
        py::arg("seqlen_q"), py::arg("seqlen_kv"));
  m.def("get_policy", [] { return policy_dict(attend::current_policy()); });
  m.def("policy_from_env", [] { return policy_dict(attend::Policy::from_env()); });
  m.def("set_policy", &set_policy_from, py::arg("force"), py::arg("disable"), py::arg("log"));
  m.def("backends", &backend_names);
  m.def("flash_isa", [] { return std::string(attend::flash_active_isa()); });
}

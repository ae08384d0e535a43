// attend._C — the native half of the Python package.
//
// Deliberately thin and free of any array library: tensors arrive as
// descriptors (views.h) that Python builds from torch tensors, numpy arrays or
// DLPack exporters, and outputs are written into arrays Python allocated (so
// they belong to the caller's library). The Python side maps PyTorch /
// FlashAttention / TransformerEngine conventions onto an AttentionSpec (a dict
// of its fields, spec_dict.h) and owns autograd. Calls release the GIL;
// attend::Error becomes the matching attend.errors class.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "attend/select.h"
#include "kernel/philox.h"
#include "parallel.h"
#include "spec_dict.h"
#include "views.h"

namespace py = pybind11;

namespace attend::python {
namespace {

Mode mode_from(const std::string& mode) {
  if (mode == "training") return Mode::training;
  if (mode == "inference") return Mode::inference;
  throw Error(ErrorCode::invalid_argument, "mode", mode, "expected 'training' or 'inference'");
}

Role role_from(const std::string& role) {
  for (Role r : {Role::q, Role::k, Role::v, Role::out, Role::lse, Role::dout, Role::dq, Role::dk, Role::dv, Role::bias,
                 Role::cu_seqlens_q, Role::cu_seqlens_kv, Role::sinks, Role::dsinks, Role::k_scale, Role::v_scale}) {
    if (to_string(r) == role) return r;
  }
  throw Error(ErrorCode::invalid_argument, "role", role,
              "expected q, k, v, out, lse, dout, dq, dk, dv, bias, sinks, dsinks, k_scale or v_scale");
}

// (shape, dtype name) a tensor of `role` must have: what Python allocates
// outputs and gradients from, and what torch's fake (meta) kernels report.
py::tuple expected(const py::dict& fields, const std::string& role) {
  const AttentionSpec spec = spec_from_dict(fields);
  const Role r = role_from(role);
  const Shape s = expected_shape(spec, r);
  py::tuple shape(static_cast<std::size_t>(s.ndim));
  for (int d = 0; d < s.ndim; ++d) shape[static_cast<std::size_t>(d)] = s.dims[d];
  return py::make_tuple(shape, std::string(to_string(expected_dtype(spec, r))));
}

GradViews grads_of(const py::dict& grads) {
  GradViews g;
  for (const auto& item : grads) {
    const std::string key = py::str(item.first);
    if (key == "dq")
      g.dq = view_of(item.second, key);
    else if (key == "dk")
      g.dk = view_of(item.second, key);
    else if (key == "dv")
      g.dv = view_of(item.second, key);
    else if (key == "dbias")
      g.dbias = view_of(item.second, key);
    else if (key == "dsinks")
      g.dsinks = view_of(item.second, key);
    else
      throw Error(ErrorCode::invalid_argument, key, "", "not a gradient (expected dq, dk, dv, dbias, dsinks)");
  }
  return g;
}

// One forward call: the context its backward runs from (same plan, same
// backend). The arrays it views are kept alive by the Python caller.
struct Call {
  Context ctx;
};

// The verdicts of a call, as last_selection() reports them: a pointer into
// the call's plan that keeps the call alive, not a copy (copying the verdict
// table cost a decode-sized call about a microsecond). Nothing reads the
// call's views through it.
std::shared_ptr<Selection> selection_of(const std::shared_ptr<Call>& call) {
  return {call, const_cast<Selection*>(&call->ctx.selection())};
}

// Runs forward into the descriptors out and lse (None: attend's own buffer).
std::shared_ptr<Call> run_forward(const Inputs& in, const AttentionSpec& spec, const std::string& mode,
                                  const py::handle& out, const py::handle& lse) {
  const Mode m = mode_from(mode);
  CallOptions options;
  options.out = view_of(out, "out");
  options.lse = view_of(lse, "lse");
  auto call = std::make_shared<Call>();
  {
    py::gil_scoped_release nogil;
    call->ctx = attend::forward(in, spec, m, options).ctx;
  }
  return call;
}

std::shared_ptr<Call> forward(const py::dict& fields, const std::string& mode, const py::dict& tensors,
                              const py::handle& out, const py::handle& lse) {
  const AttentionSpec spec = spec_from_dict(fields);
  return run_forward(inputs_of(tensors), spec, mode, out, lse);
}

// A spec parsed once for the many calls of attend.torch's fast path, which
// differ in their sizes only (a decode loop's key count grows every step):
// forward takes batch, sequence lengths, heads and head dims from the
// tensors, as the torch.library ops do, and the tensors come positionally
// rather than in a dict. Dense layouts only.
struct SizedSpec {
  AttentionSpec spec;
};

void set_sizes(AttentionSpec& s, const TensorView& q, const TensorView& k, const TensorView& v) {
  int b = 0, seq = 1, heads = 2;  // bshd
  if (s.layout == Layout::bhsd) {
    seq = 2;
    heads = 1;
  } else if (s.layout == Layout::sbhd) {
    b = 1;
    seq = 0;
  } else if (s.layout != Layout::bshd) {
    throw Error(ErrorCode::invalid_argument, "layout", std::string(to_string(s.layout)),
                "a SizedSpec reads sizes from dense (bshd, bhsd, sbhd) tensors");
  }
  for (const auto& [view, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    if (view->ndim != 4) {
      throw Error(ErrorCode::shape_mismatch, std::string(name) + ".dim", std::to_string(view->ndim),
                  "expected 4 dimensions for layout " + std::string(to_string(s.layout)));
    }
  }
  s.batch = q.shape[b];
  s.seqlen_q = q.shape[seq];
  s.heads_q = q.shape[heads];
  s.head_dim_qk = q.shape[3];
  s.seqlen_kv = k.shape[seq];
  s.heads_kv = k.shape[heads];
  s.head_dim_v = v.shape[3];
}

// The inputs of a SizedSpec call and its complete spec.
std::pair<Inputs, AttentionSpec> sized_problem(const SizedSpec& sized, const py::handle& q, const py::handle& k,
                                               const py::handle& v) {
  Inputs in;
  in.q = view_of(q, "q");
  in.k = view_of(k, "k");
  in.v = view_of(v, "v");
  AttentionSpec spec = sized.spec;
  set_sizes(spec, in.q, in.k, in.v);
  return {in, spec};
}

// q, k, v and out are descriptors; lse may be None (attend allocates it: the
// fast path's callers discard it).
std::shared_ptr<Call> sized_forward(const SizedSpec& sized, const std::string& mode, const py::handle& q,
                                    const py::handle& k, const py::handle& v, const py::handle& out,
                                    const py::handle& lse) {
  const auto [in, spec] = sized_problem(sized, q, k, v);
  return run_forward(in, spec, mode, out, lse);
}

void call_backward(const Call& call, const py::handle& dout, const py::dict& grads) {
  CallOptions options;
  options.grads = grads_of(grads);
  const TensorView d = view_of(dout, "dout");
  py::gil_scoped_release nogil;
  attend::backward(call.ctx, d, options);
}

// The policy that pins backward to forward's (backend, variant): forced, with
// nothing disabled, so a policy change after forward cannot move backward or
// silently switch it off (forward's choice wins; a backend that cannot do the
// pass still fails with its reasons).
Policy pinned_policy(const std::string& plan) {
  Policy p;
  p.force = plan;
  p.force_source = "forward's selection";
  p.log = current_policy().log;
  p.tune_cache = "off";
  return p;
}

// Backward from out and lse without a forward context, on the plan
// "backend:variant" (forward's choice) where `plan` names one, else on a
// training plan selected for the spec under the current policy.
void pinned_backward(const AttentionSpec& spec, const Inputs& in, const py::handle& out, const py::handle& lse,
                     const py::handle& dout, CallOptions options, const std::string& plan) {
  std::optional<Policy> pinned;
  if (!plan.empty()) {
    pinned = pinned_policy(plan);
    options.policy = &*pinned;
  }
  const TensorView o = view_of(out, "out"), l = view_of(lse, "lse"), d = view_of(dout, "dout");
  py::gil_scoped_release nogil;
  attend::backward(spec, in, o, l, d, options);
}

// Backward of a SizedSpec forward from the tensors autograd saved (so that
// saved-tensor hooks may move them), on the (backend, variant) `call` ran.
void sized_backward(const SizedSpec& sized, const Call& call, const py::handle& q, const py::handle& k,
                    const py::handle& v, const py::handle& out, const py::handle& lse, const py::handle& dout,
                    const py::handle& dq, const py::handle& dk, const py::handle& dv) {
  const auto [in, spec] = sized_problem(sized, q, k, v);
  CallOptions options;
  options.grads.dq = view_of(dq, "dq");
  options.grads.dk = view_of(dk, "dk");
  options.grads.dv = view_of(dv, "dv");
  const Selection& chosen = call.ctx.selection();
  pinned_backward(spec, in, out, lse, dout, options,
                  std::string(chosen.backend->name()) + ":" + std::string(chosen.variant_name()));
}

// Backward without a forward context (plans, partials, torch.library ops).
// `plan` "backend:variant" (forward's choice) runs it there; empty selects a
// training plan for the spec under the current policy.
void backward_free(const py::dict& fields, const py::dict& tensors, const py::handle& out, const py::handle& lse,
                   const py::handle& dout, const py::dict& grads, const std::string& plan) {
  const AttentionSpec spec = spec_from_dict(fields);
  const Inputs in = inputs_of(tensors);
  CallOptions options;
  options.grads = grads_of(grads);
  pinned_backward(spec, in, out, lse, dout, options, plan);
}

void merge_parts(const py::dict& fields, const py::list& parts, const py::handle& out, const py::handle& lse) {
  const AttentionSpec spec = spec_from_dict(fields);
  std::vector<Partial> ps;
  for (std::size_t i = 0; i < py::len(parts); ++i) {
    const auto p = parts[i].cast<py::tuple>();
    const std::string name = "parts[" + std::to_string(i) + "]";
    ps.push_back({view_of(p[0], name + ".out"), view_of(p[1], name + ".lse")});
  }
  const TensorView o = view_of(out, "out"), l = view_of(lse, "lse");
  py::gil_scoped_release nogil;
  attend::merge(spec, ps, o, l);
}

py::tuple evaluate(const py::dict& fields, const std::string& mode, const std::string& device) {
  const Selection sel = attend::evaluate(spec_from_dict(fields), mode_from(mode), current_policy(),
                                         attend::parse_device(device, "device"));
  return py::make_tuple(sel.explain(), sel.to_json());
}

// The keep mask of attend's dropout for sequence `b`, (H, Sq, Sk) bytes (1 =
// kept), from the same Philox function every backend uses (src/kernel/philox.h).
py::bytes dropout_keep(std::uint64_t seed, double p, std::int64_t b, std::int64_t heads, std::int64_t sq,
                       std::int64_t sk) {
  if (!(p >= 0.0 && p < 1.0)) {
    throw Error(ErrorCode::invalid_argument, "dropout_p", std::to_string(p), "must be in [0, 1)");
  }
  if (heads < 0 || sq < 0 || sk < 0) {
    throw Error(ErrorCode::invalid_argument, "shape",
                std::to_string(heads) + "x" + std::to_string(sq) + "x" + std::to_string(sk),
                "sizes must be non-negative");
  }
  std::string out;
  out.reserve(static_cast<std::size_t>(heads * sq * sk));
  const detail::DropoutMask mask = detail::DropoutMask::make(seed, p);
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t i = 0; i < sq; ++i) {
      for (std::int64_t j = 0; j < sk; ++j) out.push_back(mask.keep(b, h, i, j) ? '\1' : '\0');
    }
  }
  return py::bytes(out);
}

py::dict policy_dict(const Policy& p) {
  py::dict d;
  d["force"] = p.force ? py::cast(*p.force) : py::none();
  d["disable"] = p.disabled;
  d["log"] = p.log == LogLevel::off ? "off" : p.log == LogLevel::info ? "info" : "debug";
  d["select"] = std::string(to_string(p.strategy));
  d["tune_cache"] = p.tune_cache;
  return d;
}

Policy policy_from(const std::optional<std::string>& force, const std::vector<std::string>& disable,
                   const std::string& log, const std::string& select, const std::string& tune_cache) {
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
  p.strategy = parse_strategy(select, "select");
  p.strategy_source = "select";
  p.tune_cache = tune_cache;
  return p;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const auto& b : Registry::global().backends()) out.emplace_back(b.backend->name());
  return out;
}

std::unique_ptr<KVCache> make_kvcache(std::int64_t batch, std::int64_t heads_kv, std::int64_t head_dim_qk,
                                      std::int64_t head_dim_v, std::int64_t max_seqlen, std::int64_t page_size,
                                      std::int64_t num_pages, const std::string& dtype,
                                      const std::optional<std::string>& kv_dtype,
                                      const std::optional<std::string>& kv_scale) {
  KVCacheConfig c;
  c.batch = batch;
  c.heads_kv = heads_kv;
  c.head_dim_qk = head_dim_qk;
  c.head_dim_v = head_dim_v;
  c.max_seqlen = max_seqlen;
  c.page_size = page_size;
  c.num_pages = num_pages;
  c.dtype = parse_dtype(dtype, "dtype");
  if (kv_dtype) c.kv_dtype = parse_dtype(*kv_dtype, "kv_dtype");
  if (kv_scale) c.kv_scale = parse_kv_scale(*kv_scale, "kv_scale");
  return std::make_unique<KVCache>(c);
}

// An 8-bit cache's scales as (shape, values), copied out (they are small: one
// f32 per token and kv head at most); None when the cache has none.
py::object cache_scales(const TensorView& s) {
  if (s.data == nullptr || s.ndim == 0) return py::none();
  py::tuple shape(static_cast<std::size_t>(s.ndim));
  std::int64_t n = 1;
  for (int d = 0; d < s.ndim; ++d) {
    shape[static_cast<std::size_t>(d)] = s.shape[d];
    n *= s.shape[d];
  }
  const auto* p = static_cast<const float*>(s.data);
  return py::make_tuple(shape, std::vector<float>(p, p + n));
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

void bind_selection(py::module_& m) {
  py::class_<Selection, std::shared_ptr<Selection>>(m, "Selection", "Every backend's verdict for one call.")
      .def_property_readonly("backend", [](const Selection& s) { return std::string(s.backend->name()); })
      .def_property_readonly("variant", [](const Selection& s) { return std::string(s.variant_name()); })
      .def_property_readonly("mode", [](const Selection& s) { return std::string(to_string(s.mode)); })
      .def("explain", &Selection::explain)
      .def("to_json", &Selection::to_json);
  py::class_<Call, std::shared_ptr<Call>>(m, "Call", "The state one forward leaves for its backward.")
      .def_property_readonly("selection", &selection_of)
      .def("backward", &call_backward, py::arg("dout"), py::arg("grads"),
           "Writes (or, with accumulate_grads, adds) the gradients into the given arrays");
}

void bind_plan(py::module_& m) {
  py::class_<Plan>(m, "Plan", "A selection made once and run many times (attend::Plan).")
      .def(py::init([](const py::dict& fields, const std::string& mode) {
             return Plan::make(spec_from_dict(fields), mode_from(mode));
           }),
           py::arg("spec"), py::arg("mode"))
      .def_property_readonly("backend", [](const Plan& p) { return std::string(p.backend().name()); })
      .def_property_readonly("variant", [](const Plan& p) { return std::string(p.variant()); })
      .def_property_readonly("mode", [](const Plan& p) { return std::string(to_string(p.mode())); })
      .def_property_readonly("spec", [](const Plan& p) { return spec_dict(p.spec()); })
      .def("explain", &Plan::explain)
      .def("selection_json", [](const Plan& p) { return p.selection().to_json(); })
      .def("workspace_bytes",
           [](const Plan& p, const std::string& pass) {
             if (pass != "forward" && pass != "backward") {
               throw Error(ErrorCode::invalid_argument, "pass", pass, "expected 'forward' or 'backward'");
             }
             return p.workspace_bytes(pass == "forward" ? Pass::forward : Pass::backward);
           })
      .def("forward",
           [](const Plan& p, const py::dict& tensors, const py::handle& out, const py::handle& lse) {
             const Inputs in = inputs_of(tensors);
             const TensorView o = view_of(out, "out"), l = view_of(lse, "lse");
             py::gil_scoped_release nogil;
             p.forward(in, o, l);
           })
      .def("backward", [](const Plan& p, const py::dict& tensors, const py::handle& out, const py::handle& lse,
                          const py::handle& dout, const py::dict& grads) {
        const Inputs in = inputs_of(tensors);
        const TensorView o = view_of(out, "out"), l = view_of(lse, "lse"), d = view_of(dout, "dout");
        const GradViews g = grads_of(grads);
        py::gil_scoped_release nogil;
        p.backward(in, o, l, d, g);
      });
}

void bind_kvcache(py::module_& m) {
  py::class_<KVCache>(m, "KVCache", "A paged KV cache owned by attend (attend::KVCache).")
      .def(py::init(&make_kvcache), py::arg("batch"), py::arg("heads_kv"), py::arg("head_dim_qk"),
           py::arg("head_dim_v"), py::arg("max_seqlen"), py::arg("page_size"), py::arg("num_pages"), py::arg("dtype"),
           py::arg("kv_dtype") = py::none(), py::arg("kv_scale") = py::none())
      .def_property_readonly("batch", &KVCache::batch)
      .def_property_readonly("page_size", &KVCache::page_size)
      .def_property_readonly("pages_per_sequence", &KVCache::pages_per_sequence)
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly("free_pages", &KVCache::free_pages)
      .def_property_readonly("dtype", [](const KVCache& c) { return std::string(to_string(c.config().dtype)); })
      .def_property_readonly("kv_dtype",
                             [](const KVCache& c) { return std::string(to_string(c.config().page_dtype())); })
      .def_property_readonly("kv_scale", [](const KVCache& c) { return std::string(to_string(c.scale_layout())); })
      .def("k_scales", [](const KVCache& c) { return cache_scales(c.k_scales().view()); })
      .def("v_scales", [](const KVCache& c) { return cache_scales(c.v_scales().view()); })
      .def(
          "set_scales",
          [](KVCache& c, std::int64_t seq, const std::vector<float>& k_scale, const std::vector<float>& v_scale) {
            c.set_scales(seq, k_scale, v_scale);
          },
          py::arg("seq"), py::arg("k_scale"), py::arg("v_scale"))
      .def("length", &KVCache::length, py::arg("seq"))
      .def("leftpad", &KVCache::leftpad, py::arg("seq"))
      .def("set_leftpad", &KVCache::set_leftpad, py::arg("seq"), py::arg("tokens"))
      .def("reset", &KVCache::reset, py::arg("seq"))
      .def(
          "append",
          [](KVCache& c, const py::handle& k, const py::handle& v, const std::vector<std::int64_t>& counts) {
            const TensorView kv = view_of(k, "k"), vv = view_of(v, "v");
            py::gil_scoped_release nogil;
            c.append(kv, vv, counts);
          },
          py::arg("k"), py::arg("v"), py::arg("counts"))
      .def(
          "append_seq",
          [](KVCache& c, std::int64_t seq, const py::handle& k, const py::handle& v) {
            const TensorView kv = view_of(k, "k"), vv = view_of(v, "v");
            py::gil_scoped_release nogil;
            c.append(seq, kv, vv);
          },
          py::arg("seq"), py::arg("k"), py::arg("v"))
      .def(
          "problem_spec",
          [](const KVCache& c, const py::handle& q, const py::dict& fields, const py::handle& slopes) {
            return spec_dict(
                kvcache_problem(view_of(q, "q"), c, spec_from_dict(fields), view_of(slopes, "alibi_slopes")).spec);
          },
          py::arg("q"), py::arg("spec"), py::arg("alibi_slopes"),
          "The complete spec attention of q over the cache runs (sizes from q and the cache)")
      .def(
          "forward",
          [](const KVCache& c, const py::handle& q, const py::dict& fields, const py::handle& slopes,
             const py::handle& out, const py::handle& lse) {
            const KVCacheProblem p =
                kvcache_problem(view_of(q, "q"), c, spec_from_dict(fields), view_of(slopes, "alibi_slopes"));
            CallOptions options;
            options.out = view_of(out, "out");
            options.lse = view_of(lse, "lse");
            std::shared_ptr<const Selection> sel;
            {
              py::gil_scoped_release nogil;
              sel = std::make_shared<const Selection>(
                  attend::forward(p.inputs, p.spec, Mode::inference, options).ctx.selection());
            }
            return std::const_pointer_cast<Selection>(sel);
          },
          py::arg("q"), py::arg("spec"), py::arg("alibi_slopes"), py::arg("out"), py::arg("lse"));
}

}  // namespace
}  // namespace attend::python

PYBIND11_MODULE(_C, m) {
  using namespace attend::python;
  m.doc() = "attend native extension (use the attend and attend.torch modules)";
  m.attr("__version__") = ATTEND_VERSION;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attend::Error& e) {
      raise_attend_error(e);
    }
  });
  bind_selection(m);
  bind_plan(m);
  bind_kvcache(m);
  attend::python::bind_parallel(m);

  py::class_<SizedSpec>(m, "SizedSpec", "A spec parsed once; forward reads its sizes from the tensors.")
      .def(py::init([](const py::dict& fields) { return SizedSpec{spec_from_dict(fields)}; }), py::arg("spec"))
      .def("forward", &sized_forward, py::arg("mode"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
           py::arg("lse"), "Runs forward into out (and lse, or attend's buffer); returns the Call")
      .def("backward", &sized_backward, py::arg("call"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
           py::arg("lse"), py::arg("dout"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
           "Writes the gradients of forward's call, on the plan it ran, into dq, dk, dv");
  m.def("forward", &forward, py::arg("spec"), py::arg("mode"), py::arg("tensors"), py::arg("out"), py::arg("lse"),
        "Runs forward into out and lse; returns the Call its backward runs from");
  m.def("backward", &backward_free, py::arg("spec"), py::arg("tensors"), py::arg("out"), py::arg("lse"),
        py::arg("dout"), py::arg("grads"), py::arg("plan") = std::string(),
        "Backward from forward's out and lse, without its context; plan 'backend:variant' pins it there");
  m.def("merge", &merge_parts, py::arg("spec"), py::arg("parts"), py::arg("out"), py::arg("lse"),
        "Exact combination of partial results [(out, lse), ...] through their LSEs");
  m.def("expected", &expected, py::arg("spec"), py::arg("role"),
        "(shape, dtype) of the tensor of this role (q, out, lse, dq, ...) for the spec");
  m.def("evaluate", &evaluate, py::arg("spec"), py::arg("mode"), py::arg("device") = "cpu",
        "(table, json) of every backend's verdict; never raises for 'nothing fits'");
  m.def("describe", [](const py::dict& d) { return attend::describe(spec_from_dict(d)); });
  m.def("spec_fields", &spec_field_table,
        "The AttentionSpec field table: a dict per field (name, kind, optional, help, default)");
  m.def(
      "spec_from_fields", [](const py::dict& d) { return spec_dict(spec_from_dict(d)); }, py::arg("fields"),
      "Every field of the spec these fields describe (the rest at their defaults); an unknown or malformed "
      "field is an attend error naming it");
  m.def(
      "validate", [](const py::dict& d) { attend::validate(spec_from_dict(d)); }, py::arg("fields"),
      "Checks the spec's fields on their own (sizes, ranges); raises the attend error naming the field");
  m.def(
      "validate_inputs",
      [](const py::dict& d, const py::dict& tensors) {
        attend::validate_inputs(spec_from_dict(d), inputs_of(tensors));
      },
      py::arg("spec"), py::arg("tensors"),
      "Checks the spec and its input tensors (shapes, dtypes, index contents) without running anything");
  m.def(
      "validate_cache_append",
      [](const py::dict& d, const py::dict& tensors, std::int64_t new_tokens, bool batch_idx) {
        attend::validate_cache_append(spec_from_dict(d), inputs_of(tensors), new_tokens,
                                      batch_idx ? attend::CacheRows::cache_batch_idx : attend::CacheRows::block_table);
      },
      py::arg("spec"), py::arg("tensors"), py::arg("new_tokens"), py::arg("batch_idx"),
      "validate_inputs, then refuses an append of new_tokens per sequence (cache_seqlens: the lengths after it) "
      "that writes one page slot twice or a slot the call reads as context");
  m.def("dropout_keep", &dropout_keep, py::arg("seed"), py::arg("p"), py::arg("batch_index"), py::arg("heads"),
        py::arg("seqlen_q"), py::arg("seqlen_kv"));
  m.def("get_policy", [] { return policy_dict(attend::current_policy()); });
  m.def("policy_from_env", [] { return policy_dict(attend::Policy::from_env()); });
  // Unknown backend names fail here, not at the next call.
  m.def(
      "set_policy",
      [](const std::optional<std::string>& force, const std::vector<std::string>& disable, const std::string& log,
         const std::string& select,
         const std::string& tune_cache) { attend::set_policy(policy_from(force, disable, log, select, tune_cache)); },
      py::arg("force"), py::arg("disable"), py::arg("log"), py::arg("select") = std::string("priority"),
      py::arg("tune_cache") = std::string());
  m.def(
      "push_thread_policy",
      [](const std::optional<std::string>& force, const std::vector<std::string>& disable, const std::string& log,
         const std::string& select, const std::string& tune_cache) {
        return attend::push_thread_policy(policy_from(force, disable, log, select, tune_cache));
      },
      py::arg("force"), py::arg("disable"), py::arg("log"), py::arg("select"), py::arg("tune_cache"));
  m.def("pop_thread_policy", &attend::pop_thread_policy, py::arg("token"));
  m.def("backends", &backend_names);
  // The exact value of an 8-bit code and the code of a float (round to nearest
  // even, saturating): what Python's own quantization is tested against.
  m.def(
      "kv8_value",
      [](const std::string& dtype, int code) {
        return attend::kv8_value(attend::parse_dtype(dtype, "dtype"), static_cast<std::uint8_t>(code & 0xff));
      },
      py::arg("dtype"), py::arg("code"));
  m.def(
      "kv8_codes",
      [](const std::string& dtype, const std::vector<float>& xs) {
        const attend::DType t = attend::parse_dtype(dtype, "dtype");
        std::string codes(xs.size(), '\0');
        for (std::size_t i = 0; i < xs.size(); ++i) codes[i] = static_cast<char>(attend::kv8_code(t, xs[i]));
        return py::bytes(codes);
      },
      py::arg("dtype"), py::arg("values"), "The codes of values, one byte each");
  m.def("flash_isa", [] { return std::string(attend::flash_active_isa()); });
}

#include "harness.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <span>

#include "attend/attention.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "attend/error.h"
#include "attend/registry.h"
#include "runtime/flops.h"
#include "unfused.h"

namespace attend::bench {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// q's shape and dtype with the last (feature) dimension replaced: out and dout.
Tensor zeros_with_last(const TensorView& like, std::int64_t last) {
  std::array<std::int64_t, TensorView::kMaxDims> shape = like.shape;
  shape[static_cast<std::size_t>(like.ndim - 1)] = last;
  return Tensor::zeros(like.dtype, std::span<const std::int64_t>(shape.data(), static_cast<std::size_t>(like.ndim)));
}

Tensor lse_tensor(const AttentionSpec& s) {
  const DType t = s.dtype == DType::f64 ? DType::f64 : DType::f32;
  return s.varlen() ? Tensor::zeros(t, {s.heads_q, s.total_q}) : Tensor::zeros(t, {s.batch, s.heads_q, s.seqlen_q});
}

// Workspace handed to the backends, 64-byte aligned (a cache line, the widest
// vector), allocated once per measurement so that no timed call allocates.
class Scratch {
 public:
  explicit Scratch(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(64, (bytes_ + 63) / 64 * 64)));
    if (!data_) {
      throw Error(ErrorCode::out_of_memory, "workspace.bytes", std::to_string(bytes_), "allocation failed");
    }
  }
  Workspace workspace() const { return {data_.get(), bytes_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t bytes_;
  std::unique_ptr<std::byte, Free> data_;
};

std::int64_t attention_work(const AttentionSpec& s) {
  return s.batch * s.heads_q * s.seqlen_q * s.seqlen_kv;
}

// What the harness will run of one (problem, impl): the passes, in order.
struct Planned {
  std::size_t problem = 0;
  Impl impl = Impl::flash;
  std::vector<Pass> passes;
};

class Runner {
 public:
  Runner(const HarnessOptions& options, Report& report) : opt_(options), report_(report) {}

  std::vector<Planned> plan(const std::vector<AttentionSpec>& problems) {
    std::vector<Planned> plan;
    for (std::size_t i = 0; i < problems.size(); ++i) {
      const AttentionSpec& s = problems[i];
      validate(s);
      for (const Impl& impl : opt_.impls) {
        Planned p{i, impl, {}};
        if (impl.backend == "reference" && attention_work(s) > opt_.reference_max_work && !opt_.force_reference) {
          report_.notes.push_back("reference skipped for " + problem_label(s) + ": B*H*Sq*Sk = " +
                                  std::to_string(attention_work(s)) + " exceeds " +
                                  std::to_string(opt_.reference_max_work) + " (request it with --force-reference)");
          continue;
        }
        if (impl.is_api()) {
          // What the public path selects (training when a backward is timed):
          // its rows compare with that backend's harness rows.
          const Mode mode =
              std::ranges::find(opt_.passes, Pass::backward) != opt_.passes.end() ? Mode::training : Mode::inference;
          try {
            const Selection sel = select(s, mode);
            report_.notes.push_back(to_string(impl) + " selects " + std::string(sel.backend->name()) + ":" +
                                    sel.backend->variants()[static_cast<std::size_t>(sel.variant)].name + " for " +
                                    problem_label(s) + " (" + std::string(to_string(mode)) + ")");
          } catch (const Error& e) {
            report_.notes.push_back(to_string(impl) + " skipped for " + problem_label(s) + ": " + e.detail());
            continue;
          }
          p.passes = opt_.passes;
          total_ += static_cast<int>(p.passes.size());
          plan.push_back(std::move(p));
          continue;
        }
        if (impl.is_unfused() && !UnfusedAttention::check(s).ok()) {  // the same for every pass
          report_.notes.push_back("unfused skipped for " + problem_label(s) + ": " +
                                  UnfusedAttention::check(s).to_string());
          continue;
        }
        for (const Pass pass : opt_.passes) {
          const std::string why = unsupported(impl, s, pass);
          if (why.empty()) {
            p.passes.push_back(pass);
          } else {
            report_.notes.push_back(to_string(impl) + " " + std::string(to_string(pass)) + " skipped for " +
                                    problem_label(s) + ": " + why);
          }
        }
        total_ += static_cast<int>(p.passes.size());
        if (!p.passes.empty()) plan.push_back(std::move(p));
      }
    }
    return plan;
  }

  void run(const AttentionSpec& s, const ProblemTensors& data, const Planned& p) {
    const Inputs in = data.inputs();
    const std::int64_t pairs = detail::visible_pairs(s, in);
    if (p.impl.is_unfused()) {
      run_unfused(s, data, in, pairs, p.passes);
    } else if (p.impl.is_api()) {
      run_api(p.impl, s, data, in, pairs, p.passes);
    } else {
      run_backend(*backend(p.impl), p.impl, s, data, in, pairs, p.passes);
    }
  }

 private:
  // The registered backend an impl names (parse_impl checked that it exists).
  static std::shared_ptr<const Backend> backend(const Impl& impl) {
    auto b = Registry::global().find(impl.backend);
    if (!b) throw Error(ErrorCode::invalid_argument, "impl", impl.backend, "no registered backend has this name");
    return b;
  }
  static Target target(const Backend& b, const Impl& impl) {
    return {Device::cpu(), impl.variant.empty() ? -1 : b.find_variant(impl.variant)};
  }

  // A backend: its own check (unfused is checked once, in plan()).
  std::string unsupported(const Impl& impl, const AttentionSpec& s, Pass pass) const {
    if (impl.is_unfused()) return "";
    const auto b = backend(impl);
    const Support fwd = b->check(s, Pass::forward, target(*b, impl));
    if (!fwd.ok()) return fwd.to_string();  // backward also needs the forward's outputs
    const Support sup = b->check(s, pass, target(*b, impl));
    return sup.ok() ? "" : sup.to_string();
  }

  void measure(const AttentionSpec& s, Impl impl, Pass pass, std::int64_t pairs, std::size_t extra,
               const std::function<void()>& fn) {
    Row r;
    r.spec = s;
    r.problem = problem_label(s);
    r.impl = impl;
    r.pass = pass;
    r.extra_bytes = extra;
    r.flops = pass == Pass::forward ? detail::forward_flops(s, pairs) : detail::backward_flops(s, pairs);
    ++done_;
    if (opt_.progress != nullptr) {
      *opt_.progress << "[" << done_ << "/" << total_ << "] " << r.problem << " " << to_string(impl) << " "
                     << to_string(pass) << " ..." << std::flush;
    }
    r.timing = time_it(fn, opt_.timing);
    r.gflops = static_cast<double>(r.flops) / r.timing.best_s / 1e9;
    r.vs_sgemm = report_.header.sgemm.gflops > 0.0 ? r.gflops / report_.header.sgemm.gflops : 0.0;
    if (s.dtype == DType::bf16 && report_.header.bf16_gemm.measured()) {
      r.vs_bf16_gemm = r.gflops / report_.header.bf16_gemm.gflops;
    }
    if (s.dtype == DType::bf16) r.vs_amx_peak = ratio_to_amx_peak(r.gflops, report_.header.amx);
    if (opt_.progress != nullptr) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %.3f ms, %.1f GFLOP/s (%d reps)\n", r.timing.best_s * 1e3, r.gflops,
                    r.timing.reps);
      *opt_.progress << buf << std::flush;
    }
    report_.rows.push_back(std::move(r));
  }

  void run_backend(const Backend& b, const Impl& impl, const AttentionSpec& s, const ProblemTensors& data,
                   const Inputs& in, std::int64_t pairs, const std::vector<Pass>& passes) {
    Tensor out = zeros_with_last(in.q, s.head_dim_v), lse = lse_tensor(s);
    const Target t = target(b, impl);
    const Scratch fwd_ws(b.workspace_bytes(s, Pass::forward, t));
    const ForwardArgs fa{s, in, out, lse, fwd_ws.workspace(), t};
    bool have_forward = false;
    for (const Pass pass : passes) {
      if (pass == Pass::forward) {
        measure(s, impl, pass, pairs, b.workspace_bytes(s, pass, t), [&] { b.forward(fa); });
        have_forward = true;
        continue;
      }
      if (!have_forward) b.forward(fa);
      have_forward = true;
      TensorView dq_view = in.q;
      dq_view.dtype = s.effective_dq_dtype();  // --dq-dtype f32
      const Tensor dq = Tensor::zeros_like(dq_view), dk = Tensor::zeros_like(in.k), dv = Tensor::zeros_like(in.v);
      const Tensor dbias = s.bias_requires_grad ? Tensor::zeros_like(in.bias) : Tensor{};
      const Scratch bwd_ws(b.workspace_bytes(s, Pass::backward, t));
      const BackwardArgs ba{
          s, in, out, lse, data.dout, dq, dk, dv, dbias.defined() ? dbias.view() : TensorView{}, bwd_ws.workspace(), t};
      measure(s, impl, pass, pairs, b.workspace_bytes(s, pass, t), [&] { b.backward(ba); });
    }
  }

  // The public entry points in steady state (repeated calls): selection is
  // cached, outputs and gradients are allocated by each call unless the impl
  // is api:given; the workspace is always the runtime's own.
  void run_api(const Impl& impl, const AttentionSpec& s, const ProblemTensors& data, const Inputs& in,
               std::int64_t pairs, const std::vector<Pass>& passes) {
    const bool given = impl == Impl::api_given;
    const bool training = std::ranges::find(passes, Pass::backward) != passes.end();
    const Mode mode = training ? Mode::training : Mode::inference;
    Tensor out = zeros_with_last(in.q, s.head_dim_v), lse = lse_tensor(s);
    CallOptions fo;
    if (given) {
      fo.out = out;
      fo.lse = lse;
    }
    const Plan plan = Plan::make(s, mode);
    for (const Pass pass : passes) {
      if (pass == Pass::forward) {
        measure(s, impl, pass, pairs, plan.workspace_bytes(pass), [&] { (void)forward(in, s, mode, fo); });
        continue;
      }
      const ForwardResult fwd = forward(in, s, mode, fo);
      TensorView dq_view = in.q;
      dq_view.dtype = s.effective_dq_dtype();
      const Tensor dq = Tensor::zeros_like(dq_view), dk = Tensor::zeros_like(in.k), dv = Tensor::zeros_like(in.v);
      CallOptions bo;
      if (given) {
        bo.grads.dq = dq;
        bo.grads.dk = dk;
        bo.grads.dv = dv;
      }
      measure(s, impl, pass, pairs, plan.workspace_bytes(pass), [&] { (void)backward(fwd.ctx, data.dout, bo); });
    }
  }

  void run_unfused(const AttentionSpec& s, const ProblemTensors& data, const Inputs& in, std::int64_t pairs,
                   const std::vector<Pass>& passes) {
    UnfusedAttention u(s);
    Tensor out = zeros_with_last(in.q, s.head_dim_v);
    for (const Pass pass : passes) {
      if (pass == Pass::forward) {
        // Timed as inference (one head's buffer reused): the forward a user
        // runs when no backward follows; training differs only in where P lands.
        measure(s, Impl::unfused, pass, pairs, u.extra_bytes(pass), [&] { u.forward(in, out, false); });
        continue;
      }
      u.forward(in, out, true);
      const Tensor dq = Tensor::zeros_like(in.q), dk = Tensor::zeros_like(in.k), dv = Tensor::zeros_like(in.v);
      measure(s, Impl::unfused, pass, pairs, u.extra_bytes(pass), [&] { u.backward(in, data.dout, dq, dk, dv); });
    }
  }

  const HarnessOptions& opt_;
  Report& report_;
  int total_ = 0, done_ = 0;
};

}  // namespace

const Impl Impl::flash{"flash", ""};
const Impl Impl::reference{"reference", ""};
const Impl Impl::unfused{"unfused", ""};
const Impl Impl::api{"api", ""};
const Impl Impl::api_given{"api", "given"};

std::string to_string(const Impl& impl) {
  return impl.variant.empty() ? impl.backend : impl.backend + ":" + impl.variant;
}

Impl parse_impl(std::string_view text) {
  if (text == "unfused") return Impl::unfused;
  if (text == "api") return Impl::api;
  if (text == "api:given") return Impl::api_given;
  const auto colon = text.find(':');
  Impl impl{std::string(text.substr(0, colon)),
            colon == std::string_view::npos ? "" : std::string(text.substr(colon + 1))};
  const auto b = Registry::global().find(impl.backend);
  if (!b) {
    std::string names = "unfused, api, api:given";
    for (const auto& e : Registry::global().backends()) names += ", " + std::string(e.backend->name());
    throw Error(ErrorCode::invalid_argument, "impl", std::string(text),
                "expected one of " + names + " (optionally name:variant)");
  }
  if (!impl.variant.empty() && b->find_variant(impl.variant) < 0) {
    std::string names;
    for (const Variant& v : b->variants()) names += (names.empty() ? "" : ", ") + v.name;
    throw Error(ErrorCode::invalid_argument, "impl", std::string(text),
                impl.backend + " has no such variant (" + names + ")");
  }
  return impl;
}

Inputs ProblemTensors::inputs() const {
  Inputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  if (bias.defined()) in.bias = bias;
  if (slopes.defined()) in.alibi_slopes = slopes;
  if (cu_seqlens_q.defined()) in.cu_seqlens_q = cu_seqlens_q;
  if (cu_seqlens_kv.defined()) in.cu_seqlens_kv = cu_seqlens_kv;
  if (k_scale.defined()) in.k_scale = k_scale;
  if (v_scale.defined()) in.v_scale = v_scale;
  if (cache) cache->bind(in);
  return in;
}

Header make_header(const SgemmPeak& sgemm, const Bf16GemmPeak& bf16_gemm, const AmxPeak& amx) {
  Header h;
  h.threads = omp_get_max_threads();
  h.blas_threads = blas_threads();
  h.flash_isa = std::string(flash_active_isa());
  h.blas_config = blas_config();
  h.blas_pinned = blas_pinning(std::getenv("OPENBLAS_CORETYPE"), std::getenv("OPENBLAS_L2_SIZE"));
  h.sgemm = sgemm;
  h.bf16_gemm = bf16_gemm;
  h.amx = amx;
  return h;
}

std::string blas_pinning(const char* coretype, const char* l2_size) {
  std::string pinned;
  if (coretype != nullptr) pinned += std::string("OPENBLAS_CORETYPE=") + coretype;
  if (l2_size != nullptr) pinned += std::string(pinned.empty() ? "" : " ") + "OPENBLAS_L2_SIZE=" + l2_size;
  return pinned;
}

std::string problem_label(const AttentionSpec& s) {
  std::string l = "B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads_q);
  if (s.heads_kv != s.heads_q) l += "/" + std::to_string(s.heads_kv);
  l += " D=" + std::to_string(s.head_dim_qk);
  if (s.head_dim_v != s.head_dim_qk) l += "/" + std::to_string(s.head_dim_v);
  // Varlen sizes are the longest sequences: "varlen S<=100".
  const std::string eq = s.varlen() ? "<=" : "=";
  if (s.varlen()) l += " varlen";
  if (s.seqlen_q == s.seqlen_kv) {
    l += " S" + eq + std::to_string(s.seqlen_q);
  } else {
    l += " Sq" + eq + std::to_string(s.seqlen_q) + " Sk" + eq + std::to_string(s.seqlen_kv);
  }
  if (s.causal) l += " causal";
  if (s.window_left >= 0 || (!s.causal && s.window_right >= 0)) {
    l += " window=" + std::to_string(s.window_left) + "," + std::to_string(s.effective_window_right());
  }
  if (s.softcap > 0.0) l += " softcap=" + num(s.softcap);
  if (s.alibi) l += " alibi";
  if (s.has_bias) l += s.bias_requires_grad ? " bias+grad" : " bias";
  if (s.dropout_p > 0.0) l += " dropout=" + num(s.dropout_p);
  if (s.dtype != DType::f32) l += " " + std::string(to_string(s.dtype));
  if (s.effective_dq_dtype() != s.dtype) l += " dq=" + std::string(to_string(s.effective_dq_dtype()));
  if (s.layout != Layout::bshd && !s.varlen()) l += " " + std::string(to_string(s.layout));
  if (s.paged()) l += " paged(" + std::to_string(s.kv_page_size) + ")";
  if (s.kv_quantized()) {
    l += " kv=" + std::string(to_string(s.effective_kv_dtype())) + "/" + std::string(to_string(s.kv_scale));
  }
  return l;
}

Report run_benchmarks(const std::vector<AttentionSpec>& problems, const HarnessOptions& options,
                      const Header& header) {
  if (!options.make_tensors) {
    throw Error(ErrorCode::invalid_argument, "make_tensors", "empty", "the harness needs a data generator");
  }
  Report report;
  report.header = header;
  Runner runner(options, report);
  const std::vector<Planned> plan = runner.plan(problems);
  std::vector<std::size_t> row_problem;  // problem index of each row, to pair rows with unfused
  for (std::size_t i = 0; i < problems.size(); ++i) {
    ProblemTensors data;
    bool made = false;
    for (const Planned& p : plan) {
      if (p.problem != i) continue;
      if (!made) data = options.make_tensors(problems[i]);
      made = true;
      runner.run(problems[i], data, p);
      row_problem.resize(report.rows.size(), i);
    }
  }
  for (std::size_t r = 0; r < report.rows.size(); ++r) {
    for (std::size_t u = 0; u < report.rows.size(); ++u) {
      const Row& base = report.rows[u];
      if (base.impl == Impl::unfused && row_problem[u] == row_problem[r] && base.pass == report.rows[r].pass) {
        report.rows[r].vs_unfused = base.timing.best_s / report.rows[r].timing.best_s;
      }
    }
  }
  return report;
}

}  // namespace attend::bench

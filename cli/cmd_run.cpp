// attend run: run a problem through the high-level API and report the backend,
// time, FLOP rate, memory and (with --check) the error against the f64 reference.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

#include "attend/attention.h"
#include "attend/npy.h"
#include "attend/select.h"
#include "check.h"
#include "commands.h"
#include "runtime/flops.h"
#include "flag_checks.h"

namespace attend_cli {

namespace {

// The project's main job, run by a bare `attend run`: one MLA-shaped training
// step (DeepSeek's 192/128 head dims), causal, checked against the reference.
void use_default_job(RunCommand& cmd) {
  ProblemFlags& f = cmd.problem;
  f.batch = 1;
  f.seqlen = 512;
  f.heads = 8;
  f.head_dim_qk = 192;
  f.head_dim_v = 128;
  f.causal = true;
  f.dtype = "f32";
  cmd.check = true;
}

bool any_option_given(const CLI::App& sub) {
  for (const CLI::Option* opt : sub.get_options()) {
    if (opt->count() > 0) return true;
  }
  return false;
}

std::string format(const char* fmt, double a, double b = 0.0) {
  char buf[128];
  std::snprintf(buf, sizeof buf, fmt, a, b);
  return buf;
}

std::string bytes_string(double bytes) {
  if (bytes < 1024) return format("%.0f B", bytes);
  if (bytes < 1024.0 * 1024) return format("%.1f KiB", bytes / 1024);
  if (bytes < 1024.0 * 1024 * 1024) return format("%.1f MiB", bytes / (1024.0 * 1024));
  return format("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}

std::size_t tensor_bytes(const attend::Tensor& t) {
  return t.defined() ? static_cast<std::size_t>(t.numel()) * attend::size_of(t.view().dtype) : 0;
}

// Best of `repeat` timings of fn(), in seconds.
template <typename Fn>
double time_best(std::int64_t repeat, Fn&& fn) {
  double best = std::numeric_limits<double>::infinity();
  for (std::int64_t r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

void print_timing(const char* pass, double seconds, std::int64_t flops, std::int64_t repeat) {
  const double gflops = seconds > 0.0 ? static_cast<double>(flops) / seconds / 1e9 : 0.0;
  std::cout << pass << ": " << format("%.3f ms  %.2f GFLOP/s", seconds * 1e3, gflops);
  if (repeat > 1) std::cout << "  (best of " << repeat << ")";
  std::cout << "\n";
}

void save_all(const std::string& dir, const ProblemData& d, const attend::ForwardResult& fwd,
              const attend::Gradients* g) {
  std::filesystem::create_directories(dir);
  std::string names;
  const auto save = [&](const char* name, const attend::Tensor& t) {
    if (!t.defined()) return;
    // NumPy has no bf16: bf16 tensors are saved as '<f4' (exact widening) and
    // rounded back to bf16 when loaded with --dtype bf16 (problem_data.cpp).
    const attend::Tensor& w = t.view().dtype == attend::DType::bf16 ? convert(t, attend::DType::f32) : t;
    attend::write_npy((std::filesystem::path(dir) / (std::string(name) + ".npy")).string(), w);
    names += (names.empty() ? "" : ", ") + std::string(name);
  };
  save("q", d.q);
  save("k", d.k);
  save("v", d.v);
  save("dout", d.dout);
  save("out", fwd.out);
  save("lse", fwd.lse);
  if (g != nullptr) {
    save("dq", g->dq);
    save("dk", g->dk);
    save("dv", g->dv);
    save("dbias", g->dbias);
  }
  std::cout << "saved: " << dir << " (" << names << ")\n";
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunCommand& cmd) {
  auto* sub = app.add_subcommand(
      "run", "Run a problem (forward, and backward in training) and report time, memory and accuracy.\n"
             "With no flags: an MLA-shaped causal training step (B=1 S=512 H=8 D=192/128 f32) with --check.");
  add_problem_flags(*sub, cmd.problem);
  const char* g = "Run";
  sub->add_flag("--check", cmd.check, "compare out, lse and gradients with the f64 reference")->group(g);
  sub->add_option("--tolerance", cmd.tolerance,
                  "--check fails (exit 3) when a max_rel_err exceeds this [f64 1e-10, f32 1e-4, else 2e-2]")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return std::strtod(text.c_str(), nullptr) > 0.0 ? "" : "must be a positive number";
          },
          "POSITIVE"))
      ->group(g);
  sub->add_option("--q", cmd.q_path, "q from this .npy file")->group(g);
  sub->add_option("--k", cmd.k_path, "k from this .npy file")->group(g);
  sub->add_option("--v", cmd.v_path, "v from this .npy file")->group(g);
  sub->add_option("--dout", cmd.dout_path, "dout from this .npy file (training)")->group(g);
  sub->add_option("--save", cmd.save_dir, "write q,k,v,dout,out,lse,dq,dk,dv(,dbias).npy into DIR")->group(g);
  sub->add_option("--data-seed", cmd.data_seed, "seed of the random inputs")->check(non_negative_int())
      ->group(g)->capture_default_str();
  sub->add_option("--repeat", cmd.repeat, "time each pass this many times, report the best")
      ->check(positive_int())->group(g)->capture_default_str();
  return sub;
}

int run_run(RunCommand& cmd, const CLI::App& sub) {
  if (!any_option_given(sub)) {
    use_default_job(cmd);
    std::cout << "no flags: running the built-in default job (MLA-shaped training step, --check)\n";
  }
  const Problem p = make_problem(cmd.problem);
  const bool training = p.mode == attend::Mode::training;
  // Select before generating data so that an unsupported problem fails fast.
  const attend::Selection sel = attend::select(p.spec, p.mode, p.policy);
  std::cout << "problem: " << attend::describe(p.spec) << "\n"
            << "mode: " << describe_mode(p.mode) << "\n"
            << "backend: " << sel.backend->name() << "\n";

  const ProblemData data =
      make_data(p, DataSources{cmd.q_path, cmd.k_path, cmd.v_path, cmd.dout_path, cmd.data_seed, training});
  const attend::Inputs in = data.inputs();
  const std::int64_t pairs = attend::detail::visible_pairs(p.spec, in);

  attend::ForwardResult fwd;
  const double t_fwd = time_best(cmd.repeat, [&] { fwd = attend::forward(in, p.spec, p.mode, &p.policy); });
  print_timing("forward", t_fwd, attend::detail::forward_flops(p.spec, pairs), cmd.repeat);

  attend::Gradients grads;
  if (training) {
    const double t_bwd = time_best(cmd.repeat, [&] { grads = attend::backward(fwd.ctx, data.dout); });
    print_timing("backward", t_bwd, attend::detail::backward_flops(p.spec, pairs), cmd.repeat);
  }

  const attend::Backend& backend = fwd.ctx.backend();
  std::size_t workspace = backend.workspace_bytes(p.spec, attend::Pass::forward);
  std::string ws_text = "forward " + bytes_string(static_cast<double>(workspace));
  if (training) {
    const std::size_t bwd = backend.workspace_bytes(p.spec, attend::Pass::backward);
    ws_text += " + backward " + bytes_string(static_cast<double>(bwd));
    workspace += bwd;
  }
  const std::size_t outputs = tensor_bytes(fwd.out) + tensor_bytes(fwd.lse) + tensor_bytes(grads.dq) +
                              tensor_bytes(grads.dk) + tensor_bytes(grads.dv) + tensor_bytes(grads.dbias);
  std::cout << "memory: " << bytes_string(static_cast<double>(workspace + outputs)) << " extra (workspace "
            << ws_text << ", outputs " << bytes_string(static_cast<double>(outputs)) << ")\n";

  if (!cmd.save_dir.empty()) save_all(cmd.save_dir, data, fwd, training ? &grads : nullptr);

  if (!cmd.check) return 0;
  const double tol = cmd.tolerance > 0.0 ? cmd.tolerance : default_tolerance(p.spec.dtype);
  bool ok = true;
  for (const ErrorStats& st : check_against_reference(p, data, fwd, training ? &grads : nullptr)) {
    std::cout << "check " << st.name << ": "
              << format("max_abs_err=%.3e max_rel_err=%.3e", st.max_abs_err, st.max_rel_err) << "\n";
    ok = ok && st.max_rel_err <= tol;  // false for NaN
  }
  std::cout << "check: " << (ok ? "ok" : "FAILED") << format(" (max_rel_err tolerance %.1e)", tol) << "\n";
  return ok ? 0 : kExitCheckFailed;
}

}  // namespace attend_cli

// attend run: run a problem through the high-level API and report the backend,
// time, FLOP rate, memory and (with --check) the error against the f64 reference.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "attend/attention.h"
#include "attend/npy.h"
#include "attend/select.h"
#include "check.h"
#include "commands.h"
#include "flag_checks.h"
#include "json_output.h"
#include "runtime/flops.h"

namespace attend_cli {

namespace {

// The project's main job, run by a bare `attend run`: one MLA-shaped training
// step (DeepSeek's 192/128 head dims), causal, checked against the reference.
void use_default_job(RunCommand& cmd) {
  ProblemFlags& f = cmd.problem;
  f.seqlen = 512;
  f.heads = 8;
  f.set_text("batch", "1");
  f.set_text("head_dim_qk", "192");
  f.set_text("head_dim_v", "128");
  f.set_text("causal", "true");
  f.set_text("dtype", "f32");
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

// Best of `repeat` timings of fn(), in seconds; prepare() runs untimed before each.
template <typename Fn, typename Prepare>
double time_best(std::int64_t repeat, Fn&& fn, Prepare&& prepare) {
  double best = std::numeric_limits<double>::infinity();
  for (std::int64_t r = 0; r < repeat; ++r) {
    prepare();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

struct PassTiming {
  double seconds = 0.0, gflops = 0.0;
};

PassTiming pass_timing(double seconds, std::int64_t flops) {
  return {seconds, seconds > 0.0 ? static_cast<double>(flops) / seconds / 1e9 : 0.0};
}

void print_timing(const char* pass, const PassTiming& t, std::int64_t repeat) {
  std::cout << pass << ": " << format("%.3f ms  %.2f GFLOP/s", t.seconds * 1e3, t.gflops);
  if (repeat > 1) std::cout << "  (best of " << repeat << ")";
  std::cout << "\n";
}

std::string timing_json(const PassTiming& t) {
  return JsonObject().num("ms", t.seconds * 1e3).num("gflops", t.gflops).text();
}

// Fails before anything is computed: --save DIR creates DIR itself only, inside
// an existing directory, never a chain of missing parents (a typo would
// otherwise scatter results somewhere unexpected).
void check_save_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path(dir);
  std::error_code ec;
  if (fs::exists(path, ec)) {
    if (!fs::is_directory(path, ec)) {
      throw attend::Error(attend::ErrorCode::invalid_argument, "--save", dir, "exists and is not a directory");
    }
    return;
  }
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) {
    throw attend::Error(attend::ErrorCode::io, "--save", dir,
                        "its parent directory " + parent.string() + " does not exist (create it first)");
  }
}

// Writes and removes a probe file in DIR (creating DIR, whose parent
// check_save_dir found): permissions, a read-only or full file system fail
// here, before the run, not after it with the results lost.
void probe_save_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directory(dir, ec);
  if (ec) throw attend::Error(attend::ErrorCode::io, "--save", dir, "cannot create it: " + ec.message());
  const fs::path probe = fs::path(dir) / ".attend-save-probe";
  bool written = false;
  {
    std::ofstream out(probe, std::ios::trunc);
    out << "probe\n";
    out.flush();
    written = static_cast<bool>(out);
  }
  fs::remove(probe, ec);
  if (!written) {
    throw attend::Error(attend::ErrorCode::io, "--save", dir,
                        "cannot write into it: " + std::string(std::strerror(errno)));
  }
}

// A .npy of shape () holds a 0-d scalar, which attend's views count as no
// tensor at all: named by its flag here rather than mistaken for a missing file.
void check_file_ranks(const DataSources& src) {
  const std::pair<const NpyInput*, const char*> files[] = {
      {&src.q, "--q"},        {&src.k, "--k"}, {&src.v, "--v"}, {&src.dout, "--dout"}, {&src.slopes, "--alibi-slopes"},
      {&src.sinks, "--sinks"}};
  for (const auto& [in, flag] : files) {
    if (!in->path.empty() && in->tensor.view().ndim == 0) {
      throw attend::Error(attend::ErrorCode::shape_mismatch, flag, in->path,
                          "holds a 0-d array (shape ()); this input needs the dimensions of its layout");
    }
  }
}

// Files either describe the whole problem's inputs or none of them.
void check_input_files(const RunCommand& cmd) {
  const int given = !cmd.q_path.empty() + !cmd.k_path.empty() + !cmd.v_path.empty();
  if (given == 0 || given == 3) return;
  const char* missing = cmd.q_path.empty() ? "--q" : cmd.k_path.empty() ? "--k" : "--v";
  throw attend::Error(attend::ErrorCode::invalid_argument, missing, "missing",
                      "--q, --k and --v go together (random data next to a file is rarely meant): give all three");
}

std::string save_all(const std::string& dir, const ProblemData& d, const attend::ForwardResult& fwd,
                     const attend::Gradients* g) {
  std::filesystem::create_directory(dir);  // its parent exists: check_save_dir
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
  // Dense 8-bit K/V: the values they were quantized from (NumPy has no fp8),
  // which a replay with the same --kv-dtype quantizes again.
  save("k", d.k_wide.defined() ? d.k_wide : d.k);
  save("v", d.v_wide.defined() ? d.v_wide : d.v);
  save("dout", d.dout);
  save("alibi_slopes", d.slopes);  // replayed with --alibi-slopes
  save("sinks", d.sinks);          // replayed with --sinks
  save("out", fwd.out);
  save("lse", fwd.lse);
  if (g != nullptr) {
    save("dq", g->dq);
    save("dk", g->dk);
    save("dv", g->dv);
    save("dbias", g->dbias);
    save("dsinks", g->dsinks);
  }
  return names;
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
  sub->add_option("--alibi-slopes", cmd.alibi_slopes_path,
                  "ALiBi slopes, (H) or (B,H) f32, from this .npy file (implies --alibi)")
      ->group(g);
  sub->add_option("--sinks", cmd.sinks_path,
                  "sink logits, (H) f32, from this .npy file (implies --softmax-type learnable; "
                  "without it: seeded random)")
      ->group(g);
  sub->add_option("--save", cmd.save_dir,
                  "write q,k,v,dout,alibi_slopes,sinks,out,lse,dq,dk,dv(,dbias,dsinks).npy into DIR (created; its "
                  "parent must exist)")
      ->group(g);
  sub->add_flag("--json", cmd.json, "print the result (backend, timings, memory, check errors, exit code) as JSON")
      ->group(g);
  sub->add_option("--data-seed", cmd.data_seed, "seed of the random inputs")
      ->check(any_uint64())
      ->group(g)
      ->capture_default_str();
  sub->add_option("--repeat", cmd.repeat, "time each pass this many times, report the best")
      ->check(positive_int())->group(g)->capture_default_str();
  add_cp_flags(*sub, cmd.cp, true);
  return sub;
}

int run_run(RunCommand& cmd, const CLI::App& sub) {
  if (!any_option_given(sub)) {
    use_default_job(cmd);
    std::cout << "no flags: running the built-in default job (MLA-shaped training step, --check)\n";
  }
  if (cmd.cp.enabled()) {
#ifdef ATTEND_CLI_MPI
    return run_cp(cmd);
#else
    throw attend::Error(attend::ErrorCode::unsupported, "--cp", std::to_string(cmd.cp.size),
                        "this attend was built without MPI (install libopenmpi-dev and rebuild); "
                        "`attend select --cp N` explains the strategies without it");
#endif
  }
  if (!cmd.save_dir.empty()) {
    check_save_dir(cmd.save_dir);
    probe_save_dir(cmd.save_dir);
  }
  DataSources src{read_npy_input(cmd.q_path, "--q"),
                  read_npy_input(cmd.k_path, "--k"),
                  read_npy_input(cmd.v_path, "--v"),
                  read_npy_input(cmd.dout_path, "--dout"),
                  cmd.data_seed,
                  false,
                  read_npy_input(cmd.alibi_slopes_path, "--alibi-slopes"),
                  read_npy_input(cmd.sinks_path, "--sinks")};
  check_input_files(cmd);
  check_file_ranks(src);
  sizes_from_files(cmd.problem, src);
  if (src.slopes.tensor.defined()) cmd.problem.set_text("alibi", "true");
  if (src.sinks.tensor.defined()) cmd.problem.set_text("softmax_type", "learnable");
  const Problem p = make_problem(cmd.problem);
  const bool training = p.mode == attend::Mode::training;
  if (!training && !cmd.dout_path.empty()) {
    throw attend::Error(attend::ErrorCode::invalid_argument, "--dout", cmd.dout_path,
                        "inference runs no backward, so dout would be ignored: drop --dout or use --training");
  }
  src.need_dout = training;
  // Select before generating data so that an unsupported problem fails fast.
  const attend::Selection sel = attend::select(p.spec, p.mode, p.policy);
  const bool text = !cmd.json;
  if (text) {
    std::cout << "problem: " << attend::describe(p.spec) << "\n"
              << "mode: " << describe_mode(p.mode) << "\n"
              << "backend: " << sel.backend->name() << "\n";
  }
  JsonObject json;
  json.str("problem", attend::describe(p.spec)).str("mode", training ? "training" : "inference");

  const ProblemData data = make_data(p, src);
  const attend::Inputs in = data.inputs();
  const std::int64_t pairs = attend::detail::visible_pairs(p.spec, in);

  attend::ForwardResult fwd;
  const PassTiming t_fwd =
      pass_timing(time_best(
                      cmd.repeat, [&] { fwd = attend::forward(in, p.spec, p.mode, &p.policy); }, [] {}),
                  attend::detail::forward_flops(p.spec, pairs));
  if (text) print_timing("forward", t_fwd, cmd.repeat);
  json.str("backend", fwd.ctx.backend().name()).integer("repeat", cmd.repeat).raw("forward", timing_json(t_fwd));

  attend::Gradients grads;
  if (training) {
    // --accumulate-grads adds into dq, dk and dv: they start at zero before
    // every repetition, so the result (and --check) is one backward's.
    attend::CallOptions grad_opts;
    attend::Gradients zeroed;
    const auto zero_grads = [&] {
      if (!p.spec.accumulate_grads) return;
      zeroed.dq = zeros(attend::expected_dtype(p.spec, attend::Role::dq), q_shape(p.spec));
      zeroed.dk = attend::Tensor::zeros_like(in.k);
      zeroed.dv = attend::Tensor::zeros_like(in.v);
      grad_opts.grads = {zeroed.dq, zeroed.dk, zeroed.dv};
    };
    const auto run_backward = [&] { grads = attend::backward(fwd.ctx, data.dout, grad_opts); };
    const PassTiming t_bwd =
        pass_timing(time_best(cmd.repeat, run_backward, zero_grads), attend::detail::backward_flops(p.spec, pairs));
    if (p.spec.accumulate_grads) {
      grads.dq = zeroed.dq;
      grads.dk = zeroed.dk;
      grads.dv = zeroed.dv;
    }
    if (text) print_timing("backward", t_bwd, cmd.repeat);
    json.raw("backward", timing_json(t_bwd));
  }

  const attend::Backend& backend = fwd.ctx.backend();
  const std::size_t ws_fwd = backend.workspace_bytes(p.spec, attend::Pass::forward);
  const std::size_t ws_bwd = training ? backend.workspace_bytes(p.spec, attend::Pass::backward) : 0;
  std::string ws_text = "forward " + bytes_string(static_cast<double>(ws_fwd));
  if (training) ws_text += " + backward " + bytes_string(static_cast<double>(ws_bwd));
  const std::size_t outputs = tensor_bytes(fwd.out) + tensor_bytes(fwd.lse) + tensor_bytes(grads.dq) +
                              tensor_bytes(grads.dk) + tensor_bytes(grads.dv) + tensor_bytes(grads.dbias);
  const std::size_t extra = ws_fwd + ws_bwd + outputs;
  if (text) {
    std::cout << "memory: " << bytes_string(static_cast<double>(extra)) << " extra (workspace " << ws_text
              << ", outputs " << bytes_string(static_cast<double>(outputs)) << ")\n";
  }
  JsonObject memory;
  memory.integer("extra_bytes", static_cast<std::int64_t>(extra))
      .integer("workspace_forward_bytes", static_cast<std::int64_t>(ws_fwd));
  if (training) memory.integer("workspace_backward_bytes", static_cast<std::int64_t>(ws_bwd));
  json.raw("memory", memory.integer("output_bytes", static_cast<std::int64_t>(outputs)).text());

  if (!cmd.save_dir.empty()) {
    const std::string names = save_all(cmd.save_dir, data, fwd, training ? &grads : nullptr);
    if (text) std::cout << "saved: " << cmd.save_dir << " (" << names << ")\n";
    json.str("saved", cmd.save_dir);
  }

  int code = 0;
  if (cmd.check) {
    const double tol = cmd.tolerance > 0.0 ? cmd.tolerance : default_tolerance(p.spec.dtype);
    bool ok = true;
    std::string errors;
    if (text && p.spec.kv_quantized()) {
      std::cout << "check: against the f64 reference on the dequantized K/V (code * scale), so the errors "
                   "leave out the quantization error\n";
    }
    for (const ErrorStats& st : check_against_reference(p, data, fwd, training ? &grads : nullptr)) {
      if (text) {
        std::cout << "check " << st.name << ": "
                  << format("max_abs_err=%.3e max_rel_err=%.3e", st.max_abs_err, st.max_rel_err) << "\n";
      }
      errors += (errors.empty() ? "" : ", ") + JsonObject()
                                                   .str("name", st.name)
                                                   .num("max_abs_err", st.max_abs_err)
                                                   .num("max_rel_err", st.max_rel_err)
                                                   .text();
      ok = ok && st.max_rel_err <= tol;  // false for NaN
    }
    if (text) std::cout << "check: " << (ok ? "ok" : "FAILED") << format(" (max_rel_err tolerance %.1e)", tol) << "\n";
    JsonObject check;
    check.boolean("ok", ok).num("tolerance", tol).raw("errors", "[" + errors + "]");
    if (p.spec.kv_quantized()) check.str("kv_reference", "dequantized");
    json.raw("check", check.text());
    code = ok ? 0 : kExitCheckFailed;
  }
  if (cmd.json) std::cout << json.integer("exit_code", code).text() << "\n";
  return code;
}

}  // namespace attend_cli

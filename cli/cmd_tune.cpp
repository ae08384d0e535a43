// attend tune: fill the autotune cache ahead of time and show what it found.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "attend/select.h"
#include "attend/spec.h"
#include "attend/tune.h"
#include "commands.h"

namespace attend_cli {

namespace {

struct Shape {
  std::string group;  // "decode", "prefill", "gqa", "training"
  std::int64_t batch, sq, sk, hq, hkv, d;
  attend::DType dtype;
  attend::Mode mode;
};

// Where priority and autotune might disagree: decode-like query blocks around
// decode's crossover against a 4k cache, long and short prefill, GQA, head
// dims 64-256, f32 and bf16, and training (flash's kernel families compete).
std::vector<Shape> sweep_shapes() {
  using attend::DType;
  using attend::Mode;
  std::vector<Shape> s;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (std::int64_t sq : {1, 2, 4, 8, 16, 32, 64})
      s.push_back({"decode", 1, sq, 4096, 32, 8, 128, dt, Mode::inference});
    for (std::int64_t d : {64, 128}) {
      for (std::int64_t n : {256, 1024}) s.push_back({"prefill", 1, n, n, 8, 8, d, dt, Mode::inference});
    }
    s.push_back({"prefill", 1, 512, 512, 8, 8, 256, dt, Mode::inference});
    s.push_back({"gqa", 2, 512, 512, 16, 2, 128, dt, Mode::inference});
    for (std::int64_t d : {64, 128}) s.push_back({"training", 1, 512, 512, 8, 8, d, dt, Mode::training});
  }
  return s;
}

std::string plan_of(const attend::Selection& sel) {
  return std::string(sel.backend->name()) + ":" + std::string(sel.variant_name());
}

double seconds_of(const attend::Selection& timed, const std::string& plan) {
  for (const attend::Verdict& v : timed.verdicts) {
    if (v.backend + ":" + v.variant == plan && v.seconds) return *v.seconds;
  }
  return NAN;
}

// The tuning pass picks its winner by the same times it reports, so its own
// numbers flatter the winner; where the picks differ, both plans are timed
// again, alternately (three rounds each, median), for an unbiased gain.
std::pair<double, double> retime(const attend::AttentionSpec& spec, attend::Mode mode, const attend::Policy& policy,
                                 const std::string& a, const std::string& b) {
  attend::Policy p = policy;
  p.tune_cache = "off";  // these runs are not a tuning result
  std::vector<double> ta, tb;
  for (int round = 0; round < 3; ++round) {
    for (const auto& [plan, out] : {std::pair{&a, &ta}, std::pair{&b, &tb}}) {
      p.force = *plan;
      out->push_back(seconds_of(attend::tune(spec, mode, p), *plan));
    }
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[1], tb[1]};
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s * 1e3);
  return buf;
}

std::string describe_shape(const Shape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-8s %-9s %-4s B=%lld Sq=%-4lld Sk=%-4lld H=%lld/%lld D=%lld", s.group.c_str(),
                std::string(attend::to_string(s.mode)).c_str(), std::string(attend::to_string(s.dtype)).c_str(),
                static_cast<long long>(s.batch), static_cast<long long>(s.sq), static_cast<long long>(s.sk),
                static_cast<long long>(s.hq), static_cast<long long>(s.hkv), static_cast<long long>(s.d));
  return buf;
}

int run_sweep(TuneCommand& cmd, const attend::Policy& policy) {
  std::ostream& out = *cmd.out;
  const std::vector<Shape> shapes = sweep_shapes();
  attend::Policy priority = policy;
  priority.strategy = attend::Strategy::priority;
  out << "autotune sweep: " << shapes.size() << " shapes; cache " << attend::tune_cache_file(policy) << "\n";
  out << "times: median ms of one run (training: forward + backward); where the picks differ, both re-timed\n"
         "alternately after tuning (3 rounds each, median), so the gain is not the tuning pass's own pick\n";
  char head[200];
  std::snprintf(head, sizeof head, "%-60s %-18s %10s  %-18s %10s  %6s\n", "shape", "priority pick", "ms",
                "autotune pick", "ms", "gain");
  out << head;
  double log_gain = 0;
  int counted = 0;
  // decode-like rows: per dtype, the largest Sq where decode beat flash.
  std::vector<std::string> crossover;
  std::string last_dtype;
  std::int64_t decode_wins_to = 0;
  bool decode_seen = false, still_winning = true;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Shape& sh = shapes[i];
    *cmd.progress << "[" << i + 1 << "/" << shapes.size() << "] " << describe_shape(sh) << "\n" << std::flush;
    attend::AttentionSpec spec;
    spec.batch = sh.batch;
    spec.seqlen_q = sh.sq;
    spec.seqlen_kv = sh.sk;
    spec.heads_q = sh.hq;
    spec.heads_kv = sh.hkv;
    spec.head_dim_qk = spec.head_dim_v = sh.d;
    spec.dtype = sh.dtype;
    const attend::Selection timed = attend::tune(spec, sh.mode, policy);
    const std::string tuned = plan_of(timed);
    const std::string prio = plan_of(attend::evaluate(spec, sh.mode, priority));
    double tp = seconds_of(timed, prio), ta = seconds_of(timed, tuned);
    if (prio != tuned) std::tie(tp, ta) = retime(spec, sh.mode, policy, prio, tuned);
    const double gain = tp / ta;
    if (std::isfinite(gain) && gain > 0) {
      log_gain += std::log(gain);
      ++counted;
    }
    char row[240];
    std::snprintf(row, sizeof row, "%-60s %-18s %10s  %-18s %10s  %5.2fx\n", describe_shape(sh).c_str(), prio.c_str(),
                  ms(tp).c_str(), tuned.c_str(), ms(ta).c_str(), gain);
    out << row << std::flush;
    if (sh.group == "decode") {
      const std::string dt(attend::to_string(sh.dtype));
      if (dt != last_dtype) {
        decode_wins_to = 0;
        still_winning = true;
      }
      last_dtype = dt;
      decode_seen = true;
      double best_decode = INFINITY, best_flash = INFINITY;
      for (const attend::Verdict& v : timed.verdicts) {
        if (!v.seconds) continue;
        if (v.backend == "decode") best_decode = std::min(best_decode, *v.seconds);
        if (v.backend == "flash") best_flash = std::min(best_flash, *v.seconds);
      }
      // The crossover: decode wins from Sq=1 up to here without a gap.
      if (best_decode < best_flash && still_winning)
        decode_wins_to = sh.sq;
      else
        still_winning = false;
      const bool last_of_dtype = i + 1 == shapes.size() || shapes[i + 1].group != "decode";
      if (last_of_dtype) {
        crossover.push_back(dt + ": decode is faster than flash up to seqlen_q=" + std::to_string(decode_wins_to) +
                            " against a 4096-token cache (priority's crossover: 16)");
      }
    }
  }
  char tail[120];
  std::snprintf(tail, sizeof tail, "geometric-mean gain of autotune over priority: %.3fx over %d shapes\n",
                counted ? std::exp(log_gain / counted) : 1.0, counted);
  out << tail;
  if (decode_seen) {
    for (const std::string& c : crossover) out << "crossover " << c << "\n";
  }
  return 0;
}

}  // namespace

CLI::App* add_tune_command(CLI::App& app, TuneCommand& cmd) {
  auto* sub = app.add_subcommand(
      "tune",
      "Time every viable plan of a problem (or of a grid of shapes) and record the fastest in the autotune cache");
  add_problem_flags(*sub, cmd.problem);
  sub->add_flag("--sweep", cmd.sweep,
                "tune a built-in grid of shapes (decode-like, prefill, GQA, head dims 64-256, f32/bf16, training) "
                "instead of the problem flags, and compare priority's pick with autotune's");
  return sub;
}

int run_tune(TuneCommand& cmd, const CLI::App&) {
  Problem p = make_problem(cmd.problem);
  p.policy.strategy = attend::Strategy::autotune;
  if (cmd.sweep) return run_sweep(cmd, p.policy);
  *cmd.progress << "tuning " << attend::describe(p.spec) << " [" << attend::to_string(p.mode) << "]\n" << std::flush;
  const attend::Selection sel = attend::tune(p.spec, p.mode, p.policy);
  *cmd.out << sel.explain();
  return 0;
}

}  // namespace attend_cli

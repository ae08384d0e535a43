// Autotune: time every viable plan of a bucket once, keep the fastest.
#include "runtime/autotune.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "attend/error.h"
#include "attend/registry.h"
#include "attend/spec_fields.h"
#include "attend/tune.h"
#include "runtime/tune_cache.h"
#include "runtime/tune_data.h"

namespace attend {

namespace {

using Clock = std::chrono::steady_clock;

// Rounds (each runs every plan once): enough for a stable median of a short
// kernel, few enough that a bucket tunes in about a second at typical shapes.
constexpr int kMinRuns = 3;
constexpr int kMaxRuns = 25;
constexpr double kMinSeconds = 0.05;  // all plans' runs together
// A candidate whose warm-up run is this much slower than the best median so
// far cannot win: it is recorded with that one run.
constexpr double kHopeless = 4.0;
// A plan must beat the priority pick by more than this factor to replace it.
constexpr double kMargin = 1.05;

std::int64_t pow2_ceil(std::int64_t v) {
  if (v <= 1) return v;
  return std::int64_t{1} << std::bit_width(static_cast<std::uint64_t>(v - 1));
}

std::string plan_name(const Verdict& v) { return v.backend + ":" + v.variant; }

std::string format_seconds(double s) {
  char buf[32];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

struct AlignedFree {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
};

// One plan ready to run on the scratch data, with its own workspace.
class Timer {
 public:
  Timer(const Backend& backend, int variant, const AttentionSpec& spec, Mode mode, Device device,
        const detail::TuneData& d)
      : backend_(backend), mode_(mode) {
    const Target target{device, variant};
    std::size_t bytes = backend.workspace_bytes(spec, Pass::forward, target);
    if (mode == Mode::training) bytes = std::max(bytes, backend.workspace_bytes(spec, Pass::backward, target));
    if (bytes > 0) ws_.reset(new (std::align_val_t{64}) std::byte[bytes]);
    const Workspace workspace{ws_.get(), bytes};
    fwd_ = std::make_unique<ForwardArgs>(ForwardArgs{spec, d.in, d.out, d.lse, workspace, target, {}});
    bwd_ = std::make_unique<BackwardArgs>(
        BackwardArgs{spec, d.in, d.out, d.lse, d.dout, d.dq, d.dk, d.dv, d.dbias, workspace, target, {}});
  }
  // Seconds of one run of the mode's passes.
  double once() const {
    const auto t0 = Clock::now();
    backend_.forward(*fwd_);
    if (mode_ == Mode::training) backend_.backward(*bwd_);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  const Backend& backend_;
  Mode mode_;
  std::unique_ptr<std::byte[], AlignedFree> ws_;
  std::unique_ptr<ForwardArgs> fwd_;
  std::unique_ptr<BackwardArgs> bwd_;
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// One tuning at a time per process: concurrent timings would disturb each other.
std::mutex& tuning_mutex() {
  static std::mutex m;
  return m;
}

detail::TuneRecord measure_all(const Selection& sel, const AttentionSpec& spec, const Policy& policy,
                               const std::string& bucket) {
  const detail::TuneData data = detail::make_tune_data(spec, sel.mode);
  struct Candidate {
    std::string name;
    std::unique_ptr<Timer> timer;
    std::vector<double> runs;
  };
  std::vector<Candidate> cands;
  for (const Verdict& v : sel.verdicts) {
    if (!v.viable) continue;
    const auto backend = Registry::global().find(v.backend);
    if (!backend) continue;
    cands.push_back(
        {plan_name(v),
         std::make_unique<Timer>(*backend, backend->find_variant(v.variant), spec, sel.mode, sel.device, data),
         {}});
  }
  // Warm-up, highest priority first; a plan far slower than the best warm-up
  // cannot win and keeps that one time (the scalar kernels cost one run).
  double best_warm = std::numeric_limits<double>::infinity();
  std::vector<double> warm(cands.size());
  for (std::size_t i = 0; i < cands.size(); ++i) {
    warm[i] = cands[i].timer->once();
    best_warm = std::min(best_warm, warm[i]);
  }
  // Then rounds that run every remaining plan once each: a burst of load from
  // elsewhere slows a whole round, not one plan's every run.
  double total = 0;
  for (int round = 0; round < kMaxRuns && (round < kMinRuns || total < kMinSeconds); ++round) {
    for (std::size_t i = 0; i < cands.size(); ++i) {
      if (warm[i] > kHopeless * best_warm) continue;
      cands[i].runs.push_back(cands[i].timer->once());
      total += cands[i].runs.back();
    }
  }
  detail::TuneRecord r;
  r.problem = sel.spec_summary;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    r.seconds.emplace_back(cands[i].name, cands[i].runs.empty() ? warm[i] : median(cands[i].runs));
  }
  if (policy.log != LogLevel::off) {
    std::string line =
        "[attend] autotune " + std::string(to_string(sel.mode)) + " " + sel.spec_summary + " (bucket " + bucket + "):";
    for (const auto& [name, t] : r.seconds) line += " " + name + " " + format_seconds(t) + ";";
    std::cerr << line << "\n";
  }
  return r;
}

// Merges new times into an older record (plans not timed now keep theirs).
detail::TuneRecord merge(std::optional<detail::TuneRecord> old, detail::TuneRecord fresh) {
  if (!old) return fresh;
  for (const auto& entry : old->seconds) {
    const bool retimed =
        std::any_of(fresh.seconds.begin(), fresh.seconds.end(), [&](const auto& p) { return p.first == entry.first; });
    if (!retimed) fresh.seconds.push_back(entry);
  }
  return fresh;
}

std::optional<double> recorded(const detail::TuneRecord& r, const std::string& name) {
  for (const auto& [n, t] : r.seconds) {
    if (n == name) return t;
  }
  return std::nullopt;
}

// Chooses the fastest viable verdict by `r`; false when some viable one has no
// time. Within kMargin of the priority pick (sel's choice on entry), timing
// noise cannot tell them apart, and the priority pick stays.
bool choose(Selection& sel, const detail::TuneRecord& r) {
  Verdict* best = nullptr;
  Verdict* by_priority = nullptr;
  for (Verdict& v : sel.verdicts) {
    v.seconds.reset();
    if (v.chosen) by_priority = &v;
    if (!v.viable) continue;
    v.seconds = recorded(r, plan_name(v));
    if (!v.seconds) return false;
    if (!best || *v.seconds < *best->seconds) best = &v;
  }
  if (!best) return false;
  if (by_priority && by_priority->seconds && *by_priority->seconds <= *best->seconds * kMargin) best = by_priority;
  for (Verdict& v : sel.verdicts) v.chosen = &v == best;
  sel.backend = Registry::global().find(best->backend);
  sel.variant = sel.backend ? sel.backend->find_variant(best->variant) : -1;
  return sel.backend != nullptr;
}

void keep_priority(Selection& sel, std::string why) {
  for (Verdict& v : sel.verdicts) v.seconds.reset();
  sel.tuning = "not tuned: " + std::move(why) + "; chosen by priority";
}

}  // namespace

namespace detail {

void apply_autotune(Selection& sel, const AttentionSpec& spec, const Policy& policy, Measure measure) {
  sel.strategy = Strategy::autotune;
  const auto viable =
      std::count_if(sel.verdicts.begin(), sel.verdicts.end(), [](const Verdict& v) { return v.viable; });
  if (viable == 0) {
    sel.tuning = "not tuned: no viable plan";
    return;
  }
  if (!sel.device.is_host())
    return keep_priority(sel, "tensors on " + to_string(sel.device) + " (autotune times host plans)");
  if (viable == 1 && measure != Measure::always) return keep_priority(sel, "one viable plan, nothing to compare");
  const std::string path = resolve_tune_cache_path(policy.tune_cache);
  const std::string machine = current_machine().text();
  const std::string bucket = tune_bucket(spec, sel.mode, sel.device);
  const std::string where = path.empty() ? "memory only" : path;
  std::optional<TuneRecord> rec = find_tune_record(path, machine, bucket);
  if (measure != Measure::always && rec && choose(sel, *rec)) {
    sel.tuning = "times recorded for bucket " + bucket + " (" + where + ")";
    return;
  }
  if (measure == Measure::never) return keep_priority(sel, "bucket " + bucket + " has no times yet");
  const std::lock_guard lock(tuning_mutex());
  // Another thread may have tuned this bucket while this one waited.
  rec = find_tune_record(path, machine, bucket);
  if (measure != Measure::always && rec && choose(sel, *rec)) {
    sel.tuning = "times recorded for bucket " + bucket + " (" + where + ")";
    return;
  }
  TuneRecord fresh = merge(std::move(rec), measure_all(sel, spec, policy, bucket));
  if (!choose(sel, fresh)) return keep_priority(sel, "no plan could be timed");
  fresh.winner = std::string(sel.backend->name()) + ":" + std::string(sel.variant_name());
  const std::string warning = store_tune_record(path, machine, bucket, fresh);
  sel.tuning = "measured now for bucket " + bucket + " (median of " + std::to_string(kMinRuns) + "-" +
               std::to_string(kMaxRuns) + " interleaved rounds on scratch data; " +
               (warning.empty() ? "saved to " + where : "not saved: " + warning) + ")";
}

}  // namespace detail

std::string tune_bucket(const AttentionSpec& s, Mode mode, Device device) {
  std::string key = "Sq<=" + std::to_string(pow2_ceil(s.seqlen_q)) + ",Sk<=" + std::to_string(pow2_ceil(s.seqlen_kv)) +
                    ",BH<=" + std::to_string(pow2_ceil(s.batch * s.heads_q)) +
                    ",group=" + std::to_string(s.heads_kv > 0 ? s.heads_q / s.heads_kv : 0);
  if (s.varlen()) {
    key += ",Tq<=" + std::to_string(pow2_ceil(s.total_q)) + ",Tk<=" + std::to_string(pow2_ceil(s.total_kv));
  }
  // Every other selecting field exactly; those at their defaults are left out
  // to keep keys readable (a version change, which may change defaults, is a new file section).
  static const AttentionSpec defaults{};
  for (const SpecField& f : spec_fields()) {
    if (f.key == KeyUse::none) continue;
    const std::string_view n = f.name;
    if (n == "batch" || n == "seqlen_q" || n == "seqlen_kv" || n == "heads_q" || n == "heads_kv" || n == "total_q" ||
        n == "total_kv")
      continue;
    const std::string value = get_field(s, f);
    const bool always = n == "head_dim_qk" || n == "head_dim_v" || n == "dtype" || n == "layout";
    if (always || value != get_field(defaults, f)) key += "," + std::string(n) + "=" + value;
  }
  return key + ",mode=" + std::string(to_string(mode)) + ",device=" + to_string(device);
}

std::string tune_cache_file(const Policy& policy) { return detail::resolve_tune_cache_path(policy.tune_cache); }

void forget_tuning() {
  detail::clear_tune_memory();
  clear_selection_cache();
}

Selection tune(const AttentionSpec& spec, Mode mode, const Policy& policy, Device device) {
  Policy p = policy;
  p.strategy = Strategy::autotune;
  Selection sel = evaluate(spec, mode, p, device);        // validates spec and policy
  if (!sel.backend) (void)select(spec, mode, p, device);  // throws the unsupported error with the table
  if (!device.is_host()) {
    throw Error(ErrorCode::unsupported, "device", to_string(device), "autotune times plans on host tensors only");
  }
  detail::apply_autotune(sel, spec, p, detail::Measure::always);
  clear_selection_cache();  // selections made from the older times are stale
  return sel;
}

}  // namespace attend

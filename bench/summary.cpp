#include "summary.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>

#include "attend/backends/flash.h"

namespace attend::bench {

namespace {

const Row* find(const Report& report, const std::string& problem, const Impl& impl, Pass pass) {
  for (const Row& r : report.rows) {
    if (r.problem == problem && r.impl == impl && r.pass == pass) return &r;
  }
  return nullptr;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void line(std::ostream& os, const char* what, std::optional<double> value, double target, const char* unit) {
  char name[32];
  std::snprintf(name, sizeof name, "  %-24s", what);
  os << name;
  if (!value) {
    os << "n/a (not measured)\n";
    return;
  }
  os << fmt("%.2f", *value) << unit << "  (target >= " << fmt("%.2f", target) << unit << ")  "
     << (*value >= target ? "met" : "MISSED") << "\n";
}

}  // namespace

void print_target_summary(std::ostream& os, const Report& report, const std::vector<std::int64_t>& memory_seqlens,
                          const Targets& targets) {
  const Row* base = nullptr;
  for (const Row& r : report.rows) {
    if (r.impl == Impl::flash && r.pass == Pass::forward && !r.spec.causal &&
        (base == nullptr || r.spec.seqlen_q * r.spec.seqlen_kv > base->spec.seqlen_q * base->spec.seqlen_kv)) {
      base = &r;
    }
  }
  os << "targets";
  if (base == nullptr) {
    os << ": n/a (no non-causal flash forward was measured)\n";
    return;
  }
  const AttentionSpec plain = base->spec;
  AttentionSpec causal = plain;
  causal.causal = true;
  const std::string label = base->problem, causal_label = problem_label(causal);
  os << " (flash, " << label << "; causal twin " << causal_label << "):\n";

  const auto ratio = [](const Row* r, double Row::*field) -> std::optional<double> {
    if (r == nullptr || std::isnan(r->*field)) return std::nullopt;
    return r->*field;
  };
  const auto speedup = [&](Pass pass) -> std::optional<double> {
    const Row* n = find(report, label, Impl::flash, pass);
    const Row* c = find(report, causal_label, Impl::flash, pass);
    if (n == nullptr || c == nullptr) return std::nullopt;
    return n->timing.best_s / c->timing.best_s;
  };
  const Row* fwd = find(report, label, Impl::flash, Pass::forward);
  const Row* bwd = find(report, label, Impl::flash, Pass::backward);
  line(os, "forward vs sgemm", ratio(fwd, &Row::vs_sgemm), targets.forward_vs_sgemm, "");
  line(os, "forward vs unfused", ratio(fwd, &Row::vs_unfused), targets.forward_vs_unfused, "x");
  line(os, "backward vs sgemm", ratio(bwd, &Row::vs_sgemm), targets.backward_vs_sgemm, "");
  line(os, "causal speedup forward", speedup(Pass::forward), targets.causal_speedup, "x");
  line(os, "causal speedup backward", speedup(Pass::backward), targets.causal_speedup, "x");
  // Printed only when measured (--impls ...,api,api:given): the public path's overhead.
  for (const Impl& api : {Impl::api, Impl::api_given}) {
    for (const Pass pass : {Pass::forward, Pass::backward}) {
      const Row* kernel = find(report, label, Impl::flash, pass);
      const Row* pub = find(report, label, api, pass);
      if (kernel == nullptr || pub == nullptr) continue;
      const std::string what = to_string(api) +
                               (api == Impl::api ? (pass == Pass::forward ? " forward" : " backward")
                                                 : (pass == Pass::forward ? " fwd" : " bwd")) +
                               " vs flash";
      line(os, what.c_str(), kernel->timing.best_s / pub->timing.best_s, targets.api_vs_kernel, "");
    }
  }

  // Flat means the same bytes at every S: flash's scratch is per thread and
  // sized by the head dims only.
  const auto flash = make_flash_backend();
  for (const Pass pass : {Pass::forward, Pass::backward}) {
    char name[32];
    std::snprintf(name, sizeof name, "  %-24s", pass == Pass::forward ? "extra memory forward" : "extra memory backward");
    os << name;
    bool flat = true;
    std::size_t first = 0;
    for (std::size_t i = 0; i < memory_seqlens.size(); ++i) {
      AttentionSpec s = plain;
      s.seqlen_q = s.seqlen_kv = memory_seqlens[i];
      const std::size_t bytes = flash->workspace_bytes(s, pass);
      if (i == 0) first = bytes;
      flat = flat && bytes == first;
      os << (i ? ", " : "") << fmt("%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0)) << " MiB at S="
         << memory_seqlens[i];
    }
    os << "  (target: flat in S)  " << (flat ? "met" : "MISSED") << "\n";
  }
}

}  // namespace attend::bench

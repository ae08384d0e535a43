// Rendering of a Selection: the verdict table (for people) and JSON (for tools).
#include <algorithm>
#include <cstdio>
#include <string>

#include "attend/select.h"
#include "runtime/json.h"

namespace attend {

namespace {

using detail::json_escape;

// A pass judged for another device (Support::elsewhere) shows that verdict:
// the line above the table says for which device.
std::string pass_cell(const std::optional<Support>& s) {
  if (!s) return "n/a";
  if (s->elsewhere) return s->elsewhere->ok ? "ok" : "NO";
  return s->ok() ? "ok" : "NO";
}

const Support::Elsewhere* elsewhere(const Verdict& v) {
  if (v.forward.elsewhere) return &*v.forward.elsewhere;
  return v.backward && v.backward->elsewhere ? &*v.backward->elsewhere : nullptr;
}

std::string verdict_cell(const Verdict& v, const Verdict* winner) {
  if (v.chosen) return v.seconds ? "chosen (fastest)" : "chosen";
  if (v.disabled) return "disabled by policy";
  if (v.not_forced) return "skipped: another backend or variant is forced";
  if (!v.variant_excluded.empty()) return "excluded: " + v.variant_excluded;
  if (v.viable && v.seconds && winner && winner->seconds && *winner->seconds > 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "viable (%.2fx slower)", *v.seconds / *winner->seconds);
    return buf;
  }
  if (v.viable && !v.deferred.empty()) return "viable (defers: a speed preference)";
  if (v.viable) return "viable (lower priority)";
  if (elsewhere(v)) {
    const bool runs = (!v.forward.elsewhere || v.forward.elsewhere->ok) &&
                      (!v.backward || !v.backward->elsewhere || v.backward->elsewhere->ok);
    return std::string("rejected here; ") + (runs ? "would run" : "would not run") + " on the target";
  }
  return "rejected";
}

std::string time_cell(const Verdict& v) {
  if (!v.seconds) return "-";
  char buf[32];
  if (*v.seconds < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f us", *v.seconds * 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.3f ms", *v.seconds * 1e3);
  return buf;
}

bool same_details(const Verdict& a, const Verdict& b) {
  const auto same = [](const Support& x, const Support& y) {
    if (x.reasons.size() != y.reasons.size() || x.notes != y.notes) return false;
    if (x.elsewhere.has_value() != y.elsewhere.has_value() ||
        (x.elsewhere && (x.elsewhere->ok != y.elsewhere->ok || x.elsewhere->verdict != y.elsewhere->verdict)))
      return false;
    for (std::size_t i = 0; i < x.reasons.size(); ++i) {
      if (x.reasons[i].code != y.reasons[i].code || x.reasons[i].message != y.reasons[i].message) return false;
    }
    return true;
  };
  return same(a.forward, b.forward) && a.backward.has_value() == b.backward.has_value() &&
         (!a.backward || same(*a.backward, *b.backward));
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string support_json(const Support& s) {
  std::string out = "{\"supported\": " + std::string(s.ok() ? "true" : "false") + ", \"reasons\": [";
  for (std::size_t i = 0; i < s.reasons.size(); ++i) {
    out += (i ? ", " : "") + std::string("{\"code\": \"") + std::string(to_string(s.reasons[i].code)) +
           "\", \"message\": \"" + json_escape(s.reasons[i].message) + "\"}";
  }
  out += "], \"notes\": [";
  for (std::size_t i = 0; i < s.notes.size(); ++i) out += (i ? ", \"" : "\"") + json_escape(s.notes[i]) + "\"";
  out += "], \"target\": ";
  if (!s.elsewhere) return out + "null}";
  const Support::Elsewhere& e = *s.elsewhere;
  return out + "{\"device\": \"" + json_escape(e.device) + "\", \"supported\": " + (e.ok ? "true" : "false") +
         ", \"decided_by\": \"" + json_escape(e.decided_by) + "\", \"verdict\": \"" + json_escape(e.verdict) + "\"}}";
}

}  // namespace

std::string Selection::explain() const {
  std::size_t name_w = 7, var_w = 7;
  for (const auto& v : verdicts) {
    name_w = std::max(name_w, v.backend.size());
    var_w = std::max(var_w, v.variant.size());
  }
  name_w += 2;
  var_w += 2;
  std::string out = "problem: " + spec_summary + "\nmode:    " + std::string(to_string(mode)) + " (needs " +
                    (mode == Mode::training ? "forward + backward" : "forward") + ")" +
                    (device.is_host() ? "" : ", tensors on " + to_string(device)) + "\n";
  const Verdict* winner = nullptr;
  bool timed = false;
  for (const auto& v : verdicts) {
    if (v.chosen) winner = &v;
    timed = timed || v.seconds.has_value();
  }
  if (strategy == Strategy::autotune) out += "strategy: autotune (" + tuning + ")\n";
  // A backend answering for another device than the tensors': its pass
  // columns are that device's verdicts, and this process runs none of them.
  for (const auto& v : verdicts) {
    if (const Support::Elsewhere* e = elsewhere(v)) {
      out += "target:  " + v.backend + "'s forward/backward columns are verdicts for " + e->device + ", not for " +
             to_string(device) + ", which this process does not have" + (backend ? "" : ": nothing runs here") + "\n";
      break;
    }
  }
  out += pad("backend", name_w) + pad("variant", var_w) + pad("priority", 10) + pad("forward", 9) +
         pad("backward", 10) + (timed ? pad("time", 12) : "") + "verdict / reasons\n";
  out += std::string(name_w + var_w + 29 + 17 + (timed ? 12 : 0), '-') + "\n";
  const Verdict* shown = nullptr;  // the last row whose details were printed
  std::string noted;               // the backend whose notes were last printed
  for (const auto& v : verdicts) {
    // A variant this process cannot run gets one line: its checks add nothing.
    const bool unavailable = v.forward.failed(ReasonCode::variant);
    out += pad(v.backend, name_w) + pad(v.variant, var_w) + pad(std::to_string(v.priority), 10) +
           pad(unavailable ? "-" : pass_cell(v.forward), 9) + pad(unavailable ? "-" : pass_cell(v.backward), 10) +
           (timed ? pad(time_cell(v), 12) : "") + verdict_cell(v, winner) + "\n";
    if (unavailable) continue;
    // A speed preference is not a reason: it only orders the priority strategy.
    if (!v.deferred.empty() && !timed) out += std::string(name_w, ' ') + "~ defers: " + v.deferred + "\n";
    // Variants of one backend usually agree: say so instead of repeating them.
    if (shown && shown->backend == v.backend && same_details(*shown, v) &&
        (!v.forward.reasons.empty() || (v.backward && !v.backward->reasons.empty()))) {
      out += std::string(name_w, ' ') + "(same reasons as " + shown->variant + ")\n";
      continue;
    }
    // Reasons of a declined pass; notes only of a supported one (how it will run).
    bool printed_notes = false;
    const auto details = [&](const char* pass, const Support& s) {
      const auto reason = [&](const Reason& r) {
        out +=
            std::string(name_w, ' ') + "- " + pass + ": " + r.message + " [" + std::string(to_string(r.code)) + "]\n";
      };
      if (const auto& e = s.elsewhere) {
        // The verdict for the target first, naming the layer that decided; a
        // refusal's own words (the reasons besides [device]) right below it,
        // then why nothing runs here.
        out += std::string(name_w, ' ') + "- " + pass + " for " + e->device + ": " + (e->ok ? "ok" : "NO") + ", by " +
               e->decided_by + (e->ok ? ": " + e->verdict : "") + "\n";
        for (const Reason& r : s.reasons)
          if (r.code != ReasonCode::device) reason(r);
        for (const Reason& r : s.reasons)
          if (r.code == ReasonCode::device) reason(r);
      } else {
        for (const Reason& r : s.reasons) reason(r);
      }
      if (!s.ok()) return;
      // Notes say how a pass will run: once per backend (its first variant this
      // process may use, or the chosen one), not again for each alternative variant.
      if (!v.variant_excluded.empty() || (!v.chosen && noted == v.backend)) return;
      for (const std::string& n : s.notes) out += std::string(name_w, ' ') + "note " + pass + ": " + n + "\n";
      printed_notes = true;
    };
    details("forward", v.forward);
    if (v.backward) details("backward", *v.backward);
    if (printed_notes) noted = v.backend;
    shown = &v;
  }
  if (backend) {
    out += "selected: " + std::string(backend->name()) + " (" + std::string(variant_name()) + ")" +
           (winner && winner->seconds ? ", fastest measured: " + time_cell(*winner) : "") + "\n";
  }
  return out;
}

std::string Selection::to_json() const {
  std::string out =
      "{\"problem\": \"" + json_escape(spec_summary) + "\", \"mode\": \"" + std::string(to_string(mode)) +
      "\", \"device\": \"" + to_string(device) +
      "\", \"selected\": " + (backend ? "\"" + json_escape(backend->name()) + "\"" : std::string("null")) +
      ", \"selected_variant\": " + (backend ? "\"" + json_escape(variant_name()) + "\"" : std::string("null")) +
      ", \"strategy\": \"" + std::string(to_string(strategy)) +
      "\", \"tuning\": " + (tuning.empty() ? std::string("null") : "\"" + json_escape(tuning) + "\"") +
      ", \"backends\": [";
  for (std::size_t i = 0; i < verdicts.size(); ++i) {
    const Verdict& v = verdicts[i];
    out += (i ? ", " : "") + std::string("{\"name\": \"") + json_escape(v.backend) + "\", \"variant\": \"" +
           json_escape(v.variant) + "\", \"priority\": " + std::to_string(v.priority) +
           ", \"forward\": " + support_json(v.forward) +
           ", \"backward\": " + (v.backward ? support_json(*v.backward) : std::string("null")) +
           ", \"disabled\": " + (v.disabled ? "true" : "false") +
           ", \"not_forced\": " + (v.not_forced ? "true" : "false") + ", \"variant_excluded\": " +
           (v.variant_excluded.empty() ? std::string("null") : "\"" + json_escape(v.variant_excluded) + "\"") +
           ", \"viable\": " + (v.viable ? "true" : "false") + ", \"chosen\": " + (v.chosen ? "true" : "false") +
           ", \"deferred\": " + (v.deferred.empty() ? std::string("null") : "\"" + json_escape(v.deferred) + "\"") +
           ", \"seconds\": " + (v.seconds ? number(*v.seconds) : std::string("null")) + "}";
  }
  return out + "]}";
}

}  // namespace attend

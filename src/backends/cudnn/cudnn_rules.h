// The cudnn backend's rule layer: cuDNN's documented support for fused
// bf16/f16 SDPA, as a pure function of (spec, pass, cuDNN version, compute
// capability). No GPU and no cuDNN call: `attend select --device cuda`, the CPU
// tests and a machine without cuDNN get the same verdicts a device would, and
// on a device the engine layer (cudnn_engine.h) asks cuDNN only about problems
// these rules accept. A rule too strict costs speed (another backend runs); a
// rule too loose is caught by the engine layer, whose refusal becomes the
// reason (scripts/cuda-device-check.sh compares the two on a GPU).
#pragma once

#include <string>
#include <string_view>

#include "attend/backend.h"
#include "attend/spec.h"

namespace attend::cudnn {

// What the rules are evaluated for.
struct RuleTarget {
  int sm = 0;       // compute capability, major * 10 + minor (80 A100, 90 H100/H200, 100 B200)
  int version = 0;  // cuDNN release as cudnnGetVersion() spells it: major*10000 + minor*100 + patch
};

// "9.19.0" for 91900.
std::string version_string(int version);

// Parses "sm_90,9.19.0" (or "sm90,9.19", "90,91900"), or "sm_90" alone with
// `default_version` (the release whose headers the build used): the target
// the rules assume where there is no device to ask (ATTEND_CUDNN_TARGET).
// Throws attend::Error naming `field` and the text otherwise.
RuleTarget parse_rule_target(std::string_view text, std::string_view field, int default_version);

// Adds one reason per unmet condition of cuDNN's support for `pass` to `sup`.
// Pure. Every spec the runtime validates gets an answer.
void check_rules(const AttentionSpec& spec, Pass pass, const RuleTarget& target, Support& sup);

// How cuDNN's diagonal band expresses attend's mask (bottom-right aligned,
// FlashAttention's rule): shared by the rules (which alignment a problem
// needs) and the engine (the graph's options), so the two cannot disagree.
struct MaskBand {
  bool any = false;           // some mask at all
  bool bottom_right = false;  // needs cuDNN's BOTTOM_RIGHT alignment (Sq != Sk, or per-sequence lengths)
  int left_bound = -1;        // cuDNN's left bound: keys j > i - left_bound are kept; -1: unbounded
  int right_bound = -1;       // keys j <= i + right_bound are kept; -1: unbounded
};
MaskBand mask_band(const AttentionSpec& spec);

}  // namespace attend::cudnn

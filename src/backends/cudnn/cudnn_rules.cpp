// cuDNN's support for fused bf16/f16 SDPA as data: a head-dim table per
// architecture and version, a feature table (what the spec uses, since which
// cuDNN per pass, on which architectures) and known-bad releases, read by one
// function. Sources, for every row: the cuDNN 9.19 Developer Guide
// ("Graph API > Supported Graph Patterns > Scaled Dot Product Attention") and
// the support surface that cudnn-frontend 1.32 checks before it asks cuDNN
// (include/cudnn_frontend/node/sdpa_support_surface.h for the forward,
// node/scaled_dot_product_flash_attention.h for sdpa_backward). Where the two
// differ the stricter one is kept: a rule too strict only hands the problem to
// another backend, the engine layer catches one too loose.
#include "backends/cudnn/cudnn_rules.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "attend/error.h"
#include "kernel/kv_support.h"
#include "runtime/checked.h"

namespace attend::cudnn {
namespace {

constexpr int kNever = std::numeric_limits<int>::max();  // not in this pass, in any release
constexpr int kAnySm = 0;
constexpr int kLastSm = 999;

// The oldest release attend builds graphs for (cudnn-frontend 1.32's SDPA
// nodes and the 9.x backend API).
constexpr int kMinVersion = 90000;

// ---- head dims --------------------------------------------------------------
// Largest d_qk and d_v per pass on an architecture from a release on; the
// first row matching (sm, version) wins, so an architecture's rows are newest
// first. Both dims must also be multiples of 8 (TMA/ldmatrix granularity).
struct HeadDimRow {
  int min_sm, max_sm;
  int since;  // cuDNN version
  int forward, backward;
};
constexpr HeadDimRow kHeadDims[] = {
    // Blackwell (sm_100+): 256 forward from 9.9 (128 before); backward 128
    // (frontend: "Num hidden_dim should be less than or equal to 128").
    {100, kLastSm, 90900, 256, 128},
    {100, kLastSm, 0, 128, 128},
    // Hopper: 256 both passes (frontend backward: d <= 256, multiple of 8).
    {90, 99, 0, 256, 256},
    // Ampere/Ada: 128 up to 9.9; from 9.10 the forward surface lifts the cap
    // to the kernels' 256, the backward keeps 128.
    {80, 89, 91000, 256, 128},
    {80, 89, 0, 128, 128},
};

// Unequal pairs beyond the table's limits that a release serves in one pass:
// DeepSeek's 192/128 backward on Blackwell (9.11+), 256/256 backward on
// Blackwell (9.23+). Hopper's 192/128 is within its 256 limit. MLA's 64/512
// and 576/512 forward: neither the Developer Guide's table nor the frontend's
// bf16/f16 surface names them (its (256, 512] band is the FP8 path), but
// cuDNN itself accepts both forward graphs — with every mask, bias, varlen,
// paged and sink variant, MHA and GQA — on sm_80, sm_90 and sm_100: seen on
// cuDNN 9.19.0 deviceless for the A100, H100, H200 and B200 descriptors
// (tests/backends/cudnn/test_cudnn_deviceless.cpp). From 9.19 only, the
// first release seen; their backward is refused everywhere ("hidden_dim
// should be less than or equal to 256"), so no backward row.
struct HeadDimPair {
  int qk, v;
  int min_sm, max_sm;
  int since;
  Pass pass;
};
constexpr HeadDimPair kHeadDimPairs[] = {
    {192, 128, 100, kLastSm, 91100, Pass::backward},
    {256, 256, 100, kLastSm, 92300, Pass::backward},
    {64, 512, 80, kLastSm, 91900, Pass::forward},
    {576, 512, 80, kLastSm, 91900, Pass::forward},
};

// ---- features ---------------------------------------------------------------
// A spec feature, the releases that serve it per pass on some architectures,
// and why not where no release does.
struct FeatureRow {
  const char* feature;
  ReasonCode code;
  bool (*uses)(const AttentionSpec&);
  std::string (*fields)(const AttentionSpec&);  // the fields and values that make it used
  int min_sm, max_sm;
  int forward, backward;  // minimum cuDNN version; 0 always; kNever not at all
  const char* why;        // the reason where a pass is kNever
};

std::string num(std::int64_t v) { return std::to_string(v); }
std::string seqlens(const AttentionSpec& s) {
  return "seqlen_q=" + num(s.seqlen_q) + ", seqlen_kv=" + num(s.seqlen_kv);
}
bool per_sequence_lengths(const AttentionSpec& s) { return s.varlen() || s.paged(); }
bool windowed(const AttentionSpec& s) { return s.window_left >= 0 || s.effective_window_right() > 0; }
std::string window_fields(const AttentionSpec& s) {
  return "window_left=" + num(s.window_left) + ", window_right=" + num(s.window_right) +
         (s.causal ? ", causal=true" : "");
}

constexpr FeatureRow kFeatures[] = {
    {"softcap", ReasonCode::softcap, [](const AttentionSpec& s) { return s.softcap > 0; },
     [](const AttentionSpec& s) { return "softcap=" + std::to_string(s.softcap); }, kAnySm, kLastSm, kNever, kNever,
     "cuDNN's SDPA node has no tanh softcap (a score_mod subgraph could express one; attend builds none)"},
    {"ALiBi", ReasonCode::alibi, [](const AttentionSpec& s) { return s.alibi; },
     [](const AttentionSpec&) { return std::string("alibi=true"); }, kAnySm, kLastSm, kNever, kNever,
     "cuDNN's alibi_mask computes its own slopes (2^(-8(h+1)/H), causal only) and takes none, while attend's "
     "slopes are an input"},
    {"dropout", ReasonCode::dropout, [](const AttentionSpec& s) { return s.dropout_p > 0; },
     [](const AttentionSpec& s) { return "dropout_p=" + std::to_string(s.dropout_p); }, kAnySm, kLastSm, kNever, kNever,
     "cuDNN draws its own Philox mask from (seed, offset), not attend's counter rule, so the same seed would "
     "drop other entries than every other backend (a precomputed mask tensor would take B*H*Sq*Sk bytes)"},
    {"positions of a partial problem", ReasonCode::positions,
     [](const AttentionSpec& s) { return s.has_offsets() && s.is_masked(); },
     [](const AttentionSpec& s) { return "q_offset=" + num(s.q_offset) + ", kv_offset=" + num(s.kv_offset); }, kAnySm,
     kLastSm, kNever, kNever,
     "cuDNN's diagonal band is relative to the problem's own rows and keys; attend builds no shifted band"},
    {"an out dtype other than the inputs'", ReasonCode::out_dtype,
     [](const AttentionSpec& s) { return s.effective_out_dtype() != s.dtype; },
     [](const AttentionSpec& s) { return "out_dtype=" + std::string(to_string(s.effective_out_dtype())); }, kAnySm,
     kLastSm, kNever, kNever, "cuDNN writes O (and reads dO) in the I/O dtype"},
    {"a dq dtype other than the inputs'", ReasonCode::dtype,
     [](const AttentionSpec& s) { return s.effective_dq_dtype() != s.dtype; },
     [](const AttentionSpec& s) { return "dq_dtype=" + std::string(to_string(s.effective_dq_dtype())); }, kAnySm,
     kLastSm, 0, kNever, "cuDNN's sdpa_backward writes dQ in the I/O dtype"},
    {"accumulating gradients", ReasonCode::accumulate, [](const AttentionSpec& s) { return s.accumulate_grads; },
     [](const AttentionSpec&) { return std::string("accumulate_grads=true"); }, kAnySm, kLastSm, 0, kNever,
     "cuDNN's sdpa_backward overwrites dQ, dK and dV"},
    {"dbias", ReasonCode::bias_grad, [](const AttentionSpec& s) { return s.bias_requires_grad; },
     [](const AttentionSpec&) { return std::string("bias_requires_grad=true"); }, kAnySm, kLastSm, 0, kNever,
     "cuDNN computes dbias only for a bias broadcast over the batch, (1, H, Sq, Sk), and the spec does not fix "
     "which bias shape a call passes"},
    {"paged K/V", ReasonCode::layout, [](const AttentionSpec& s) { return s.paged(); },
     [](const AttentionSpec& s) { return "kv_page_size=" + num(s.kv_page_size); }, kAnySm, kLastSm, 90500, kNever,
     "cuDNN's sdpa_backward takes no page tables (paged K/V is for inference)"},
    {"left-padded paged K/V", ReasonCode::layout, [](const AttentionSpec& s) { return s.paged() && s.kv_leftpad; },
     [](const AttentionSpec&) { return std::string("kv_leftpad=true"); }, kAnySm, kLastSm, kNever, kNever,
     "cuDNN reads each sequence's keys from the start of its block table; cache_leftpad has no counterpart"},
    // thd: ragged offsets. On SM8x the forward came with 9.18.1; the backward
    // cannot take the ragged LSE there ("Packed/ragged LSE is not supported
    // for bprop thd on SM8X").
    {"varlen (thd, ragged offsets)", ReasonCode::varlen, [](const AttentionSpec& s) { return s.varlen(); },
     [](const AttentionSpec&) { return std::string("layout=thd"); }, 80, 89, 91801, kNever,
     "cuDNN's sdpa_backward takes no ragged LSE on sm_8x"},
    {"GQA with ragged offsets", ReasonCode::gqa,
     [](const AttentionSpec& s) { return s.varlen() && s.heads_q != s.heads_kv; },
     [](const AttentionSpec& s) { return "heads_q=" + num(s.heads_q) + ", heads_kv=" + num(s.heads_kv); }, kAnySm,
     kLastSm, 0, 90600, ""},
    // attend's masks are bottom-right aligned; where Sq == Sk without
    // per-sequence lengths the top-left diagonal is the same one.
    {"a bottom-right aligned mask", ReasonCode::mask, [](const AttentionSpec& s) { return mask_band(s).bottom_right; },
     [](const AttentionSpec& s) { return seqlens(s) + ", " + window_fields(s); }, kAnySm, kLastSm, 90600, 90600, ""},
    {"a mask with seqlen_q > seqlen_kv", ReasonCode::mask,
     [](const AttentionSpec& s) { return s.is_masked() && !per_sequence_lengths(s) && s.seqlen_q > s.seqlen_kv; },
     seqlens, kAnySm, kLastSm, kNever, kNever,
     "cuDNN's diagonal band needs seqlen_q <= seqlen_kv unless sequence lengths are given (rows above the "
     "bottom-right diagonal would see no key)"},
    {"bias with a bottom-right aligned mask", ReasonCode::bias,
     [](const AttentionSpec& s) { return s.has_bias && mask_band(s).bottom_right; },
     [](const AttentionSpec& s) { return "has_bias=true, " + seqlens(s); }, kAnySm, kLastSm, kNever, kNever,
     "cuDNN's bottom-right diagonal alignment takes no bias"},
    // Left bounds (and right bounds other than causal's 0) with bias or without
    // a causal diagonal came with 9.10.2.
    {"a sliding window", ReasonCode::mask, windowed, window_fields, kAnySm, kLastSm, 91002, 91002, ""},
    {"attention sinks", ReasonCode::sinks, [](const AttentionSpec& s) { return s.has_sink(); },
     [](const AttentionSpec& s) { return "softmax_type=" + std::string(to_string(s.softmax_type)); }, kAnySm, kLastSm,
     91300, 91300, ""},
    {"attention sinks with seqlen_q=1", ReasonCode::sinks,
     [](const AttentionSpec& s) { return s.has_sink() && s.seqlen_q == 1; },
     [](const AttentionSpec& s) { return "softmax_type=" + std::string(to_string(s.softmax_type)) + ", seqlen_q=1"; },
     kAnySm, kLastSm, kNever, kNever, "cuDNN's decode path (seqlen_q=1) takes no sink token"},
    // Older releases read out of bounds in the backward's dO.O pre-pass.
    {"attention sinks with ragged offsets", ReasonCode::sinks,
     [](const AttentionSpec& s) { return s.has_sink() && s.varlen(); },
     [](const AttentionSpec& s) { return "softmax_type=" + std::string(to_string(s.softmax_type)) + ", layout=thd"; },
     kAnySm, kLastSm, 0, 92600, ""},
    {"a deterministic backward", ReasonCode::deterministic, [](const AttentionSpec& s) { return s.deterministic; },
     [](const AttentionSpec&) { return std::string("deterministic=true"); }, 100, kLastSm, 0, 91800, ""},
    {"a deterministic varlen backward", ReasonCode::deterministic,
     [](const AttentionSpec& s) { return s.deterministic && s.varlen(); },
     [](const AttentionSpec&) { return std::string("deterministic=true, layout=thd"); }, 80, 89, 0, kNever,
     "cuDNN has no deterministic thd backward on sm_8x"},
    {"one query and one key", ReasonCode::seqlen,
     [](const AttentionSpec& s) { return s.seqlen_q == 1 && s.seqlen_kv == 1; }, seqlens, kAnySm, kLastSm, 0, kNever,
     "cuDNN's sdpa_backward refuses s_q = s_kv = 1"},
};

// Releases with a bug that the frontend refuses to run into.
struct KnownBug {
  int first, last;  // versions, inclusive
  ReasonCode code;
  bool (*uses)(const AttentionSpec&);
  const char* what;
};
constexpr KnownBug kKnownBugs[] = {
    {91000, 91001, ReasonCode::library, [](const AttentionSpec&) { return true; },
     "bf16/f16 SDPA in both passes has known bugs (fixed in 9.10.2)"},
    {91400, 91400, ReasonCode::mask,
     [](const AttentionSpec& s) { return s.window_left >= 0 && !s.causal && s.seqlen_kv > 1024; },
     "a sliding window without causal and seqlen_kv > 1024 computes wrong results (fixed in 9.14.1)"},
};

std::string sm_string(int sm) { return "sm_" + std::to_string(sm); }
std::string target_string(const RuleTarget& t) {
  return "cuDNN " + version_string(t.version) + " on " + sm_string(t.sm);
}

int version_needed(int forward, int backward, Pass pass) { return pass == Pass::forward ? forward : backward; }

void check_head_dims(const AttentionSpec& s, Pass pass, const RuleTarget& t, Support& sup) {
  const auto row = std::find_if(std::begin(kHeadDims), std::end(kHeadDims), [&](const HeadDimRow& r) {
    return t.sm >= r.min_sm && t.sm <= r.max_sm && t.version >= r.since;
  });
  if (row == std::end(kHeadDims)) return;  // an architecture below sm_80: check_rules declines it
  const int limit = pass == Pass::forward ? row->forward : row->backward;
  const bool pair = std::any_of(std::begin(kHeadDimPairs), std::end(kHeadDimPairs), [&](const HeadDimPair& p) {
    return p.qk == s.head_dim_qk && p.v == s.head_dim_v && p.pass == pass && t.sm >= p.min_sm && t.sm <= p.max_sm &&
           t.version >= p.since;
  });
  const auto require_dim = [&](std::int64_t dim, const char* field, ReasonCode code) {
    sup.require(dim % 8 == 0, code, [&] {
      return std::string(field) + "=" + num(dim) + " is not a multiple of 8, which cuDNN's SDPA requires";
    });
    sup.require(pair || dim <= limit, code, [&] {
      return std::string(field) + "=" + num(dim) + " (head dims " + num(s.head_dim_qk) + "/" + num(s.head_dim_v) +
             ") exceeds cuDNN's " + std::string(to_string(pass)) + " limit " + std::to_string(limit) + " (" +
             target_string(t) + ")";
    });
  };
  require_dim(s.head_dim_qk, "head_dim_qk", ReasonCode::head_dim_qk);
  require_dim(s.head_dim_v, "head_dim_v", ReasonCode::head_dim_v);
}

void check_features(const AttentionSpec& s, Pass pass, const RuleTarget& t, Support& sup) {
  for (const FeatureRow& f : kFeatures) {
    if (t.sm < f.min_sm || t.sm > f.max_sm || !f.uses(s)) continue;
    const int need = version_needed(f.forward, f.backward, pass);
    sup.require(t.version >= need, f.code, [&] {
      const std::string head = std::string(f.feature) + " (" + f.fields(s) + ")";
      if (need == kNever) return head + ": " + f.why;
      return head + " needs cuDNN " + version_string(need) + " or later in " + std::string(to_string(pass)) + " on " +
             sm_string(t.sm) + "; the target has " + version_string(t.version);
    });
  }
  for (const KnownBug& b : kKnownBugs) {
    sup.require(t.version < b.first || t.version > b.last || !b.uses(s), b.code,
                [&] { return "cuDNN " + version_string(t.version) + ": " + b.what; });
  }
}

int parse_int(std::string_view text, bool* ok) {
  int value = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  *ok = *ok && r.ec == std::errc() && r.ptr == text.data() + text.size() && !text.empty();
  return value;
}

}  // namespace

std::string version_string(int version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

RuleTarget parse_rule_target(std::string_view text, std::string_view field, int default_version) {
  const auto bad = [&](const char* why) {
    return Error(ErrorCode::invalid_argument, std::string(field), std::string(text), why);
  };
  const std::size_t comma = text.find(',');
  std::string_view sm = text.substr(0, comma);
  const std::string version_text =
      comma == std::string_view::npos ? version_string(default_version) : std::string(text.substr(comma + 1));
  std::string_view version = version_text;
  if (sm.starts_with("sm_"))
    sm.remove_prefix(3);
  else if (sm.starts_with("sm"))
    sm.remove_prefix(2);
  bool ok = true;
  RuleTarget t;
  t.sm = parse_int(sm, &ok);
  if (!ok || t.sm < 10 || t.sm > kLastSm) throw bad("the compute capability is not sm_XY (e.g. sm_90)");
  if (version.find('.') == std::string_view::npos) {
    t.version = parse_int(version, &ok);  // cudnnGetVersion()'s encoding, e.g. 91900
  } else {
    int parts[3] = {0, 0, 0};
    for (int i = 0; i < 3 && ok; ++i) {
      const std::size_t dot = version.find('.');
      parts[i] = parse_int(version.substr(0, dot), &ok);
      if (dot == std::string_view::npos) break;
      version.remove_prefix(dot + 1);
      if (i == 2) ok = false;  // a fourth part
    }
    ok = ok && parts[1] < 100 && parts[2] < 100;
    t.version = parts[0] * 10000 + parts[1] * 100 + parts[2];
  }
  if (!ok || t.version < 10000 || t.version > 999999) throw bad("the cuDNN version is not MAJOR.MINOR[.PATCH]");
  return t;
}

MaskBand mask_band(const AttentionSpec& s) {
  MaskBand m;
  m.any = s.is_masked();
  if (!m.any) return m;
  m.bottom_right = per_sequence_lengths(s) || s.seqlen_q != s.seqlen_kv;
  // A band wider than every row and key is unbounded; the clamp keeps cuDNN's
  // int bounds exact for any window attend accepts (check_rules limits seqlens).
  const std::int64_t span = s.seqlen_q + s.seqlen_kv;
  // attend keeps j >= i' - window_left; cuDNN keeps j > i' - left_bound.
  if (s.window_left >= 0) m.left_bound = static_cast<int>(std::min(s.window_left, span) + 1);
  const std::int64_t right = s.effective_window_right();
  if (right >= 0) m.right_bound = static_cast<int>(std::min(right, span));
  return m;
}

void check_rules(const AttentionSpec& s, Pass pass, const RuleTarget& t, Support& sup) {
  detail::require_kv_dtype(s, pass, "cudnn", false, sup);
  sup.require(s.dtype == DType::bf16 || s.dtype == DType::f16, ReasonCode::dtype, [&] {
    return "dtype=" + std::string(to_string(s.dtype)) +
           ": cuDNN's fused SDPA multiplies bf16/f16 on tensor cores (f32 and f64 run on cuda's simt variant)";
  });
  sup.require(t.version >= kMinVersion, ReasonCode::library, [&] {
    return "cuDNN " + version_string(t.version) + ": attend builds its SDPA graphs for cuDNN " +
           version_string(kMinVersion) + " or later";
  });
  sup.require(t.sm >= 80, ReasonCode::device,
              [&] { return sm_string(t.sm) + ": cuDNN's bf16/f16 flash SDPA needs sm_80 (Ampere) or later"; });
  // cuDNN's bounds and the ragged offsets attend builds are 32-bit.
  constexpr std::int64_t kMaxInt = std::numeric_limits<std::int32_t>::max();
  sup.require(std::max({s.seqlen_q, s.seqlen_kv, s.total_q, s.total_kv}) <= kMaxInt / 2, ReasonCode::seqlen, [&] {
    return seqlens(s) + ": cuDNN's mask bounds are 32-bit, at most " + num(kMaxInt / 2) + " rows or keys";
  });
  if (s.varlen()) {
    // Ragged offsets count elements of the packed tensors (int32 in attend's graphs).
    const std::int64_t elements = detail::sat_mul(std::max(s.total_q, s.total_kv),
                                                  detail::sat_mul(s.heads_q, std::max(s.head_dim_qk, s.head_dim_v)));
    sup.require(elements <= kMaxInt, ReasonCode::seqlen, [&] {
      return "total_q=" + num(s.total_q) + ", total_kv=" + num(s.total_kv) +
             ": the ragged offsets of a packed tensor exceed 32 bits (" + num(elements) + " elements)";
    });
  }
  check_head_dims(s, pass, t, sup);
  check_features(s, pass, t, sup);
}

}  // namespace attend::cudnn

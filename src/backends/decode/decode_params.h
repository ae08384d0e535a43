// DecodeParams: everything a decode kernel reads, derived once per call from the
// spec and the tensors (one params struct per operation, like FlashParams).
#pragma once

#include <cstdint>

#include "attend/backend.h"
#include "kernel/kernel_problem.h"
#include "kernel/layout.h"
#include "kernel/semantics.h"

namespace attend::decode {

inline constexpr std::int64_t kBlockN = 16;  // keys per inner step (one AVX-512 vector of scores)
inline constexpr std::int64_t kPad = 16;     // row padding of every scratch buffer (widest W)

constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// How the keys of one (sequence, kv head) are cut. A pure function of the spec —
// never of the thread count — so the combine order, hence every bit of the
// result, is the same for any number of threads.
struct SplitPlan {
  std::int64_t split_len = 0;   // keys per split, a multiple of kBlockN
  std::int64_t max_splits = 1;  // splits of the longest sequence
  std::int64_t max_rows = 0;    // query rows of one (sequence, kv head): group * seqlen_q
  std::int64_t dqkp = 0, dvp = 0;
  // Most kv heads one task walks together (their rows of a token are adjacent in
  // memory, so a task streams whole token rows instead of one head's slices
  // 4 KiB apart). Only speed depends on it: every head's math is the same.
  std::int64_t head_chunk = 1;
  std::int64_t head_floats = 0;  // scratch floats of one kv head's rows
  // Floats of per-thread scratch (head_chunk heads), and of the partial outputs + LSEs of all splits.
  std::int64_t scratch_floats = 0;
  // Where in a thread's scratch an 8-bit cache's block is widened (kBlockN rows
  // of dqkp, then of dvp, elements: f32 at most), after the heads' rows.
  std::int64_t convert_offset = 0;
  std::int64_t partial_floats = 0;
};
SplitPlan plan_splits(const AttentionSpec& spec);

struct DecodeParams : detail::KernelProblem {
  SplitPlan plan;

  void* out = nullptr;
  detail::TokenStrides so;
  float* lse = nullptr;
  detail::TokenStrides slse;
  float* partial = nullptr;  // workspace: per slot max_rows * dvp outputs, then max_rows LSEs

  // Row pointers of keys [t0, t0 + n) of kv head hk: one division per call,
  // then page-by-page steps (a division per row would cost more than the row's math).
  template <class E>
  void gather(std::int64_t b, std::int64_t hk, std::int64_t t0, std::int64_t n, const E** kr,
              const E** vr) const {
    const E* kb = static_cast<const E*>(k);
    const E* vb = static_cast<const E*>(v);
    const std::int64_t row0 = span(b).kv_begin + t0;
    if (!pages.paged()) {
      const E* kp = kb + sk.offset(b, row0, hk);
      const E* vp = vb + sv.offset(b, row0, hk);
      for (std::int64_t j = 0; j < n; ++j) {
        kr[j] = kp + j * sk.s;
        vr[j] = vp + j * sv.s;
      }
      return;
    }
    std::int64_t slot = row0 / pages.page_size, in_page = row0 % pages.page_size;
    for (std::int64_t j = 0; j < n;) {
      const std::int64_t page = pages.table[b * pages.row_stride + slot * pages.col_stride];
      const E* kp = kb + page * sk.b + hk * sk.h;
      const E* vp = vb + page * sv.b + hk * sv.h;
      for (; in_page < pages.page_size && j < n; ++in_page, ++j) {
        kr[j] = kp + in_page * sk.s;
        vr[j] = vp + in_page * sv.s;
      }
      ++slot;
      in_page = 0;
    }
  }
  // The K and V scales of keys [t0, t0 + n) of kv head hk (an 8-bit cache with
  // scales), walking pages like gather.
  void gather_scales(std::int64_t b, std::int64_t hk, std::int64_t t0, std::int64_t n, float* ks, float* vs) const {
    const std::int64_t row0 = span(b).kv_begin + t0;
    if (!kscale.paged) {
      for (std::int64_t j = 0; j < n; ++j) {
        ks[j] = kscale.data[kscale.st.offset(b, row0 + j, hk)];
        vs[j] = vscale.data[vscale.st.offset(b, row0 + j, hk)];
      }
      return;
    }
    std::int64_t slot = row0 / pages.page_size, in_page = row0 % pages.page_size;
    for (std::int64_t j = 0; j < n;) {
      const std::int64_t page = pages.table[b * pages.row_stride + slot * pages.col_stride];
      const float* kp = kscale.data + page * kscale.st.b + hk * kscale.st.h;
      const float* vp = vscale.data + page * vscale.st.b + hk * vscale.st.h;
      for (; in_page < pages.page_size && j < n; ++in_page, ++j) {
        ks[j] = kp[in_page * kscale.st.s];
        vs[j] = vp[in_page * vscale.st.s];
      }
      ++slot;
      in_page = 0;
    }
  }
  detail::KeyRange keys(std::int64_t b, std::int64_t i) const {
    const detail::SeqSpan s = span(b);
    return detail::visible_keys(mask, i, s.q_len, s.kv_len);
  }
  // Keys any query row of sequence b can see (visible ranges only grow with i).
  detail::KeyRange key_union(std::int64_t b) const {
    const std::int64_t q_len = span(b).q_len;
    if (q_len == 0) return {};
    const detail::KeyRange first = keys(b, 0), last = keys(b, q_len - 1);
    return {first.begin, std::max(first.begin, last.end)};
  }
  // Splits of sequence b: at least one (it writes the empty rows), none without queries.
  std::int64_t splits(std::int64_t b) const {
    if (span(b).q_len == 0) return 0;
    const detail::KeyRange u = key_union(b);
    return std::max<std::int64_t>(1, (u.end - u.begin + plan.split_len - 1) / plan.split_len);
  }
  float* partial_out(std::int64_t b, std::int64_t hk, std::int64_t split) const {
    return partial + ((b * heads_kv + hk) * plan.max_splits + split) * plan.max_rows * (plan.dvp + 1);
  }
  float* partial_lse(std::int64_t b, std::int64_t hk, std::int64_t split) const {
    return partial_out(b, hk, split) + plan.max_rows * plan.dvp;
  }
};

// Inputs are validated before; plain values only (no allocation).
DecodeParams make_params(const ForwardArgs& args);

}  // namespace attend::decode

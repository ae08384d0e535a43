// How the cudnn backend describes a problem to cuDNN: every tensor as
// (b, h, s, d) dims and strides, the options of the SDPA node, and the small
// device arrays it uploads (sequence lengths, ragged offsets). Pure: no cuDNN,
// no GPU, so the CPU tests check the arithmetic the engine layer
// (cudnn_engine.cpp) builds its graphs from; GraphDesc::key() is the key of
// its graph cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attend/backend.h"
#include "backends/cudnn/cudnn_rules.h"

namespace attend::cudnn {

// The q/k/v/out-shaped tensors (and the LSE), as cuDNN sees them: (b, h, s, d).
enum Role4 { rQ, rK, rV, rO, rStats, rDO, rDQ, rDK, rDV, kRoles };
inline constexpr const char* kRoleNames[kRoles] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};

// Variant-pack ids. Ragged offsets: kRagged + role.
enum Uid : std::int64_t { kBias = 100, kSeqQ, kSeqKv, kPageK, kPageV, kSink, kDSink, kRagged = 200 };

struct Dims4 {
  std::int64_t dim[4] = {1, 1, 1, 1};
  std::int64_t stride[4] = {1, 1, 1, 1};
};

// The tensors of a call (data may be null: the check's packed stand-ins).
struct Views {
  TensorView t[kRoles];
  TensorView bias, block_table, sinks, dsinks;
};

// Everything a graph depends on; key() is the cache key.
struct GraphDesc {
  Pass pass = Pass::forward;
  int device = 0, sm = 0;
  DType dtype = DType::bf16;
  float scale = 1.0f;
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_kv = 0, dqk = 0, dv = 0;
  bool varlen = false, paged = false;
  MaskBand band;
  bool has_bias = false;
  SoftmaxType sink = SoftmaxType::vanilla;
  std::int64_t sink_stride = 1, dsink_stride = 1;  // of the (H) sink logits and their gradient
  bool deterministic = false;
  Dims4 t[kRoles];
  Dims4 bias, table;

  std::string key() const;  // every field, exactly (floats by their bits)
};

// Device scratch after cuDNN's workspace: sequence lengths (B each), a ragged
// offset array (B + 1) per packed tensor, and H zero floats (the fixed sink
// logit of off_by_one). 16-byte aligned pieces.
struct Extras {
  std::size_t seq_q = 0, seq_kv = 0, ragged[kRoles] = {}, sink = 0, bytes = 0;
};
Extras extras_for(const GraphDesc& g);

// The graph for `pass` of `spec` on the tensors `v` (cuDNN's BHSD view of
// each, thd's ragged b stride, a paged pool as (pages, heads, page_size, d)).
GraphDesc describe(const AttentionSpec& spec, Pass pass, int device, int sm, const Views& v);
// Packed tensors of the spec's layout (no data): what a Plan allocates, and
// what the check asks cuDNN about.
Views packed_views(const AttentionSpec& spec);

// The extras' contents: sequence lengths and ragged offsets from host copies of
// the call's index tensors (`index`: cu_seqlens, or cache_seqlens for paged).
std::vector<std::int32_t> fill_extras(const AttentionSpec& spec, const GraphDesc& g, const Extras& e,
                                      const Inputs& index);

inline std::size_t aligned(std::size_t bytes, std::size_t to = 256) { return (bytes + to - 1) / to * to; }

}  // namespace attend::cudnn

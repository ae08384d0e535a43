// What the cudnn backend tells cuDNN about a problem (cudnn_graph_desc.h),
// without a GPU: each tensor's (b, h, s, d) dims and strides per layout, thd's
// ragged offsets and sequence lengths, paged pools and block tables, bias
// broadcasts, and the graph cache's key.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attend/attend.h"
#include "backends/cudnn/cudnn_graph_desc.h"

namespace attend {
namespace {

using cudnn::Dims4;

AttentionSpec spec(Layout layout) {
  AttentionSpec s;
  s.batch = 3;
  s.seqlen_q = 5;
  s.seqlen_kv = 7;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 16;
  s.head_dim_v = 8;
  s.dtype = DType::bf16;
  s.layout = layout;
  if (layout == Layout::thd) {
    s.total_q = 11;
    s.total_kv = 13;
  }
  return s;
}

void expect_dims(const Dims4& d, std::vector<std::int64_t> dims, std::vector<std::int64_t> strides) {
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(d.dim[i], dims[static_cast<std::size_t>(i)]) << "dim " << i;
    EXPECT_EQ(d.stride[i], strides[static_cast<std::size_t>(i)]) << "stride " << i;
  }
}

cudnn::GraphDesc packed(const AttentionSpec& s, Pass pass) {
  return cudnn::describe(s, pass, 0, 90, cudnn::packed_views(s));
}

TEST(CudnnGraphDesc, BshdTensorsAreSeenAsBhsdWithTokenStrides) {
  const cudnn::GraphDesc g = packed(spec(Layout::bshd), Pass::backward);
  expect_dims(g.t[cudnn::rQ], {3, 4, 5, 16}, {5 * 4 * 16, 16, 4 * 16, 1});
  expect_dims(g.t[cudnn::rK], {3, 2, 7, 16}, {7 * 2 * 16, 16, 2 * 16, 1});
  expect_dims(g.t[cudnn::rV], {3, 2, 7, 8}, {7 * 2 * 8, 8, 2 * 8, 1});
  expect_dims(g.t[cudnn::rO], {3, 4, 5, 8}, {5 * 4 * 8, 8, 4 * 8, 1});
  expect_dims(g.t[cudnn::rDK], {3, 2, 7, 16}, {7 * 2 * 16, 16, 2 * 16, 1});
  // The LSE (B, H, Sq): cuDNN's packed BHSD Stats.
  expect_dims(g.t[cudnn::rStats], {3, 4, 5, 1}, {4 * 5, 5, 1, 1});
}

TEST(CudnnGraphDesc, BhsdTensorsKeepTheirOrder) {
  const cudnn::GraphDesc g = packed(spec(Layout::bhsd), Pass::forward);
  expect_dims(g.t[cudnn::rQ], {3, 4, 5, 16}, {4 * 5 * 16, 5 * 16, 16, 1});
  expect_dims(g.t[cudnn::rV], {3, 2, 7, 8}, {2 * 7 * 8, 7 * 8, 8, 1});
}

TEST(CudnnGraphDesc, ThdUsesRaggedOffsetsInElementsAndSequenceLengths) {
  const AttentionSpec s = spec(Layout::thd);
  const cudnn::GraphDesc g = packed(s, Pass::backward);
  EXPECT_TRUE(g.varlen);
  expect_dims(g.t[cudnn::rQ], {3, 4, 5, 16}, {5 * 4 * 16, 16, 4 * 16, 1});
  // attend's varlen LSE is (H, total_q): head stride total_q, token stride 1.
  expect_dims(g.t[cudnn::rStats], {3, 4, 5, 1}, {4 * 5, 11, 1, 1});
  std::vector<std::int32_t> cu_q{0, 4, 4, 9}, cu_kv{0, 6, 7, 13};
  Inputs index;
  index.cu_seqlens_q = TensorView::contiguous(cu_q.data(), DType::i32, {4});
  index.cu_seqlens_kv = TensorView::contiguous(cu_kv.data(), DType::i32, {4});
  const cudnn::Extras e = cudnn::extras_for(g);
  const std::vector<std::int32_t> host = cudnn::fill_extras(s, g, e, index);
  const auto at = [&](std::size_t offset, std::size_t i) { return host[offset / 4 + i]; };
  const std::int32_t seq_q[] = {4, 0, 5}, seq_kv[] = {6, 1, 6};
  for (std::size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(at(e.seq_q, b), seq_q[b]);
    EXPECT_EQ(at(e.seq_kv, b), seq_kv[b]);
  }
  for (std::size_t b = 0; b < 4; ++b) {
    EXPECT_EQ(at(e.ragged[cudnn::rQ], b), cu_q[b] * 4 * 16);
    EXPECT_EQ(at(e.ragged[cudnn::rDO], b), cu_q[b] * 4 * 8);
    EXPECT_EQ(at(e.ragged[cudnn::rK], b), cu_kv[b] * 2 * 16);
    EXPECT_EQ(at(e.ragged[cudnn::rDV], b), cu_kv[b] * 2 * 8);
    EXPECT_EQ(at(e.ragged[cudnn::rStats], b), cu_q[b]);
  }
  // Every piece 16-byte aligned, within the bytes the workspace reserves.
  for (std::size_t off : {e.seq_q, e.seq_kv, e.ragged[cudnn::rQ], e.ragged[cudnn::rDV]}) {
    EXPECT_EQ(off % 16, 0u);
    EXPECT_LT(off, e.bytes);
  }
}

TEST(CudnnGraphDesc, PagedPoolsAndBlockTable) {
  AttentionSpec s = spec(Layout::bshd);
  s.seqlen_q = 1;
  s.kv_page_size = 4;  // 7 keys: 2 pages per sequence
  const cudnn::GraphDesc g = packed(s, Pass::forward);
  EXPECT_TRUE(g.paged);
  // (pages, page_size, Hkv, D) pools as (pages, Hkv, page_size, D).
  expect_dims(g.t[cudnn::rK], {6, 2, 4, 16}, {4 * 2 * 16, 16, 2 * 16, 1});
  expect_dims(g.table, {3, 1, 2, 1}, {2, 2, 1, 1});
  std::vector<std::int32_t> lens{7, 3, 5};
  Inputs index;
  index.cache_seqlens = TensorView::contiguous(lens.data(), DType::i32, {3});
  const cudnn::Extras e = cudnn::extras_for(g);
  const std::vector<std::int32_t> host = cudnn::fill_extras(s, g, e, index);
  for (std::size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(host[e.seq_q / 4 + b], 1);
    EXPECT_EQ(host[e.seq_kv / 4 + b], lens[b]);
  }
}

TEST(CudnnGraphDesc, BroadcastBiasHasZeroStrides) {
  AttentionSpec s = spec(Layout::bshd);
  s.has_bias = true;
  cudnn::Views v = cudnn::packed_views(s);
  v.bias = TensorView::contiguous(nullptr, DType::bf16, {1, 4, 5, 7});
  const cudnn::GraphDesc g = cudnn::describe(s, Pass::forward, 0, 90, v);
  expect_dims(g.bias, {1, 4, 5, 7}, {0, 5 * 7, 7, 1});
  const cudnn::GraphDesc full = packed(s, Pass::forward);
  expect_dims(full.bias, {3, 4, 5, 7}, {4 * 5 * 7, 5 * 7, 7, 1});
  EXPECT_NE(g.key(), full.key());
}

TEST(CudnnGraphDesc, KeySeparatesWhatChangesTheGraph) {
  const AttentionSpec s = spec(Layout::bshd);
  EXPECT_EQ(packed(s, Pass::forward).key(), packed(s, Pass::forward).key());
  EXPECT_NE(packed(s, Pass::forward).key(), packed(s, Pass::backward).key());
  EXPECT_NE(packed(s, Pass::forward).key(), cudnn::describe(s, Pass::forward, 1, 90, cudnn::packed_views(s)).key());
  AttentionSpec scaled = s;
  scaled.scale = 0.2500001;  // a different float scale, 3 ulps from 0.25
  AttentionSpec quarter = s;
  quarter.scale = 0.25;
  EXPECT_NE(packed(scaled, Pass::forward).key(), packed(quarter, Pass::forward).key());
  cudnn::Views strided = cudnn::packed_views(s);
  strided.t[cudnn::rQ].strides[1] = 4 * 32;  // q rows padded to 32 features per head
  EXPECT_NE(cudnn::describe(s, Pass::forward, 0, 90, strided).key(), packed(s, Pass::forward).key());
}

}  // namespace
}  // namespace attend

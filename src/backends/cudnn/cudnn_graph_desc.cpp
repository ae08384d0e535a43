// See cudnn_graph_desc.h.
#include "backends/cudnn/cudnn_graph_desc.h"

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel/layout.h"

namespace attend::cudnn {
namespace {

// A q/k/v/out-shaped view as (b, h, s, d). Packed varlen tensors get the b
// stride of a padded batch (cuDNN follows the ragged offsets instead); a paged
// pool is (pages, heads, page_size, d).
Dims4 token_dims(const AttentionSpec& s, const TensorView& view, std::int64_t heads, std::int64_t dim,
                 std::int64_t seqlen, bool pool) {
  const detail::TokenStrides ts = detail::token_strides(view, s.layout);
  Dims4 d;
  if (pool) {
    const detail::TokenStrides ps = detail::token_strides(view, Layout::bshd);
    d = {{view.shape[0], heads, s.kv_page_size, dim}, {ps.b, ps.h, ps.s, 1}};
  } else {
    d = {{s.batch, heads, seqlen, dim}, {s.varlen() ? seqlen * ts.s : ts.b, ts.h, ts.s, 1}};
  }
  return d;
}

Dims4 lse_dims(const AttentionSpec& s, const TensorView& lse) {
  const detail::TokenStrides ls = detail::lse_strides(lse, s.layout);
  return {{s.batch, s.heads_q, s.seqlen_q, 1}, {s.varlen() ? s.heads_q * s.seqlen_q : ls.b, ls.h, ls.s, 1}};
}

}  // namespace

std::string GraphDesc::key() const {
  std::string k = std::to_string(static_cast<int>(pass)) + "|" + std::to_string(device) + "|" + std::to_string(sm) +
                  "|" + std::string(to_string(dtype)) + "|" + std::to_string(std::bit_cast<std::uint32_t>(scale));
  for (std::int64_t v : {batch, heads_q, heads_kv, seqlen_q, seqlen_kv, dqk, dv}) k += "|" + std::to_string(v);
  for (std::int64_t v :
       {std::int64_t{varlen}, std::int64_t{paged}, std::int64_t{band.any}, std::int64_t{band.bottom_right},
        std::int64_t{band.left_bound}, std::int64_t{band.right_bound}, std::int64_t{has_bias},
        static_cast<std::int64_t>(sink), sink_stride, dsink_stride, std::int64_t{deterministic}})
    k += "|" + std::to_string(v);
  const auto dims = [&](const Dims4& d) {
    for (int i = 0; i < 4; ++i) k += "|" + std::to_string(d.dim[i]) + ":" + std::to_string(d.stride[i]);
  };
  for (const Dims4& d : t) dims(d);
  dims(bias);
  dims(table);
  return k;
}

GraphDesc describe(const AttentionSpec& s, Pass pass, int device, int sm, const Views& v) {
  GraphDesc g;
  g.pass = pass;
  g.device = device;
  g.sm = sm;
  g.dtype = s.dtype;
  g.scale = static_cast<float>(s.effective_scale());
  g.batch = s.batch;
  g.heads_q = s.heads_q;
  g.heads_kv = s.heads_kv;
  g.seqlen_q = s.seqlen_q;
  g.seqlen_kv = s.seqlen_kv;
  g.dqk = s.head_dim_qk;
  g.dv = s.head_dim_v;
  g.varlen = s.varlen();
  g.paged = s.paged();
  g.band = mask_band(s);
  g.has_bias = s.has_bias;
  g.sink = s.softmax_type;
  if (v.sinks.defined()) g.sink_stride = v.sinks.strides[0];
  if (v.dsinks.defined()) g.dsink_stride = v.dsinks.strides[0];
  g.deterministic = s.deterministic;
  const std::int64_t heads[kRoles] = {s.heads_q, s.heads_kv, s.heads_kv, s.heads_q, s.heads_q,
                                      s.heads_q, s.heads_q,  s.heads_kv, s.heads_kv};
  const std::int64_t dims[kRoles] = {s.head_dim_qk, s.head_dim_qk, s.head_dim_v,  s.head_dim_v, 1,
                                     s.head_dim_v,  s.head_dim_qk, s.head_dim_qk, s.head_dim_v};
  const int last = pass == Pass::forward ? rStats : rDV;
  for (int r = 0; r <= last; ++r) {
    if (r == rStats) {
      g.t[r] = lse_dims(s, v.t[r]);
      continue;
    }
    const bool kv = r == rK || r == rV || r == rDK || r == rDV;
    g.t[r] = token_dims(s, v.t[r], heads[r], dims[r], kv ? s.seqlen_kv : s.seqlen_q, kv && s.paged());
  }
  if (s.has_bias) {
    const TensorView& b = v.bias;
    g.bias = {{b.shape[0], b.shape[1], b.shape[2], b.shape[3]},
              {b.shape[0] == 1 ? 0 : b.strides[0], b.shape[1] == 1 ? 0 : b.strides[1], b.strides[2], b.strides[3]}};
  }
  if (s.paged()) {
    const TensorView& bt = v.block_table;
    g.table = {{s.batch, 1, bt.shape[1], 1}, {bt.strides[0], bt.strides[0], bt.strides[1], 1}};
  }
  return g;
}

// Packed tensors of the spec's layout: what a Plan allocates, and what the
// check asks cuDNN about.
Views packed_views(const AttentionSpec& s) {
  const Role roles[kRoles] = {Role::q,    Role::k,  Role::v,  Role::out, Role::lse,
                              Role::dout, Role::dq, Role::dk, Role::dv};
  const std::int64_t pages_per_seq = s.paged() ? (s.seqlen_kv + s.kv_page_size - 1) / s.kv_page_size : 0;
  Views v;
  for (int r = 0; r < kRoles; ++r) {
    Shape shape = expected_shape(s, roles[r]);
    if (shape.dims[0] < 0) shape.dims[0] = s.batch * pages_per_seq;  // a page pool
    v.t[r] = TensorView::contiguous(nullptr, expected_dtype(s, roles[r]), shape.span());
  }
  if (s.has_bias) v.bias = TensorView::contiguous(nullptr, s.dtype, expected_shape(s, Role::bias).span());
  if (s.paged()) v.block_table = TensorView::contiguous(nullptr, DType::i32, {s.batch, pages_per_seq});
  return v;
}

Extras extras_for(const GraphDesc& g) {
  Extras e;
  std::size_t at = 0;
  const auto take = [&](std::int64_t count) {
    const std::size_t here = at;
    at = aligned(at + static_cast<std::size_t>(count) * sizeof(std::int32_t), 16);
    return here;
  };
  if (g.varlen || g.paged) {
    e.seq_q = take(g.batch);
    e.seq_kv = take(g.batch);
  }
  if (g.varlen)
    for (int r = 0; r < kRoles; ++r) e.ragged[r] = take(g.batch + 1);
  if (g.sink != SoftmaxType::vanilla) e.sink = take(g.heads_q);
  e.bytes = aligned(at);
  return e;
}

std::vector<std::int32_t> fill_extras(const AttentionSpec& s, const GraphDesc& g, const Extras& e,
                                      const Inputs& index) {
  std::vector<std::int32_t> host(e.bytes / sizeof(std::int32_t), 0);
  const auto at = [&](std::size_t offset) { return host.data() + offset / sizeof(std::int32_t); };
  if (g.varlen) {
    const TensorView& cq = index.cu_seqlens_q;
    const TensorView& ck = index.cu_seqlens_kv;
    const auto cu = [](const TensorView& c, std::int64_t b) { return c.as<const std::int32_t>()[b * c.strides[0]]; };
    for (std::int64_t b = 0; b < g.batch; ++b) {
      at(e.seq_q)[b] = cu(cq, b + 1) - cu(cq, b);
      at(e.seq_kv)[b] = cu(ck, b + 1) - cu(ck, b);
    }
    const int last = g.pass == Pass::forward ? rStats : rDV;
    for (int r = 0; r <= last; ++r) {
      const bool kv = r == rK || r == rV || r == rDK || r == rDV;
      // Element offsets: the sequence's first token times the token stride
      // (check_rules keeps them within 32 bits).
      for (std::int64_t b = 0; b <= g.batch; ++b)
        at(e.ragged[r])[b] = static_cast<std::int32_t>(cu(kv ? ck : cq, b) * g.t[r].stride[2]);
    }
  } else if (g.paged) {
    const TensorView& lens = index.cache_seqlens;
    for (std::int64_t b = 0; b < g.batch; ++b) {
      at(e.seq_q)[b] = static_cast<std::int32_t>(s.seqlen_q);
      at(e.seq_kv)[b] = lens.as<const std::int32_t>()[b * lens.strides[0]];
    }
  }
  return host;  // the off_by_one sink logits stay 0
}

}  // namespace attend::cudnn

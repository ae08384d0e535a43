// The SDPA graphs (cudnn_graph_build.h): tensors by role (uid = role + 1),
// ragged offsets for thd, page tables, sequence lengths, sinks and bias.
#include "backends/cudnn/cudnn_graph_build.h"

#include <cstdint>
#include <string>

namespace attend::cudnn {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

fe::DataType_t io_type(DType d) { return d == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

TensorPtr make_tensor(fe::graph::Graph& graph, const std::string& name, std::int64_t uid, const Dims4& d,
                      fe::DataType_t type) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({d.dim[0], d.dim[1], d.dim[2], d.dim[3]})
                          .set_stride({d.stride[0], d.stride[1], d.stride[2], d.stride[3]})
                          .set_data_type(type));
}

// Sets an output's uid, shape, strides (and ragged offsets) to the call's.
void describe_output(fe::graph::Graph& graph, const GraphDesc& g, const TensorPtr& t, int role, fe::DataType_t type) {
  const Dims4& d = g.t[role];
  t->set_output(true)
      .set_name(kRoleNames[role])
      .set_uid(role + 1)
      .set_dim({d.dim[0], d.dim[1], d.dim[2], d.dim[3]})
      .set_stride({d.stride[0], d.stride[1], d.stride[2], d.stride[3]})
      .set_data_type(type);
  if (g.varlen)
    t->set_ragged_offset(make_tensor(graph, std::string("ragged_") + kRoleNames[role], kRagged + role,
                                     Dims4{{g.batch + 1, 1, 1, 1}, {1, 1, 1, 1}}, fe::DataType_t::INT32));
}

TensorPtr input(fe::graph::Graph& graph, const GraphDesc& g, int role, fe::DataType_t type) {
  TensorPtr t = make_tensor(graph, kRoleNames[role], role + 1, g.t[role], type);
  const bool pool = g.paged && (role == rK || role == rV);
  if (g.varlen && !pool)
    t->set_ragged_offset(make_tensor(graph, std::string("ragged_") + kRoleNames[role], kRagged + role,
                                     Dims4{{g.batch + 1, 1, 1, 1}, {1, 1, 1, 1}}, fe::DataType_t::INT32));
  return t;
}

// The options both passes share: scale, bias, mask band, sequence lengths, sinks.
template <class Options>
void common_options(fe::graph::Graph& graph, const GraphDesc& g, Options& o) {
  o.set_attn_scale(g.scale);
  if (g.has_bias) o.set_bias(make_tensor(graph, "bias", kBias, g.bias, io_type(g.dtype)));
  if (g.band.any) {
    o.set_diagonal_alignment(g.band.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                 : fe::DiagonalAlignment_t::TOP_LEFT);
    if (g.band.left_bound >= 0) o.set_diagonal_band_left_bound(g.band.left_bound);
    if (g.band.right_bound >= 0) o.set_diagonal_band_right_bound(g.band.right_bound);
  }
  if (g.varlen || g.paged) {
    const Dims4 lengths{{g.batch, 1, 1, 1}, {1, 1, 1, 1}};
    o.set_padding_mask(true)
        .set_seq_len_q(make_tensor(graph, "seq_len_q", kSeqQ, lengths, fe::DataType_t::INT32))
        .set_seq_len_kv(make_tensor(graph, "seq_len_kv", kSeqKv, lengths, fe::DataType_t::INT32));
  }
  if (g.sink != SoftmaxType::vanilla)
    o.set_sink_token(make_tensor(graph, "sink", kSink,
                                 Dims4{{1, g.heads_q, 1, 1}, {g.heads_q * g.sink_stride, g.sink_stride, 1, 1}},
                                 fe::DataType_t::FLOAT));
}

// bf16/f16 I/O, f32 softmax and accumulation; the compute capability is the
// device's (set, so the frontend does not ask the CUDA runtime it loads itself).
std::shared_ptr<fe::graph::Graph> new_graph(const GraphDesc& g) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(io_type(g.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT)
      .set_sm_version(g.sm);
  return graph;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const GraphDesc& g) {
  auto graph = new_graph(g);
  const fe::DataType_t io = io_type(g.dtype);
  TensorPtr q = input(*graph, g, rQ, io), k = input(*graph, g, rK, io), v = input(*graph, g, rV, io);
  fe::graph::SDPA_attributes o;
  o.set_name("attend_sdpa").set_generate_stats(true);
  common_options(*graph, g, o);
  if (g.paged) {
    o.set_paged_attention_k_table(make_tensor(*graph, "block_table_k", kPageK, g.table, fe::DataType_t::INT32))
        .set_paged_attention_v_table(make_tensor(*graph, "block_table_v", kPageV, g.table, fe::DataType_t::INT32))
        .set_paged_attention_max_seq_len_kv(static_cast<int>(g.seqlen_kv));
  }
  auto [out, stats] = graph->sdpa(q, k, v, o);
  describe_output(*graph, g, out, rO, io);
  describe_output(*graph, g, stats, rStats, fe::DataType_t::FLOAT);
  return graph;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const GraphDesc& g) {
  auto graph = new_graph(g);
  const fe::DataType_t io = io_type(g.dtype);
  TensorPtr q = input(*graph, g, rQ, io), k = input(*graph, g, rK, io), v = input(*graph, g, rV, io);
  TensorPtr out = input(*graph, g, rO, io), dout = input(*graph, g, rDO, io);
  TensorPtr stats = input(*graph, g, rStats, fe::DataType_t::FLOAT);
  fe::graph::SDPA_backward_attributes o;
  o.set_name("attend_sdpa_backward");
  common_options(*graph, g, o);
  if (g.deterministic) o.set_deterministic_algorithm(true);
  if (g.sink == SoftmaxType::learnable)
    o.set_dsink_token(make_tensor(*graph, "dsink", kDSink,
                                  Dims4{{1, g.heads_q, 1, 1}, {g.heads_q * g.dsink_stride, g.dsink_stride, 1, 1}},
                                  fe::DataType_t::FLOAT));
  auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, out, dout, stats, o);
  describe_output(*graph, g, dq, rDQ, io);
  describe_output(*graph, g, dk, rDK, io);
  describe_output(*graph, g, dv, rDV, io);
  return graph;
}

}  // namespace

std::shared_ptr<fe::graph::Graph> make_graph(const GraphDesc& g) {
  return g.pass == Pass::forward ? forward_graph(g) : backward_graph(g);
}

}  // namespace attend::cudnn

// The tensors of a problem for `attend run`: loaded from .npy or generated from
// a seed, with the shapes the spec implies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attend/backend.h"
#include "attend/kvcache.h"
#include "attend/tensor.h"
#include "problem_flags.h"

namespace attend_cli {

using Shape = std::vector<std::int64_t>;

// Shapes implied by the spec (in spec.layout).
Shape q_shape(const attend::AttentionSpec& s);
Shape k_shape(const attend::AttentionSpec& s);
Shape v_shape(const attend::AttentionSpec& s);
Shape out_shape(const attend::AttentionSpec& s);
Shape lse_shape(const attend::AttentionSpec& s);
attend::DType lse_dtype(const attend::AttentionSpec& s);

// Tensor::zeros for a run-time shape (at most 4 dims).
attend::Tensor zeros(attend::DType dtype, const Shape& shape);
// A contiguous copy converted to dtype.
attend::Tensor convert(const attend::TensorView& t, attend::DType dtype);
std::string shape_string(const Shape& shape);

// Seeded normal data, at memory speed: element i of a tensor is a pure
// function of (seed, stream, i) — Philox4x32-10 (src/kernel/philox.h) on a
// counter from i, Box-Muller on its words, in f32 — so it is the same for any
// thread count and any CPU. Writes mean + stddev * N(0, 1) into every element
// of the contiguous f32, f64, bf16 or f16 tensor t (rounded to nearest even).
// threads <= 0: OpenMP's count. The radius sqrt(-2 ln u) of 24-bit uniforms
// ends at 5.77 (a tail of 8e-9 of the normal's mass).
void fill_normal(const attend::Tensor& t, std::uint64_t seed, std::uint32_t stream, double mean = 0.0,
                 double stddev = 1.0, int threads = 0);
// A tensor of standard normals as above, allocated without Tensor::zeros'
// zero-fill: the threads that fill it take its page faults, in parallel.
attend::Tensor normal_tensor(attend::DType dtype, const Shape& shape, std::uint64_t seed, std::uint32_t stream,
                             int threads = 0);

// A .npy input, read once (read_npy_input) so that its shape can fill in the
// size flags before the data is built. An empty path: seeded random data.
struct NpyInput {
  std::string path;
  attend::Tensor tensor;
};
NpyInput read_npy_input(const std::string& path, std::string_view flag);

struct DataSources {
  NpyInput q, k, v, dout;
  std::uint64_t seed = 1;
  bool need_dout = false;
  NpyInput slopes;  // ALiBi slopes, (H) or (B, H) f32; none: random positive slopes
  NpyInput sinks{};  // softmax_type=learnable: sink logits (H), f32 (f64 problems: f64); none: seeded random
};

// Sizes the .npy files imply (dense q, k, v of 4 dims in the flags' layout; a
// KV cache's k/v are (B, S, Hkv, D)) written into the size flags the command
// line left unset, so `run --q q.npy --k k.npy --v v.npy` replays saved files.
void sizes_from_files(ProblemFlags& flags, const DataSources& src);

struct ProblemData {
  attend::Tensor q, k, v, dout, bias, slopes, cu_seqlens_q, cu_seqlens_kv;
  attend::Tensor sinks;  // softmax_type=learnable
  // An 8-bit spec.kv_dtype on dense K/V: k and v above hold the codes and
  // k_scale / v_scale their f32 scales (spec.kv_scale's layout; undefined for
  // none), quantized from k_wide / v_wide, the random or --k/--v values in
  // spec.dtype (what --save writes, so that a replay quantizes them again).
  attend::Tensor k_scale, v_scale, k_wide, v_wide;
  // spec.paged(): k and v above are the dense tokens appended to an
  // attend::KVCache (B, max cached, Hkv, D); the kernels read its pages.
  std::shared_ptr<const attend::KVCache> cache;
  attend::Inputs inputs() const;
};

// Which entry of k_scale / v_scale scales each row of an 8-bit k or v (a row:
// the head_dim elements of one (token, kv head), row = element index / head
// dim of the contiguous tensor), for spec.kv_scale's layout. Per-head scales
// of a page pool belong to the sequence whose block-table row lists the page.
class KVScaleIndex {
 public:
  // k_shape: the shape of k (or v); cu_seqlens_kv for thd, block_table when paged.
  KVScaleIndex(const attend::AttentionSpec& s, const Shape& k_shape, const attend::TensorView& cu_seqlens_kv,
               const attend::TensorView& block_table);
  // -1: a page no sequence owns (never read).
  std::int64_t operator()(std::int64_t row) const;

 private:
  attend::AttentionSpec spec_;
  Shape shape_;
  std::vector<std::int64_t> seq_of_;  // thd: cu_seqlens_kv; paged per_head: owner per page
};

// Throws attend::Error when a file is malformed or disagrees with the spec.
ProblemData make_data(const Problem& p, const DataSources& src);

}  // namespace attend_cli

#include "kernel/sink_grad.h"

#include <cmath>
#include <vector>

#include "kernel/half.h"
#include "kernel/layout.h"

namespace attend::detail {
namespace {

template <class E, class Z>
void run(const BackwardArgs& a) {
  const AttentionSpec& s = a.spec;
  const TokenStrides os = token_strides(a.out, s.layout), dos = token_strides(a.dout, s.layout),
                     ls = lse_strides(a.lse, s.layout);
  const E* out = a.out.as<const E>();
  const E* dout = a.dout.as<const E>();
  const Z* lse = a.lse.as<const Z>();
  const Z* z = a.in.sinks.as<const Z>();
  std::vector<double> dz(static_cast<std::size_t>(s.heads_q), 0.0);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const SeqSpan sp = sequence_span(s, a.in, b);
    for (std::int64_t i = 0; i < sp.q_len; ++i) {
      const std::int64_t row = sp.q_begin + i;
      for (std::int64_t h = 0; h < s.heads_q; ++h) {
        const double l = static_cast<double>(lse[ls.offset(b, row, h)]);
        const double p_sink = std::exp(static_cast<double>(z[h * a.in.sinks.strides[0]]) - l);
        if (p_sink == 0.0) continue;  // also a vanilla partial's LSE of -inf: no sink there
        const E* o = out + os.offset(b, row, h);
        const E* g = dout + dos.offset(b, row, h);
        double d = 0;
        for (std::int64_t c = 0; c < s.head_dim_v; ++c) d += static_cast<double>(o[c]) * static_cast<double>(g[c]);
        dz[static_cast<std::size_t>(h)] -= p_sink * d;
      }
    }
  }
  for (std::int64_t h = 0; h < s.heads_q; ++h) {
    Z* dst = a.dsinks.as<Z>() + h * a.dsinks.strides[0];
    const double prev = s.accumulate_grads ? static_cast<double>(*dst) : 0.0;
    *dst = static_cast<Z>(prev + dz[static_cast<std::size_t>(h)]);
  }
}

}  // namespace

void sink_gradient(const BackwardArgs& a) {
  switch (a.spec.dtype) {
    case DType::bf16: run<bf16_t, float>(a); return;
    case DType::f16: run<f16_t, float>(a); return;
    case DType::f64: run<double, double>(a); return;
    default: run<float, float>(a); return;
  }
}

}  // namespace attend::detail

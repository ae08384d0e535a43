// Runs one small training step through the installed library and checks the
// selection and the output against a hand-computed value.
#include <attend/attend.h>

#include <cmath>
#include <cstdio>

int main() {
  attend::AttentionSpec spec;
  spec.seqlen_q = 1;
  spec.seqlen_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 1;
  spec.scale = 1.0;
  float q[1] = {1.0f}, k[2] = {0.0f, 1.0f}, v[2] = {1.0f, 3.0f}, dout[1] = {1.0f};
  const auto view = [](float* p, long s) { return attend::TensorView::contiguous(p, attend::DType::f32, {1, s, 1, 1}); };
  auto fwd = attend::forward(view(q, 1), view(k, 2), view(v, 2), spec, attend::Mode::training);
  auto grads = attend::backward(fwd.ctx, view(dout, 1));
  // softmax([0, 1]) . [1, 3] = (1 + 3e) / (1 + e)
  const double e = std::exp(1.0), expected = (1.0 + 3.0 * e) / (1.0 + e);
  const double got = fwd.out.as<float>()[0];
  std::printf("backend=%s out=%.6f expected=%.6f dv0=%.6f\n", std::string(fwd.ctx.backend().name()).c_str(), got,
              expected, grads.dv.as<float>()[0]);
  return std::abs(got - expected) < 1e-5 ? 0 : 1;
}

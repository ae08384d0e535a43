// sample: the smallest honest backend — a direct, unfused forward in f64
// arithmetic for f32/f64 problems with masks, GQA, partial offsets and sinks, and no
// backward. It exists to prove the backend-folder mechanism and the
// conformance suite (tests/conformance): it is registered exactly as the
// built-ins are, and declines what it does not compute with reasons.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attend/backend.h"
#include "kernel/layout.h"
#include "kernel/semantics.h"
#include "runtime/builtin.h"

namespace attend {
namespace {

class SampleBackend final : public Backend {
 public:
  std::string_view name() const override { return "sample"; }

 protected:
  void supports(const AttentionSpec& s, Pass pass, const Target&, Support& sup) const override {
    sup.require(pass == Pass::forward, ReasonCode::no_backward, "sample has no backward (a forward-only test backend)");
    sup.require(s.dtype == DType::f32 || s.dtype == DType::f64, ReasonCode::dtype,
                [&] { return "dtype=" + std::string(to_string(s.dtype)) + " is not computed by sample (f32, f64)"; });
    sup.require(s.softcap == 0, ReasonCode::softcap, "softcap is not computed by sample");
    sup.require(!s.alibi, ReasonCode::alibi, "alibi is not computed by sample");
    sup.require(!s.has_bias, ReasonCode::bias, "bias is not computed by sample");
    sup.require(s.dropout_p == 0, ReasonCode::dropout, "dropout is not computed by sample");
    sup.require(!s.varlen() && !s.paged(), ReasonCode::layout, "varlen and paged K/V are not computed by sample");
  }
  std::size_t scratch_bytes(const AttentionSpec&, Pass, const Target&) const override { return 0; }

  void run_forward(const ForwardArgs& a) const override {
    if (a.spec.dtype == DType::f64) {
      run<double>(a);
    } else {
      run<float>(a);
    }
  }
  void run_backward(const BackwardArgs&) const override {}

 private:
  static double sink(const ForwardArgs& a, std::int64_t h) {
    switch (a.spec.softmax_type) {
      case SoftmaxType::off_by_one: return 0.0;
      case SoftmaxType::learnable:
        return a.in.sinks.dtype == DType::f64 ? a.in.sinks.as<const double>()[h]
                                              : static_cast<double>(a.in.sinks.as<const float>()[h]);
      case SoftmaxType::vanilla: break;
    }
    return -std::numeric_limits<double>::infinity();
  }

  template <class T>
  static void run(const ForwardArgs& a) {
    const AttentionSpec& s = a.spec;
    const detail::MaskRule rule = detail::mask_rule(s);
    const detail::TokenStrides qs = detail::token_strides(a.in.q, s.layout),
                               ks = detail::token_strides(a.in.k, s.layout),
                               vs = detail::token_strides(a.in.v, s.layout),
                               os = detail::token_strides(a.out, s.layout), ls = detail::lse_strides(a.lse, s.layout);
    using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const double scale = s.effective_scale();
    std::vector<double> p(static_cast<std::size_t>(s.seqlen_kv)), o(static_cast<std::size_t>(s.head_dim_v));
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t h = 0; h < s.heads_q; ++h) {
        const std::int64_t hk = h / s.group_size();
        for (std::int64_t i = 0; i < s.seqlen_q; ++i) {
          const detail::KeyRange r = detail::visible_keys(rule, i, s.seqlen_q, s.seqlen_kv);
          const T* q = a.in.q.as<const T>() + qs.offset(b, i, h);
          double m = -std::numeric_limits<double>::infinity();
          for (std::int64_t j = r.begin; j < r.end; ++j) {
            const T* k = a.in.k.as<const T>() + ks.offset(b, j, hk);
            double dot = 0;
            for (std::int64_t d = 0; d < s.head_dim_qk; ++d)
              dot += static_cast<double>(q[d]) * static_cast<double>(k[d]);
            p[static_cast<std::size_t>(j)] = scale * dot;
            m = std::max(m, scale * dot);
          }
          // The sink logit z is one more denominator term with no value.
          const double z = sink(a, h);
          if (z > m) m = z;
          std::fill(o.begin(), o.end(), 0.0);
          double sum = std::isinf(z) ? 0.0 : std::exp(z - m);
          for (std::int64_t j = r.begin; j < r.end; ++j) sum += std::exp(p[static_cast<std::size_t>(j)] - m);
          for (std::int64_t j = r.begin; j < r.end; ++j) {
            const double w = std::exp(p[static_cast<std::size_t>(j)] - m) / sum;
            const T* v = a.in.v.as<const T>() + vs.offset(b, j, hk);
            for (std::int64_t d = 0; d < s.head_dim_v; ++d)
              o[static_cast<std::size_t>(d)] += w * static_cast<double>(v[d]);
          }
          T* out = a.out.as<T>() + os.offset(b, i, h);
          for (std::int64_t d = 0; d < s.head_dim_v; ++d) out[d] = static_cast<T>(o[static_cast<std::size_t>(d)]);
          a.lse.as<L>()[ls.offset(b, i, h)] = static_cast<L>(sum == 0 ? m : m + std::log(sum));
        }
      }
    }
  }
};

}  // namespace

namespace backends {
// Below the reference: never chosen over a built-in, judged in every table.
void register_sample(detail::BuiltinBackends& list) { list.add(std::make_shared<SampleBackend>(), -10); }
}  // namespace backends

}  // namespace attend

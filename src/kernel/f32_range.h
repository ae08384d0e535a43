// Scale and softcap as the f32 kernels (flash, decode) hold them. The spec
// accepts any finite double; a float cannot hold every one (1e39 becomes inf,
// and softcap * tanh(s / softcap) needs 1/softcap as a normal float), and the
// result would be silently wrong. Those backends' checks decline such specs
// with this reason, so the selector falls back to the reference (f64 inside).
#pragma once

#include <cfloat>
#include <cmath>
#include <sstream>
#include <string>
#include <string_view>

#include "attend/backend.h"
#include "attend/spec.h"

namespace attend::detail {

inline constexpr double kMaxF32Softcap = 0x1p126;  // 1/softcap stays a normal float

inline void require_f32_logit_terms(const AttentionSpec& s, std::string_view backend, Support& sup) {
  const auto num = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  const double scale = s.effective_scale();
  sup.require(std::fabs(scale) <= FLT_MAX, ReasonCode::other, [&] {
    return "scale=" + num(scale) + " is beyond the f32 range of " + std::string(backend) + "'s kernels (" +
           num(FLT_MAX) + ")";
  });
  sup.require(s.softcap <= kMaxF32Softcap, ReasonCode::softcap, [&] {
    return "softcap=" + num(s.softcap) + " exceeds 2^126 (" + num(kMaxF32Softcap) + "), the largest " +
           std::string(backend) + "'s f32 kernels hold exactly";
  });
}

}  // namespace attend::detail

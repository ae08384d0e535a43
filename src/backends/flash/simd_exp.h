// Constants of the vector exp shared by the SIMD back ends.
#pragma once

namespace attend::flash {

inline constexpr float kLog2e = 1.44269504088896341f;
// exp(x) for x below this is < 2^-126 (FLT_MIN): returned as exactly 0.
inline constexpr float kExpUnderflow = -87.33654475f;
// Taylor polynomial of 2^f = sum (f ln2)^k / k!, degree 6, on f in [-0.5, 0.5]:
// truncation error (0.5 ln2)^7/7! ~ 1.2e-7, about one f32 ulp.
inline constexpr int kExp2Degree = 6;
inline constexpr float kExp2C[kExp2Degree + 1] = {1.0f,          0.693147181f,  0.240226507f, 0.0555041087f,
                                                  0.00961812911f, 0.00133335581f, 0.000154035304f};

}  // namespace attend::flash

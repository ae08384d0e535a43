// Constants of the vector exp shared by the SIMD back ends.
#pragma once

namespace attend::cpu {

inline constexpr float kLog2e = 1.44269504088896341f;
// exp(x) for x below this is < 2^-126 (FLT_MIN): returned as exactly 0.
inline constexpr float kExpUnderflow = -87.33654475f;
// Taylor polynomial of 2^f = sum (f ln2)^k / k!, degree 6, on f in [-0.5, 0.5]:
// truncation error (0.5 ln2)^7/7! ~ 1.2e-7, about one f32 ulp.
inline constexpr int kExp2Degree = 6;
inline constexpr float kExp2C[kExp2Degree + 1] = {1.0f,           0.693147181f,   0.240226507f,   0.0555041087f,
                                                  0.00961812911f, 0.00133335581f, 0.000154035304f};

// tanh near 0: 1 - 2/(exp(2x)+1) cancels catastrophically (about 1e-7 absolute
// error, i.e. 10% relative at |x| = 1e-6, which a large softcap magnifies), so
// |x| < kTanhSeriesBound uses the odd Taylor series x + x^3 * P(x^2) instead;
// with terms to x^11 its truncation error at the bound is ~5e-8 relative.
inline constexpr float kTanhSeriesBound = 0.3f;
inline constexpr int kTanhSeriesTerms = 5;  // coefficients of x^3 .. x^11
inline constexpr float kTanhSeries[kTanhSeriesTerms] = {-1.0f / 3, 2.0f / 15, -17.0f / 315, 62.0f / 2835,
                                                        -1382.0f / 155925};

}  // namespace attend::cpu

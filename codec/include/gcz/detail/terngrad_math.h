// gcz/detail/terngrad_math.h — the per-element math of TernGrad (Wen et al. 2017) shared by the CPU and
// CUDA backends: the clipped scale, the ternary rounding and the two trit packings, written in the
// float32 operation order docs/codecs/terngrad.md states.
//
//   using namespace gcz::detail::terngrad;
//   const float s = scale_from_stats(max_abs, sigma, clip);   // max|clip(x)|, at least kMinScale
//   const float inv = 1.0f / s;
//   uint32_t t = trit<true>(x, s, inv, rng.uniform(i));        // 0: zero, 1: +s, 2: -s
//   float y = detrit(t, s);
#pragma once

#include <math.h>

#include <cstdint>

#include "gcz/detail/float_bits.h"
#include "gcz/detail/hd.h"
#include "gcz/detail/philox.h"

namespace gcz::detail::terngrad {

// The smallest nonzero scale (2^-120), so that 1 / s is finite.
inline constexpr float kMinScale = 0x1p-120f;

// Trit values as stored: 0 for zero, 1 for +s, 2 for -s.
inline constexpr uint32_t kZero = 0, kPlus = 1, kMinus = 2;

// x for a finite x, 0 for NaN and ±Inf (non-finite elements are encoded as zero).
GCZ_HD float finite_or_zero(float x) {
  return (bit_cast<uint32_t>(x) & 0x7FFFFFFFu) < 0x7F800000u ? x : 0.0f;
}

// The population standard deviation of n_f finite elements from S1 = Σ d and S2 = Σ d² (d = x − K
// for a shift K, float64, in the order of gcz/detail/quant_reduce.h): var = (S2 − (S1·S1) / n_f) / n_f,
// sigma = sqrt(var), and 0 when n_f = 0 or var is not positive (rounding can leave a constant's var
// slightly below 0, or NaN).
GCZ_HD double sigma_from_sums(double s1, double s2, uint64_t finite) {
  if (finite == 0) return 0.0;
  const double n = static_cast<double>(finite);
  const double var = (s2 - (s1 * s1) / n) / n;
  return var > 0.0 ? sqrt(var) : 0.0;
}

// The scale s = max|clip(x)| from max|x| (finite elements, float32) and the population standard
// deviation sigma (float64): with clip c > 0 and sigma > 0, s = min(max|x|, c * sigma) computed in
// float64 and rounded to float32 (to nearest even); otherwise s = max|x| (sigma = 0 means every finite
// element is the same value: there is no outlier to clip, and clipping to 0 would erase a constant).
// A nonzero s is raised to at least kMinScale.
GCZ_HD float scale_from_stats(float max_abs, double sigma, double clip) {
  double s = max_abs;
  if (clip > 0.0 && sigma > 0.0) {
    const double t = clip * sigma;
    s = t < s ? t : s;
  }
  if (!(s > 0.0)) return 0.0f;
  const float f = static_cast<float>(s);
  return f < kMinScale ? kMinScale : f;
}

// The trit of x: a = min(|x|, s) (the clip; 0 for a non-finite x); p = a * inv with inv = 1 / s, but
// p = 1 for a = s > 0 (an element at the clip is always ±s, so constants decode exactly); nonzero when
// u <= p (stochastic) or p >= 0.5 (deterministic); the sign is x's.
GCZ_HD float trit_p(float y, float s, float inv) {
  float a = bit_cast<float>(bit_cast<uint32_t>(y) & 0x7FFFFFFFu);
  a = a < s ? a : s;
  return a < s ? a * inv : (s > 0.0f ? 1.0f : 0.0f);
}
// The trit of y where it rounds to nonzero (`on`): kPlus or kMinus by y's sign, else kZero. Worked
// out rather than chosen: for a stochastic rounding `on` is a coin flip, which a branch would
// mispredict half the time (the vector encoders settle their ties, one element in 256, with trit()).
GCZ_HD uint32_t trit_code(bool on, float y) {
  static_assert(kZero == 0 && kPlus == 1 && kMinus == 2, "trit codes");
  const uint32_t nonzero = on, negative = y < 0.0f;
  return nonzero + (nonzero & negative);
}
template <bool kStochastic>
GCZ_HD uint32_t trit(float x, float s, float inv, float u) {
  const float y = finite_or_zero(x);
  const float p = trit_p(y, s, inv);
  return trit_code(kStochastic ? u <= p : p >= 0.5f, y);
}
// trit<true> with u = Rng::to_uniform(256 coarse + fine), from the coarse byte and, only when it does
// not settle the draw (one element in 256), fine(), which returns the fine byte.
template <typename Fine>
GCZ_HD uint32_t trit_drawn(float x, float s, float inv, uint32_t coarse, const Fine& fine) {
  const float y = finite_or_zero(x);
  const uint32_t threshold = bernoulli_threshold(trit_p(y, s, inv));
  int on = coarse_bernoulli(coarse, threshold);
  if (on < 0) on = bernoulli_fine(coarse, fine(), threshold) ? 1 : 0;
  return trit_code(on != 0, y);
}

// x̂ for trit t: +s, -s or 0.
GCZ_HD float detrit(uint32_t t, float s) { return t == kPlus ? s : t == kMinus ? -s : 0.0f; }

// base3: five trits per byte, byte = t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4 (t0 the first element), so a
// valid byte is at most 242.
GCZ_HD uint8_t pack_base3(const uint8_t* t) {
  return static_cast<uint8_t>(t[0] + 3 * (t[1] + 3 * (t[2] + 3 * (t[3] + 3 * t[4]))));
}
// 2bit: four trits per byte, trit k in bits 2k..2k+1 (LSB first); the code 3 is invalid.
GCZ_HD uint8_t pack_2bit(const uint8_t* t) {
  return static_cast<uint8_t>(t[0] | (t[1] << 2) | (t[2] << 4) | (t[3] << 6));
}

}  // namespace gcz::detail::terngrad

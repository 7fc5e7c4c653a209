// gcz/detail/powersgd_math.h — the small pieces of the PowerSGD codec's math (docs/codecs/powersgd.md)
// that do not need a BLAS, written once for the CPU backend and a later CUDA backend: the seeded
// Gaussian start Q0, the fallback rule, Gram–Schmidt on float64 columns, the power-of-two balancing of
// the stored factors, and one decoded element.
//
//   gcz::detail::Rng rng(seed, gcz::tensor_key(name), gcz::detail::kStreamPowerSgdInit);
//   float q0 = gcz::detail::powersgd_gaussian(rng, j * r + c);   // Q0[j][c]
//   double x = gcz::detail::powersgd_element(p + i * r, q + j * r, r);  // x̂[i][j] before rounding
#pragma once

#include <math.h>

#include <cstdint>

#include "gcz/detail/float_bits.h"
#include "gcz/detail/hd.h"
#include "gcz/detail/philox.h"

namespace gcz::detail {

// Gaussian draw t of `rng` (Box–Muller, float64, then rounded to float32): u1 from draw 2t is in
// (0, 1] so that log(u1) is finite, u2 from draw 2t + 1 is in [0, 1).
GCZ_HD float powersgd_gaussian(const Rng& rng, uint64_t t) {
  const double u1 = (static_cast<double>(rng.bits(2 * t) >> 8) + 1.0) * 0x1p-24;
  const double u2 = static_cast<double>(rng.bits(2 * t + 1) >> 8) * 0x1p-24;
  const double kTwoPi = 6.283185307179586;  // 2π rounded to float64
  return static_cast<float>(sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2));
}

// The size rule for an n × m matrix view of a tensor whose elements have `dtype_bytes` bytes: true when
// rank-r factors, counted as float32 (4 bytes) whatever codec stores them, would not make the tensor
// at least `min_rate` times smaller. Evaluated in float64 exactly as written.
GCZ_HD bool powersgd_too_small(uint64_t n, uint64_t m, uint64_t r, unsigned dtype_bytes, double min_rate) {
  const double factor_bytes = static_cast<double>(r) * (static_cast<double>(n) + static_cast<double>(m)) * 4.0;
  const double dense_bytes = static_cast<double>(n) * static_cast<double>(m) * static_cast<double>(dtype_bytes);
  return factor_bytes >= dense_bytes / min_rate;
}

GCZ_HD double powersgd_dot(const double* a, const double* b, uint64_t n) {
  double s = 0.0;
  for (uint64_t i = 0; i < n; ++i) s = s + a[i] * b[i];
  return s;
}

// Orthonormalizes the r columns of v in place (column c is v[c·n .. c·n + n), float64) by modified
// Gram–Schmidt with each projection pass run twice ("twice is enough": the second pass removes what
// rounding left of the earlier directions, so the result is orthogonal to float64 precision even
// when columns are nearly dependent). A column whose norm after projection is not above
// eps = 1e-8 · (the largest column norm on entry) becomes zero: zero or dependent columns give zeros,
// never NaN. Dots sum in index order; a kept column is divided element by element by its norm.
GCZ_HD void powersgd_orthonormalize(double* v, uint64_t n, uint64_t r) {
  double max_norm = 0.0;
  for (uint64_t c = 0; c < r; ++c) {
    const double norm = sqrt(powersgd_dot(v + c * n, v + c * n, n));
    max_norm = norm > max_norm ? norm : max_norm;
  }
  const double eps = 1e-8 * max_norm;
  for (uint64_t c = 0; c < r; ++c) {
    double* vc = v + c * n;
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t k = 0; k < c; ++k) {
        const double* vk = v + k * n;
        const double d = powersgd_dot(vk, vc, n);
        for (uint64_t i = 0; i < n; ++i) vc[i] = vc[i] - d * vk[i];
      }
    }
    const double norm = sqrt(powersgd_dot(vc, vc, n));
    const bool keep = norm > eps;  // false for 0 and NaN
    for (uint64_t i = 0; i < n; ++i) vc[i] = keep ? vc[i] / norm : 0.0;
  }
}

// floor((e + eq − ep) / 2): column c of P is stored scaled by 2^k and column c of Q by 2^(e − k), where
// 2^ep ≤ max|P'_c| < 2^(ep+1), 2^eq ≤ max|Q'_c| < 2^(eq+1) and 2^e is the scale taken out of the matrix.
// The two stored columns then have largest magnitudes within a factor of 4 of each other, so a
// narrow factor codec (fp16) keeps as much of each as it can and float32 never overflows.
GCZ_HD int powersgd_balance_shift(int e, int ep, int eq) {
  const int s = e + eq - ep;
  return s >= 0 ? s / 2 : -((1 - s) / 2);
}

// A decoded sum as stored: acc, or the default quiet NaN (0x7FF8000000000000, positive, no payload)
// for any NaN acc. Where NaN or Inf factors meet (only a made-up file has them), which NaN a sum
// makes depends on the machine's instructions (x86 keeps the first operand's, a GPU may keep the
// other's), so every decoder settles it here.
GCZ_HD double powersgd_settle_nan(double acc) {
  return acc == acc ? acc : bit_cast<double>(uint64_t{0x7FF8000000000000u});
}

// x̂[i][j] before rounding to the tensor's dtype: Σ_c P[i][c]·Q[j][c] over c = 0 .. r−1 in float64,
// starting from +0 (each product of two float32 values is exact in float64; each sum is rounded),
// a NaN settled by powersgd_settle_nan.
GCZ_HD double powersgd_element(const float* p_row, const float* q_row, uint64_t r) {
  double acc = 0.0;
  for (uint64_t c = 0; c < r; ++c) acc = acc + static_cast<double>(p_row[c]) * static_cast<double>(q_row[c]);
  return powersgd_settle_nan(acc);
}

}  // namespace gcz::detail

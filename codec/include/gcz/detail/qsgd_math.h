// gcz/detail/qsgd_math.h — the per-element math of QSGD (Alistarh et al. 2017) shared by the CPU and
// CUDA backends: group scales, levels, stochastic/nearest rounding, and the dense code packing. Every
// float operation is written out in the order docs/codecs/qsgd.md states, so both backends produce
// the same bytes.
//
//   using namespace gcz::detail::qsgd;
//   const int s = levels(8);                                   // 127
//   const float inv = inverse_step(scale, s);                  // s / scale, or 0 for a zero scale
//   uint32_t c = quantize<8, true>(x, inv, s, scale, rng.uniform(i)); // sign-magnitude code
//   float y = dequantize<8>(c, step(scale, s), scale);
#pragma once

#include <math.h>

#include <cstdint>

#include "gcz/detail/float_bits.h"
#include "gcz/detail/hd.h"
#include "gcz/detail/philox.h"

namespace gcz::detail::qsgd {

// Magnitude levels per sign for `bits`-bit codes: s = 2^(bits-1) - 1.
GCZ_HD constexpr int levels(int bits) { return (1 << (bits - 1)) - 1; }

// The smallest nonzero scale (2^-120): a group whose largest magnitude is below it gets this scale, so
// that s / scale stays finite for every s <= 127.
inline constexpr float kMinScale = 0x1p-120f;
inline constexpr float kMaxFloat = 3.40282346638528859812e+38f;

// |x| for a finite x, 0 for NaN and ±Inf (non-finite elements are encoded as zero), as bits: for
// non-negative floats the unsigned order of the bits is the numeric order, so a max over them is an
// integer max that vectorizes.
GCZ_HD uint32_t finite_abs_bits(float x) {
  const uint32_t a = bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
  return a < 0x7F800000u ? a : 0u;
}
GCZ_HD float finite_abs(float x) { return bit_cast<float>(finite_abs_bits(x)); }

// Positive finite v rounded up (toward +Inf) to the next float16 / bfloat16 / float32, saturating at
// the largest finite value of the type. Returns the stored bit pattern.
GCZ_HD uint16_t ceil_to_f16(float v) {
  uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) < v) h = static_cast<uint16_t>(h + 1);
  return h >= 0x7C00u ? uint16_t{0x7BFFu} : h;
}
GCZ_HD uint16_t ceil_to_bf16(float v) {
  uint16_t b = f32_to_bf16(v);
  if (bf16_to_f32(b) < v) b = static_cast<uint16_t>(b + 1);
  return b >= 0x7F80u ? uint16_t{0x7F7Fu} : b;
}
GCZ_HD float ceil_to_f32(double v) {
  float f = f64_to_f32(v);
  if (static_cast<double>(f) < v) f = bit_cast<float>(bit_cast<uint32_t>(f) + 1u);
  return f > kMaxFloat ? kMaxFloat : f;
}

// The l2 scale ||x_G||_2 from the sum of the finite elements' squares (float64, in the order of
// gcz/detail/quant_reduce.h): sqrt in float64, rounded up to float32.
GCZ_HD float l2_scale(double sum_of_squares) { return ceil_to_f32(sqrt(sum_of_squares)); }

// The scale before it is rounded to the stored dtype: 0 for a zero group, else at least kMinScale.
GCZ_HD float floor_scale(float raw) { return raw == 0.0f ? 0.0f : (raw < kMinScale ? kMinScale : raw); }

// Levels per unit of |x|: s / scale in float32, 0 for a zero scale (every element then gets level 0).
GCZ_HD float inverse_step(float scale, int s) { return scale > 0.0f ? static_cast<float>(s) / scale : 0.0f; }
// The value of one level: scale / s in float32.
GCZ_HD float step(float scale, int s) { return scale / static_cast<float>(s); }

// The B-bit code of x under stored scale S (float32): level in the low B-1 bits, sign in bit B-1.
// r = min(|x| * inv, s), or r = s when |x| >= S > 0 (an element at the scale, the group's max, gets
// level s exactly), r = 0 for a non-finite x; l = floor(r); level = l + (u <= r - l) when stochastic,
// l + (r - l >= 0.5) when not. The sign bit is set only for x < 0 with level > 0, so zeros have one
// code.
struct LevelFrac {
  uint32_t l;  // floor(r)
  float frac;  // r - l, exact
};
GCZ_HD LevelFrac level_frac(float x, float inv, float s, float scale) {
  const float a = finite_abs(x);
  float r = a * inv;
  r = r < s ? r : s;
  r = (a >= scale && scale > 0.0f) ? s : r;
  const uint32_t l = static_cast<uint32_t>(static_cast<int32_t>(r));
  return {l, r - static_cast<float>(static_cast<int32_t>(l))};
}
template <int B>
GCZ_HD uint32_t code_of(uint32_t level, float x) {
  const uint32_t neg = (bit_cast<uint32_t>(x) >> 31) & (level != 0 ? 1u : 0u);
  return level | (neg << (B - 1));
}
template <int B, bool kStochastic>
GCZ_HD uint32_t quantize(float x, float inv, float s, float scale, float u) {
  const LevelFrac lf = level_frac(x, inv, s, scale);
  const uint32_t up = kStochastic ? (u <= lf.frac ? 1u : 0u) : (lf.frac >= 0.5f ? 1u : 0u);
  return code_of<B>(lf.l + up, x);
}
// quantize<B, true> with u = Rng::to_uniform(256 coarse + fine), from the coarse byte and, only when
// it does not settle the rounding (one element in 256), fine(), which returns the fine byte.
template <int B, typename Fine>
GCZ_HD uint32_t quantize_drawn(float x, float inv, float s, float scale, uint32_t coarse, const Fine& fine) {
  const LevelFrac lf = level_frac(x, inv, s, scale);
  const uint32_t threshold = bernoulli_threshold(lf.frac);
  int up = coarse_bernoulli(coarse, threshold);
  if (up < 0) up = bernoulli_fine(coarse, fine(), threshold) ? 1 : 0;
  return code_of<B>(lf.l + static_cast<uint32_t>(up), x);
}

// x̂ = ±(level * step) in float32, and ±scale exactly for level s; the sign bit flips the sign (a
// level-0 code with the sign bit, which the encoder never writes, decodes to -0).
template <int B>
GCZ_HD float dequantize(uint32_t code, float step_value, float scale) {
  constexpr uint32_t kMask = (1u << (B - 1)) - 1u;
  const uint32_t level = code & kMask;
  const float mag = level == kMask ? scale : static_cast<float>(static_cast<int32_t>(level)) * step_value;
  return bit_cast<float>(bit_cast<uint32_t>(mag) ^ (((code >> (B - 1)) & 1u) << 31));
}

// Packing: code i occupies bits [i*B, (i+1)*B) of the stream, LSB first, where bit k of the stream is
// bit k mod 8 of byte k / 8. Eight codes fill exactly B bytes.
template <int B>
GCZ_HD void pack8(const uint8_t* codes, uint8_t* out) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= static_cast<uint64_t>(codes[k]) << (k * B);
  for (int j = 0; j < B; ++j) out[j] = static_cast<uint8_t>(v >> (8 * j));
}
template <int B>
GCZ_HD void unpack8(const uint8_t* in, uint8_t* codes) {
  uint64_t v = 0;
  for (int j = 0; j < B; ++j) v |= static_cast<uint64_t>(in[j]) << (8 * j);
  for (int k = 0; k < 8; ++k) codes[k] = static_cast<uint8_t>((v >> (k * B)) & ((1u << B) - 1u));
}

}  // namespace gcz::detail::qsgd

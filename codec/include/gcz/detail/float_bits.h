// gcz/detail/float_bits.h — bit-exact conversions between IEEE-style binary formats, shared by the CPU
// and CUDA backends (so both produce the same bytes).
//
// Narrowing rounds to nearest, ties to even; overflow gives ±Inf; values below half the smallest
// subnormal give ±0; subnormals are produced and consumed exactly; widening is exact. A NaN stays a
// NaN with its sign and leading payload bits, and every conversion sets its quiet bit (hardware
// float32 -> float64 casts do the same), so the result never depends on the platform.
//
//   uint16_t h = gcz::detail::f32_to_f16(1.0f);      // 0x3C00
//   float f = gcz::detail::f16_to_f32(0x3C00);      // 1.0f
#pragma once

#include <cstdint>
#include <cstring>

#include "gcz/detail/hd.h"

namespace gcz::detail {

template <class To, class From>
GCZ_HD To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// Narrows a value of a format with SE exponent and SM fraction bits to one with DE and DM (DE <= SE,
// DM < SM). Returns the destination bit pattern in the low 1 + DE + DM bits.
template <int SE, int SM, int DE, int DM>
GCZ_HD uint32_t narrow_float_bits(uint64_t src) {
  constexpr int64_t kSrcMaxExp = (int64_t{1} << SE) - 1;
  constexpr int64_t kSrcBias = (int64_t{1} << (SE - 1)) - 1;
  constexpr uint32_t kDstMaxExp = (uint32_t{1} << DE) - 1;
  constexpr int64_t kDstBias = (int64_t{1} << (DE - 1)) - 1;
  constexpr uint32_t kDstInf = kDstMaxExp << DM;

  const uint32_t sign = static_cast<uint32_t>((src >> (SE + SM)) & 1u) << (DE + DM);
  const int64_t exp = static_cast<int64_t>((src >> SM) & static_cast<uint64_t>(kSrcMaxExp));
  uint64_t m = src & ((uint64_t{1} << SM) - 1);

  if (exp == kSrcMaxExp) {
    if (m == 0) return sign | kDstInf;
    return sign | kDstInf | static_cast<uint32_t>(m >> (SM - DM)) | (uint32_t{1} << (DM - 1));
  }
  if (exp == 0 && m == 0) return sign;

  // Normalise so that m is in [2^SM, 2^(SM+1)) and the value is m * 2^(e - SM).
  int64_t e;
  if (exp == 0) {
    e = 1 - kSrcBias;
    while (m < (uint64_t{1} << SM)) {
      m <<= 1;
      --e;
    }
  } else {
    e = exp - kSrcBias;
    m |= uint64_t{1} << SM;
  }

  const int64_t de = e + kDstBias;
  const int64_t shift = (SM - DM) + (de < 1 ? 1 - de : 0);
  if (shift > SM + 1) return sign;  // below half the smallest subnormal
  const uint64_t q = m >> shift;
  const uint64_t rem = m & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  const uint64_t rounded = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  if (de < 1) return sign | static_cast<uint32_t>(rounded);  // subnormal, or the smallest normal by carry
  // (de - 1) * 2^DM + rounded carries a mantissa overflow into the exponent.
  const uint64_t bits = (static_cast<uint64_t>(de - 1) << DM) + rounded;
  if (bits >= kDstInf) return sign | kDstInf;
  return sign | static_cast<uint32_t>(bits);
}

// Widens a value of a format with SE/SM bits to one with DE/DM bits (DE > SE, DM > SM), exactly. (With
// DE == SE a subnormal source would need a subnormal result, which this does not make.) The generic
// reference that the tests hold the branch-free widenings (f16_to_f32, f32_to_f64) to.
template <int SE, int SM, int DE, int DM>
GCZ_HD uint64_t widen_float_bits(uint32_t src) {
  constexpr uint32_t kSrcMaxExp = (uint32_t{1} << SE) - 1;
  constexpr int64_t kSrcBias = (int64_t{1} << (SE - 1)) - 1;
  constexpr uint64_t kDstMaxExp = (uint64_t{1} << DE) - 1;
  constexpr int64_t kDstBias = (int64_t{1} << (DE - 1)) - 1;

  const uint64_t sign = static_cast<uint64_t>((src >> (SE + SM)) & 1u) << (DE + DM);
  const uint32_t exp = (src >> SM) & kSrcMaxExp;
  uint64_t m = src & ((uint32_t{1} << SM) - 1);
  if (exp == kSrcMaxExp) {  // Inf, or NaN with its payload on top and the quiet bit set
    const uint64_t quiet = m != 0 ? uint64_t{1} << (DM - 1) : 0;
    return sign | (kDstMaxExp << DM) | (m << (DM - SM)) | quiet;
  }
  if (exp == 0 && m == 0) return sign;
  int64_t e;
  if (exp == 0) {
    e = 1 - kSrcBias;
    while (m < (uint64_t{1} << SM)) {
      m <<= 1;
      --e;
    }
    m &= (uint64_t{1} << SM) - 1;
  } else {
    e = static_cast<int64_t>(exp) - kSrcBias;
  }
  return sign | (static_cast<uint64_t>(e + kDstBias) << DM) | (m << (DM - SM));
}

// float32 -> float16 without branches, so loops over it vectorize, given `small`, the result for
// |f| below the float16 normal range (f32_to_f16_small, or a caller's own rounding of it). Normal
// results round by adding half an ulp (plus the tie bit) before truncating.
GCZ_HD uint16_t f32_to_f16_given_small(float f, uint32_t small) {
  const uint32_t bits = bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7FFFFFFFu;
  const uint32_t rounded = x + 0xFFFu + ((x >> 13) & 1u);
  const uint32_t normal = (rounded >> 13) - (112u << 10);
  const uint32_t nan = 0x7E00u | ((x >> 13) & 0x3FFu);
  const uint32_t h = x > 0x7F800000u ? nan : rounded >= 0x47800000u ? 0x7C00u : x < 0x38800000u ? small : normal;
  return static_cast<uint16_t>(sign | h);
}
// The float16 subnormal (or 0, or the smallest normal) nearest |f| below 2^-14: its multiple of
// 2^-24, the mantissa shifted right and rounded to nearest even on the integers. No floating-point
// operation: it does not depend on the FPU's rounding mode and raises nothing.
GCZ_HD uint32_t f32_to_f16_small(float f) {
  const uint32_t x = bit_cast<uint32_t>(f) & 0x7FFFFFFFu;
  // The value is m * 2^(e - 150), that is m >> (126 - e) steps of 2^-24, from 14 up (e <= 112); past
  // 31 every result is 0, and a shift of 31 gives it (as for the lanes whose result is another,
  // which need only a shift in range).
  const uint32_t e = x >> 23;
  const uint32_t m = (x & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);
  const uint32_t sh = e < 95 || e > 112 ? 31u : 126u - e;
  const uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}
// Same results as narrow_float_bits<8, 23, 5, 10> (tests compare them).
GCZ_HD uint16_t f32_to_f16(float f) { return f32_to_f16_given_small(f, f32_to_f16_small(f)); }
GCZ_HD uint16_t f64_to_f16(double d) {
  return static_cast<uint16_t>(narrow_float_bits<11, 52, 5, 10>(bit_cast<uint64_t>(d)));
}
// float16 -> float32 without branches. A subnormal m * 2^-24 is the integer m, converted exactly,
// times 2^-24: exact, a float32 normal, so neither the rounding mode nor flush-to-zero changes it,
// and nothing is raised.
GCZ_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t x = h & 0x7FFFu;
  const uint32_t normal = (x << 13) + (112u << 23);
  const uint32_t special = (x << 13) | 0x7F800000u | (x > 0x7C00u ? 0x00400000u : 0u);  // NaN made quiet
  const uint32_t small = bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(x)) * 0x1p-24f);
  const uint32_t f = x >= 0x7C00u ? special : x < 0x0400u ? small : normal;
  return bit_cast<float>(sign | f);
}

// float32 -> bfloat16: bfloat16 is the top half of a float32, so rounding is one add; a carry out of
// the largest finite value lands on Inf, as it should. NaN keeps its top payload bits, made quiet.
GCZ_HD uint16_t f32_to_bf16(float f) {
  const uint32_t bits = bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? ((bits >> 16) | 0x40u) : rounded);
}
GCZ_HD uint16_t f64_to_bf16(double d) {
  return static_cast<uint16_t>(narrow_float_bits<11, 52, 8, 7>(bit_cast<uint64_t>(d)));
}
GCZ_HD float bf16_to_f32(uint16_t b) {
  const uint32_t quiet = (b & 0x7FFFu) > 0x7F80u ? 0x00400000u : 0u;  // NaN made quiet
  return bit_cast<float>((static_cast<uint32_t>(b) << 16) | quiet);
}

// float32 -> float64, exactly, as x86's cvtss2sd does it with the default MXCSR (a NaN keeps its sign
// and payload, made quiet), but on the bits and without branches: the instruction reads a subnormal
// as zero where the process has set denormals-are-zero, and the device's NaN handling is not promised.
// A subnormal m·2^-149 is the integer m, converted exactly, times 2^-149: a normal float64.
GCZ_HD double f32_to_f64(float f) {
  const uint32_t u = bit_cast<uint32_t>(f);
  const uint64_t sign = static_cast<uint64_t>(u >> 31) << 63;
  const uint32_t x = u & 0x7FFFFFFFu;
  const uint64_t normal = (static_cast<uint64_t>(x) << 29) + (uint64_t{1023 - 127} << 52);
  const uint64_t special =
      (static_cast<uint64_t>(x) << 29) | 0x7FF0000000000000u | (x > 0x7F800000u ? uint64_t{1} << 51 : 0);
  const uint64_t small = bit_cast<uint64_t>(static_cast<double>(static_cast<int32_t>(x)) * 0x1p-149);
  return bit_cast<double>(sign | (x >= 0x7F800000u ? special : x < 0x00800000u ? small : normal));
}

// float64 -> float32 keeps NaN payloads the same way as the narrower conversions.
GCZ_HD float f64_to_f32(double d) {
  return bit_cast<float>(narrow_float_bits<11, 52, 8, 23>(bit_cast<uint64_t>(d)));
}

}  // namespace gcz::detail

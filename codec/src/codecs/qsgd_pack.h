// QSGD's dense code packing, widths 2..8 (qsgd::pack8 / unpack8 eight codes at a time; docs/codecs/qsgd.md):
// a portable loop per width, and AVX2 loops for the widths whose codes cross bytes. Force-inlined
// into the span loops (qsgd_span.cpp); include from there only.
//
//   qsgd::pack<3>(codes, n, out);             // ceil(3n / 8) bytes
//   bool clean = qsgd::unpack<3>(in, n, codes);  // false: nonzero padding bits
#pragma once

#include <cstdint>
#include <cstring>

#include "codecs/span_inline.h"
#include "gcz/detail/qsgd_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcz::detail::qsgd {

// The bytes n codes of width B pack into.
template <int B>
GCZ_CPU_INLINE uint64_t packed_size(uint64_t n) {
  return n * B / 8 + (n * B % 8 != 0);
}

// Packs n codes into ceil(n * B / 8) bytes; the last byte's unused high bits are zero. Widths 4 and 2
// never cross a byte and get loops of their own that vectorize.
template <int B>
GCZ_CPU_INLINE void pack(const uint8_t* c, uint64_t n, uint8_t* out) {
  if constexpr (B == 4) {
    for (uint64_t j = 0; j < n / 2; ++j) out[j] = static_cast<uint8_t>(c[2 * j] | (c[2 * j + 1] << 4));
    if (n % 2) out[n / 2] = c[n - 1];
  } else if constexpr (B == 2) {
    for (uint64_t j = 0; j < n / 4; ++j) {
      out[j] = static_cast<uint8_t>(c[4 * j] | (c[4 * j + 1] << 2) | (c[4 * j + 2] << 4) | (c[4 * j + 3] << 6));
    }
    uint8_t last = 0;
    for (uint64_t k = n / 4 * 4; k < n; ++k) last = static_cast<uint8_t>(last | (c[k] << (2 * (k % 4))));
    if (n % 4) out[n / 4] = last;
  } else {
    const uint64_t full = n / 8;
    for (uint64_t k = 0; k < full; ++k) pack8<B>(c + 8 * k, out + B * k);
    if (const uint64_t rem = n % 8) {
      uint8_t codes[8] = {0, 0, 0, 0, 0, 0, 0, 0}, bytes[8];
      std::memcpy(codes, c + 8 * full, rem);
      pack8<B>(codes, bytes);
      std::memcpy(out + B * full, bytes, packed_size<B>(rem));
    }
  }
}

// Unpacks n codes into c (room for n rounded up to 8); false if the padding bits of a partial last
// byte are not zero.
template <int B>
GCZ_CPU_INLINE bool unpack(const uint8_t* in, uint64_t n, uint8_t* c) {
  const uint64_t bytes = packed_size<B>(n);
  if constexpr (B == 4 || B == 2) {
    constexpr int kPer = 8 / B;
    constexpr uint8_t kMask = (1u << B) - 1u;
    for (uint64_t j = 0; j < bytes; ++j) {
      for (int k = 0; k < kPer; ++k) c[kPer * j + k] = static_cast<uint8_t>((in[j] >> (B * k)) & kMask);
    }
  } else {
    const uint64_t full = n / 8;
    for (uint64_t k = 0; k < full; ++k) unpack8<B>(in + B * k, c + 8 * k);
    if (n % 8) {
      uint8_t last[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::memcpy(last, in + B * full, bytes - B * full);
      unpack8<B>(last, c + 8 * full);
    }
  }
  // The codes read from padding bits (and zero bits beyond the stream) must all be zero.
  const uint64_t unpacked = (B == 4 || B == 2) ? bytes * (8 / B) : (n + 7) / 8 * 8;
  uint8_t pad = 0;
  for (uint64_t k = n; k < unpacked; ++k) pad |= c[k];
  return pad == 0;
}

#if defined(__x86_64__)
// Widths 2, 3, 5, 6 and 7 pack eight codes into B bytes (pack8: code k at bits kB .. kB + B - 1, little
// endian). AVX2 does 32 codes (4B bytes) a step: each 64-bit lane holds one group of eight codes, whose
// bits are joined (or split) in three steps of doubling width: bytes into 16-bit words, words into
// 32-bit dwords, dwords into the lane; a byte shuffle moves each lane's B bytes into place. Widths 4
// and 8 need none of this.
template <int B>
constexpr bool kVectorPackable = B != 4 && B != 8;

// The B bytes of each 64-bit lane's group, for a shuffle within 128-bit halves: group 0 of a half
// from its bytes 0 .. B - 1, group 1 from B .. 2B - 1 (unpack: bytes of a half into its two lanes),
// or back (pack).
template <int B>
GCZ_AVX2_INLINE __m256i spread_bytes() {
  alignas(32) int8_t c[32];
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 16; ++k) c[16 * h + k] = (k % 8) < B ? static_cast<int8_t>((k / 8) * B + k % 8) : -1;
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
}
template <int B>
GCZ_AVX2_INLINE __m256i gather_bytes() {
  alignas(32) int8_t c[32];
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 16; ++k) c[16 * h + k] = k < 2 * B ? static_cast<int8_t>((k / B) * 8 + k % B) : -1;
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
}

// The 32 codes of the 4B bytes at in (16 bytes readable at in and at in + 2B), in element order.
template <int B>
GCZ_AVX2_INLINE __m256i unpack32_avx2(const uint8_t* in, __m256i spread) {
  const __m256i raw = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(in + 2 * B),
                                          reinterpret_cast<const __m128i*>(in));  // codes 16..31 | 0..15
  const __m256i v = _mm256_shuffle_epi8(raw, spread);  // one group of eight codes per 64-bit lane
  const __m256i d = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi64x((int64_t{1} << (4 * B)) - 1)),
                                    _mm256_slli_epi64(_mm256_srli_epi64(v, 4 * B), 32));  // codes 4..7 up
  const __m256i w = _mm256_or_si256(_mm256_and_si256(d, _mm256_set1_epi32((1 << (2 * B)) - 1)),
                                    _mm256_slli_epi32(_mm256_srli_epi32(d, 2 * B), 16));  // codes 2, 3 up
  return _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi16((1 << B) - 1)),
                         _mm256_slli_epi16(_mm256_srli_epi16(w, B), 8));  // code 1 up
}

// pack<B>: whole steps of 32 codes while both 16-byte stores stay inside the output (the second, at
// 2B, overwrites what the first wrote past its 2B bytes), the rest by the portable loop.
template <int B>
GCZ_AVX2_INLINE void pack_avx2(const uint8_t* c, uint64_t n, uint8_t* out) {
  const uint64_t bytes = packed_size<B>(n);
  const __m256i gather = gather_bytes<B>();
  uint64_t k = 0;
  for (; k + 32 <= n && k / 8 * B + 2 * B + 16 <= bytes; k += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + k));
    const __m256i w = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16(0xFF)),
                                      _mm256_slli_epi16(_mm256_srli_epi16(v, 8), B));    // code 1 down
    const __m256i d = _mm256_madd_epi16(w, _mm256_set1_epi32(1 | (1 << (2 * B + 16))));  // codes 2, 3 down
    const __m256i q = _mm256_or_si256(_mm256_and_si256(d, _mm256_set1_epi64x(0xFFFFFFFF)),
                                      _mm256_slli_epi64(_mm256_srli_epi64(d, 32), 4 * B));  // codes 4..7 down
    const __m256i packed = _mm256_shuffle_epi8(q, gather);  // each half's 2B bytes first
    uint8_t* o = out + k / 8 * B;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(packed));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * B), _mm256_extracti128_si256(packed, 1));
  }
  pack<B>(c + k, n - k, out + k / 8 * B);
}
#endif

}  // namespace gcz::detail::qsgd

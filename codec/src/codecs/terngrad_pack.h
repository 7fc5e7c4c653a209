// TernGrad's trit packings (terngrad::pack_base3 / pack_2bit over a whole run; docs/codecs/terngrad.md):
// the portable pack and unpack, and the AVX2 pieces of base3 packing (each step's trits weighted by
// 3^(e mod 5), a round of 160 weighted trits summed into 32 bytes). Force-inlined into the span loops
// (terngrad_span.cpp); include from there only.
//
//   terngrad::pack(true, trits, n, out);             // ceil(n / 5) bytes
//   bool clean = terngrad::unpack(true, in, n, trits);  // false: an invalid byte or nonzero padding
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "codecs/span_inline.h"
#include "gcz/detail/terngrad_math.h"

#if defined(__x86_64__)
#include "codecs/avx2_bytes.h"
#endif

namespace gcz::detail::terngrad {

// pack_base3 of t[0..5) with one multiply: the eight bytes at t (little-endian; the last three are
// ignored) times 81 + 27 * 2^8 + 9 * 2^16 + 3 * 2^24 + 2^32 hold t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4 in
// byte 4. No byte of the product below it exceeds 2 * (81 + 27 + 9 + 3) = 240, so no carry reaches it.
GCZ_CPU_INLINE uint8_t pack_base3_word(const uint8_t* t) {
  if constexpr (std::endian::native != std::endian::little) return pack_base3(t);
  uint64_t v;
  std::memcpy(&v, t, 8);
  return static_cast<uint8_t>((v * 0x0103091B51ull) >> 32);
}

// Packs n trits; a partial last byte holds zero trits in its unused places. base3 reads t up to 3
// bytes past the last whole group of five (the scratch has room).
GCZ_CPU_INLINE void pack(bool base3, const uint8_t* t, uint64_t n, uint8_t* out) {
  const uint64_t per = base3 ? 5 : 4, full = n / per;
  if (base3) {
    for (uint64_t j = 0; j < full; ++j) out[j] = pack_base3_word(t + 5 * j);
  } else {
    for (uint64_t j = 0; j < full; ++j) out[j] = pack_2bit(t + 4 * j);
  }
  if (const uint64_t rem = n % per) {
    uint8_t last[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(last, t + per * full, rem);
    out[full] = base3 ? pack_base3(last) : pack_2bit(last);
  }
}

// The five trits of each base-3 byte (bytes 243..255 hold none: all zero here, rejected before use).
struct Base3Table {
  std::array<std::array<uint8_t, 5>, 256> trits{};
  constexpr Base3Table() {
    for (unsigned b = 0; b < 243; ++b) {
      for (unsigned k = 0, v = b; k < 5; ++k, v /= 3) trits[b][k] = static_cast<uint8_t>(v % 3);
    }
  }
};
inline constexpr Base3Table kBase3;

// Unpacks n trits into t (room for a whole last byte); false on an invalid byte or code, or nonzero
// trits in a partial last byte.
GCZ_CPU_INLINE bool unpack(bool base3, const uint8_t* in, uint64_t n, uint8_t* t) {
  const uint64_t per = base3 ? 5 : 4, bytes = n / per + (n % per != 0);
  unsigned bad = 0;
  if (base3) {
    for (uint64_t j = 0; j < bytes; ++j) {
      bad |= in[j] >= 243 ? 1u : 0u;
      std::memcpy(t + 5 * j, kBase3.trits[in[j]].data(), 5);
    }
  } else {
    for (uint64_t j = 0; j < bytes; ++j) {
      const unsigned b = in[j];
      bad |= (b & (b >> 1) & 0x55u) != 0 ? 1u : 0u;  // a code 3
      for (int k = 0; k < 4; ++k) t[4 * j + k] = static_cast<uint8_t>((b >> (2 * k)) & 3u);
    }
  }
  for (uint64_t k = n; k < bytes * per; ++k) bad |= t[k];
  return bad == 0;
}

#if defined(__x86_64__)
// Base3 in vectors. A round of 160 elements (five steps of 32) packs into 32 bytes: byte m holds
// the trits of elements 5m .. 5m + 4 as t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4. Each step makes its trits
// already times their weights, w = t * 3^(e mod 5) for element e of the round (kPlus = 1 gives the
// weight, kMinus = 2 twice it), and byte m is then the sum of w over its five elements.

// The weight 3^(e mod 5) of each byte of step k, in the packs' interleaved order: byte b of the step
// holds element 8 ((b mod 16) / 4) + 4 (b / 16) + b mod 4 of it (avx2::pack_interleaved), and that
// element is 32 k + it of the round. w[1] holds the weights times two.
struct Base3Weights {
  alignas(32) uint8_t w[2][5][32];
  constexpr Base3Weights() : w{} {
    constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
    for (int k = 0; k < 5; ++k) {
      for (int b = 0; b < 32; ++b) {
        const int e = 32 * k + 8 * ((b % 16) / 4) + 4 * (b / 16) + b % 4;
        w[0][k][b] = kPow3[e % 5];
        w[1][k][b] = static_cast<uint8_t>(2 * kPow3[e % 5]);
      }
    }
  }
};
inline constexpr Base3Weights kBase3Weights;

// The compaction of a round: for the window sums of 16-byte piece q (S below), byte j of a lane takes
// byte 5 j - 16 q of the piece where that lies in it (output j of the lane begins there), else 0.
struct Base3Picks {
  alignas(32) int8_t at[5][32];
  constexpr Base3Picks() : at{} {
    for (int q = 0; q < 5; ++q) {
      for (int b = 0; b < 32; ++b) {
        const int from = 5 * (b % 16) - 16 * q;
        at[q][b] = static_cast<int8_t>(from >= 0 && from < 16 ? from : -128);
      }
    }
  }
};
inline constexpr Base3Picks kBase3Picks;

GCZ_AVX2_INLINE __m256i load256(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }

// The same from 32 trits in element order (the scalar loop's).
GCZ_AVX2_INLINE __m256i weigh_trits(__m256i t, int k) {
  const __m256i w = avx2::in_element_order(load256(kBase3Weights.w[0][k]));
  const __m256i plus = _mm256_cmpeq_epi8(t, _mm256_set1_epi8(kPlus));
  const __m256i minus = _mm256_cmpeq_epi8(t, _mm256_set1_epi8(kMinus));
  return _mm256_or_si256(_mm256_and_si256(plus, w), _mm256_and_si256(minus, _mm256_add_epi8(w, w)));
}

// The 32 bytes of a round from its weighted trits w[0..4] (160 bytes in element order). With the
// round cut into 16-byte pieces C0 .. C9, the vectors Y_q = (C_q, C_q+5) put pieces q and q + 5 in
// the two lanes, so that every lane-wise step below works on both halves of the round at once. In
// each lane, S[b] = Y[b] + .. + Y[b + 4] (reading on into Y_q+1): A[b] = Y[b] + Y[b + 1], then
// A[b] + A[b + 2] + Y[b + 4]. The bytes wrap, but an output's five weighted trits sum to at most
// 2 (81 + 27 + 9 + 3 + 1) = 242. Output m of a lane is S at 5 m, picked from the piece that holds it
// (kBase3Picks). The windows that read past piece 4 (and 9) start at bytes 12 and on of it, and no
// output starts there (5 m - 64 is 1, 6 or 11), so Y_4 stands in for the missing Y_5.
GCZ_AVX2_INLINE __m256i base3_round(const __m256i* w) {
  __m256i y[6];
  y[0] = _mm256_blend_epi32(w[0], w[2], 0xF0);         // C0 C5
  y[1] = _mm256_permute2x128_si256(w[0], w[3], 0x21);  // C1 C6
  y[2] = _mm256_blend_epi32(w[1], w[3], 0xF0);         // C2 C7
  y[3] = _mm256_permute2x128_si256(w[1], w[4], 0x21);  // C3 C8
  y[4] = _mm256_blend_epi32(w[2], w[4], 0xF0);         // C4 C9
  y[5] = y[4];
  __m256i a[6], out = _mm256_setzero_si256();
  for (int q = 0; q < 5; ++q) a[q] = _mm256_add_epi8(y[q], _mm256_alignr_epi8(y[q + 1], y[q], 1));
  a[5] = a[4];
  for (int q = 0; q < 5; ++q) {
    const __m256i b = _mm256_add_epi8(a[q], _mm256_alignr_epi8(a[q + 1], a[q], 2));
    const __m256i sum = _mm256_add_epi8(b, _mm256_alignr_epi8(y[q + 1], y[q], 4));
    out = _mm256_or_si256(out, _mm256_shuffle_epi8(sum, load256(kBase3Picks.at[q])));
  }
  return out;
}
#endif

}  // namespace gcz::detail::terngrad

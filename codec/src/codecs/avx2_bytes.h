// AVX2 pieces the quantizers' span loops share (qsgd_span.cpp, terngrad_span.cpp): a group's walk in
// steps of 32 values (its last few masked), narrowing 32 32-bit lanes to 32 bytes (values 0..255, or
// signs and masks) in element order and back, and the max of eight int32 lanes. Each function is
// force-inlined into AVX2 code only; include this file from x86-64 translation units.
//
//   __m256i bytes = gcz::detail::avx2::pack_interleaved(c0, c1, c2, c3);  // lanes 0..255
//   _mm256_storeu_si256(out, gcz::detail::avx2::in_element_order(bytes));
#pragma once

#include <cstdint>
#include <cstring>

#include "codecs/quant_uniforms.h"
#include "codecs/span_inline.h"
#include "codecs/x86_intrinsics.h"

namespace gcz::detail::avx2 {

// The 32 lanes of a..d (each 0..255) as bytes, with their 128-bit halves interleaved the way the
// AVX2 packs leave them: a[0..3] b[0..3] c[0..3] d[0..3] | a[4..7] b[4..7] c[4..7] d[4..7]. Lane-wise
// work on bytes can happen in this order; in_element_order then puts element k at byte k.
GCZ_AVX2_INLINE __m256i pack_interleaved(__m256i a, __m256i b, __m256i c, __m256i d) {
  return _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
}
// The same narrowing with signed saturation all the way: each byte keeps its lane's sign (and a lane
// of all ones stays 0xFF), for sign bits and masks.
GCZ_AVX2_INLINE __m256i pack_signed_interleaved(__m256i a, __m256i b, __m256i c, __m256i d) {
  return _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
}
GCZ_AVX2_INLINE __m256i in_element_order(__m256i interleaved) {
  return _mm256_permutevar8x32_epi32(interleaved, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The inverse of in_element_order: 32 bytes in element order (a load) into the packs' order.
GCZ_AVX2_INLINE __m256i in_pack_order(__m256i ordered) {
  return _mm256_permutevar8x32_epi32(ordered, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
}

// Prefetches the `lines` cache lines that start kAhead float32 values past x, with `hint`. The address
// is formed as an integer: it may lie past the end of the input, where a prefetch does not fault.
template <long kAhead, auto kHint = _MM_HINT_T0, int kLines = 1>
GCZ_AVX2_INLINE void prefetch_ahead(const float* x) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(x) + sizeof(float) * kAhead;
  for (int k = 0; k < kLines; ++k) _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * k), kHint);
}

// TernGrad's span loops read their input once, in order, and each span's draws come first: the
// hardware prefetcher alone leaves the start of every span to wait for memory. So each of their
// steps of 32 elements also prefetches, into L2, the 128 bytes 8192 float32 values ahead, and the
// next span's start arrives while this span ends. (QSGD's maxima and TernGrad's moments prefetch
// too, each at its own distance: qsgd_span.cpp, terngrad_moments.cpp.)
inline constexpr long kPrefetchAhead = 8192;
GCZ_AVX2_INLINE void prefetch_next_span(const float* x) { prefetch_ahead<kPrefetchAhead, _MM_HINT_T1, 2>(x); }

// The 32 float32 values at x as bits, in four vectors (the span loops' step).
GCZ_AVX2_INLINE void load32(const float* x, __m256i* xi) {
  for (int k = 0; k < 4; ++k) xi[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * k));
}

// x[0, rest) as bits in four vectors, zeros in the lanes from rest on (which are not read).
GCZ_AVX2_INLINE void load_rest(const float* x, uint64_t rest, __m256i* xi) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int k = 0; k < 4; ++k) {
    const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rest) - 8 * k), lane);
    xi[k] = _mm256_castps_si256(_mm256_maskload_ps(x + 8 * k, in));
  }
}

// For the lambdas that steps32 calls: force-inlined AVX2 code like the functions here.
#define GCZ_AVX2_LAMBDA __attribute__((always_inline, target("avx2")))

// The tie masks (note_ties, in the packs' order) of the first `rest` elements of a step, rest 0..32.
struct PackedKeep {
  uint32_t mask[33];
  constexpr PackedKeep() : mask{} {
    for (unsigned rest = 0; rest <= 32; ++rest) {
      for (unsigned b = 0; b < 32; ++b) mask[rest] |= tie_element(b) < rest ? uint32_t{1} << b : 0u;
    }
  }
};
inline constexpr PackedKeep kPackedKeep;

// The span loops' walk over a group x[0, n): step(xi, i, bytes, keep) for each 32 elements from i,
// given as bits, writes their 32 result bytes at bytes and notes ties only where `keep` (a tie mask)
// has a bit (the elements that exist). The last (n mod 32) elements get the same step, with the
// lanes past the group loaded as zeros and the result through a buffer of which only they are kept.
// Even for one element this beats the scalar loops, whose rounding branches mispredict about every
// other time (on 16 MiB, `qsgd:group=100,bits=4` took 1.13 ns per element with its last 4 scalar,
// 0.73 so).
// kPrefetch: each whole step also prefetches the next span (prefetch_next_span).
template <bool kPrefetch, typename Step>
GCZ_AVX2_INLINE void steps32(const float* x, uint64_t n, uint8_t* out, const Step& step) {
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i xi[4];
    if constexpr (kPrefetch) prefetch_next_span(x + i);
    load32(x + i, xi);
    step(xi, i, out + i, ~uint32_t{0});
  }
  const uint64_t rest = n - i;
  if (rest == 0) return;
  __m256i xi[4];
  load_rest(x + i, rest, xi);
  alignas(32) uint8_t bytes[32];
  step(xi, i, bytes, kPackedKeep.mask[rest]);
  std::memcpy(out + i, bytes, rest);
}

GCZ_AVX2_INLINE int32_t hmax_epi32(__m256i v) {
  __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(m);
}

}  // namespace gcz::detail::avx2

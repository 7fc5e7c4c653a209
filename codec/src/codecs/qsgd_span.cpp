// QSGD span loops. Every helper is force-inlined into the two entry points per code width (SSE2 and
// AVX2), so each loop is compiled, and vectorized, once per instruction set. The bit packing is in
// qsgd_pack.h.
#include "codecs/qsgd_span.h"

#include <algorithm>
#include <cstring>

#include "codecs/qsgd_pack.h"
#include "codecs/quant_uniforms.h"
#include "codecs/span_inline.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/qsgd_math.h"
#include "gcz/detail/quant_reduce.h"

#if defined(__x86_64__)
#include "codecs/avx2_bytes.h"
#endif

namespace gcz::detail {
namespace {

using namespace qsgd;

GCZ_CPU_INLINE uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// max over the group of |x| (finite elements only), exact: a max over the bits as signed integers
// (|x| < 2^31 as bits), which vectorizes where a float max reduction would not.
GCZ_CPU_INLINE float group_max(const float* x, uint64_t n) {
  int32_t m = 0;
  for (uint64_t i = 0; i < n; ++i) m = std::max(m, static_cast<int32_t>(finite_abs_bits(x[i])));
  return bit_cast<float>(m);
}

// ||x_G||_2 of the finite elements, rounded up to float32: the squares (exact in float64) summed in
// the order of gcz/detail/quant_reduce.h, sqrt in float64.
GCZ_CPU_INLINE float group_l2(const float* x, uint64_t n) {
  PairwiseSum sum;
  for (uint64_t b = 0; b < n; b += kSumBlock) {
    const float* xb = x + b;
    const uint64_t m = std::min(kSumBlock, n - b);
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t i = 0;
    for (; i + 8 <= m; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const double a = finite_abs(xb[i + j]);
        lane[j] += a * a;
      }
    }
    for (int j = 0; i < m; ++i, ++j) {
      const double a = finite_abs(xb[i]);
      lane[j] += a * a;
    }
    sum.add(combine_lanes(lane));
  }
  return l2_scale(sum.total());
}

// Rounds the (floored) scale up to the stored dtype, writes its bytes and returns its float32 value:
// the value the decoder reads, which the encoder then quantizes with.
GCZ_CPU_INLINE float store_scale(float scale, DType dtype, std::byte* out) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, &scale, 4);
    return scale;
  }
  const uint16_t h = scale == 0.0f ? 0 : dtype == DType::kFloat16 ? ceil_to_f16(scale) : ceil_to_bf16(scale);
  std::memcpy(out, &h, 2);
  return dtype == DType::kFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
}

GCZ_CPU_INLINE float load_scale(const std::byte* in, DType dtype) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, in, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, in, 2);
  return dtype == DType::kFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// The codes of x[0, n), elements at .. at + n - 1 of the span: stochastic rounding takes each
// element's coarse draw byte u[i] and, when that does not settle it, its fine byte.
template <int B, bool kStochastic>
GCZ_CPU_INLINE void quantize_run(const float* x, const uint8_t* u, uint8_t* c, uint64_t n, float scale,
                                 const FineDraws& fine, uint64_t at) {
  const float s = static_cast<float>(levels(B)), inv = inverse_step(scale, levels(B));
  for (uint64_t i = 0; i < n; ++i) {
    if constexpr (kStochastic) {
      c[i] = static_cast<uint8_t>(quantize_drawn<B>(x[i], inv, s, scale, u[i], [&] { return fine.at(at + i); }));
    } else {
      c[i] = static_cast<uint8_t>(quantize<B, false>(x[i], inv, s, scale, 0.0f));
    }
  }
}

#if defined(__x86_64__)
// unpack<B>: whole steps of 32 codes while both 16-byte loads stay inside the stream, the rest (and
// the padding check) by the portable loop. (Called, not inlined, from decode_span, which is also
// compiled without AVX2.)
template <int B>
__attribute__((target("avx2"))) bool unpack_avx2(const uint8_t* in, uint64_t n, uint8_t* c) {
  const uint64_t bytes = ceil_div(n * B, 8);
  const __m256i spread = spread_bytes<B>();
  uint64_t k = 0;  // codes done
  for (; k + 32 <= n && k / 8 * B + 2 * B + 16 <= bytes; k += 32) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + k), unpack32_avx2<B>(in + k / 8 * B, spread));
  }
  return unpack<B>(in + k / 8 * B, n - k, c + k);
}
#endif

template <int B>
GCZ_CPU_INLINE void encode_span(const QsgdEncodeSpan& j) {
  const uint64_t groups = ceil_div(j.len, j.group);
  const std::size_t ssize = dtype_size(j.scale_dtype);
  for (uint64_t g = 0; g < groups; ++g) {
    const float* xg = j.x + g * j.group;
    const uint64_t n = std::min(j.group, j.len - g * j.group);
    const float raw = floor_scale(j.l2_scale ? group_l2(xg, n) : group_max(xg, n));
    j.scale[g] = store_scale(raw, j.scale_dtype, j.scales + g * ssize);
  }
  uint8_t* c = B == 8 ? j.codes : j.scratch;  // 8-bit codes are their own packing
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.group) {
    const uint64_t n = std::min(j.group, j.len - a);
    if (j.stochastic) {
      quantize_run<B, true>(j.x + a, j.u + a, c + a, n, j.scale[g], j.fine, a);
    } else {
      quantize_run<B, false>(j.x + a, j.u + a, c + a, n, j.scale[g], j.fine, a);
    }
  }
  if (B != 8) pack<B>(c, j.len, j.codes);
}

template <int B, bool kVectorPack = false>
GCZ_CPU_INLINE QsgdSpanError decode_span(const QsgdDecodeSpan& j) {
  const int s = levels(B);
  const uint64_t groups = ceil_div(j.len, j.group);
  const std::size_t ssize = dtype_size(j.scale_dtype);
  bool ok = true;
  for (uint64_t g = 0; g < groups; ++g) {
    const float scale = load_scale(j.scales + g * ssize, j.scale_dtype);
    ok = ok && scale >= 0.0f && scale <= kMaxFloat;
    j.step[g] = step(scale, s);
    j.scale[g] = scale;
  }
  if (!ok) return QsgdSpanError::kBadScale;
  const uint8_t* c = j.codes;
  if (B != 8) {
    bool padded;
    if constexpr (kVectorPack) {
      padded = unpack_avx2<B>(j.codes, j.len, j.scratch);
    } else {
      padded = unpack<B>(j.codes, j.len, j.scratch);
    }
    if (!padded) return QsgdSpanError::kPadding;
    c = j.scratch;
  }
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.group) {
    const uint64_t n = std::min(j.group, j.len - a);
    const float st = j.step[g], sc = j.scale[g];
    for (uint64_t i = 0; i < n; ++i) j.y[a + i] = dequantize<B>(c[a + i], st, sc);
  }
  return QsgdSpanError::kNone;
}

template <int B>
void encode_sse2(const QsgdEncodeSpan& j) {
  encode_span<B>(j);
}
template <int B>
QsgdSpanError decode_sse2(const QsgdDecodeSpan& j) {
  return decode_span<B>(j);
}
#if defined(__x86_64__)
// The AVX2 encoder: the same float32 operations as qsgd::quantize, eight lanes at a time, 32 codes
// per step. Scalar code finishes every group's last (size mod 32) elements, so any group size and
// alignment works.
// The group maxima are the first to read a span's values. On a 2-core Xeon whose hardware prefetcher
// did not keep up with a loop that computes between its loads, a prefetch of the cache line 4096
// elements (16 KiB, some three spans) ahead, once per line, took the 8-bit encode of 1 GiB from
// 5.3-5.4 to 6.0-6.1 GB/s and the 4-bit one from 5.2-5.3 to 5.7-5.8 (1024 or 2048 elements ahead
// helped 8 bits as much and 4 bits not at all; 8192, both a little less).
constexpr long kMaxAhead = 4096;

// max over the group of |x| as bits when every element is finite; a result >= 0x7F800000 (an Inf or
// NaN was seen) sends the caller to the exact group_max.
GCZ_AVX2_INLINE int32_t abs_bits_max_avx2(const float* x, uint64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    avx2::prefetch_ahead<kMaxAhead>(x + i);
    m0 = _mm256_max_epi32(m0, _mm256_and_si256(abs_mask, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
    m1 = _mm256_max_epi32(m1,
                          _mm256_and_si256(abs_mask, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8))));
  }
  if (i + 8 <= n) {
    m0 = _mm256_max_epi32(m0, _mm256_and_si256(abs_mask, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
    i += 8;
  }
  int32_t r = avx2::hmax_epi32(_mm256_max_epi32(m0, m1));
  for (; i < n; ++i) r = std::max(r, static_cast<int32_t>(bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu));
  return r;
}

// R = floor(2^17 r) of eight elements from their bits xi (qsgd::level_frac: l = R >> 17 and
// floor(2^17 frac) = R mod 2^17). kFinite: every element is known to be finite, so none needs zeroing.
// R is computed as min(a * inv17, s17) with inv17 = 2^17 inv and s17 = 2^17 s (s17 when a >= scale_ge,
// the stored scale, or +Inf for a zero scale): a power of two commutes with the rounding of a product
// in the normal range, and an r below 2^-126 gives level 0 and frac 0 either way. R is exact: r < 128,
// so R < 2^24.
template <bool kFinite>
GCZ_AVX2_INLINE __m256i fixed8_avx2(__m256i xi, __m256 inv17, __m256 s17, __m256 scale_ge) {
  __m256i abs_bits = _mm256_and_si256(xi, _mm256_set1_epi32(0x7FFFFFFF));
  if constexpr (!kFinite) {
    abs_bits = _mm256_and_si256(abs_bits, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), abs_bits));
  }
  const __m256 a = _mm256_castsi256_ps(abs_bits);
  __m256 r17 = _mm256_min_ps(_mm256_mul_ps(a, inv17), s17);  // min_ps(r, s) is r < s ? r : s
  r17 = _mm256_blendv_ps(r17, s17, _mm256_cmp_ps(a, scale_ge, _CMP_GE_OQ));
  return _mm256_cvttps_epi32(r17);
}

// The levels of 32 elements as bytes in the packs' order, from their R (fixed8_avx2). Nearest: frac >=
// 0.5 exactly when R mod 2^17 >= 2^16, so l + up = (R + 2^16) >> 17. Stochastic: R >> 9 narrows to 16
// bits as l * 2^8 + t, t = floor(2^17 frac) >> 9 the top byte of the rounding threshold, which the
// coarse draw bytes u (element order) meet: u < t rounds up, u > t down, and u = t (one element in
// 256) stays down here and is noted in tie_mask (note_ties) for a fine byte to settle.
template <bool kStochastic>
GCZ_AVX2_INLINE __m256i levels32_avx2(const __m256i* fx, const uint8_t* u, uint32_t& tie_mask) {
  if constexpr (kStochastic) {
    const __m256i w01 = _mm256_packus_epi32(_mm256_srli_epi32(fx[0], 9), _mm256_srli_epi32(fx[1], 9));
    const __m256i w23 = _mm256_packus_epi32(_mm256_srli_epi32(fx[2], 9), _mm256_srli_epi32(fx[3], 9));
    const __m256i low = _mm256_set1_epi16(0xFF);
    const __m256i l = _mm256_packus_epi16(_mm256_srli_epi16(w01, 8), _mm256_srli_epi16(w23, 8));
    const __m256i t = _mm256_packus_epi16(_mm256_and_si256(w01, low), _mm256_and_si256(w23, low));
    const __m256i d = avx2::in_pack_order(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u)));
    tie_mask = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(t, d)));  // the packs' order
    return _mm256_add_epi8(l, _mm256_min_epu8(_mm256_subs_epu8(t, d), _mm256_set1_epi8(1)));  // + (d < t)
  } else {
    tie_mask = 0;
    const __m256i half = _mm256_set1_epi32(0x10000);
    return avx2::pack_interleaved(
        _mm256_srli_epi32(_mm256_add_epi32(fx[0], half), 17), _mm256_srli_epi32(_mm256_add_epi32(fx[1], half), 17),
        _mm256_srli_epi32(_mm256_add_epi32(fx[2], half), 17), _mm256_srli_epi32(_mm256_add_epi32(fx[3], half), 17));
  }
}

// The codes of the 32 elements whose bits are xi (draw bytes at u), in element order at c, and in
// tie_mask those whose rounding waits for a fine byte (levels32_avx2).
template <int B, bool kStochastic, bool kFinite>
GCZ_AVX2_INLINE void codes32_avx2(const __m256i* xi, const uint8_t* u, __m256 inv17, __m256 s17, __m256 scale_ge,
                                  uint8_t* c, uint32_t& tie_mask) {
  __m256i fx[4];
  for (int k = 0; k < 4; ++k) fx[k] = fixed8_avx2<kFinite>(xi[k], inv17, s17, scale_ge);
  const __m256i levels = levels32_avx2<kStochastic>(fx, u, tie_mask);
  // Levels < 128 and the elements' bits packed alike to bytes (the signed saturating packs keep
  // each sign), both in the packs' interleaved order, which one permute of the codes undoes.
  const __m256i signs = avx2::pack_signed_interleaved(xi[0], xi[1], xi[2], xi[3]);
  // The sign bit (bit 7 of a byte, moved to bit B - 1) where x < 0 and the level is not 0.
  const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i neg = _mm256_and_si256(_mm256_andnot_si256(_mm256_cmpeq_epi8(levels, _mm256_setzero_si256()), signs), sign);
  if constexpr (B < 8) neg = _mm256_srli_epi16(neg, 8 - B);  // bit 15 stays in its byte, at bit 7 + B
  const __m256i codes = _mm256_or_si256(levels, neg);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c), avx2::in_element_order(codes));
}

// The codes of group x[0, n) (elements at .. at + n - 1 of the span) with stored scale `scale_value`;
// the elements whose rounding waits for a fine byte are noted in ties (note_ties). The last (n mod 32)
// elements take a masked step (avx2::steps32; their draw bytes are followed by others: u has room for
// 32 past any element). For a scale so small that 2^17 inv overflows (below about s * 2^-111) the
// scalar loop does the whole group.
template <int B, bool kStochastic, bool kFinite>
GCZ_AVX2_INLINE void quantize_run_avx2(const float* x, const uint8_t* u, uint8_t* c, uint64_t n, float scale_value,
                                       const FineDraws& fine, uint64_t at, uint32_t* ties, uint64_t& count) {
  const float inv17_value = inverse_step(scale_value, levels(B)) * 131072.0f;
  if (!(inv17_value <= kMaxFloat)) return quantize_run<B, kStochastic>(x, u, c, n, scale_value, fine, at);
  const __m256 inv17 = _mm256_set1_ps(inv17_value);
  const __m256 s17 = _mm256_set1_ps(static_cast<float>(levels(B)) * 131072.0f);
  const __m256 scale_ge = _mm256_set1_ps(scale_value > 0.0f ? scale_value : __builtin_inff());
  avx2::steps32<false>(x, n, c, [&](const __m256i* xi, uint64_t i, uint8_t* codes, uint32_t keep) GCZ_AVX2_LAMBDA {
    uint32_t tie_mask;
    codes32_avx2<B, kStochastic, kFinite>(xi, u + i, inv17, s17, scale_ge, codes, tie_mask);
    if constexpr (kStochastic) note_ties(tie_mask & keep, at + i, ties, count);
  });
}

// The codes of the span's elements noted in ties[0, 2 count) (note_ties): qsgd::quantize with the
// whole 16-bit draw.
template <int B>
GCZ_CPU_INLINE void settle_ties(const QsgdEncodeSpan& j, uint8_t* c, uint64_t count) {
  const float s = static_cast<float>(levels(B));
  for_each_tie(j.ties, count, j.fine, [&](uint64_t e, uint32_t fine) {
    const float scale = j.scale[e / j.group];
    const uint16_t draw = static_cast<uint16_t>((uint32_t{j.u[e]} << 8) | fine);
    c[e] = static_cast<uint8_t>(quantize<B, true>(j.x[e], inverse_step(scale, levels(B)), s, scale,
                                                  Rng::to_uniform(draw)));
  });
}

// One block x[0, m) of group_l2's sums (m <= kSumBlock; lane j adds the exact squares a * a of the
// elements k = j mod 8 in order, lanes 0-3 and 4-7 as two vectors of four doubles), combined as
// combine_lanes does; the max of the elements' |x| bits goes to mx and max_bits.
GCZ_AVX2_INLINE double l2_block_avx2(const float* x, uint64_t m, __m256i& mx, int32_t& max_bits) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  __m256d lo = _mm256_setzero_pd(), hi = lo;
  uint64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256i bits = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
    mx = _mm256_max_epi32(mx, bits);
    const __m256 a = _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_cmpgt_epi32(inf, bits)));  // finite_abs
    const __m256d a_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
    const __m256d a_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
    lo = _mm256_add_pd(lo, _mm256_mul_pd(a_lo, a_lo));
    hi = _mm256_add_pd(hi, _mm256_mul_pd(a_hi, a_hi));
  }
  double lane[8];
  _mm256_storeu_pd(lane, lo);
  _mm256_storeu_pd(lane + 4, hi);
  for (int j = 0; i < m; ++i, ++j) {
    const double a = finite_abs(x[i]);
    lane[j] += a * a;
    max_bits = std::max(max_bits, static_cast<int32_t>(bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu));
  }
  return combine_lanes(lane);
}

// group_l2, bit for bit, with the max of the elements' |x| bits (>= 0x7F800000: one is not finite)
// from the same pass. A group of one block needs no PairwiseSum: its total is the block's sum.
GCZ_AVX2_INLINE float group_l2_avx2(const float* x, uint64_t n, int32_t& max_bits) {
  __m256i mx = _mm256_setzero_si256();
  max_bits = 0;
  double total;
  if (n <= kSumBlock) {
    total = l2_block_avx2(x, n, mx, max_bits);
  } else {
    PairwiseSum sum;
    for (uint64_t b = 0; b < n; b += kSumBlock) sum.add(l2_block_avx2(x + b, std::min(kSumBlock, n - b), mx, max_bits));
    total = sum.total();
  }
  max_bits = std::max(max_bits, avx2::hmax_epi32(mx));
  return l2_scale(total);
}

// The span's scales first (max scale: a vector max, exact unless an element is not finite; l2 scale:
// group_l2_avx2), so that the groups' reductions overlap; then each group's codes, then the packing.
template <int B>
__attribute__((target("avx2"))) void encode_avx2(const QsgdEncodeSpan& j) {
  const std::size_t ssize = dtype_size(j.scale_dtype);
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.group) {
    const float* xg = j.x + a;
    const uint64_t n = std::min(j.group, j.len - a);
    float raw;
    if (j.l2_scale) {
      int32_t m;
      raw = group_l2_avx2(xg, n, m);
      j.finite[g] = m < 0x7F800000;
    } else {
      const int32_t m = abs_bits_max_avx2(xg, n);
      j.finite[g] = m < 0x7F800000;
      raw = j.finite[g] ? bit_cast<float>(m) : group_max(xg, n);
    }
    j.scale[g] = store_scale(floor_scale(raw), j.scale_dtype, j.scales + g * ssize);
  }
  uint8_t* c = B == 8 ? j.codes : j.scratch;
  uint64_t ties = 0;
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.group) {
    const float* xg = j.x + a;
    const uint64_t n = std::min(j.group, j.len - a);
    if (j.stochastic) {
      if (j.finite[g]) {
        quantize_run_avx2<B, true, true>(xg, j.u + a, c + a, n, j.scale[g], j.fine, a, j.ties, ties);
      } else {
        quantize_run_avx2<B, true, false>(xg, j.u + a, c + a, n, j.scale[g], j.fine, a, j.ties, ties);
      }
    } else {
      if (j.finite[g]) {
        quantize_run_avx2<B, false, true>(xg, j.u + a, c + a, n, j.scale[g], j.fine, a, j.ties, ties);
      } else {
        quantize_run_avx2<B, false, false>(xg, j.u + a, c + a, n, j.scale[g], j.fine, a, j.ties, ties);
      }
    }
  }
  settle_ties<B>(j, c, ties);
  if constexpr (kVectorPackable<B>) {
    pack_avx2<B>(c, j.len, j.codes);
  } else if constexpr (B != 8) {
    pack<B>(c, j.len, j.codes);
  }
}
template <int B>
__attribute__((target("avx2"))) QsgdSpanError decode_avx2(const QsgdDecodeSpan& j) {
  return decode_span<B, kVectorPackable<B>>(j);
}
#endif

template <int B>
void encode_dispatch(const QsgdEncodeSpan& j) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return encode_avx2<B>(j);
#endif
  encode_sse2<B>(j);
}
template <int B>
QsgdSpanError decode_dispatch(const QsgdDecodeSpan& j) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return decode_avx2<B>(j);
#endif
  return decode_sse2<B>(j);
}

}  // namespace

void qsgd_encode_span(int bits, const QsgdEncodeSpan& job) {
  switch (bits) {
    case 2: return encode_dispatch<2>(job);
    case 3: return encode_dispatch<3>(job);
    case 4: return encode_dispatch<4>(job);
    case 5: return encode_dispatch<5>(job);
    case 6: return encode_dispatch<6>(job);
    case 7: return encode_dispatch<7>(job);
    default: return encode_dispatch<8>(job);
  }
}

QsgdSpanError qsgd_decode_span(int bits, const QsgdDecodeSpan& job) {
  switch (bits) {
    case 2: return decode_dispatch<2>(job);
    case 3: return decode_dispatch<3>(job);
    case 4: return decode_dispatch<4>(job);
    case 5: return decode_dispatch<5>(job);
    case 6: return decode_dispatch<6>(job);
    case 7: return decode_dispatch<7>(job);
    default: return decode_dispatch<8>(job);
  }
}

}  // namespace gcz::detail

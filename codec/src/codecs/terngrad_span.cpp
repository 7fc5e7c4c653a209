// TernGrad span loops. Every helper is force-inlined into the entry points, which exist once for SSE2
// and once for AVX2, so each loop is compiled, and vectorized, per instruction set.
#include "codecs/terngrad_span.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "codecs/quant_uniforms.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/terngrad_math.h"

#if defined(__x86_64__)
#include "codecs/avx2_bytes.h"
#endif

namespace gcz::detail {
namespace {

using namespace terngrad;

#define GCZ_CPU_INLINE [[gnu::always_inline]] inline

GCZ_CPU_INLINE uint32_t abs_bits(float x) { return bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

// sigma from a range's sums S1, S2 over its n_f finite elements (TernGradMoments::sigma).
GCZ_CPU_INLINE double sigma_of(double s1, double s2, uint64_t finite) {
  if (finite == 0) return 0.0;
  const double n = static_cast<double>(finite);
  const double var = (s2 - (s1 * s1) / n) / n;
  return var > 0.0 ? std::sqrt(var) : 0.0;
}

// pack_base3 of t[0..5) with one multiply: the eight bytes at t (little-endian; the last three are
// ignored) times 81 + 27 * 2^8 + 9 * 2^16 + 3 * 2^24 + 2^32 hold t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4 in
// byte 4. No byte of the product below it exceeds 2 * (81 + 27 + 9 + 3) = 240, so no carry reaches it.
GCZ_CPU_INLINE uint8_t pack_base3_word(const uint8_t* t) {
  if constexpr (std::endian::native != std::endian::little) return pack_base3(t);
  uint64_t v;
  std::memcpy(&v, t, 8);
  return static_cast<uint8_t>((v * 0x0103091B51ull) >> 32);
}

// GCC vector types: the eight lanes of the sums as two vectors of four, written out because the
// compiler does not vectorize the lane loop by itself. Same operations, lane by lane, as the scalar tail.
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef double D4 __attribute__((vector_size(32)));
typedef int64_t L4 __attribute__((vector_size(32)));

// d = x - k for the four finite x, 0 for the others. (Results by reference: returning a 32-byte vector
// from a function compiled without AVX would change its ABI.)
GCZ_CPU_INLINE void shifted4(const float* x, double k, D4& d) {
  F4 v;
  I4 bits;
  std::memcpy(&v, x, sizeof v);
  std::memcpy(&bits, x, sizeof bits);
  const I4 finite = (bits & 0x7FFFFFFF) < 0x7F800000;
  d = __builtin_convertvector(v, D4) - k;
  d = __builtin_convertvector(finite, L4) ? d : D4{0, 0, 0, 0};
}

// One block (at most kSumBlock elements) of S1 and S2.
GCZ_CPU_INLINE void add_block(const float* x, uint64_t n, double k, TernGradMoments& m) {
  D4 s1a = {0, 0, 0, 0}, s1b = s1a, s2a = s1a, s2b = s1a;  // lanes 0-3 and 4-7
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    D4 da, db;
    shifted4(x + i, k, da);
    shifted4(x + i + 4, k, db);
    s1a += da;
    s1b += db;
    s2a += da * da;
    s2b += db * db;
  }
  double s1[8] = {s1a[0], s1a[1], s1a[2], s1a[3], s1b[0], s1b[1], s1b[2], s1b[3]};
  double s2[8] = {s2a[0], s2a[1], s2a[2], s2a[3], s2b[0], s2b[1], s2b[2], s2b[3]};
  for (int j = 0; i < n; ++i, ++j) {
    const double d = abs_bits(x[i]) < 0x7F800000u ? static_cast<double>(x[i]) - k : 0.0;
    s1[j] += d;
    s2[j] += d * d;
  }
  m.s1.add(combine_lanes(s1));
  m.s2.add(combine_lanes(s2));
}

// Sets K, the range's first finite element, if this part of the range holds it (elements before it
// are not finite and add nothing).
GCZ_CPU_INLINE void find_shift(const float* x, uint64_t n, TernGradMoments& m) {
  for (uint64_t i = 0; !m.has_shift && i < n; ++i) {
    if (abs_bits(x[i]) < 0x7F800000u) {
      m.shift = x[i];
      m.has_shift = true;
    }
  }
}

// One block's count, max and sums, every element checked for finiteness.
GCZ_CPU_INLINE void add_block_checked(const float* x, uint64_t n, TernGradMoments& m) {
  uint32_t count = 0;  // n <= kSumBlock
  int32_t mx = m.max_bits;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t a = abs_bits(x[i]);
    const bool finite = a < 0x7F800000u;
    count += finite ? 1u : 0u;
    mx = std::max(mx, finite ? static_cast<int32_t>(a) : 0);
  }
  m.finite += count;
  m.max_bits = mx;
  add_block(x, n, m.shift, m);
}

GCZ_CPU_INLINE void add_moments(const float* x, uint64_t n, TernGradMoments& m) {
  find_shift(x, n, m);
  for (uint64_t b = 0; b < n; b += kSumBlock) add_block_checked(x + b, std::min(kSumBlock, n - b), m);
}

GCZ_CPU_INLINE void group_scales(const float* x, uint64_t n, uint64_t group, double clip, float* scales) {
  for (uint64_t g = 0, b = 0; b < n; ++g, b += group) {
    TernGradMoments m;
    add_moments(x + b, std::min(group, n - b), m);
    scales[g] = m.scale(clip);
  }
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

// The trits of x[0, n), elements at .. at + n - 1 of the span: a stochastic draw takes each element's
// coarse draw byte u[i] and, when that does not settle it, its fine byte.
template <bool kStochastic>
GCZ_CPU_INLINE void trit_run(const float* x, const uint8_t* u, uint8_t* t, uint64_t n, float s, const FineDraws& fine,
                             uint64_t at) {
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (uint64_t i = 0; i < n; ++i) {
    if constexpr (kStochastic) {
      t[i] = static_cast<uint8_t>(trit_drawn(x[i], s, inv, u[i], [&] { return fine.at(at + i); }));
    } else {
      t[i] = static_cast<uint8_t>(trit<false>(x[i], s, inv, 0.0f));
    }
  }
}

// The trits of the span's elements noted in ties[0, 2 count) (note_ties; a zero trit so far), with
// the whole 16-bit draw, added into the packed bytes.
GCZ_CPU_INLINE void settle_ties(const TernGradEncodeSpan& j, uint64_t count) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  for_each_tie(j.ties, count, j.fine, [&](uint64_t e, uint32_t fine) {
    const float s = j.scales[e / j.piece], inv = s > 0.0f ? 1.0f / s : 0.0f;
    const uint16_t draw = static_cast<uint16_t>((uint32_t{j.u[e]} << 8) | fine);
    const uint32_t t = trit<true>(j.x[e], s, inv, Rng::to_uniform(draw));
    if (j.base3) {
      j.out[e / 5] = static_cast<uint8_t>(j.out[e / 5] + t * kPow3[e % 5]);
    } else {
      j.out[e / 4] = static_cast<uint8_t>(j.out[e / 4] | (t << (2 * (e % 4))));
    }
  });
}

// The five trits of each base-3 byte (bytes 243..255 hold none: all zero here, rejected before use).
struct Base3Table {
  std::array<std::array<uint8_t, 5>, 256> trits{};
  Base3Table() {
    for (unsigned b = 0; b < 243; ++b) {
      for (unsigned k = 0, v = b; k < 5; ++k, v /= 3) trits[b][k] = static_cast<uint8_t>(v % 3);
    }
  }
};
const Base3Table kBase3;

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

GCZ_CPU_INLINE void encode_span(const TernGradEncodeSpan& j) {
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.piece) {
    const uint64_t n = std::min(j.piece, j.len - a);
    if (j.stochastic) {
      trit_run<true>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a);
    } else {
      trit_run<false>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a);
    }
  }
  pack(j.base3, j.scratch, j.len, j.out);
}

GCZ_CPU_INLINE bool decode_span(const TernGradDecodeSpan& j) {
  if (!unpack(j.base3, j.in, j.len, j.scratch)) return false;
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.piece) {
    const uint64_t n = std::min(j.piece, j.len - a);
    const float s = j.scales[g];
    const uint8_t* t = j.scratch + a;
    float* y = j.y + a;
    for (uint64_t i = 0; i < n; ++i) y[i] = detrit(t[i], s);
  }
  return true;
}

void moments_sse2(const float* x, uint64_t n, TernGradMoments& m) { add_moments(x, n, m); }
void group_scales_sse2(const float* x, uint64_t n, uint64_t group, double clip, float* scales) {
  group_scales(x, n, group, clip, scales);
}
void encode_sse2(const TernGradEncodeSpan& j) { encode_span(j); }
bool decode_sse2(const TernGradDecodeSpan& j) { return decode_span(j); }
#if defined(__x86_64__)
// The AVX2 loops: the same operations as the portable ones, written out with intrinsics.
#define GCZ_AVX2_FMA_INLINE [[gnu::always_inline, gnu::target("avx2,fma")]] inline

// A block's sums when all its elements are finite (then its count is its length and no element
// needs zeroing): lanes 0-3 and 4-7 of add_block as two vectors of four doubles per sum, with the max
// of the bits taken in the same pass.
struct BlockSums {
  double s1[8], s2[8];
  int32_t max_bits;
};

// The sums of the eight elements at x into (s1a, s1b, s2a, s2b), and their bits' max into mx. d = x - K
// is computed as fma(x, 1, -K): the same single rounding, on the multiply ports, which leaves the add
// ports (where the conversions also run) to the sums. Nothing else here may fuse (-ffp-contract=off).
// The conversions read memory directly, saving the extraction of the high half.
GCZ_AVX2_FMA_INLINE void add8_avx2(const float* x, __m256d k, __m256d& s1a, __m256d& s1b, __m256d& s2a,
                                   __m256d& s2b, __m256i& mx) {
  const __m256i xi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  mx = _mm256_max_epi32(mx, _mm256_and_si256(xi, _mm256_set1_epi32(0x7FFFFFFF)));
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d da = _mm256_fmsub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x)), one, k);
  const __m256d db = _mm256_fmsub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + 4)), one, k);
  s1a = _mm256_add_pd(s1a, da);
  s1b = _mm256_add_pd(s1b, db);
  s2a = _mm256_add_pd(s2a, _mm256_mul_pd(da, da));
  s2b = _mm256_add_pd(s2b, _mm256_mul_pd(db, db));
}

GCZ_AVX2_INLINE void store_sums(__m256d s1a, __m256d s1b, __m256d s2a, __m256d s2b, __m256i mx, BlockSums& out) {
  _mm256_storeu_pd(out.s1, s1a);
  _mm256_storeu_pd(out.s1 + 4, s1b);
  _mm256_storeu_pd(out.s2, s2a);
  _mm256_storeu_pd(out.s2 + 4, s2b);
  out.max_bits = avx2::hmax_epi32(mx);
}

// One block x[0, n), any n <= kSumBlock: whole lanes in vectors, the rest as add_block does.
GCZ_AVX2_FMA_INLINE void one_block_avx2(const float* x, uint64_t n, double shift, BlockSums& a) {
  const __m256d k = _mm256_set1_pd(shift);
  __m256d s1a = _mm256_setzero_pd(), s1b = s1a, s2a = s1a, s2b = s1a;
  __m256i mx = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) add8_avx2(x + i, k, s1a, s1b, s2a, s2b, mx);
  store_sums(s1a, s1b, s2a, s2b, mx, a);
  for (int j = 0; i < n; ++i, ++j) {
    a.max_bits = std::max(a.max_bits, static_cast<int32_t>(abs_bits(x[i])));
    const double d = static_cast<double>(x[i]) - shift;
    a.s1[j] += d;
    a.s2[j] += d * d;
  }
}

// Adds block x[0, n) to m: from its fast sums if it was all finite, else element by element.
GCZ_AVX2_INLINE void commit_block(const float* x, uint64_t n, const BlockSums& b, TernGradMoments& m) {
  if (b.max_bits >= 0x7F800000) return add_block_checked(x, n, m);
  m.s1.add(combine_lanes(b.s1));
  m.s2.add(combine_lanes(b.s2));
  m.finite += n;
  m.max_bits = std::max(m.max_bits, b.max_bits);
}

__attribute__((target("avx2,fma"))) void moments_avx2(const float* x, uint64_t n, TernGradMoments& m) {
  find_shift(x, n, m);
  uint64_t b = 0;
  if (!m.has_shift) {  // no finite element at all: every block adds zeros
    for (; b < n; b += kSumBlock) add_block_checked(x + b, std::min(kSumBlock, n - b), m);
    return;
  }
  BlockSums s0;
  for (; b < n; b += kSumBlock) {
    const uint64_t len = std::min(kSumBlock, n - b);
    one_block_avx2(x + b, len, m.shift, s0);
    commit_block(x + b, len, s0, m);
  }
}

// S1 and S2 of a block whose whole lanes are in registers, as (S1, S2): combine_lanes of each, in its
// order ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), with no trip through memory.
GCZ_AVX2_INLINE __m128d combine_lanes_avx2(__m256d s1a, __m256d s1b, __m256d s2a, __m256d s2b) {
  const __m256d t1 = _mm256_hadd_pd(s1a, s1b), t2 = _mm256_hadd_pd(s2a, s2b);  // l0+l1, l4+l5, l2+l3, l6+l7
  const __m128d u1 = _mm_add_pd(_mm256_castpd256_pd128(t1), _mm256_extractf128_pd(t1, 1));
  const __m128d u2 = _mm_add_pd(_mm256_castpd256_pd128(t2), _mm256_extractf128_pd(t2, 1));
  return _mm_hadd_pd(u1, u2);
}

// A group of one block (G <= kSumBlock) whose first element is finite (so K = x[0]) and, as the fast
// sums then show, all the others too, has its moments straight from one_block_avx2's lanes, with no
// TernGradMoments; a group that is not so takes the general path. Groups of whole lanes keep their
// sums in registers and leave sigma and the scale to a second loop over a batch of groups, whose
// divisions and square roots then overlap instead of stalling each group.
__attribute__((target("avx2,fma"))) void group_scales_avx2(const float* x, uint64_t n, uint64_t group, double clip,
                                                       float* scales) {
  constexpr int kBatch = 32;
  struct Pending {
    uint64_t g;
    double s1, s2;
    int32_t max_bits;
  } pending[kBatch];
  const bool whole_lanes = group <= kSumBlock && group % 8 == 0;
  BlockSums sums;
  for (uint64_t g = 0, b = 0; b < n;) {
    int count = 0;
    for (; count < kBatch && b < n; ++g, b += group) {
      const uint64_t len = std::min(group, n - b);
      if (len <= kSumBlock && abs_bits(x[b]) < 0x7F800000u) {
        if (whole_lanes && len == group) {
          const __m256d k = _mm256_set1_pd(x[b]);
          __m256d s1a = _mm256_setzero_pd(), s1b = s1a, s2a = s1a, s2b = s1a;
          __m256i mx = _mm256_setzero_si256();
          for (uint64_t i = 0; i < len; i += 8) add8_avx2(x + b + i, k, s1a, s1b, s2a, s2b, mx);
          const int32_t max_bits = avx2::hmax_epi32(mx);
          if (max_bits < 0x7F800000) {
            const __m128d both = combine_lanes_avx2(s1a, s1b, s2a, s2b);
            pending[count++] = {g, _mm_cvtsd_f64(both), _mm_cvtsd_f64(_mm_unpackhi_pd(both, both)), max_bits};
            continue;
          }
        } else {
          one_block_avx2(x + b, len, x[b], sums);
          if (sums.max_bits < 0x7F800000) {
            const double sigma = clip > 0.0 ? sigma_of(combine_lanes(sums.s1), combine_lanes(sums.s2), len) : 0.0;
            scales[g] = scale_from_stats(bit_cast<float>(sums.max_bits), sigma, clip);
            continue;
          }
        }
      }
      TernGradMoments m;
      moments_avx2(x + b, len, m);
      scales[g] = m.scale(clip);
    }
    for (int q = 0; q < count; ++q) {
      const Pending& p = pending[q];
      const double sigma = clip > 0.0 ? sigma_of(p.s1, p.s2, group) : 0.0;
      scales[p.g] = scale_from_stats(bit_cast<float>(p.max_bits), sigma, clip);
    }
  }
}

// One scale's constants for the trit loops, broadcast. The vector loops compute p times `pscale`:
// inv for deterministic rounding, inv * 2^17 for stochastic, where they test floor(2^17 p) > 2 d. The
// products are those of terngrad::trit exactly scaled by 2^17 (a power of two commutes with the
// rounding of a product in the normal range, and a subnormal p gives floor 0 either way), unless
// inv * 2^17 overflows (s < 2^-110): `vector` is false then and the scalar loop runs.
//
// The vector loops also skip trit()'s rule p = 1 for a = s: there p = s * fl(1 / s) >= 1 - 2^-20
// (1 / s may be subnormal), which is >= 0.5, and whose threshold byte is 255 (as for p = 1 once
// saturated), so that the same draws are nonzero and the same ones tie (and are settled by trit()).
struct TritScale {
  __m256 s, pscale;
  bool vector;
};
template <bool kStochastic>
GCZ_AVX2_INLINE TritScale trit_scale(float s) {
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  const float pscale = kStochastic ? inv * 131072.0f : inv;
  return {_mm256_set1_ps(s), _mm256_set1_ps(pscale), pscale <= 3.40282346638528859812e+38f};
}

// p of eight elements (their bits xi) times c.pscale (any value for a non-finite x, which `finite`
// masks), with a = min(|x|, s).
GCZ_AVX2_INLINE __m256 p8_avx2(__m256i xi, const TritScale& c, __m256i& finite) {
  const __m256 y = _mm256_castsi256_ps(_mm256_and_si256(xi, _mm256_set1_epi32(0x7FFFFFFF)));  // |x|
  finite = _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
  return _mm256_mul_ps(_mm256_min_ps(y, c.s), c.pscale);
}

// The trits of the 32 elements whose bits are xi, as bytes at t: terngrad::trit<kStochastic> lane by
// lane. The elements' bits are packed to bytes (the signed saturating packs keep each sign); a nonzero
// trit has |x| > 0, so its sign is x's sign bit: 1 - (x < 0 ? -1 : 0) is kPlus or kMinus.
// Deterministic: the nonzero masks are packed alike. Stochastic: floor(2^17 p) >> 9 narrows to a byte
// d, the top byte of the draw's threshold (terngrad::trit_drawn), which the coarse draw bytes u meet:
// u < d is nonzero, u > d zero, and u = d (one element in 256) stays zero here and is noted in
// tie_mask (bit k for element k) for its fine byte to settle. The packs saturate d = 256 (p = 1) to
// 255, which is still exact: every u below 255 is nonzero then, and u = 255 is settled.
template <bool kStochastic>
GCZ_AVX2_INLINE void trits32_avx2(const __m256i* xi, const uint8_t* u, const TritScale& c, uint8_t* t,
                                  uint32_t& tie_mask) {
  __m256i fin[4];
  __m256 p[4];
  for (int k = 0; k < 4; ++k) p[k] = p8_avx2(xi[k], c, fin[k]);
  const __m256i signs = avx2::pack_signed_interleaved(xi[0], xi[1], xi[2], xi[3]);
  const __m256i code = _mm256_sub_epi8(_mm256_set1_epi8(1), _mm256_cmpgt_epi8(_mm256_setzero_si256(), signs));
  __m256i trits;
  if constexpr (kStochastic) {
    __m256i top[4];  // 0 for a non-finite x: its trit is zero (or settled as a tie, to zero)
    for (int k = 0; k < 4; ++k) top[k] = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvttps_epi32(p[k]), 9), fin[k]);
    const __m256i d = _mm256_packus_epi16(_mm256_packus_epi32(top[0], top[1]), _mm256_packus_epi32(top[2], top[3]));
    const __m256i draws = avx2::in_pack_order(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u)));
    tie_mask = static_cast<uint32_t>(_mm256_movemask_epi8(avx2::in_element_order(_mm256_cmpeq_epi8(d, draws))));
    const __m256i zero = _mm256_cmpeq_epi8(_mm256_subs_epu8(d, draws), _mm256_setzero_si256());  // u >= d
    trits = _mm256_andnot_si256(zero, code);
  } else {
    tie_mask = 0;
    __m256i on[4];
    for (int k = 0; k < 4; ++k) {
      on[k] = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(p[k], _mm256_set1_ps(0.5f), _CMP_GE_OQ)), fin[k]);
    }
    trits = _mm256_and_si256(avx2::pack_signed_interleaved(on[0], on[1], on[2], on[3]), code);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(t), avx2::in_element_order(trits));
}

// The trits of x[0, n), elements at .. at + n - 1 of the span; the elements whose draw waits for a
// fine byte are noted in ties (note_ties). The last (n mod 32) elements take a masked step
// (avx2::steps32; their draw bytes are followed by others: u has room for 32 past any element).
template <bool kStochastic>
GCZ_AVX2_INLINE void trit_run_avx2(const float* x, const uint8_t* u, uint8_t* t, uint64_t n, float s,
                                   const FineDraws& fine, uint64_t at, uint32_t* ties, uint64_t& count) {
  const TritScale c = trit_scale<kStochastic>(s);
  if (!c.vector) return trit_run<kStochastic>(x, u, t, n, s, fine, at);
  avx2::steps32<true>(x, n, t, [&](const __m256i* xi, uint64_t i, uint8_t* trits, uint32_t keep) GCZ_AVX2_LAMBDA {
    uint32_t tie_mask;
    trits32_avx2<kStochastic>(xi, u + i, c, trits, tie_mask);
    if constexpr (kStochastic) note_ties(tie_mask & keep, at + i, ties, count);
  });
}

// The 32 base3 bytes of the 160 trits at t, unrolled: four instructions a byte.
GCZ_CPU_INLINE void pack_base3_160(const uint8_t* t, uint8_t* out) {
#pragma GCC unroll 32
  for (int k = 0; k < 32; ++k) out[k] = pack_base3_word(t + 5 * k);
}

// One step of 32 trits at element i of a span whose pieces hold whole steps: g is the step's scale,
// `left` the elements left in its piece, c its constants; ties as for trit_run_avx2.
template <bool kStochastic>
GCZ_AVX2_INLINE void trit_step(const TernGradEncodeSpan& j, uint64_t i, uint64_t& g, uint64_t& left, TritScale& c,
                               uint64_t& ties) {
  if (left == 0) {
    c = trit_scale<kStochastic>(j.scales[++g]);
    left = j.piece;
  }
  left -= 32;
  if (c.vector) {
    uint32_t tie_mask;
    __m256i xi[4];
    avx2::prefetch_next_span(j.x + i);
    avx2::load32(j.x + i, xi);
    trits32_avx2<kStochastic>(xi, j.u + i, c, j.scratch + i, tie_mask);
    if constexpr (kStochastic) note_ties(tie_mask, i, j.ties, ties);
  } else {
    trit_run<kStochastic>(j.x + i, j.u + i, j.scratch + i, 32, j.scales[g], j.fine, i);
  }
}

// When every scale's piece holds whole steps of 32 (a tensor scale, a group that holds the span, or
// a group size that is a multiple of 32), base3 packing runs inside the trit loop, one round of five
// steps (160 trits, 32 bytes) behind it: its scalar multiplies then overlap the vector work, and
// reading bytes not long stored does not stall on store forwarding. Returns the ties noted.
template <bool kStochastic>
GCZ_AVX2_INLINE uint64_t trit_pack_run_avx2(const TernGradEncodeSpan& span) {
  const TernGradEncodeSpan j = span;  // a copy: the byte stores cannot alias its fields
  uint64_t g = 0, left = j.piece, ties = 0;
  TritScale c = trit_scale<kStochastic>(j.scales[0]);
  uint64_t i = 0;
  for (; i + 160 <= j.len; i += 160) {
    for (uint64_t k = 0; k < 160; k += 32) trit_step<kStochastic>(j, i + k, g, left, c, ties);
    if (i > 0) pack_base3_160(j.scratch + i - 160, j.out + (i - 160) / 5);
  }
  for (; i + 32 <= j.len; i += 32) trit_step<kStochastic>(j, i, g, left, c, ties);
  if (left == 0 && i < j.len) ++g;
  trit_run<kStochastic>(j.x + i, j.u + i, j.scratch + i, j.len - i, j.scales[g], j.fine, i);  // the last (len mod 32)
  const uint64_t packed = j.len >= 160 ? (j.len / 160 - 1) * 32 : 0;  // bytes written to out
  pack(true, j.scratch + 5 * packed, j.len - 5 * packed, j.out + packed);
  return ties;
}

// The trits, packed, then the ties settled in the packed bytes.
__attribute__((target("avx2"))) void encode_avx2(const TernGradEncodeSpan& j) {
  uint64_t ties = 0;
  if (j.base3 && (j.piece >= j.len || j.piece % 32 == 0)) {
    ties = j.stochastic ? trit_pack_run_avx2<true>(j) : trit_pack_run_avx2<false>(j);
  } else {
    for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.piece) {
      const uint64_t n = std::min(j.piece, j.len - a);
      if (j.stochastic) {
        trit_run_avx2<true>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a, j.ties, ties);
      } else {
        trit_run_avx2<false>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a, j.ties, ties);
      }
    }
    pack(j.base3, j.scratch, j.len, j.out);
  }
  settle_ties(j, ties);
}
__attribute__((target("avx2"))) bool decode_avx2(const TernGradDecodeSpan& j) { return decode_span(j); }
#endif

}  // namespace

float TernGradMoments::max_abs() const { return bit_cast<float>(max_bits); }

double TernGradMoments::sigma() const { return sigma_of(s1.total(), s2.total(), finite); }

float TernGradMoments::scale(double clip) const {
  return scale_from_stats(max_abs(), clip > 0.0 ? sigma() : 0.0, clip);
}

void terngrad_add_moments(const float* x, uint64_t n, TernGradMoments& m) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return moments_avx2(x, n, m);
#endif
  moments_sse2(x, n, m);
}

void terngrad_encode_span(const TernGradEncodeSpan& job) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return encode_avx2(job);
#endif
  encode_sse2(job);
}

void terngrad_find_shift(const float* x, uint64_t n, TernGradMoments& m) { find_shift(x, n, m); }

void terngrad_group_scales(const float* x, uint64_t n, uint64_t group, double clip, float* scales) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return group_scales_avx2(x, n, group, clip, scales);
#endif
  group_scales_sse2(x, n, group, clip, scales);
}

bool terngrad_decode_span(const TernGradDecodeSpan& job) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return decode_avx2(job);
#endif
  return decode_sse2(job);
}

}  // namespace gcz::detail

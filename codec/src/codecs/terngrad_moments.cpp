// TernGrad's moments: the count, max|x| and shifted sums behind a range's scale, and the scales of
// groups. Every helper is force-inlined into the entry points, which exist once for SSE2 and once for
// AVX2 (and a range's moments once more for AVX-512F), so each loop is compiled, and vectorized, per
// instruction set. (The trit loops are in terngrad_span.cpp.)
#include <algorithm>
#include <cstring>

#include "codecs/span_inline.h"
#include "codecs/terngrad_span.h"
#include "gcz/detail/terngrad_math.h"

#if defined(__x86_64__)
#include "codecs/avx2_bytes.h"
#endif

namespace gcz::detail {
namespace {

using namespace terngrad;

GCZ_CPU_INLINE uint32_t abs_bits(float x) { return bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

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

GCZ_CPU_INLINE bool group_scales(const float* x, uint64_t n, uint64_t group, double clip, float* scales) {
  bool finite = true;
  for (uint64_t g = 0, b = 0; b < n; ++g, b += group) {
    TernGradMoments m;
    const uint64_t len = std::min(group, n - b);
    add_moments(x + b, len, m);
    scales[g] = m.scale(clip);
    finite = finite && m.finite == len;
  }
  return finite;
}

void moments_sse2(const float* x, uint64_t n, TernGradMoments& m) { add_moments(x, n, m); }
bool group_scales_sse2(const float* x, uint64_t n, uint64_t group, double clip, float* scales) {
  return group_scales(x, n, group, clip, scales);
}

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
GCZ_AVX2_FMA_INLINE void add8_avx2(const float* x, __m256d k, __m256d& s1a, __m256d& s1b, __m256d& s2a, __m256d& s2b,
                                   __m256i& mx) {
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

// The moments read their input once, in order, with little arithmetic per load, and the hardware
// prefetcher alone may not keep up: on a 2-core Xeon the pass read 6.9 GB/s where a plain read of the
// same bytes, in the same run, reached 12.2. A prefetch of the cache line 1024 elements (4 KiB) ahead,
// once per line, brought it within 4% of the plain read of its run (512 to 2048 elements ahead did
// as well; 256 came 12% short).
constexpr long kMomentsAhead = 1024;

// One block x[0, n), any n <= kSumBlock: whole lanes in vectors, the rest as add_block does.
GCZ_AVX2_FMA_INLINE void one_block_avx2(const float* x, uint64_t n, double shift, BlockSums& a) {
  const __m256d k = _mm256_set1_pd(shift);
  __m256d s1a = _mm256_setzero_pd(), s1b = s1a, s2a = s1a, s2b = s1a;
  __m256i mx = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    avx2::prefetch_ahead<kMomentsAhead>(x + i);
    add8_avx2(x + i, k, s1a, s1b, s2a, s2b, mx);
    add8_avx2(x + i + 8, k, s1a, s1b, s2a, s2b, mx);
  }
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

// The same moments with AVX-512F: the eight lanes of a block's sums in one register of eight doubles
// instead of two of four, so each element costs half the instructions; lane j still sums elements j,
// j + 8, j + 16, ... of the block, in that order, with the same roundings (the same bits). On a
// 2-core Xeon, 1 GiB, one thread: the two-pass encode 4.24 -> 4.51 GB/s, the one pass 4.85 -> 4.96.
GCZ_AVX512_INLINE void one_block_avx512(const float* x, uint64_t n, double shift, BlockSums& a) {
  const __m512d k = _mm512_set1_pd(shift), one = _mm512_set1_pd(1.0);
  __m512d s1 = _mm512_setzero_pd(), s2 = s1;
  __m512i mx = _mm512_setzero_si512();
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    avx2::prefetch_ahead<kMomentsAhead>(x + i);
    mx = _mm512_max_epi32(mx, _mm512_and_si512(_mm512_loadu_si512(x + i), _mm512_set1_epi32(0x7FFFFFFF)));
    const __m512d d0 = _mm512_fmsub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i)), one, k);
    const __m512d d1 = _mm512_fmsub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8)), one, k);
    s1 = _mm512_add_pd(s1, d0);
    s2 = _mm512_add_pd(s2, _mm512_mul_pd(d0, d0));
    s1 = _mm512_add_pd(s1, d1);
    s2 = _mm512_add_pd(s2, _mm512_mul_pd(d1, d1));
  }
  if (i + 8 <= n) {
    // The upper eight lanes loaded as zeros, which do not change the max.
    mx = _mm512_max_epi32(mx, _mm512_and_si512(_mm512_maskz_loadu_epi32(0x00FF, x + i), _mm512_set1_epi32(0x7FFFFFFF)));
    const __m512d d = _mm512_fmsub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i)), one, k);
    s1 = _mm512_add_pd(s1, d);
    s2 = _mm512_add_pd(s2, _mm512_mul_pd(d, d));
    i += 8;
  }
  _mm512_storeu_pd(a.s1, s1);
  _mm512_storeu_pd(a.s2, s2);
  a.max_bits = _mm512_reduce_max_epi32(mx);
  for (int j = 0; i < n; ++i, ++j) {
    a.max_bits = std::max(a.max_bits, static_cast<int32_t>(abs_bits(x[i])));
    const double d = static_cast<double>(x[i]) - shift;
    a.s1[j] += d;
    a.s2[j] += d * d;
  }
}

GCZ_AVX512 void moments_avx512(const float* x, uint64_t n, TernGradMoments& m) {
  find_shift(x, n, m);
  uint64_t b = 0;
  if (!m.has_shift) {
    for (; b < n; b += kSumBlock) add_block_checked(x + b, std::min(kSumBlock, n - b), m);
    return;
  }
  BlockSums s0;
  for (; b < n; b += kSumBlock) {
    const uint64_t len = std::min(kSumBlock, n - b);
    one_block_avx512(x + b, len, m.shift, s0);
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

// scale_from_stats(max|x|, sigma_from_sums(S1, S2, n), clip) of four groups of n elements (n > 0) at once:
// the same float64 operations lane by lane, each correctly rounded as in the scalar code, so the same
// bits; the divisions and square roots of a batch of groups then share the vector units instead of
// taking one group at a time. The root takes max(var, 0): 0 wherever sigma_from_sums's var > 0 fails, and no
// invalid-operation flag for a negative var.
GCZ_AVX2_INLINE __m128 scales4_avx2(const double* s1, const double* s2, const int32_t* max_bits, double n,
                                    double clip) {
  const __m256d zero = _mm256_setzero_pd(), k = _mm256_set1_pd(n);
  const __m256d a = _mm256_loadu_pd(s1), b = _mm256_loadu_pd(s2);
  const __m256d var = _mm256_div_pd(_mm256_sub_pd(b, _mm256_div_pd(_mm256_mul_pd(a, a), k)), k);
  const __m256d sigma = _mm256_sqrt_pd(_mm256_max_pd(var, zero));  // max gives 0 for a NaN var too
  __m256d s = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(max_bits))));
  if (clip > 0.0) {
    const __m256d t = _mm256_mul_pd(_mm256_set1_pd(clip), sigma);
    const __m256d clipped = _mm256_and_pd(_mm256_cmp_pd(sigma, zero, _CMP_GT_OQ), _mm256_cmp_pd(t, s, _CMP_LT_OQ));
    s = _mm256_blendv_pd(s, t, clipped);
  }
  const __m256i wide = _mm256_castpd_si256(_mm256_cmp_pd(s, zero, _CMP_GT_OQ));  // the double lanes' masks
  const __m128 positive = _mm_castsi128_ps(
      _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(wide, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0))));
  const __m128 f = _mm_and_ps(_mm256_cvtpd_ps(s), positive);
  const __m128 least = _mm_set1_ps(kMinScale);
  return _mm_blendv_ps(f, least, _mm_and_ps(_mm_cmplt_ps(f, least), positive));
}

// A group of one block (G <= kSumBlock) whose first element is finite (so K = x[0]) and, as the fast
// sums then show, all the others too, has its moments straight from one_block_avx2's lanes, with no
// TernGradMoments; a group that is not so takes the general path. Groups of whole lanes keep their
// sums and leave sigma and the scale to a second loop over a batch of groups, four at a time
// (scales4_avx2).
__attribute__((target("avx2,fma"))) bool group_scales_avx2(const float* x, uint64_t n, uint64_t group, double clip,
                                                           float* scales) {
  constexpr int kBatch = 32;
  alignas(32) double pending_s1[kBatch], pending_s2[kBatch];
  alignas(16) int32_t pending_max[kBatch];
  uint64_t pending_g[kBatch];
  const bool whole_lanes = group <= kSumBlock && group % 8 == 0;
  bool finite = true;
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
          for (uint64_t i = 0; i < len; i += 8) {
            if (i % 16 == 0) avx2::prefetch_ahead<kMomentsAhead>(x + b + i);
            add8_avx2(x + b + i, k, s1a, s1b, s2a, s2b, mx);
          }
          const int32_t max_bits = avx2::hmax_epi32(mx);
          if (max_bits < 0x7F800000) {
            const __m128d both = combine_lanes_avx2(s1a, s1b, s2a, s2b);
            _mm_storel_pd(pending_s1 + count, both);
            _mm_storeh_pd(pending_s2 + count, both);
            pending_max[count] = max_bits;
            pending_g[count++] = g;
            continue;
          }
        } else {
          one_block_avx2(x + b, len, x[b], sums);
          if (sums.max_bits < 0x7F800000) {
            const double sigma =
                clip > 0.0 ? sigma_from_sums(combine_lanes(sums.s1), combine_lanes(sums.s2), len) : 0.0;
            scales[g] = scale_from_stats(bit_cast<float>(sums.max_bits), sigma, clip);
            continue;
          }
        }
      }
      TernGradMoments m;
      moments_avx2(x + b, len, m);
      scales[g] = m.scale(clip);
      finite = finite && m.finite == len;
    }
    int q = 0;
    for (; q + 4 <= count; q += 4) {
      alignas(16) float four[4];
      _mm_store_ps(four,
                   scales4_avx2(pending_s1 + q, pending_s2 + q, pending_max + q, static_cast<double>(group), clip));
      for (int r = 0; r < 4; ++r) scales[pending_g[q + r]] = four[r];
    }
    for (; q < count; ++q) {
      const double sigma = clip > 0.0 ? sigma_from_sums(pending_s1[q], pending_s2[q], group) : 0.0;
      scales[pending_g[q]] = scale_from_stats(bit_cast<float>(pending_max[q]), sigma, clip);
    }
  }
  return finite;
}
#endif

}  // namespace

float TernGradMoments::max_abs() const { return bit_cast<float>(max_bits); }

double TernGradMoments::sigma() const { return sigma_from_sums(s1.total(), s2.total(), finite); }

float TernGradMoments::scale(double clip) const {
  return scale_from_stats(max_abs(), clip > 0.0 ? sigma() : 0.0, clip);
}

void terngrad_add_moments(const float* x, uint64_t n, TernGradMoments& m) {
#if defined(__x86_64__)
  if (cpu_has_avx512()) return moments_avx512(x, n, m);
  if (cpu_has_avx2()) return moments_avx2(x, n, m);
#endif
  moments_sse2(x, n, m);
}

void terngrad_find_shift(const float* x, uint64_t n, TernGradMoments& m) { find_shift(x, n, m); }

bool terngrad_group_scales(const float* x, uint64_t n, uint64_t group, double clip, float* scales) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return group_scales_avx2(x, n, group, clip, scales);
#endif
  return group_scales_sse2(x, n, group, clip, scales);
}

}  // namespace gcz::detail

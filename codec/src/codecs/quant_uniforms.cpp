// Philox4x32-10 across several blocks at once. The vector lanes hold different blocks (counters), so
// each lane computes exactly gcz::detail::philox4x32_10; the four output words of each block are then
// transposed into element order (draw i is word i mod 4 of block i / 4) and mapped to [0, 1) like
// Rng::to_uniform. x86 lacks a 32x32->64 multiply on all lanes: even lanes and odd lanes are
// multiplied separately (pmuludq) and their high and low halves recombined.
#include "codecs/quant_uniforms.h"

#include <atomic>

#include "gcz/detail/philox.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcz::detail {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

void fill_scalar(const Rng& rng, uint64_t first, uint64_t n, float* u) {
  for (uint64_t k = 0; k < n; ++k) u[k] = rng.uniform(first + k);
}

#if defined(__x86_64__)

// hi and lo halves of a * m on four lanes.
inline void mulhilo4(__m128i a, __m128i m, __m128i& hi, __m128i& lo) {
  const __m128i low_mask = _mm_set1_epi64x(0xFFFFFFFFll);
  const __m128i even = _mm_mul_epu32(a, m);
  const __m128i odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), m);
  hi = _mm_or_si128(_mm_srli_epi64(even, 32), _mm_andnot_si128(low_mask, odd));
  lo = _mm_or_si128(_mm_and_si128(even, low_mask), _mm_slli_epi64(odd, 32));
}

inline __m128 to_uniform4(__m128i w) {
  return _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(w, 8)), _mm_set1_ps(1.0f / 16777216.0f));
}

// Blocks b .. b + 3 -> u[0 .. 16).
void blocks4(uint64_t b, uint32_t k0, uint32_t k1, uint32_t purpose, float* u) {
  __m128i c0 = _mm_set_epi32(static_cast<int>(b + 3), static_cast<int>(b + 2), static_cast<int>(b + 1),
                             static_cast<int>(b));
  __m128i c1 = _mm_set_epi32(static_cast<int>((b + 3) >> 32), static_cast<int>((b + 2) >> 32),
                             static_cast<int>((b + 1) >> 32), static_cast<int>(b >> 32));
  __m128i c2 = _mm_set1_epi32(static_cast<int>(purpose)), c3 = _mm_setzero_si128();
  const __m128i m0 = _mm_set1_epi32(static_cast<int>(kM0)), m1 = _mm_set1_epi32(static_cast<int>(kM1));
  for (int round = 0; round < 10; ++round) {
    __m128i hi0, lo0, hi1, lo1;
    mulhilo4(c0, m0, hi0, lo0);
    mulhilo4(c2, m1, hi1, lo1);
    c0 = _mm_xor_si128(_mm_xor_si128(hi1, c1), _mm_set1_epi32(static_cast<int>(k0)));
    c2 = _mm_xor_si128(_mm_xor_si128(hi0, c3), _mm_set1_epi32(static_cast<int>(k1)));
    c1 = lo1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  __m128 r0 = to_uniform4(c0), r1 = to_uniform4(c1), r2 = to_uniform4(c2), r3 = to_uniform4(c3);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // row k = block b + k's four words
  _mm_storeu_ps(u, r0);
  _mm_storeu_ps(u + 4, r1);
  _mm_storeu_ps(u + 8, r2);
  _mm_storeu_ps(u + 12, r3);
}

__attribute__((target("avx2"))) inline __m256 to_uniform8(__m256i w) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w, 8)), _mm256_set1_ps(1.0f / 16777216.0f));
}

// hi and lo halves of a * m on eight lanes: even lanes and odd lanes multiplied separately, then blended.
__attribute__((target("avx2"))) inline void mulhilo8(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}
// The counters (low and high words) of blocks b .. b + 7.
__attribute__((target("avx2"))) inline void counters8(uint64_t b, __m256i& c0, __m256i& c1) {
  alignas(32) uint32_t lo[8], hi[8];
  for (int k = 0; k < 8; ++k) {
    lo[k] = static_cast<uint32_t>(b + k);
    hi[k] = static_cast<uint32_t>((b + k) >> 32);
  }
  c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
  c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
}
// Words c0..c3 of blocks b .. b + 7 -> u[0 .. 32) in element order.
__attribute__((target("avx2"))) inline void store8(__m256i c0, __m256i c1, __m256i c2, __m256i c3, float* u) {
  const __m256 r0 = to_uniform8(c0), r1 = to_uniform8(c1), r2 = to_uniform8(c2), r3 = to_uniform8(c3);
  // 4x4 transposes within each 128-bit half: t_k = (block k | block k + 4).
  const __m256 a = _mm256_unpacklo_ps(r0, r1), b = _mm256_unpackhi_ps(r0, r1);
  const __m256 c = _mm256_unpacklo_ps(r2, r3), d = _mm256_unpackhi_ps(r2, r3);
  const __m256 t0 = _mm256_shuffle_ps(a, c, 0x44), t1 = _mm256_shuffle_ps(a, c, 0xEE);
  const __m256 t2 = _mm256_shuffle_ps(b, d, 0x44), t3 = _mm256_shuffle_ps(b, d, 0xEE);
  _mm256_storeu_ps(u, _mm256_permute2f128_ps(t0, t1, 0x20));
  _mm256_storeu_ps(u + 8, _mm256_permute2f128_ps(t2, t3, 0x20));
  _mm256_storeu_ps(u + 16, _mm256_permute2f128_ps(t0, t1, 0x31));
  _mm256_storeu_ps(u + 24, _mm256_permute2f128_ps(t2, t3, 0x31));
}
// Blocks b .. b + 15 -> u[0 .. 64): two independent sets of eight lanes, so one set's multiplies
// overlap the other's latency. keys[2r], keys[2r + 1] are round r's key words.
__attribute__((target("avx2"))) void blocks16(uint64_t b, const uint32_t* keys, uint32_t purpose, float* u) {
  __m256i a0, a1, b0, b1;
  counters8(b, a0, a1);
  counters8(b + 8, b0, b1);
  __m256i a2 = _mm256_set1_epi32(static_cast<int>(purpose)), a3 = _mm256_setzero_si256(), b2 = a2, b3 = a3;
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0)), m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  for (int round = 0; round < 10; ++round) {
    const __m256i k0 = _mm256_set1_epi32(static_cast<int>(keys[2 * round]));
    const __m256i k1 = _mm256_set1_epi32(static_cast<int>(keys[2 * round + 1]));
    __m256i ahi0, alo0, ahi1, alo1, bhi0, blo0, bhi1, blo1;
    mulhilo8(a0, m0, ahi0, alo0);
    mulhilo8(b0, m0, bhi0, blo0);
    mulhilo8(a2, m1, ahi1, alo1);
    mulhilo8(b2, m1, bhi1, blo1);
    a0 = _mm256_xor_si256(_mm256_xor_si256(ahi1, a1), k0);
    b0 = _mm256_xor_si256(_mm256_xor_si256(bhi1, b1), k0);
    a2 = _mm256_xor_si256(_mm256_xor_si256(ahi0, a3), k1);
    b2 = _mm256_xor_si256(_mm256_xor_si256(bhi0, b3), k1);
    a1 = alo1;
    b1 = blo1;
    a3 = alo0;
    b3 = blo0;
  }
  store8(a0, a1, a2, a3, u);
  store8(b0, b1, b2, b3, u + 32);
}
#endif

}  // namespace

namespace {
std::atomic<bool> g_avx2_allowed{true};
}  // namespace

bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has && g_avx2_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void allow_avx2_for_testing(bool allowed) { g_avx2_allowed.store(allowed); }

void fill_uniforms(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, float* u) {
  const Rng rng(seed, tensor_key, purpose);
  uint64_t k = 0;
  // Draws before the first whole block, one by one.
  for (; k < n && (first + k) % 4 != 0; ++k) u[k] = rng.uniform(first + k);
#if defined(__x86_64__)
  const uint32_t k0 = static_cast<uint32_t>(seed ^ tensor_key), k1 = static_cast<uint32_t>((seed ^ tensor_key) >> 32);
  if (cpu_has_avx2()) {
    uint32_t keys[20];
    for (int r = 0; r < 10; ++r) {
      keys[2 * r] = k0 + static_cast<uint32_t>(r) * kW0;
      keys[2 * r + 1] = k1 + static_cast<uint32_t>(r) * kW1;
    }
    for (; k + 64 <= n; k += 64) blocks16((first + k) / 4, keys, purpose, u + k);
  }
  for (; k + 16 <= n; k += 16) blocks4((first + k) / 4, k0, k1, purpose, u + k);
#endif
  fill_scalar(rng, first + k, n - k, u + k);
}

}  // namespace gcz::detail

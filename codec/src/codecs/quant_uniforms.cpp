// Philox4x32-10 across several blocks at once. The vector lanes hold different blocks (counters), so
// each lane computes exactly gcz::detail::philox4x32_10; the four output words of each block are then
// transposed into draw order (32-bit draw w is word w mod 4 of block w / 4) and stored as they are: in
// little-endian memory, byte k of block b of sub-stream 0 is then Rng::coarse8(16 b + k) (and of
// sub-stream 1, Rng::fine8). x86 lacks a 32x32->64 multiply on all lanes: the SSE2 path multiplies
// even lanes and odd lanes separately (pmuludq) and recombines their high and low halves; the AVX2
// and AVX-512 paths keep one block per 64-bit lane instead (see blocks_avx2).
#include "codecs/quant_uniforms.h"

#include <algorithm>
#include <cstring>

#include "gcz/detail/philox.h"

#if defined(__x86_64__)
#include "codecs/x86_intrinsics.h"
#endif

namespace gcz::detail {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;


#if defined(__x86_64__)

// hi and lo halves of a * m on four lanes.
inline void mulhilo4(__m128i a, __m128i m, __m128i& hi, __m128i& lo) {
  const __m128i low_mask = _mm_set1_epi64x(0xFFFFFFFFll);
  const __m128i even = _mm_mul_epu32(a, m);
  const __m128i odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), m);
  hi = _mm_or_si128(_mm_srli_epi64(even, 32), _mm_andnot_si128(low_mask, odd));
  lo = _mm_or_si128(_mm_and_si128(even, low_mask), _mm_slli_epi64(odd, 32));
}

// Blocks b .. b + 3 of sub-stream 0 -> their 16 32-bit words at w.
void blocks4(uint64_t b, uint32_t k0, uint32_t k1, uint32_t purpose, void* w) {
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
  __m128 r0 = _mm_castsi128_ps(c0), r1 = _mm_castsi128_ps(c1), r2 = _mm_castsi128_ps(c2), r3 = _mm_castsi128_ps(c3);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // row k = block b + k's four words
  auto* out = static_cast<float*>(w);
  _mm_storeu_ps(out, r0);
  _mm_storeu_ps(out + 4, r1);
  _mm_storeu_ps(out + 8, r2);
  _mm_storeu_ps(out + 12, r3);
}

// The AVX2 kernel keeps each 32-bit word of a block in the low half of a 64-bit lane (the high half
// is don't-care: vpmuludq reads only the low halves), four blocks to a register. Then one vpmuludq
// gives the whole 64-bit product: its low half already is `lo`, and one shift gives `hi`, with no
// re-interleaving of even and odd lanes in any round. kSets independent groups of four blocks are in
// flight at once so that one group's multiply latency overlaps the others' work. Within a group the
// 64-bit lanes hold blocks (0, 2, 1, 3), so that two shuffles put the words in element order.
constexpr int kSets = 6;
constexpr int kBlocksPerCall = 4 * kSets;

struct Keys8 {
  __m256i k0[10], k1[10];  // round r's key words, broadcast
  __m256i round0_c0;       // round 0's hi(purpose * M1) ^ k0 (c2 = purpose is the same for every block)
  __m256i round0_c2k;      // round 0's c3 ^ k1: the sub-stream, the same for every block, ^ k1
  __m256i round1_c1k;      // round 0's lo(purpose * M1), which is round 1's c1, ^ round 1's k0
};

__attribute__((target("avx2"))) void make_keys8(uint32_t k0, uint32_t k1, uint32_t purpose, uint32_t sub,
                                                Keys8& keys) {
  for (int r = 0; r < 10; ++r) {
    keys.k0[r] = _mm256_set1_epi32(static_cast<int>(k0 + static_cast<uint32_t>(r) * kW0));
    keys.k1[r] = _mm256_set1_epi32(static_cast<int>(k1 + static_cast<uint32_t>(r) * kW1));
  }
  uint32_t hi1, lo1;
  mulhilo32(kM1, purpose, hi1, lo1);
  keys.round0_c0 = _mm256_set1_epi32(static_cast<int>(hi1 ^ k0));
  keys.round1_c1k = _mm256_set1_epi32(static_cast<int>(lo1 ^ (k0 + kW0)));
  keys.round0_c2k = _mm256_set1_epi32(static_cast<int>(sub ^ k1));
}

// make_keys8's keys for sub-stream `sub` (0 or 1), kept per thread for the last (k0, k1, purpose)
// asked for: a quantizer asks for the same ones twice a span (QSGD's spans are 1536 elements), and
// making them costs about as much as a call's worth of Philox rounds for a few blocks.
struct CachedKeys8 {
  uint32_t k0 = 0, k1 = 0, purpose = 0;
  bool made = false;
  Keys8 keys;
};
thread_local CachedKeys8 cached_keys8[2];

__attribute__((target("avx2"))) const Keys8& keys8(uint32_t k0, uint32_t k1, uint32_t purpose, uint32_t sub) {
  CachedKeys8& c = cached_keys8[sub];
  if (!c.made || c.k0 != k0 || c.k1 != k1 || c.purpose != purpose) {
    make_keys8(k0, k1, purpose, sub, c.keys);
    c.k0 = k0;
    c.k1 = k1;
    c.purpose = purpose;
    c.made = true;
  }
  return c.keys;
}

// Blocks b .. b + 4 kN - 1 (kGather: blocks b[0 .. 4 kN - 1]) -> their words at w, block by block.
template <bool kGather, int kN = kSets>
__attribute__((target("avx2"))) void blocks_avx2(uint64_t b, const uint64_t* blocks, const Keys8& keys, void* w) {
  const __m256i m0 = _mm256_set1_epi64x(kM0), m1 = _mm256_set1_epi64x(kM1);
  const __m256i order = _mm256_set_epi64x(3, 1, 2, 0);
  __m256i c0[kN], c1[kN], c2[kN], c3[kN];
  // Round 0: c2 = purpose and c3 = sub for every block, so purpose * M1 is a constant.
#pragma GCC unroll 8
  for (int s = 0; s < kN; ++s) {
    const __m256i ctr =
        kGather ? _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks + 4 * s)),
                                           _MM_SHUFFLE(3, 1, 2, 0))
                : _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(b + 4 * s)), order);
    const __m256i p0 = _mm256_mul_epu32(ctr, m0);
    c0[s] = _mm256_xor_si256(keys.round0_c0, _mm256_srli_epi64(ctr, 32));
    c2[s] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), keys.round0_c2k);
    c3[s] = p0;
  }
  // Round 1: c1 is round 0's constant lo(purpose * M1).
#pragma GCC unroll 8
  for (int s = 0; s < kN; ++s) {
    const __m256i p0 = _mm256_mul_epu32(c0[s], m0);
    const __m256i p1 = _mm256_mul_epu32(c2[s], m1);
    c0[s] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), keys.round1_c1k);
    c2[s] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(c3[s], keys.k1[1]));
    c1[s] = p1;
    c3[s] = p0;
  }
#pragma GCC unroll 10
  for (int round = 2; round < 9; ++round) {
#pragma GCC unroll 8
    for (int s = 0; s < kN; ++s) {
      const __m256i p0 = _mm256_mul_epu32(c0[s], m0);
      const __m256i p1 = _mm256_mul_epu32(c2[s], m1);
      c0[s] = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(c1[s], keys.k0[round]));
      c2[s] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(c3[s], keys.k1[round]));
      c1[s] = p1;
      c3[s] = p0;
    }
  }
  // Round 9, straight into element order: (c1 ^ k0) << 32 ^ p1 is (lo(p1), hi(p1) ^ c1 ^ k0), that is
  // the new (c1, c0) in the low and high halves of each 64-bit lane; likewise (c3, c2). One shuffle per
  // two blocks puts each block's words in order c0, c1, c2, c3.
  auto* out = static_cast<__m256i*>(w);
#pragma GCC unroll 8
  for (int s = 0; s < kN; ++s) {
    const __m256i p0 = _mm256_mul_epu32(c0[s], m0);
    const __m256i p1 = _mm256_mul_epu32(c2[s], m1);
    const __m256 w10 = _mm256_castsi256_ps(
        _mm256_xor_si256(p1, _mm256_slli_epi64(_mm256_xor_si256(c1[s], keys.k0[9]), 32)));
    const __m256 w32 = _mm256_castsi256_ps(
        _mm256_xor_si256(p0, _mm256_slli_epi64(_mm256_xor_si256(c3[s], keys.k1[9]), 32)));
    const __m256i lo = _mm256_castps_si256(_mm256_shuffle_ps(w10, w32, _MM_SHUFFLE(0, 1, 0, 1)));  // blocks 0, 1
    const __m256i hi = _mm256_castps_si256(_mm256_shuffle_ps(w10, w32, _MM_SHUFFLE(2, 3, 2, 3)));  // blocks 2, 3
    _mm256_storeu_si256(out + 2 * s, lo);
    _mm256_storeu_si256(out + 2 * s + 1, hi);
  }
}

// The AVX-512 kernel: blocks_avx2's rounds on eight blocks per register, with each round's two
// three-way XORs one vpternlogq each. The 64-bit lanes hold blocks (0, 4, 1, 5, 2, 6, 3, 7), so that
// the same two shuffles, applied per 128-bit lane, leave blocks 0-3 in one register and 4-7 in the
// other, in element order. The keys are Keys8's, widened.
constexpr int kWideSets = 4;
constexpr int kBlocksPerWideCall = 8 * kWideSets;

__attribute__((target("avx512f"))) inline __m512i wide(__m256i k) { return _mm512_broadcast_i64x4(k); }
// a ^ b ^ c
__attribute__((target("avx512f"))) inline __m512i xor3(__m512i a, __m512i b, __m512i c) {
  return _mm512_ternarylogic_epi64(a, b, c, 0x96);
}

// Blocks b .. b + kBlocksPerWideCall - 1 -> their words at w, block by block.
__attribute__((target("avx512f"))) void blocks_avx512(uint64_t b, const Keys8& keys, void* w) {
  constexpr int kN = kWideSets;
  const __m512i m0 = _mm512_set1_epi64(kM0), m1 = _mm512_set1_epi64(kM1);
  const __m512i order = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0);
  __m512i c0[kN], c1[kN], c2[kN], c3[kN];
  // Round 0 (c2 = purpose, c3 = sub: as in blocks_avx2).
  const __m512i r0_c0 = wide(keys.round0_c0), r0_c2k = wide(keys.round0_c2k);
#pragma GCC unroll 8
  for (int s = 0; s < kN; ++s) {
    const __m512i ctr = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(b + 8 * s)), order);
    const __m512i p0 = _mm512_mul_epu32(ctr, m0);
    c0[s] = _mm512_xor_si512(r0_c0, _mm512_srli_epi64(ctr, 32));
    c2[s] = _mm512_xor_si512(_mm512_srli_epi64(p0, 32), r0_c2k);
    c3[s] = p0;
  }
  // Round 1: c1 is round 0's constant lo(purpose * M1).
  const __m512i r1_c1k = wide(keys.round1_c1k), r1_k1 = wide(keys.k1[1]);
#pragma GCC unroll 8
  for (int s = 0; s < kN; ++s) {
    const __m512i p0 = _mm512_mul_epu32(c0[s], m0);
    const __m512i p1 = _mm512_mul_epu32(c2[s], m1);
    c0[s] = _mm512_xor_si512(_mm512_srli_epi64(p1, 32), r1_c1k);
    c2[s] = xor3(_mm512_srli_epi64(p0, 32), c3[s], r1_k1);
    c1[s] = p1;
    c3[s] = p0;
  }
#pragma GCC unroll 10
  for (int round = 2; round < 9; ++round) {
    const __m512i k0 = wide(keys.k0[round]), k1 = wide(keys.k1[round]);
#pragma GCC unroll 8
    for (int s = 0; s < kN; ++s) {
      const __m512i p0 = _mm512_mul_epu32(c0[s], m0);
      const __m512i p1 = _mm512_mul_epu32(c2[s], m1);
      c0[s] = xor3(_mm512_srli_epi64(p1, 32), c1[s], k0);
      c2[s] = xor3(_mm512_srli_epi64(p0, 32), c3[s], k1);
      c1[s] = p1;
      c3[s] = p0;
    }
  }
  // Round 9 into element order, as blocks_avx2 does it.
  const __m512i k0 = wide(keys.k0[9]), k1 = wide(keys.k1[9]);
  auto* out = static_cast<__m512i*>(w);
#pragma GCC unroll 8
  for (int s = 0; s < kN; ++s) {
    const __m512i p0 = _mm512_mul_epu32(c0[s], m0);
    const __m512i p1 = _mm512_mul_epu32(c2[s], m1);
    const __m512 w10 = _mm512_castsi512_ps(_mm512_xor_si512(p1, _mm512_slli_epi64(_mm512_xor_si512(c1[s], k0), 32)));
    const __m512 w32 = _mm512_castsi512_ps(_mm512_xor_si512(p0, _mm512_slli_epi64(_mm512_xor_si512(c3[s], k1), 32)));
    const __m512i lo = _mm512_castps_si512(_mm512_shuffle_ps(w10, w32, _MM_SHUFFLE(0, 1, 0, 1)));  // blocks 0-3
    const __m512i hi = _mm512_castps_si512(_mm512_shuffle_ps(w10, w32, _MM_SHUFFLE(2, 3, 2, 3)));  // blocks 4-7
    _mm512_storeu_si512(out + 2 * s, lo);
    _mm512_storeu_si512(out + 2 * s + 1, hi);
  }
}
#endif

}  // namespace

namespace {

// The coarse bytes (T = uint8_t) or 32-bit draws (T = uint32_t) first .. first + n - 1: a partial
// first and last Philox block one block at a time, whole calls of the vector kernels in between (the
// AVX-512 one first, where it runs), and the rest of the AVX2 work in calls of 8 blocks (the last
// through a buffer), so that no more than 7 blocks are made in vain.
template <typename T>
void fill_draws(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, T* d,
                const float* touch) {
  constexpr uint64_t kPerBlock = 16 / sizeof(T);  // draws per Philox block
  const Rng rng(seed, tensor_key, purpose);
  // Draws [from, to) of block b (numbered within the block) to out.
  auto block_draws = [&rng](uint64_t b, uint64_t from, uint64_t to, T* out) {
    const Philox4x32 w = rng.block(b);
    for (uint64_t j = from; j < to; ++j) {
      if constexpr (sizeof(T) == 1) {
        out[j - from] = static_cast<T>(block_byte(w, static_cast<uint32_t>(j)));
      } else {
        out[j - from] = w.v[j];
      }
    }
  };
  uint64_t k = 0;
  if (const uint64_t at = first % kPerBlock; at != 0 && n > 0) {
    k = std::min(n, kPerBlock - at);
    block_draws(first / kPerBlock, at, at + k, d);
  }
#if defined(__x86_64__)
  const uint32_t k0 = static_cast<uint32_t>(seed ^ tensor_key), k1 = static_cast<uint32_t>((seed ^ tensor_key) >> 32);
  if (cpu_has_avx2()) {
    constexpr uint64_t kPerCall = kPerBlock * kBlocksPerCall, kPerSmallCall = kPerBlock * 8;
    constexpr uint64_t kPerWideCall = kPerBlock * kBlocksPerWideCall;
    const Keys8& keys = keys8(k0, k1, purpose, 0);
    // The cache lines of the `count` values from element `from` that a call's draws will round.
    auto prefetch_touch = [touch](uint64_t from, uint64_t count) {
      if (touch == nullptr) return;
      for (uint64_t b = 0; b < count; b += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(touch + from + b), _MM_HINT_T0);
      }
    };
    if (cpu_has_avx512()) {
      for (; k + kPerWideCall <= n; k += kPerWideCall) {
        prefetch_touch(k, kPerWideCall);
        blocks_avx512((first + k) / kPerBlock, keys, d + k);
      }
    }
    for (; k + kPerCall <= n; k += kPerCall) {
      prefetch_touch(k, kPerCall);
      blocks_avx2<false>((first + k) / kPerBlock, nullptr, keys, d + k);
    }
    for (; k + kPerSmallCall <= n; k += kPerSmallCall) {
      blocks_avx2<false, 2>((first + k) / kPerBlock, nullptr, keys, d + k);
    }
    if (n - k > kPerBlock) {  // more than one block left: one more small call, through a buffer
      alignas(32) T rest[kPerSmallCall];
      blocks_avx2<false, 2>((first + k) / kPerBlock, nullptr, keys, rest);
      std::memcpy(d + k, rest, (n - k) * sizeof(T));
      k = n;
    }
  }
  for (; k + 4 * kPerBlock <= n; k += 4 * kPerBlock) blocks4((first + k) / kPerBlock, k0, k1, purpose, d + k);
#endif
  for (; k < n; k += kPerBlock) block_draws((first + k) / kPerBlock, 0, std::min(kPerBlock, n - k), d + k);
}

}  // namespace

void fill_coarse8(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, uint8_t* d,
                  const float* touch) {
  fill_draws(seed, tensor_key, purpose, first, n, d, touch);
}

#if defined(__x86_64__)
namespace {
// f[q] = the fine bytes of elements first + k[q], q < count <= 4 kN, from one call of kN sets (the
// blocks past count repeat the last element's).
template <int kN>
__attribute__((target("avx2"))) void gather_call(const Keys8& keys, uint64_t first, const uint64_t* k, uint64_t count,
                                                 uint8_t* f) {
  uint64_t blocks[4 * kN];
  for (uint64_t q = 0; q < 4 * kN; ++q) blocks[q] = (first + k[std::min<uint64_t>(q, count - 1)]) >> 4;
  alignas(32) uint8_t bytes[64 * kN];
  blocks_avx2<true, kN>(0, blocks, keys, bytes);
  for (uint64_t q = 0; q < count; ++q) f[q] = bytes[16 * q + ((first + k[q]) & 15)];  // little-endian words
}
}  // namespace
#endif

void FineDraws::gather(const uint64_t* k, uint64_t n, uint8_t* f) const {
  const Rng rng(seed, tensor_key, purpose);
  uint64_t j = 0;
#if defined(__x86_64__)
  if (cpu_has_avx2() && n >= 4) {
    const Keys8& keys =
        keys8(static_cast<uint32_t>(seed ^ tensor_key), static_cast<uint32_t>((seed ^ tensor_key) >> 32), purpose, 1);
    for (; n - j >= kBlocksPerCall; j += kBlocksPerCall) gather_call<kSets>(keys, first, k + j, kBlocksPerCall, f + j);
    for (; n - j >= 4; j += std::min<uint64_t>(8, n - j)) {  // the rest, eight blocks a call
      gather_call<2>(keys, first, k + j, std::min<uint64_t>(8, n - j), f + j);
    }
  }
#endif
  for (; j < n; ++j) f[j] = static_cast<uint8_t>(rng.fine8(first + k[j]));
}

void fill_draws32(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, uint32_t* d) {
  fill_draws(seed, tensor_key, purpose, first, n, d, static_cast<const float*>(nullptr));
}

}  // namespace gcz::detail

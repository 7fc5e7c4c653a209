// Bulk random draws on the CPU, for the stochastic quantizers (QSGD, TernGrad) and Random-K: exactly
// Rng(seed, tensor_key, purpose).coarse8(i) (or .bits(i)) for a run of element indices, computed four
// Philox blocks (SSE2), 24 (AVX2) or 32 (AVX-512F) at once, the instruction set chosen at run time.
// Integer math only, so the values do not depend on the instruction set. The quantizers settle most
// roundings with the coarse byte and ask FineDraws for the rest.
//
//   std::vector<uint8_t> d(n);
//   gcz::detail::fill_coarse8(seed, key, gcz::detail::kStreamQsgdRounding, first, n, d.data());
#pragma once

#include <cstdint>

#include "cpu_features.h"
#include "gcz/detail/philox.h"

namespace gcz::detail {

// d[k] = Rng(seed, tensor_key, purpose).coarse8(first + k) for k in [0, n). `touch`, if given, is the
// n float32 values these draws will round: the call prefetches them into cache as it goes, so that
// their memory reads overlap its arithmetic instead of stalling the quantize loop that follows.
void fill_coarse8(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, uint8_t* d,
                  const float* touch = nullptr);

// The fine bytes of a span's draws: at(k) = Rng(seed, tensor_key, purpose).fine8(first + k) for the
// span's element k, one Philox block each (they are needed for about one element in 256); gather
// makes them for a list of elements, 24 or 8 blocks per AVX2 call.
struct FineDraws {
  uint64_t seed, tensor_key;
  uint32_t purpose;
  uint64_t first;
  uint32_t at(uint64_t k) const { return Rng(seed, tensor_key, purpose).fine8(first + k); }
  // f[j] = at(k[j]) for j in [0, n).
  void gather(const uint64_t* k, uint64_t n, uint8_t* f) const;
};

// The vector loops note the elements whose rounding waits for a fine byte as (first element, mask)
// pairs, bit b of the mask for element first + tie_element(b), without a branch (a tie is too rare to
// predict, and too common to pay a misprediction for): a pair goes to ties[2 count], ties[2 count + 1],
// and is kept when its mask is not zero. Room: tie_room words.
// The bits are in the order in which the AVX2 packs leave 32 bytes narrowed from four vectors of
// eight lanes (avx2::pack_interleaved): byte b holds element 8 ((b mod 16) / 4) + 4 (b / 16) + b mod 4.
// A mask taken there needs no permute back to element order (taking it out of TernGrad's trit pass
// in L2 saved 1% with a tensor scale and 5% with groups of 128); the few ties pay for the order.
constexpr unsigned tie_element(unsigned b) { return ((b & 12u) << 1) | ((b >> 2) & 4u) | (b & 3u); }
[[gnu::always_inline]] inline void note_ties(uint32_t mask, uint64_t first, uint32_t* ties, uint64_t& count) {
  ties[2 * count] = static_cast<uint32_t>(first);
  ties[2 * count + 1] = mask;
  count += mask != 0 ? 1 : 0;
}
// The words note_ties may write for a span of len elements in groups of `group`: a pair per step of
// 32 elements and per group (its last, partial step), whatever the masks.
inline uint64_t tie_room(uint64_t len, uint64_t group) { return 2 * (len / 32 + (len + group - 1) / group); }

// Calls settle(k, fine byte of k) for each element k noted in ties[0, 2 count), in batches whose fine
// bytes come from one FineDraws::gather.
template <typename Settle>
[[gnu::always_inline]] inline void for_each_tie(const uint32_t* ties, uint64_t count, const FineDraws& fine,
                                                const Settle& settle) {
  constexpr int kBatch = 64;
  uint64_t k[kBatch];
  uint8_t f[kBatch];
  int n = 0;
  auto flush = [&] {
    fine.gather(k, static_cast<uint64_t>(n), f);
    for (int q = 0; q < n; ++q) settle(k[q], f[q]);
    n = 0;
  };
  for (uint64_t p = 0; p < count; ++p) {
    for (uint32_t mask = ties[2 * p + 1]; mask != 0; mask &= mask - 1) {
      k[n++] = ties[2 * p] + tie_element(static_cast<unsigned>(__builtin_ctz(mask)));
      if (n == kBatch) flush();
    }
  }
  if (n > 0) flush();
}

// d[k] = Rng(seed, tensor_key, purpose).bits(first + k) for k in [0, n): the 32-bit draws (Random-K's
// keys), from the same kernels.
void fill_draws32(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, uint32_t* d);

}  // namespace gcz::detail

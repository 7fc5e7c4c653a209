// Bulk random draws on the CPU, for the stochastic quantizers (QSGD, TernGrad) and Random-K: exactly
// Rng(seed, tensor_key, purpose).draw16(i) (or .bits(i)) for a run of element indices, computed four
// Philox blocks (SSE2) or 24 (AVX2, chosen at run time) at once. Integer math only, so the values do
// not depend on the instruction set. The quantizers turn a draw into its uniform with Rng::to_uniform.
//
//   std::vector<uint16_t> d(n);
//   gcz::detail::fill_draws16(seed, key, gcz::detail::kStreamQsgdRounding, first, n, d.data());
#pragma once

#include <cstdint>

namespace gcz::detail {

// d[k] = Rng(seed, tensor_key, purpose).draw16(first + k) for k in [0, n). `touch`, if given, is the
// n float32 values these draws will round: the call prefetches them into cache as it goes, so that
// their memory reads overlap its arithmetic instead of stalling the quantize loop that follows.
void fill_draws16(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, uint16_t* d,
                  const float* touch = nullptr);

// d[k] = Rng(seed, tensor_key, purpose).bits(first + k) for k in [0, n): the 32-bit draws (Random-K's
// keys), from the same kernels.
void fill_draws32(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, uint32_t* d);

// Whether the quantizers run their AVX2 code paths: the CPU has AVX2 and FMA (which every AVX2 CPU of
// note has; TernGrad's moments use it for exact subtractions) and tests have not turned it off.
bool cpu_has_avx2();
// Tests turn the AVX2 paths off to check that the SSE2 paths write the same bytes.
void allow_avx2_for_testing(bool allowed);

}  // namespace gcz::detail

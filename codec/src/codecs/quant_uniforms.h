// Bulk uniform draws for the stochastic quantizers (QSGD, TernGrad) on the CPU: exactly
// Rng(seed, tensor_key, purpose).uniform(i) for a run of element indices, computed four Philox blocks
// (SSE2) or 24 (AVX2, chosen at run time) at once. Integer math only, so the values do not depend
// on the instruction set.
//
//   std::vector<float> u(n);
//   gcz::detail::fill_uniforms(seed, key, gcz::detail::kStreamQsgdRounding, first, n, u.data());
#pragma once

#include <cstdint>

namespace gcz::detail {

// u[k] = Rng(seed, tensor_key, purpose).uniform(first + k) for k in [0, n).
void fill_uniforms(uint64_t seed, uint64_t tensor_key, uint32_t purpose, uint64_t first, uint64_t n, float* u);

// Whether the quantizers run their AVX2 code paths: the CPU has AVX2 and tests have not turned it off.
bool cpu_has_avx2();
// Tests turn the AVX2 paths off to check that the SSE2 paths write the same bytes.
void allow_avx2_for_testing(bool allowed);

}  // namespace gcz::detail

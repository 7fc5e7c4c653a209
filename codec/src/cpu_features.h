// Run-time choice of the x86-64 vector code paths (the quantizers, the Philox kernels, the error
// metrics). Every such path computes exactly what its portable twin does; the choice changes speed,
// never a result.
//
//   if (gcz::detail::cpu_has_avx2()) return encode_avx2(job);
#pragma once

namespace gcz::detail {

// Whether the AVX2 code paths run: the CPU has AVX2, FMA and F16C (which every AVX2 CPU of note has;
// TernGrad's moments use FMA for exact subtractions, the metrics F16C to widen fp16) and tests have
// not turned them off.
bool cpu_has_avx2();
// Tests turn the AVX2 paths off to check that the portable paths give the same results.
void allow_avx2_for_testing(bool allowed);
// Whether the AVX-512 code paths run (the bulk Philox draws, TernGrad's moments): the AVX2 paths run
// and the CPU has AVX-512F, and tests have not turned them off.
bool cpu_has_avx512();
// Tests turn the AVX-512 paths off to check that the AVX2 paths give the same results.
void allow_avx512_for_testing(bool allowed);

}  // namespace gcz::detail

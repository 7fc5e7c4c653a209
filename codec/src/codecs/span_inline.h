// The span loops' helpers are force-inlined into their entry points, so that each is compiled, and
// vectorized, once per instruction set: GCZ_CPU_INLINE for helpers of every entry point,
// GCZ_AVX2_INLINE for those of the AVX2 ones only, GCZ_AVX512_INLINE for those of the AVX-512F ones
// (which also use AVX2 and FMA: every CPU with AVX-512F has them).
#pragma once

#define GCZ_CPU_INLINE [[gnu::always_inline]] inline
#define GCZ_AVX2_INLINE [[gnu::always_inline, gnu::target("avx2")]] inline
#define GCZ_AVX512_INLINE [[gnu::always_inline, gnu::target("avx512f,avx2,fma")]] inline
#define GCZ_AVX512 __attribute__((target("avx512f,avx2,fma")))

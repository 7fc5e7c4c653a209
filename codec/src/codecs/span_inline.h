// The span loops' helpers are force-inlined into their entry points, so that each is compiled, and
// vectorized, once per instruction set: GCZ_CPU_INLINE for helpers of every entry point,
// GCZ_AVX2_INLINE for those of the AVX2 ones only.
#pragma once

#define GCZ_CPU_INLINE [[gnu::always_inline]] inline
#define GCZ_AVX2_INLINE [[gnu::always_inline, gnu::target("avx2")]] inline

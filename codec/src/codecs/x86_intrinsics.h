// <immintrin.h> for the CPU loops. GCC 12 warns that the AVX-512 intrinsics' own placeholder operands
// (_mm512_undefined_*) are used uninitialized (GCC bug 105593) wherever they are inlined; they are,
// by design, and the warnings are silenced for this header alone. Include it from x86-64 code only.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

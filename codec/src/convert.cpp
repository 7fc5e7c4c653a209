#include "gcz/convert.h"

#include <bit>
#include <cstring>

#include "cpu_features.h"
#include "gcz/detail/float_bits.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static_assert(std::endian::native == std::endian::little, "gcz assumes a little-endian host");

namespace gcz {
namespace {

// Element types as stored: float16 and bfloat16 are their 16-bit patterns. ExactF64 is a float64
// widened on the bits (f32_to_f64), for a process whose FPU reads subnormals as zero or traps.
struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };
struct ExactF64 { double value; };
static_assert(sizeof(ExactF64) == sizeof(double));
// FpuF32 is a float32 narrowed from float64 by the FPU, where it rounds as f64_to_f32 does; FpuF16
// a float16 whose subnormal results the FPU rounds (f32_to_f16_by_fpu).
struct FpuF32 { float value; };
struct FpuF16 { uint16_t bits; };

// float32 -> float16 as f32_to_f16, but with results below the float16 normal range rounded by the
// FPU: x + 0.5 puts x's multiple of 2^-24 (the float16 subnormal step) in the low mantissa bits,
// rounded to nearest even. Without f32_to_f16_small's per-lane variable shifts, its loops vectorize
// on SSE2 too (3.2 against 1.3 GB/s); it runs only where the FPU rounds to nearest even and traps
// nothing (fpu_narrows_as_specified; a subnormal x read as 0 gives 0, its right result, anyway).
inline uint16_t f32_to_f16_by_fpu(float f) {
  const float x = detail::bit_cast<float>(detail::bit_cast<uint32_t>(f) & 0x7FFFFFFFu);
  return detail::f32_to_f16_given_small(f, detail::bit_cast<uint32_t>(x + 0.5f) - 0x3F000000u);
}

// Loads widen exactly; float64 goes straight to the narrow formats (one rounding, CODECS.md).
inline float load_f32(F16 v) { return detail::f16_to_f32(v.bits); }
inline float load_f32(BF16 v) { return detail::bf16_to_f32(v.bits); }
inline float load_f32(float v) { return v; }

template <class To>
inline To store(float v);
template <>
inline F16 store<F16>(float v) { return {detail::f32_to_f16(v)}; }
template <>
inline FpuF16 store<FpuF16>(float v) { return {f32_to_f16_by_fpu(v)}; }
template <>
inline BF16 store<BF16>(float v) { return {detail::f32_to_bf16(v)}; }
template <>
inline float store<float>(float v) { return v; }
template <>
inline double store<double>(float v) { return static_cast<double>(v); }
template <>
inline ExactF64 store<ExactF64>(float v) { return {detail::f32_to_f64(v)}; }

// x86's MXCSR sets how the SSE and F16C conversions round (bits 13-14), whether they flush results
// (bit 15) and read operands (bit 6, DAZ, which a library built with -ffast-math may have set for the
// whole process) as zero, and which exceptions trap (masks, bits 7-12, all set by default). The
// hardware conversions run only where their results are the specified ones and nothing traps; the
// bit-level code, which does no floating-point operation that rounds or raises, runs otherwise, and
// on other CPUs.
constexpr unsigned kExceptionMasks = 0x1F80u;
unsigned mxcsr() {
#if defined(__x86_64__)
  return _mm_getcsr();
#else
  return 0xFFFFu;  // no hardware path
#endif
}
// Widening float32 to float64 (exact, whatever the rounding): subnormals read as themselves.
bool fpu_widens_exactly() { return (mxcsr() & (0x0040u | kExceptionMasks)) == kExceptionMasks; }
// float16 <-> float32 on F16C: the instructions round to nearest even by their immediate, and read
// and make float16 subnormals whatever MXCSR says (tests hold them to the bits under every mode).
bool fpu_traps_nothing() { return (mxcsr() & kExceptionMasks) == kExceptionMasks; }
// Narrowing float64 to float32 as f64_to_f32 does: rounding to nearest even, no flush to zero. Its
// NaN is f64_to_f32's too: quiet, with the payload's top bits (tests compare them).
bool fpu_narrows_as_specified() { return (mxcsr() & (0xE000u | kExceptionMasks)) == kExceptionMasks; }
// Everything at its default: fpu_narrows_as_specified, and subnormals read as themselves.
bool fpu_at_defaults() { return (mxcsr() & (0xE040u | kExceptionMasks)) == kExceptionMasks; }

template <class To>
inline To store_from_f64(double v);
template <>
inline F16 store_from_f64<F16>(double v) { return {detail::f64_to_f16(v)}; }
template <>
inline BF16 store_from_f64<BF16>(double v) { return {detail::f64_to_bf16(v)}; }
template <>
inline float store_from_f64<float>(double v) { return detail::f64_to_f32(v); }
template <>
inline FpuF32 store_from_f64<FpuF32>(double v) { return {static_cast<float>(v)}; }

// One tight loop per (from, to) pair, so the compiler can vectorize the branch-free conversions.
template <class From, class To>
void convert_loop(const void* src, void* dst, std::size_t n) {
  const From* in = static_cast<const From*>(src);
  To* out = static_cast<To*>(dst);
  if constexpr (std::is_same_v<From, double>) {
    for (std::size_t i = 0; i < n; ++i) out[i] = store_from_f64<To>(in[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = store<To>(load_f32(in[i]));
  }
}

template <class From>
void convert_from(const void* src, DType to, void* dst, std::size_t n) {
  switch (to) {
    case DType::kFloat16:
      if constexpr (!std::is_same_v<From, double>) {
        if (fpu_narrows_as_specified()) return convert_loop<From, FpuF16>(src, dst, n);
      }
      convert_loop<From, F16>(src, dst, n);
      return;
    case DType::kBFloat16: convert_loop<From, BF16>(src, dst, n); return;
    case DType::kFloat32:
      // float64 on the bits runs at about 1.3 GB/s; the FPU's vectorized narrowing, where it rounds
      // as specified, several times faster.
      if constexpr (std::is_same_v<From, double>) {
        if (fpu_narrows_as_specified()) return convert_loop<From, FpuF32>(src, dst, n);
      }
      convert_loop<From, float>(src, dst, n);
      return;
    case DType::kFloat64:
      if constexpr (!std::is_same_v<From, double>) {
        // The FPU's widening is exact and vectorizes; on the bits it takes about twice as long.
        if (fpu_widens_exactly()) {
          convert_loop<From, double>(src, dst, n);
        } else {
          convert_loop<From, ExactF64>(src, dst, n);
        }
      }
      return;
  }
}

#if defined(__x86_64__)
// float32 <-> float16 with the F16C instructions, 16 elements a step: IEEE conversions, rounding to
// nearest even (the immediate, not MXCSR, sets the rounding), with NaNs made quiet and their payload's
// top bits kept: bit for bit what f32_to_f16 and f16_to_f32 compute (tests compare them).
[[gnu::target("avx2,f16c")]] void f32_to_f16_f16c(const float* in, uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    const __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(in + i + 8), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), b);
  }
  for (; i < n; ++i) out[i] = detail::f32_to_f16(in[i]);
}
[[gnu::target("avx2,f16c")]] void f16_to_f32_f16c(const uint16_t* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    _mm256_storeu_ps(out + i + 8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 8))));
  }
  for (; i < n; ++i) out[i] = detail::f16_to_f32(in[i]);
}

// float16 -> float64: through float32 on F16C, then widened on the FPU. Every float16, subnormals
// included, is a float32 normal, so denormals-are-zero cannot touch the second step; a NaN keeps its
// payload and comes out quiet, as f16_to_f32 and f32_to_f64 make it.
[[gnu::target("avx2,f16c")]] void f16_to_f64_f16c(const uint16_t* in, double* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_pd(out + i, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
    _mm256_storeu_pd(out + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
  }
  for (; i < n; ++i) out[i] = detail::f32_to_f64(detail::f16_to_f32(in[i]));
}

// float32 -> bfloat16: f32_to_bf16's add-and-shift rounding and its NaN rule on eight lanes.
[[gnu::always_inline, gnu::target("avx2")]] inline __m256i bf16_bits8(__m256i bits) {
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
}
// Stores two runs of eight bfloat16 results in 32-bit lanes as 16 elements: every result fits in
// 16 bits, so the saturating pack is exact; it interleaves the halves, which the permute undoes.
[[gnu::always_inline, gnu::target("avx2")]] inline void store_bf16x16(uint16_t* out, __m256i lo, __m256i hi) {
  const __m256i packed = _mm256_packus_epi32(lo, hi);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
}
[[gnu::target("avx2")]] void f32_to_bf16_avx2(const float* in, uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = bf16_bits8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    const __m256i hi = bf16_bits8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8)));
    store_bf16x16(out + i, lo, hi);
  }
  for (; i < n; ++i) out[i] = detail::f32_to_bf16(in[i]);
}
// float64 -> float16 and bfloat16 round once (CODECS.md), which no instruction here does; rounding to
// odd first makes two roundings one. x narrowed to float32 toward zero, with the last bit set where
// that dropped anything, then rounded to nearest even at two or more bits fewer, is x rounded to
// nearest even once (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
// algorithms using rounding to odd", 2008). float16 keeps 11 of float32's 24 bits, and its subnormals
// are float32 normals; bfloat16 keeps 8, and its subnormals lie on float32's own subnormal grid 16
// bits coarser. Overflow truncates to float32's largest finite value, which both round to Inf as x
// does; a NaN is narrowed as it is by f64_to_f32, whose payload bits both keep.
//
// Four lanes: the FPU narrows to nearest even (cvtpd2ps), and widening back says whether that was
// exact and whether it rounded away from zero, in which case the truncation is one less in the bits.
// Only where MXCSR has its defaults (fpu_at_defaults): nearest even, no flush to zero, and subnormal
// float32 results read back as themselves.
[[gnu::always_inline, gnu::target("avx2")]] inline __m128i f64_to_f32_odd4(const double* p) {
  const __m256d x = _mm256_loadu_pd(p);
  const __m128 r = _mm256_cvtpd_ps(x);
  const __m256d back = _mm256_cvtps_pd(r);
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFF));
  const __m256d away = _mm256_cmp_pd(_mm256_and_pd(back, abs_mask), _mm256_and_pd(x, abs_mask), _CMP_GT_OQ);
  // Ordered compares: false for a NaN, which stays as the FPU narrowed it.
  const __m256d inexact = _mm256_cmp_pd(back, x, _CMP_NEQ_OQ);
  const __m256i even_lanes = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);  // 64-bit masks to 32-bit
  const __m128i away32 = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), even_lanes));
  const __m128i inexact32 =
      _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), even_lanes));
  const __m128i toward_zero = _mm_add_epi32(_mm_castps_si128(r), away32);  // a true mask is -1
  return _mm_or_si128(toward_zero, _mm_and_si128(inexact32, _mm_set1_epi32(1)));
}
[[gnu::always_inline, gnu::target("avx2")]] inline __m256i f64_to_f32_odd8(const double* p) {
  return _mm256_set_m128i(f64_to_f32_odd4(p + 4), f64_to_f32_odd4(p));
}
[[gnu::target("avx2,f16c")]] void f64_to_f16_avx2(const double* in, uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 odd = _mm256_castsi256_ps(f64_to_f32_odd8(in + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(odd, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = detail::f64_to_f16(in[i]);
}
[[gnu::target("avx2")]] void f64_to_bf16_avx2(const double* in, uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    store_bf16x16(out + i, bf16_bits8(f64_to_f32_odd8(in + i)), bf16_bits8(f64_to_f32_odd8(in + i + 8)));
  }
  for (; i < n; ++i) out[i] = detail::f64_to_bf16(in[i]);
}

// bfloat16 -> float32: bf16_to_f32 (the bits on top, a NaN made quiet) on eight lanes a step.
[[gnu::target("avx2")]] void bf16_to_f32_avx2(const uint16_t* in, float* out, std::size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFF0000), inf = _mm256_set1_epi32(0x7F800000);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_or_si256(bits, _mm256_and_si256(nan, quiet)));
  }
  for (; i < n; ++i) out[i] = detail::bf16_to_f32(in[i]);
}
#endif

}  // namespace

double element_as_double(DType dtype, const void* data, std::size_t i) {
  // Widened on the bits, as convert_elements does where the FPU might read a subnormal as 0 or trap.
  switch (dtype) {
    case DType::kFloat16:
      return detail::f32_to_f64(detail::f16_to_f32(static_cast<const uint16_t*>(data)[i]));
    case DType::kBFloat16:
      return detail::f32_to_f64(detail::bf16_to_f32(static_cast<const uint16_t*>(data)[i]));
    case DType::kFloat32:
      return detail::f32_to_f64(static_cast<const float*>(data)[i]);
    case DType::kFloat64: return static_cast<const double*>(data)[i];
  }
  return 0.0;
}

void convert_elements(DType from, const void* src, DType to, void* dst, std::size_t n) {
  if (from == to) {  // no conversion: the bits are copied, NaN payloads included
    if (src != dst && n != 0) std::memmove(dst, src, n * dtype_size(from));
    return;
  }
#if defined(__x86_64__)
  if (detail::cpu_has_avx2()) {  // the hardware float16 conversions and bfloat16 rounding in AVX2
    if (from == DType::kFloat32 && to == DType::kFloat16 && fpu_traps_nothing()) {
      return f32_to_f16_f16c(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
    }
    if (from == DType::kFloat16 && to == DType::kFloat32 && fpu_traps_nothing()) {
      return f16_to_f32_f16c(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
    }
    if (from == DType::kFloat32 && to == DType::kBFloat16) {
      return f32_to_bf16_avx2(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
    }
    if (from == DType::kBFloat16 && to == DType::kFloat32) {
      return bf16_to_f32_avx2(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
    }
    if (from == DType::kFloat16 && to == DType::kFloat64 && fpu_traps_nothing()) {
      return f16_to_f64_f16c(static_cast<const uint16_t*>(src), static_cast<double*>(dst), n);
    }
    if (from == DType::kFloat64 && to == DType::kFloat16 && fpu_at_defaults()) {
      return f64_to_f16_avx2(static_cast<const double*>(src), static_cast<uint16_t*>(dst), n);
    }
    if (from == DType::kFloat64 && to == DType::kBFloat16 && fpu_at_defaults()) {
      return f64_to_bf16_avx2(static_cast<const double*>(src), static_cast<uint16_t*>(dst), n);
    }
  }
#endif
  switch (from) {
    case DType::kFloat16: convert_from<F16>(src, to, dst, n); return;
    case DType::kBFloat16: convert_from<BF16>(src, to, dst, n); return;
    case DType::kFloat32: convert_from<float>(src, to, dst, n); return;
    case DType::kFloat64: convert_from<double>(src, to, dst, n); return;
  }
}

}  // namespace gcz

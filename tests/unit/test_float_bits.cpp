#include "gcz/detail/float_bits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu_features.h"
#include "gcz/convert.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcz::detail {
namespace {

bool is_f16_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }

TEST(FloatBits, F16RoundTripsThroughF32Exactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const uint16_t back = f32_to_f16(f);
    if (is_f16_nan(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(is_f16_nan(back));
      EXPECT_EQ(back & 0x8000, h & 0x8000);
    } else {
      ASSERT_EQ(back, h) << "f16 bits " << h;
    }
  }
}

TEST(FloatBits, F16MatchesCompilerConversion) {
  // _Float16 conversions are IEEE round-to-nearest-even; compare on a dense sweep of float32 patterns.
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4093) {
    const float f = bit_cast<float>(static_cast<uint32_t>(b));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    ASSERT_EQ(f32_to_f16(f), bit_cast<uint16_t>(ref)) << "float bits " << b;
  }
}

TEST(FloatBits, F16EdgeCases) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);           // max finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);           // rounds up to Inf
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even -> 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie to even (up)
  EXPECT_TRUE(is_f16_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_f16_nan(f32_to_f16(bit_cast<float>(0x7F800001u))));  // signalling NaN, low payload
}

TEST(FloatBits, Bf16RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // max float rounds to Inf
  EXPECT_EQ(f32_to_bf16(bit_cast<float>(0x00010000u)), 0x0001);  // subnormal kept
  EXPECT_EQ(f32_to_bf16(bit_cast<float>(0x00008000u)), 0x0000);  // tie to even -> 0
  EXPECT_EQ(f32_to_bf16(bit_cast<float>(0x00018000u)), 0x0002);
  const uint16_t nan = f32_to_bf16(bit_cast<float>(0x7F800001u));
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0);
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), b);
  }
}

TEST(FloatBits, F64NarrowingRoundsOnce) {
  // 1 + 2^-11 + 2^-40 is just above the float16 tie: a single rounding goes up, float32 first would tie.
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(f64_to_f16(d), 0x3C01);
  EXPECT_EQ(f32_to_f16(static_cast<float>(d)), 0x3C00);
  const double b = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  EXPECT_EQ(f64_to_bf16(b), 0x3F81);
  for (double v : {0.0, -0.0, 1e-300, 3.14159, -2.5e38, 1e39, 65504.0, 1e-8}) {
    EXPECT_EQ(bit_cast<uint32_t>(f64_to_f32(v)), bit_cast<uint32_t>(static_cast<float>(v))) << v;
    EXPECT_EQ(f64_to_f16(v), bit_cast<uint16_t>(static_cast<_Float16>(v))) << v;
  }
}

// The branch-free float32 conversions against the generic bit-level rounding, on a dense sweep of
// every float32 exponent and many fractions (NaNs included).
TEST(FloatBits, FastPathsMatchGenericRounding) {
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 257) {
    const uint32_t bits = static_cast<uint32_t>(b);
    const float f = bit_cast<float>(bits);
    ASSERT_EQ(f32_to_f16(f), (narrow_float_bits<8, 23, 5, 10>(bits))) << "bits " << bits;
    ASSERT_EQ(f32_to_bf16(f), (narrow_float_bits<8, 23, 8, 7>(bits))) << "bits " << bits;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(bit_cast<uint32_t>(f16_to_f32(static_cast<uint16_t>(h))),
              static_cast<uint32_t>(widen_float_bits<5, 10, 8, 23>(h)))
        << "f16 bits " << h;
  }
}

// The float32 patterns f32_to_f64 is checked on: every subnormal and zero of both signs, and for every
// other exponent (Inf and NaN included) a set of mantissas.
std::vector<float> f32_patterns() {
  std::vector<float> out;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t m = 0; m < (1u << 23); ++m) out.push_back(bit_cast<float>(sign | m));
    for (uint32_t e = 1; e <= 255; ++e) {
      for (uint32_t m : {0u, 1u, 2u, 0x2AAAAAu, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFFu}) {
        out.push_back(bit_cast<float>(sign | (e << 23) | m));
      }
    }
  }
  return out;
}

// The exact widening: widen_float_bits, with a NaN made quiet.
uint64_t widened(float f) {
  const uint32_t u = bit_cast<uint32_t>(f);
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return widen_float_bits<8, 23, 11, 52>(u) | (nan ? uint64_t{1} << 51 : 0);
}

TEST(FloatBits, F32ToF64IsExactAndMatchesTheCompilersConversion) {
  for (float f : f32_patterns()) {
    const uint64_t got = bit_cast<uint64_t>(f32_to_f64(f));
    ASSERT_EQ(got, widened(f)) << "float bits " << std::hex << bit_cast<uint32_t>(f);
    ASSERT_EQ(got, bit_cast<uint64_t>(static_cast<double>(f))) << "float bits " << std::hex << bit_cast<uint32_t>(f);
  }
}

// A process may have set flush-to-zero and denormals-are-zero (a library built with -ffast-math does
// so at load): float32 -> float64 still keeps every subnormal, as the CUDA backend does.
TEST(FloatBits, F32ToF64KeepsSubnormalsWhereDenormalsAreZero) {
#if defined(__x86_64__)
  const std::vector<float> in = f32_patterns();
  std::vector<double> out(in.size());
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
  convert_elements(DType::kFloat32, in.data(), DType::kFloat64, out.data(), in.size());
  // The compiler's own conversion under the flags, pinned between them by volatile accesses.
  volatile float tiny = bit_cast<float>(1u);
  volatile double probe = static_cast<double>(tiny);
  _mm_setcsr(saved);
  ASSERT_EQ(bit_cast<uint64_t>(static_cast<double>(probe)), 0u)
      << "DAZ did not take effect: the test would prove nothing";
  for (std::size_t k = 0; k < in.size(); ++k) {
    ASSERT_EQ(bit_cast<uint64_t>(out[k]), widened(in[k])) << "float bits " << std::hex << bit_cast<uint32_t>(in[k]);
  }
#else
  GTEST_SKIP() << "denormals-are-zero is set through x86's MXCSR; this CPU has none";
#endif
}

// float64 patterns around everything float32 rounds at: for each exponent from below float32's
// subnormals to above its overflow (and Inf/NaN), fractions exact, just below, at and above a float32
// tie (odd and even), and NaN payloads of every reach.
std::vector<double> f64_patterns() {
  std::vector<double> out;
  const uint64_t fractions[] = {0,
                                1,
                                (uint64_t{1} << 28) - 1,
                                uint64_t{1} << 28,
                                (uint64_t{1} << 28) + 1,
                                (uint64_t{3} << 28),
                                (uint64_t{1} << 29) | 1,
                                (uint64_t{1} << 51),
                                (uint64_t{1} << 51) | 1,
                                (uint64_t{1} << 52) - 1,
                                0x5555555555555ull,
                                0xAAAAAAAAAAAAAull};
  for (uint64_t sign : {uint64_t{0}, uint64_t{1} << 63}) {
    for (uint64_t e = 0; e < 2048; ++e) {
      if (e != 0 && e != 2047 && (e < 1023 - 160 || e > 1023 + 130)) continue;  // far out: 0 or Inf alike
      for (uint64_t f : fractions) out.push_back(bit_cast<double>(sign | (e << 52) | f));
    }
  }
  return out;
}

// convert_elements narrows float64 to float32 with the FPU where MXCSR has its defaults, and on the
// bits (f64_to_f32) where it flushes to zero or rounds otherwise: the same results either way.
TEST(FloatBits, F64ToF32ByTheFpuMatchesTheBits) {
  const std::vector<double> in = f64_patterns();
  std::vector<float> out(in.size());
  convert_elements(DType::kFloat64, in.data(), DType::kFloat32, out.data(), in.size());
  for (std::size_t k = 0; k < in.size(); ++k) {
    ASSERT_EQ(bit_cast<uint32_t>(out[k]), bit_cast<uint32_t>(f64_to_f32(in[k])))
        << "double bits " << std::hex << bit_cast<uint64_t>(in[k]);
  }
#if defined(__x86_64__)
  const unsigned saved = _mm_getcsr();
  for (unsigned flags : {0x8000u, 0x6000u}) {  // flush to zero; rounding toward zero
    _mm_setcsr(saved | flags);
    convert_elements(DType::kFloat64, in.data(), DType::kFloat32, out.data(), in.size());
    _mm_setcsr(saved);
    for (std::size_t k = 0; k < in.size(); ++k) {
      ASSERT_EQ(bit_cast<uint32_t>(out[k]), bit_cast<uint32_t>(f64_to_f32(in[k])))
          << "MXCSR flags " << std::hex << flags << ", double bits " << bit_cast<uint64_t>(in[k]);
    }
  }
#endif
}

// float64 patterns around everything float16 and bfloat16 round at: for each exponent from below
// float32's subnormals to above its overflow (and Inf/NaN), each tie position from float16's and
// bfloat16's normal precision down to half their smallest subnormal, the fraction just below, at and
// just above the tie, with an even and an odd bit above it; then random bit patterns of the same
// exponents. A length of 8k + 5 leaves a scalar tail.
std::vector<double> f64_half_patterns() {
  std::vector<double> out;
  std::vector<uint64_t> fractions = {0, 1, (uint64_t{1} << 52) - 1, 0x5555555555555ull, 0xAAAAAAAAAAAAAull};
  for (int s = 30; s <= 52; ++s) {
    const uint64_t tie = uint64_t{1} << (s - 1);
    const uint64_t odd = s < 52 ? uint64_t{1} << s : 0;
    for (uint64_t f : {tie - 1, tie, tie + 1}) {
      fractions.push_back(f);
      fractions.push_back(f | odd);
    }
  }
  for (uint64_t sign : {uint64_t{0}, uint64_t{1} << 63}) {
    for (uint64_t e = 0; e < 2048; ++e) {
      if (e != 0 && e != 2047 && (e < 1023 - 160 || e > 1023 + 130)) continue;  // far out: 0 or Inf alike
      for (uint64_t f : fractions) out.push_back(bit_cast<double>(sign | (e << 52) | f));
    }
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;  // splitmix64
  for (int k = 0; k < 200003; ++k) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const uint64_t e = 1023 - 160 + ((z >> 52) & 0x7FF) % 291;
    out.push_back(bit_cast<double>((z & 0x800FFFFFFFFFFFFFull) | (e << 52)));
  }
  return out;
}

// convert_elements narrows float64 to float16 and bfloat16 by rounding to odd on the FPU and then to
// nearest even (AVX2 and F16C, where MXCSR has its defaults), and on the bits elsewhere: the same
// results either way, also where MXCSR reads or flushes subnormals as zero or rounds otherwise.
TEST(FloatBits, F64ToHalfByRoundingToOddMatchesTheBits) {
  const std::vector<double> in = f64_half_patterns();
  std::vector<uint16_t> out(in.size());
  std::vector<unsigned> flag_sets = {0};
#if defined(__x86_64__)
  flag_sets.insert(flag_sets.end(), {0x0040u, 0x8000u, 0x6000u});  // DAZ; flush to zero; toward zero
  const unsigned saved = _mm_getcsr();
#endif
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    for (unsigned flags : flag_sets) {
#if defined(__x86_64__)
      _mm_setcsr(saved | flags);
#endif
      convert_elements(DType::kFloat64, in.data(), half, out.data(), in.size());
#if defined(__x86_64__)
      _mm_setcsr(saved);
#endif
      for (std::size_t k = 0; k < in.size(); ++k) {
        const uint64_t bits = bit_cast<uint64_t>(in[k]);
        const uint16_t want = half == DType::kFloat16 ? f64_to_f16(in[k]) : f64_to_bf16(in[k]);
        ASSERT_EQ(out[k], want) << dtype_name(half) << ", MXCSR flags " << std::hex << flags << ", double bits "
                                << bits;
      }
    }
  }
}

// Every float16 pattern widened to float64 by convert_elements (F16C, where the CPU has it) is the
// exact value, NaNs quiet with their payload, also where MXCSR reads subnormals as zero.
TEST(FloatBits, F16ToF64IsExact) {
  std::vector<uint16_t> h(0x10000 + 5);
  for (uint32_t k = 0; k < h.size(); ++k) h[k] = static_cast<uint16_t>(k);
  std::vector<double> out(h.size());
  std::vector<unsigned> flag_sets = {0};
#if defined(__x86_64__)
  flag_sets.push_back(0x8040u);  // denormals are zero, flush to zero
  const unsigned saved = _mm_getcsr();
#endif
  for (unsigned flags : flag_sets) {
#if defined(__x86_64__)
    _mm_setcsr(saved | flags);
#endif
    convert_elements(DType::kFloat16, h.data(), DType::kFloat64, out.data(), h.size());
#if defined(__x86_64__)
    _mm_setcsr(saved);
#endif
    for (std::size_t k = 0; k < h.size(); ++k) {
      const uint64_t want = widen_float_bits<5, 10, 11, 52>(h[k]);
      ASSERT_EQ(bit_cast<uint64_t>(out[k]), want) << "MXCSR flags " << std::hex << flags << ", float16 bits " << h[k];
    }
  }
}

// The conversions' results (convert_elements, element_as_double) are the specified ones (the bit-level reference:
// narrow_float_bits and widen_float_bits, integer code) whatever the process did to MXCSR: each rounding mode, flush to
// zero, denormals are zero, and every floating-point exception unmasked (a conversion that raised one would stop this
// test with SIGFPE). Every pair of dtypes, on every 16-bit pattern, the float32 sweep of
// VectorConversionsMatchPortableBitForBit and the float64 patterns above (NaN payloads, subnormals, overflow, ties),
// through the hardware paths where the CPU has them and through the portable ones.
TEST(FloatBits, ConversionsIgnoreTheFpuModesAndTrapNothing) {
  const DType types[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  std::vector<uint64_t> inputs[4];  // bit patterns per source dtype
  for (uint32_t k = 0; k < 0x10000; ++k) inputs[0].push_back(k), inputs[1].push_back(k);
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000, 0xFFFF};
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) inputs[2].push_back((hi << 16) | lo);
  }
  for (double d : f64_patterns()) inputs[3].push_back(bit_cast<uint64_t>(d));
  for (double d : f64_half_patterns()) inputs[3].push_back(bit_cast<uint64_t>(d));
  for (auto& in : inputs) in.resize(in.size() + 5, in[0x3C00 % in.size()]);  // a scalar tail
  // The reference, through float64 where it widens (exactly) and from there in one rounding.
  auto to_f64 = [](DType d, uint64_t b) -> uint64_t {
    switch (d) {
      case DType::kFloat16:
        return widen_float_bits<5, 10, 11, 52>(static_cast<uint32_t>(b));
      case DType::kBFloat16:
        return widen_float_bits<8, 23, 11, 52>(static_cast<uint32_t>(b) << 16);
      case DType::kFloat32:
        return widen_float_bits<8, 23, 11, 52>(static_cast<uint32_t>(b));
      case DType::kFloat64:
        return b;
    }
    return 0;
  };
  auto from_f64 = [](DType d, uint64_t b) -> uint64_t {
    switch (d) {
      case DType::kFloat16:
        return narrow_float_bits<11, 52, 5, 10>(b);
      case DType::kBFloat16:
        return narrow_float_bits<11, 52, 8, 7>(b);
      case DType::kFloat32:
        return narrow_float_bits<11, 52, 8, 23>(b);
      case DType::kFloat64:
        return b;
    }
    return 0;
  };
  std::vector<unsigned> modes = {0};
#if defined(__x86_64__)
  const unsigned saved = _mm_getcsr();
  modes = {saved,
           saved | 0x2000u,
           saved | 0x4000u,
           saved | 0x6000u,
           saved | 0x8000u,
           saved | 0x0040u,
           (saved | 0x8040u) & ~0x1F80u,
           saved & ~0x1F80u};
#endif
  for (bool vec : {true, false}) {
    allow_avx2_for_testing(vec);
    for (std::size_t f = 0; f < 4; ++f) {
      const std::size_t fsize = dtype_size(types[f]);
      std::vector<unsigned char> src(inputs[f].size() * fsize);
      for (std::size_t k = 0; k < inputs[f].size(); ++k) std::memcpy(&src[k * fsize], &inputs[f][k], fsize);
      for (std::size_t t = 0; t < 4; ++t) {
        if (t == f) continue;
        const std::size_t tsize = dtype_size(types[t]);
        std::vector<unsigned char> dst(inputs[f].size() * tsize);
        for (unsigned mode : modes) {
#if defined(__x86_64__)
          _mm_setcsr(mode);
#endif
          convert_elements(types[f], src.data(), types[t], dst.data(), inputs[f].size());
          std::vector<double> read(t == (f == 0 ? 1 : 0) ? inputs[f].size() : 0);  // element_as_double, once per source
          for (std::size_t k = 0; k < read.size(); ++k) read[k] = element_as_double(types[f], src.data(), k);
#if defined(__x86_64__)
          _mm_setcsr(saved);
#endif
          for (std::size_t k = 0; k < read.size(); ++k) {
            ASSERT_EQ(bit_cast<uint64_t>(read[k]), to_f64(types[f], inputs[f][k]))
                << "element_as_double of " << dtype_name(types[f]) << ", MXCSR " << std::hex << mode << ", bits "
                << inputs[f][k];
          }
          for (std::size_t k = 0; k < inputs[f].size(); ++k) {
            uint64_t got = 0;
            std::memcpy(&got, &dst[k * tsize], tsize);
            const uint64_t want = from_f64(types[t], to_f64(types[f], inputs[f][k]));
            ASSERT_EQ(got, want) << dtype_name(types[f]) << " -> " << dtype_name(types[t]) << ", MXCSR " << std::hex
                                 << mode << ", vector paths " << vec << ", bits " << inputs[f][k];
          }
        }
      }
    }
  }
  allow_avx2_for_testing(true);
}

// convert_elements between float32 and float16 (the x86 F16C instructions) and bfloat16 (AVX2
// integer code) against the portable branch-free code: every 16-bit pattern widened, and narrowed
// every float32 pattern whose low 16 bits are one of a set that holds each rounding case (exact,
// below, at and above the tie, the tie with an odd result, all ones) for every exponent, sign and
// NaN payload; runs of lengths that leave a scalar tail.
TEST(FloatBits, VectorConversionsMatchPortableBitForBit) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2/F16C on this CPU: only the portable conversions run";
  std::vector<uint16_t> h(0x10000 + 7);
  for (uint32_t k = 0; k < h.size(); ++k) h[k] = static_cast<uint16_t>(k);
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000, 0xFFFF};
  std::vector<float> f;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) f.push_back(bit_cast<float>((hi << 16) | lo));
  }
  f.resize(f.size() + 5, 1.0f);
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> wide[2];
    std::vector<uint16_t> narrow[2];
    for (int vec = 0; vec < 2; ++vec) {
      allow_avx2_for_testing(vec == 1);
      wide[vec].resize(h.size());
      narrow[vec].resize(f.size());
      convert_elements(half, h.data(), DType::kFloat32, wide[vec].data(), h.size());
      convert_elements(DType::kFloat32, f.data(), half, narrow[vec].data(), f.size());
    }
    allow_avx2_for_testing(true);
    for (std::size_t k = 0; k < h.size(); ++k) {
      ASSERT_EQ(bit_cast<uint32_t>(wide[0][k]), bit_cast<uint32_t>(wide[1][k]))
          << dtype_name(half) << " bits " << h[k];
    }
    for (std::size_t k = 0; k < f.size(); ++k) {
      ASSERT_EQ(narrow[0][k], narrow[1][k]) << dtype_name(half) << " from float bits " << bit_cast<uint32_t>(f[k]);
    }
  }
}

}  // namespace
}  // namespace gcz::detail

// TernGrad's one-pass encode of a tensor scale: the moments and the trits in one pass, the trits made
// under a bracket guessed for the scale and the pending ones settled after. Whatever path it takes
// (one pass; a scale outside the bracket; too many pending elements; no guess at all), it writes the
// bytes of the two-pass encode, at any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "codecs/quant_uniforms.h"
#include "codecs/terngrad.h"
#include "codecs/terngrad_span.h"
#include "cpu_features.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"

namespace gcz {
namespace {

using Path = detail::TernGradCodec::Path;
constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

struct Encoded {
  ByteBuffer trits, scales;
  Path path;
  bool operator==(const Encoded& o) const { return trits == o.trits && scales == o.scales; }
};

// Encodes the whole tensor with `spec` on `threads` threads, the one-pass encode allowed from
// `min_elements` on (and its bracket forced to [lo, hi] c sigma when they are not 0).
Encoded encode(const std::string& spec, const TensorInfo& t, const void* x, unsigned threads, uint64_t min_elements,
               double lo = 0.0, double hi = 0.0) {
  auto parsed = parse_codec_spec(spec);
  EXPECT_TRUE(parsed) << spec;
  auto made = make_codec("terngrad", parsed->stages[0].params, Backend::kCpu);
  EXPECT_TRUE(made) << made.status().message();
  Codec& c = **made;
  c.set_context({11, 3});
  c.set_threads(threads);
  detail::terngrad_one_pass_for_testing(min_elements, lo, hi);
  std::vector<ByteBuffer> out(2);
  const Status s = c.encode(t, x, 0, *t.numel(), out);
  detail::terngrad_one_pass_for_testing(detail::kTernGradOnePassMin);
  EXPECT_TRUE(s) << s.message();
  return {out[0], out[1], dynamic_cast<detail::TernGradCodec&>(c).last_path()};
}

TensorInfo f32(uint64_t n) { return {"t", DType::kFloat32, {n}}; }

// Two pieces of the one-pass encode (5 * 2^18 elements each) and a partial third, whose length is
// not a multiple of 5 or of 160: a tail of pending elements and a last byte of fewer trits.
constexpr uint64_t kN = 2 * 5 * (uint64_t{1} << 18) + 12347;

std::vector<float> gaussian(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(TernGradOnePass, WritesTheTwoPassBytesAtEveryThreadCount) {
  if (!detail::cpu_has_avx2()) GTEST_SKIP() << "the one-pass encode needs AVX2, which this CPU lacks";
  std::vector<std::vector<float>> sets;
  sets.push_back(gaussian(kN, 1));
  // Heavy tails: a Student t with 5 degrees of freedom (a wider bracket, more pending elements).
  std::mt19937 rng(2);
  std::student_t_distribution<float> student(5.0f);
  sets.emplace_back(kN);
  for (float& x : sets.back()) x = 0.01f * student(rng);
  // Rows of different scales, a non-finite first element (K comes later) and non-finite elements in
  // later spans (their spans take the loop that tests each element), exact zeros and -0.
  sets.push_back(gaussian(kN, 3));
  for (uint64_t i = 0; i < kN; ++i) sets.back()[i] *= 1.0f + static_cast<float>((i / 4096) % 7);
  sets.back()[0] = std::numeric_limits<float>::quiet_NaN();
  sets.back()[1500001] = std::numeric_limits<float>::infinity();
  sets.back()[kN - 2] = -std::numeric_limits<float>::infinity();
  for (uint64_t i = 100; i < 900; ++i) sets.back()[i] = i % 2 ? 0.0f : -0.0f;
  for (std::size_t d = 0; d < sets.size(); ++d) {
    const Encoded want = encode("terngrad", f32(kN), sets[d].data(), 1, kNever);
    EXPECT_EQ(want.path, Path::kTwoPasses);
    // The moments in AVX-512F where the CPU has it (TernGrad.Avx512MomentsAtEveryLength says if not), and in AVX2.
    for (bool avx512 : {true, false}) {
      detail::allow_avx512_for_testing(avx512);
      for (unsigned threads : {1u, 2u, 3u}) {
        const Encoded got = encode("terngrad", f32(kN), sets[d].data(), threads, 0);
        EXPECT_EQ(got.path, Path::kOnePass) << "data " << d << ", threads " << threads << ", AVX-512 " << avx512;
        EXPECT_TRUE(got == want) << "data " << d << ", threads " << threads << ", AVX-512 " << avx512;
      }
    }
    detail::allow_avx512_for_testing(true);
    // Another clip moves the scale (and the bracket) within the data. At s = sigma most elements lie
    // near enough the scale that the heavier-tailed sets' wider brackets would leave too many
    // pending: their guesses decline, and they take two passes.
    const Encoded clip1 = encode("terngrad:clip=1", f32(kN), sets[d].data(), 2, 0);
    EXPECT_EQ(clip1.path, d == 0 ? Path::kOnePass : Path::kTwoPasses) << "data " << d;
    EXPECT_TRUE(clip1 == encode("terngrad:clip=1", f32(kN), sets[d].data(), 2, kNever)) << "data " << d;
    // Deterministic rounding: pending where p crosses 1/2 within the bracket, settled by trit<false>.
    for (unsigned threads : {1u, 3u}) {
      const Encoded det = encode("terngrad:rounding=deterministic", f32(kN), sets[d].data(), threads, 0);
      if (d == 0) EXPECT_EQ(det.path, Path::kOnePass) << "threads " << threads;
      EXPECT_TRUE(det == encode("terngrad:rounding=deterministic", f32(kN), sets[d].data(), 1, kNever))
          << "data " << d << ", threads " << threads << ", path " << static_cast<int>(det.path);
    }
  }
  // bfloat16 and float16 input: each chunk converted once, for its moments and its trits.
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    ByteBuffer in(kN * 2);
    convert_elements(DType::kFloat32, sets[0].data(), dtype, in.data(), kN);
    const TensorInfo t{"t", dtype, {kN}};
    const Encoded one = encode("terngrad", t, in.data(), 2, 0);
    EXPECT_EQ(one.path, Path::kOnePass) << dtype_name(dtype);
    EXPECT_TRUE(one == encode("terngrad", t, in.data(), 1, kNever)) << dtype_name(dtype);
  }
}

// A bracket that misses the scale, on either side, or is so wide that too many elements wait: the
// trits are made again by the second pass, and the bytes do not change. A bracket a little wider
// than the guess's own still settles every pending element.
TEST(TernGradOnePass, ABracketThatMissesOrIsTooWideFallsBackToTheSecondPass) {
  if (!detail::cpu_has_avx2()) GTEST_SKIP() << "the one-pass encode needs AVX2, which this CPU lacks";
  const std::vector<float> x = gaussian(kN, 4);
  const Encoded want = encode("terngrad", f32(kN), x.data(), 1, kNever);
  struct Case {
    double lo, hi;
    Path path;
  };
  for (const Case& c : {Case{1.05, 1.1, Path::kMissed}, Case{0.9, 0.95, Path::kMissed}, Case{0.7, 1.4, Path::kGaveUp},
                        Case{0.99, 1.01, Path::kOnePass}}) {
    for (unsigned threads : {1u, 2u}) {
      const Encoded got = encode("terngrad", f32(kN), x.data(), threads, 0, c.lo, c.hi);
      EXPECT_EQ(got.path, c.path) << c.lo << ".." << c.hi << ", threads " << threads;
      EXPECT_TRUE(got == want) << c.lo << ".." << c.hi << ", threads " << threads;
    }
  }
}

// Where the scale may be max|x| rather than c sigma (no clip; no element beyond the bracket), where
// the packing is not base 3, or where the CPU lacks AVX2, the encode makes two passes.
TEST(TernGradOnePass, TwoPassesWhereTheOnePassDoesNotApply) {
  const std::vector<float> x = gaussian(kN, 5);
  std::vector<float> uniform(kN);
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : uniform) v = u(rng);  // sigma = 0.577: 2.5 sigma is above max|x|
  struct Case {
    const char* spec;
    const std::vector<float>* data;
  };
  for (const Case& c : {Case{"terngrad:clip=0", &x}, Case{"terngrad", &uniform}, Case{"terngrad:packing=2bit", &x}}) {
    const Encoded got = encode(c.spec, f32(kN), c.data->data(), 2, 0);
    EXPECT_EQ(got.path, Path::kTwoPasses) << c.spec;
  }
  detail::allow_avx2_for_testing(false);
  const Encoded sse2 = encode("terngrad", f32(kN), x.data(), 2, 0);
  detail::allow_avx2_for_testing(true);
  EXPECT_EQ(sse2.path, Path::kTwoPasses);
  if (detail::cpu_has_avx2()) EXPECT_TRUE(sse2 == encode("terngrad", f32(kN), x.data(), 2, 0));
}

// Samples that guess badly or not at all: mostly NaN (no guess); values near the top of the float
// range (their squares overflow float32, not the sample's float64 sums); a tensor whose variance
// lies in a stretch between the sampled blocks (a scale outside the bracket). The bytes are the two
// passes' whatever the path.
TEST(TernGradOnePass, SamplesThatMisleadKeepTheBytes) {
  std::vector<std::vector<float>> sets(3, gaussian(kN, 8));
  for (uint64_t i = 0; i < kN; ++i) {
    if (i % 3 != 0) sets[0][i] = std::numeric_limits<float>::quiet_NaN();
  }
  for (float& v : sets[1]) v *= 3e37f;
  sets[1][77777] = std::numeric_limits<float>::infinity();
  // The stretch lies between two of the sample's blocks (at 500496 and 501792 of kN, as the codec
  // spaces its 2048 blocks), and holds nearly all the variance: the guess misses the scale.
  for (uint64_t i = 0; i < kN; ++i) sets[2][i] *= 1e-3f;
  for (uint64_t i = 500600; i < 501700; ++i) sets[2][i] = 50.0f * (i % 2 ? 1.0f : -1.0f);
  const Path paths[3] = {Path::kTwoPasses, Path::kOnePass, Path::kMissed};
  for (std::size_t d = 0; d < sets.size(); ++d) {
    const Encoded want = encode("terngrad", f32(kN), sets[d].data(), 1, kNever);
    for (unsigned threads : {1u, 2u}) {
      const Encoded got = encode("terngrad", f32(kN), sets[d].data(), threads, 0);
      if (detail::cpu_has_avx2()) EXPECT_EQ(got.path, paths[d]) << "data " << d << ", threads " << threads;
      EXPECT_TRUE(got == want) << "data " << d << ", threads " << threads;
    }
  }
}

// The span loops themselves, on the values where a bracket's decisions are closest: x at the scale,
// at the bracket's ends and one step either side, at s k / 256 (a whole threshold byte) and one step
// either side, above the clip, zeros, subnormals and non-finite values; scales whose 1 / s is
// subnormal or near the smallest the vector loops take; brackets of zero width, one step wide, and
// ending at the scale; both roundings (deterministic: x at s / 2 and next to it). Bracketed and
// settled, the bytes are those of the two-pass span loop.
TEST(TernGradOnePass, SpanLoopsAtTheEdgesWriteTheTwoPassBytes) {
  if (!detail::terngrad_bracket_supported(1.0f)) GTEST_SKIP() << "the one-pass encode needs AVX2, which this CPU lacks";
  constexpr float inf = std::numeric_limits<float>::infinity();
  auto up = [](float v) { return std::nextafter(v, inf); };
  auto down = [](float v) { return std::nextafter(v, 0.0f); };
  std::mt19937 rng(31);
  for (const float s : {1.0f, 3.7e-3f, 0x1p-110f, 1.5e38f}) {
    struct Ends {
      float lo, hi;
    };
    for (const Ends br :
         {Ends{s, s}, Ends{down(s), up(s)}, Ends{0.97f * s, 1.03f * s}, Ends{s, 1.05f * s}, Ends{0.95f * s, s}}) {
      ASSERT_TRUE(detail::terngrad_bracket_supported(br.lo)) << s;
      const std::vector<float> edges = {
          s,           down(s),  up(s),        br.lo,        down(br.lo),  up(br.lo),     br.hi, up(br.hi),
          2 * s,       0.0f,     -0.0f,        1e-45f,       -3e-39f,      std::nanf(""), -inf,  inf,
          down(br.hi), 0.5f * s, 0.5f * br.lo, 0.5f * br.hi, up(0.5f * s), down(0.5f * s)};
      for (const uint64_t n : {uint64_t{160 * 9}, uint64_t{160 * 9 + 37}}) {
        for (const int variant : {0, 1, 2, 3}) {
          const bool finite = variant % 2 == 1, stochastic = variant < 2;
          std::vector<float> x(n);
          std::uniform_int_distribution<int> pick(0, 2), which(0, static_cast<int>(edges.size()) - 1), k(0, 256);
          std::uniform_real_distribution<float> any(-1.2f, 1.2f);
          for (float& v : x) {
            const int kind = pick(rng);
            const float q = static_cast<float>(k(rng)) / 256.0f * s;
            v = kind == 0 ? edges[which(rng)] : kind == 1 ? (k(rng) % 2 ? up(q) : down(q)) : any(rng) * s;
            if (finite && !std::isfinite(v)) v = s;
            if (rng() % 2) v = -v;
          }
          std::vector<uint8_t> u(n + 32), scratch(n + 5), want((n + 4) / 5), got((n + 4) / 5, 0xEE);
          std::vector<uint32_t> ties(detail::tie_room(n, n));
          detail::fill_coarse8(5, 6, detail::kStreamTernGrad, 0, n, u.data());
          const detail::FineDraws fine{5, 6, detail::kStreamTernGrad, 0};
          detail::terngrad_encode_span(
              {x.data(), u.data(), fine, n, n, &s, stochastic, true, finite, scratch.data(), ties.data(), want.data()});
          std::vector<detail::TernGradPending> pending(n);
          uint64_t count = 0;
          detail::terngrad_bracket_span(
              {x.data(), u.data(), n, 0, finite, stochastic, br.lo, br.hi, ties.data(), got.data()}, pending.data(),
              count);
          detail::terngrad_settle_pending(pending.data(), count, s, fine, got.data(), stochastic);
          EXPECT_EQ(got, want) << "s " << s << ", bracket " << br.lo << ".." << br.hi << ", n " << n << ", finite "
                               << finite << ", stochastic " << stochastic;
        }
      }
    }
  }
}

// By default only tensors of kTernGradOnePassMin elements or more take the one pass.
TEST(TernGradOnePass, FromTheDefaultSizeOn) {
  if (!detail::cpu_has_avx2()) GTEST_SKIP() << "the one-pass encode needs AVX2, which this CPU lacks";
  const uint64_t n = detail::kTernGradOnePassMin;
  const std::vector<float> x = gaussian(n, 7);
  EXPECT_EQ(encode("terngrad", f32(n - 1), x.data(), 2, detail::kTernGradOnePassMin).path, Path::kTwoPasses);
  const Encoded one = encode("terngrad", f32(n), x.data(), 2, detail::kTernGradOnePassMin);
  EXPECT_EQ(one.path, Path::kOnePass);
  EXPECT_TRUE(one == encode("terngrad", f32(n), x.data(), 2, kNever));
}

}  // namespace
}  // namespace gcz

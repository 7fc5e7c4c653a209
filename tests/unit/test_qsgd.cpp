// QSGD: the paper's properties (unbiasedness, the variance bound), nearest rounding's error bound, the
// documented bit layout and RNG mapping, chunking independence, edge cases and bad parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "codecs/quant_uniforms.h"
#include "gcz/codec.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/qsgd_math.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace gcz {
namespace {

std::unique_ptr<Codec> make(const std::string& spec, uint64_t seed = 1, uint64_t key = 7) {
  auto s = parse_codec_spec(spec);
  EXPECT_TRUE(s) << spec;
  auto c = make_codec("qsgd", s->stages[0].params, Backend::kCpu);
  EXPECT_TRUE(c) << c.status().message();
  (*c)->set_context({seed, key});
  return std::move(*c);
}

Status make_error(const std::string& spec) {
  auto s = parse_codec_spec(spec);
  if (!s) return s.status();
  auto c = make_codec(s->stages[0].name, s->stages[0].params, Backend::kCpu);
  return c ? Status::ok() : c.status();
}

struct Encoded {
  ByteBuffer codes, scales;
};

Encoded encode(Codec& c, const TensorInfo& t, const void* x, uint64_t first, uint64_t n) {
  std::vector<ByteBuffer> out(2);
  Status s = c.encode(t, x, first, n, out);
  EXPECT_TRUE(s) << s.message();
  return {out[0], out[1]};
}

std::vector<float> decode(Codec& c, const TensorInfo& t, const Encoded& e, uint64_t first, uint64_t n) {
  std::vector<float> y(n);
  Status s = c.decode(t, {ByteSpan(e.codes), ByteSpan(e.scales)}, first, n, y.data());
  EXPECT_TRUE(s) << s.message();
  return y;
}

TensorInfo f32(uint64_t n) { return {"t", DType::kFloat32, {n}}; }

std::vector<float> gaussian(uint64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<float> round_trip(const std::string& spec, const std::vector<float>& x, uint64_t seed = 1) {
  auto c = make(spec, seed);
  const TensorInfo t = f32(x.size());
  return decode(*c, t, encode(*c, t, x.data(), 0, x.size()), 0, x.size());
}

float max_abs(const float* x, uint64_t n) {
  float m = 0;
  for (uint64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

TEST(Qsgd, CanonicalParametersStreamsAndSizes) {
  auto c = make("qsgd");
  const Params p = c->params();
  EXPECT_EQ(std::get<int64_t>(p.at("bits")), 8);
  EXPECT_EQ(std::get<int64_t>(p.at("group")), 128);
  EXPECT_EQ(std::get<std::string>(p.at("scale")), "max");
  EXPECT_EQ(std::get<std::string>(p.at("rounding")), "stochastic");
  EXPECT_EQ(std::get<std::string>(p.at("scale_dtype")), "fp32");
  EXPECT_EQ(c->stream_names(f32(1)), (std::vector<std::string>{"codes", "scales"}));
  EXPECT_EQ(c->chunk_unit(), 128u);
  auto c3 = make("qsgd:bits=3,group=100,scale_dtype=bf16");
  EXPECT_EQ(c3->chunk_unit(), 200u);  // lcm(100, 8)
  EXPECT_EQ(*c3->stream_size(f32(1000), 0, 0, 1000), 375u);  // ceil(1000 * 3 / 8)
  EXPECT_EQ(*c3->stream_size(f32(1001), 0, 0, 1001), 376u);
  EXPECT_EQ(*c3->stream_size(f32(1001), 1, 0, 1001), 11u * 2);  // ceil(1001 / 100) bf16 scales
  // Rebuilding from the recorded parameters gives the same codec.
  auto again = make_codec("qsgd", c3->params(), Backend::kCpu);
  ASSERT_TRUE(again);
  EXPECT_EQ((*again)->params(), c3->params());
}

TEST(Qsgd, BadParametersAreRejectedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"qsgd:bits=1", "bits"},           {"qsgd:bits=9", "bits"},        {"qsgd:bits=x", "bits"},
      {"qsgd:group=0", "group"},         {"qsgd:group=-5", "group"},     {"qsgd:group=99999999", "group"},
      {"qsgd:scale=mean", "scale"},      {"qsgd:rounding=up", "rounding"}, {"qsgd:scale_dtype=fp64", "scale_dtype"},
      {"qsgd:levels=4", "levels"},
  };
  for (const auto& [spec, key] : cases) {
    Status s = make_error(spec);
    ASSERT_FALSE(s) << spec;
    EXPECT_NE(s.message().find("qsgd"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
  }
}

// The documented layout: sign-magnitude codes packed LSB-first, scale per group.
TEST(Qsgd, BitLayoutKnownAnswers) {
  // bits=4: s = 7. Group of 8 with max 1: levels 7, -7, 3.5 -> 4 (nearest, ties up), 0, ...
  const std::vector<float> x = {1.0f, -1.0f, 0.5f, 0.0f, -0.25f, 0.0f, 0.0f, 0.125f};
  auto c = make("qsgd:bits=4,group=8,rounding=nearest");
  Encoded e = encode(*c, f32(8), x.data(), 0, 8);
  // codes: 7, 8|7, 4, 0, 8|2 (1.75 -> 2), 0, 0, 1 (0.875 -> 1)
  const std::vector<uint8_t> want = {0xF7, 0x04, 0x0A, 0x10};
  ASSERT_EQ(e.codes.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(static_cast<uint8_t>(e.codes[i]), want[i]) << i;
  ASSERT_EQ(e.scales.size(), 4u);
  float scale;
  std::memcpy(&scale, e.scales.data(), 4);
  EXPECT_EQ(scale, 1.0f);

  // bits=3: s = 3; codes cross byte boundaries. x = 1, -1/3, 2/3, 0 -> codes 3, 4|1=5, 2, 0.
  const std::vector<float> y = {1.0f, -1.0f / 3, 2.0f / 3, 0.0f};
  auto c3 = make("qsgd:bits=3,group=4,rounding=nearest");
  Encoded e3 = encode(*c3, f32(4), y.data(), 0, 4);
  // bits: 011 101 010 000 -> stream bits LSB first: byte0 = 3 | 5<<3 | (2&3)<<6 = 0xAB, byte1 = 2>>2 | 0 = 0
  ASSERT_EQ(e3.codes.size(), 2u);
  EXPECT_EQ(static_cast<uint8_t>(e3.codes[0]), 0xABu);
  EXPECT_EQ(static_cast<uint8_t>(e3.codes[1]), 0x00u);
}

// Stochastic rounding draws Rng(seed, key, kStreamQsgdRounding).bernoulli(i, frac) for element i.
TEST(Qsgd, StochasticRoundingUsesTheDocumentedDraws) {
  const uint64_t n = 1000, seed = 99, key = 12345;
  const std::vector<float> x = gaussian(n, 3);
  auto c = make("qsgd:bits=8,group=1000", seed, key);
  Encoded e = encode(*c, f32(n), x.data(), 0, n);
  const float scale = max_abs(x.data(), n);
  const float inv = 127.0f / scale;
  detail::Rng rng(seed, key, detail::kStreamQsgdRounding);
  for (uint64_t i = 0; i < n; ++i) {
    const float r = std::fabs(x[i]) >= scale ? 127.0f : std::min(std::fabs(x[i]) * inv, 127.0f);
    const float l = std::floor(r);
    const uint32_t level = static_cast<uint32_t>(l) + (rng.bernoulli(i, r - l) ? 1 : 0);
    const uint32_t code = level | ((x[i] < 0 && level > 0) ? 0x80u : 0u);
    ASSERT_EQ(static_cast<uint8_t>(e.codes[i]), code) << i;
  }
}

// E[Q(x)] = x: the mean over 2000 seeds is within 5 standard deviations of the mean (per element; the
// variance of one draw is step^2 f (1 - f), f the fractional level), plus float32 rounding.
TEST(Qsgd, StochasticRoundingIsUnbiased) {
  const uint64_t n = 300, seeds = 2000;
  for (int bits : {2, 4, 8}) {
    const std::vector<float> x = gaussian(n, 5 + bits);
    const std::string spec = "qsgd:bits=" + std::to_string(bits) + ",group=128";
    std::vector<double> sum(n, 0.0);
    for (uint64_t seed = 0; seed < seeds; ++seed) {
      const std::vector<float> y = round_trip(spec, x, seed);
      for (uint64_t i = 0; i < n; ++i) sum[i] += y[i];
    }
    const double s = detail::qsgd::levels(bits);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t g0 = i / 128 * 128;
      const double scale = max_abs(x.data() + g0, std::min<uint64_t>(128, n - g0));
      const double r = std::fabs(x[i]) * s / scale, f = r - std::floor(r);
      const double sd = scale / s * std::sqrt(f * (1 - f) / seeds);
      EXPECT_NEAR(sum[i] / seeds, x[i], 5 * sd + 1e-6 * scale) << "bits " << bits << " element " << i;
    }
  }
}

// Alistarh et al., Lemma 3.1: E||Q(v) - v||^2 <= min(n / s^2, sqrt(n) / s) ||v||^2 with the l2 scale,
// checked per group on the mean over 2000 seeds (with 10% slack for the sampling error of the mean).
TEST(Qsgd, VarianceBoundWithTheL2Scale) {
  const uint64_t group = 128, n = 3 * group + 50, seeds = 2000;
  for (int bits : {2, 3, 4, 8}) {
    const std::vector<float> x = gaussian(n, 20 + bits, 0.01f);
    const std::string spec = "qsgd:scale=l2,group=128,bits=" + std::to_string(bits);
    std::vector<double> err((n + group - 1) / group, 0.0);
    for (uint64_t seed = 0; seed < seeds; ++seed) {
      const std::vector<float> y = round_trip(spec, x, seed);
      for (uint64_t i = 0; i < n; ++i) err[i / group] += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    }
    const double s = detail::qsgd::levels(bits);
    for (std::size_t g = 0; g < err.size(); ++g) {
      const uint64_t len = std::min(group, n - g * group);
      double norm2 = 0;
      for (uint64_t i = g * group; i < g * group + len; ++i) norm2 += double(x[i]) * x[i];
      const double bound = std::min(len / (s * s), std::sqrt(double(len)) / s) * norm2;
      EXPECT_LE(err[g] / seeds, 1.1 * bound) << "bits " << bits << " group " << g;
      EXPECT_GT(err[g], 0.0);
    }
  }
}

TEST(Qsgd, NearestRoundingErrorIsAtMostHalfAStep) {
  const uint64_t n = 1000;
  const std::vector<float> x = gaussian(n, 11);
  for (int bits = 2; bits <= 8; ++bits) {
    for (const char* scale : {"max", "l2"}) {
      const std::string spec = "qsgd:rounding=nearest,group=96,scale=" + std::string(scale) + ",bits=" + std::to_string(bits);
      auto c = make(spec);
      Encoded e = encode(*c, f32(n), x.data(), 0, n);
      const std::vector<float> y = decode(*c, f32(n), e, 0, n);
      const double s = detail::qsgd::levels(bits);
      for (uint64_t i = 0; i < n; ++i) {
        float sc;
        std::memcpy(&sc, e.scales.data() + i / 96 * 4, 4);
        ASSERT_LE(std::fabs(double(y[i]) - x[i]), sc / (2 * s) * (1 + 1e-5)) << spec << " element " << i;
      }
    }
  }
}

TEST(Qsgd, ChunkedEncodeEqualsWholeEncode) {
  const uint64_t n = 10007;
  const std::vector<float> x = gaussian(n, 13);
  for (const char* spec : {"qsgd", "qsgd:bits=3,group=100", "qsgd:bits=5,group=7,rounding=nearest",
                           "qsgd:bits=2,group=1,scale=l2", "qsgd:bits=6,group=3000,scale_dtype=fp16"}) {
    auto c = make(spec);
    const TensorInfo t = f32(n);
    const Encoded whole = encode(*c, t, x.data(), 0, n);
    const std::vector<float> y = decode(*c, t, whole, 0, n);
    for (uint64_t chunk : {c->chunk_unit(), 3 * c->chunk_unit(), 50 * c->chunk_unit()}) {
      Encoded parts;
      std::vector<float> ychunks;
      for (uint64_t first = 0; first < n; first += chunk) {
        const uint64_t count = std::min(chunk, n - first);
        Encoded e = encode(*c, t, x.data() + first, first, count);
        const std::vector<float> yc = decode(*c, t, e, first, count);
        parts.codes.insert(parts.codes.end(), e.codes.begin(), e.codes.end());
        parts.scales.insert(parts.scales.end(), e.scales.begin(), e.scales.end());
        ychunks.insert(ychunks.end(), yc.begin(), yc.end());
      }
      EXPECT_EQ(parts.codes, whole.codes) << spec << " chunk " << chunk;
      EXPECT_EQ(parts.scales, whole.scales) << spec << " chunk " << chunk;
      EXPECT_EQ(ychunks, y) << spec << " chunk " << chunk;
    }
  }
}

// The SSE2 and AVX2 loops (chosen at run time) write the same bytes and decode to the same values.
TEST(Qsgd, InstructionSetDoesNotChangeTheBytes) {
  const uint64_t n = 5003;
  std::vector<float> x = gaussian(n, 19);
  x[10] = std::numeric_limits<float>::infinity();
  x[77] = std::numeric_limits<float>::quiet_NaN();
  x[300] = -std::numeric_limits<float>::infinity();
  for (uint64_t i = 512; i < 640; ++i) x[i] = 0.0f;                     // an all-zero group
  for (uint64_t i = 640; i < 768; ++i) x[i] = i % 2 ? -0.75f : 0.75f;   // constant magnitude
  for (uint64_t i = 768; i < 896; ++i) x[i] *= 1e-41f;                  // subnormals
  for (uint64_t i = 896; i < 1024; ++i) x[i] *= 1e37f;                  // huge
  for (uint64_t i = 1024; i < 1152; ++i) x[i] *= 5e37f;                 // 1 / scale subnormal (2 bits)
  for (uint64_t i = 1152; i < 1280; ++i) x[i] *= 1e-32f;                // 2^17 s / scale overflows: scalar
  for (uint64_t i = 1280; i < 1408; ++i) x[i] *= 1e-30f;                // ... and just does not
  x[1500] = -0.0f;
  for (const char* spec : {"qsgd", "qsgd:rounding=nearest", "qsgd:bits=4", "qsgd:bits=3,group=100,scale=l2",
                           "qsgd:bits=2,rounding=nearest", "qsgd:bits=7,group=1000,scale_dtype=bf16",
                           "qsgd:bits=5,group=5,scale=l2", "qsgd:bits=6,group=1", "qsgd:group=33,scale_dtype=fp16",
                           "qsgd:bits=8,group=4096", "qsgd:bits=2,group=7", "qsgd:scale=l2",
                           "qsgd:scale=l2,group=700,rounding=nearest"}) {
    Encoded e[2];
    std::vector<float> y[2];
    for (int avx2 = 0; avx2 < 2; ++avx2) {
      detail::allow_avx2_for_testing(avx2 == 1);
      auto c = make(spec);
      e[avx2] = encode(*c, f32(n), x.data(), 0, n);
      y[avx2] = decode(*c, f32(n), e[avx2], 0, n);
    }
    detail::allow_avx2_for_testing(true);
    EXPECT_EQ(e[0].codes, e[1].codes) << spec;
    EXPECT_EQ(e[0].scales, e[1].scales) << spec;
    EXPECT_EQ(y[0], y[1]) << spec;
  }
}

// The shared math's quantize_drawn is quantize<B, true> with the uniform of 256 coarse + fine, and
// asks for the fine byte only when the coarse byte ties with the threshold's top byte.
TEST(Qsgd, QuantizeDrawnIsQuantizeWithTheWholeDraw) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> mag(0.0f, 1.0f);
  const float scale = 0.75f, s = 127.0f, inv = detail::qsgd::inverse_step(scale, 127);
  uint32_t asked = 0, cases = 0;
  for (int k = 0; k < 20000; ++k) {
    const float x = (k % 2 ? -1.0f : 1.0f) * mag(rng) * (k % 7 == 0 ? 2.0f : 0.8f);
    const uint32_t coarse = rng() & 0xFF, fine = rng() & 0xFF;
    bool called = false;
    const uint32_t got = detail::qsgd::quantize_drawn<8>(x, inv, s, scale, coarse, [&] {
      called = true;
      return fine;
    });
    const float u = detail::Rng::to_uniform(static_cast<uint16_t>(256 * coarse + fine));
    ASSERT_EQ(got, (detail::qsgd::quantize<8, true>(x, inv, s, scale, u))) << x << " " << coarse << " " << fine;
    const detail::qsgd::LevelFrac lf = detail::qsgd::level_frac(x, inv, s, scale);
    ASSERT_EQ(called, coarse == detail::bernoulli_threshold(lf.frac) >> 9) << x << " " << coarse;
    asked += called ? 1 : 0;
    ++cases;
  }
  EXPECT_GT(asked, 0u);
  EXPECT_LT(asked, cases / 50);  // about one in 256
}

// Values made so that every rounding ties with its coarse draw byte (floor(2^17 frac) >> 9 equals
// Rng::coarse8(i), and the fine byte decides): the vector loops note each one and settle it with the
// whole 16-bit draw, so the codes are still those of the documented draws, on either instruction set,
// for 8-bit codes and for 4-bit codes (packed as the loop goes), with a short last group of 3 elements
// (the scalar loop) or 20 (a vector step with its lanes past the group masked off).
TEST(Qsgd, RoundingsTheCoarseByteCannotSettle) {
  const uint64_t seed = 2024, key = 99;
  const detail::Rng rng(seed, key, detail::kStreamQsgdRounding);
  const std::pair<uint64_t, int> cases[] = {{4099, 8}, {4099, 4}, {4116, 8}, {4116, 4}};  // (n, bits)
  for (const auto& [n, bits] : cases) {
    const uint32_t s = (1u << (bits - 1)) - 1;
    std::vector<float> x(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t threshold = 512 * rng.coarse8(i) + 1 + static_cast<uint32_t>(i % 510);
      const float r = static_cast<float>(i % s) + static_cast<float>(threshold) * 0x1p-17f;  // exact
      x[i] = i % 3 == 0 ? -r : r;
    }
    x[0] = x[4096] = static_cast<float>(s);  // each group's scale, so that inv = 1 and r = |x|
    std::vector<uint8_t> want(n);
    uint32_t up = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const float r = std::fabs(x[i]), l = std::floor(r);
      const uint32_t level = static_cast<uint32_t>(l) + (rng.bernoulli(i, r - l) ? 1 : 0);
      up += level > static_cast<uint32_t>(l) ? 1 : 0;
      want[i] = static_cast<uint8_t>(level | ((x[i] < 0 && level > 0) ? 1u << (bits - 1) : 0u));
    }
    EXPECT_GT(up, n / 8);  // the fine bytes round some up and some down
    EXPECT_LT(up, n - n / 8);
    for (const int avx2 : {1, 0}) {
      detail::allow_avx2_for_testing(avx2 == 1);
      auto c = make("qsgd:group=4096,bits=" + std::to_string(bits), seed, key);
      const Encoded e = encode(*c, f32(n), x.data(), 0, n);
      ASSERT_EQ(e.codes.size(), (n * bits + 7) / 8);
      for (uint64_t i = 0; i < n; ++i) {
        const uint32_t code = bits == 8 ? static_cast<uint8_t>(e.codes[i])
                                        : (static_cast<uint8_t>(e.codes[i / 2]) >> (4 * (i % 2))) & 0xFu;
        ASSERT_EQ(code, want[i]) << n << " " << bits << " " << avx2 << " " << i;
      }
    }
    detail::allow_avx2_for_testing(true);
  }
}

TEST(Qsgd, SeedAndTensorKeyChooseTheDraws) {
  const std::vector<float> x = gaussian(500, 17);
  auto a = make("qsgd:bits=4", 1, 7), b = make("qsgd:bits=4", 1, 7), c = make("qsgd:bits=4", 2, 7),
       d = make("qsgd:bits=4", 1, 8);
  const TensorInfo t = f32(500);
  EXPECT_EQ(encode(*a, t, x.data(), 0, 500).codes, encode(*b, t, x.data(), 0, 500).codes);
  EXPECT_NE(encode(*a, t, x.data(), 0, 500).codes, encode(*c, t, x.data(), 0, 500).codes);
  EXPECT_NE(encode(*a, t, x.data(), 0, 500).codes, encode(*d, t, x.data(), 0, 500).codes);
}

TEST(Qsgd, EmptyZeroDimAndSingleElement) {
  auto c = make("qsgd:bits=3");
  Encoded e = encode(*c, f32(0), nullptr, 0, 0);
  EXPECT_TRUE(e.codes.empty());
  EXPECT_TRUE(e.scales.empty());
  EXPECT_TRUE(decode(*c, f32(0), e, 0, 0).empty());

  const TensorInfo scalar{"s", DType::kFloat32, {}};
  const float v = -2.5f;
  Encoded one = encode(*c, scalar, &v, 0, 1);
  EXPECT_EQ(one.codes.size(), 1u);
  EXPECT_EQ(one.scales.size(), 4u);
  // A lone element is its group's max: level s, which decodes to the scale exactly.
  EXPECT_EQ(decode(*c, scalar, one, 0, 1)[0], v);
}

// The largest group on a small tensor: one scale, chunk unit 2^24, scratch sized by the data.
TEST(Qsgd, LargestGroupOnASmallTensor) {
  const std::vector<float> x = gaussian(1000, 83);
  auto c = make("qsgd:group=16777216,rounding=nearest");
  EXPECT_EQ(c->chunk_unit(), uint64_t{1} << 24);
  Encoded e = encode(*c, f32(1000), x.data(), 0, 1000);
  EXPECT_EQ(e.scales.size(), 4u);
  const std::vector<float> y = decode(*c, f32(1000), e, 0, 1000);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(y[i] - x[i]), max_abs(x.data(), 1000) / 254 * 1.0001);
}

TEST(Qsgd, ZerosConstantsAndOddSizes) {
  for (uint64_t n : {1u, 5u, 13u, 129u, 1001u}) {
    const std::vector<float> zeros(n, 0.0f);
    for (const char* spec : {"qsgd:bits=3,group=5", "qsgd:scale=l2,group=7", "qsgd:bits=2,scale_dtype=fp16"}) {
      const std::vector<float> y = round_trip(spec, zeros);
      for (float v : y) ASSERT_EQ(v, 0.0f) << spec;
      // A constant group is its own max: level s, decoded exactly. With the l2 scale each element is
      // within one step (scale / s) of the constant.
      const bool l2 = std::string(spec).find("l2") != std::string::npos;
      const std::vector<float> k = round_trip(spec, std::vector<float>(n, -0.75f));
      for (float v : k) {
        if (l2) {
          ASSERT_NEAR(v, -0.75f, 0.75 * std::sqrt(7.0) / 127) << spec;
        } else {
          ASSERT_EQ(v, -0.75f) << spec;
        }
      }
    }
  }
}

TEST(Qsgd, HugeTinyAndSubnormalMagnitudes) {
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> huge = {big, -big, 1e38f, -3e37f, 0.0f, 1.0f, big, big};
  for (const char* spec : {"qsgd:rounding=nearest,group=8", "qsgd:rounding=nearest,group=8,scale=l2"}) {
    const std::vector<float> y = round_trip(spec, huge);
    for (std::size_t i = 0; i < huge.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << spec;
      ASSERT_LE(std::fabs(double(y[i]) - huge[i]), double(big) / 127 * 0.5001) << spec << " " << i;
    }
  }
  const std::vector<float> tiny = {1e-30f, -3e-31f, 2e-32f, 0.0f};
  const std::vector<float> yt = round_trip("qsgd:rounding=nearest,group=4", tiny);
  for (std::size_t i = 0; i < tiny.size(); ++i) EXPECT_NEAR(yt[i], tiny[i], 1e-30 / 254 * 1.0001);
  // Subnormal groups use the smallest scale, 2^-120: the error stays below half its step.
  const std::vector<float> sub = {1e-40f, -3e-41f, 1.4e-45f, 0.0f};
  for (const char* spec : {"qsgd:rounding=nearest,group=4", "qsgd:group=4"}) {
    const std::vector<float> ys = round_trip(spec, sub);
    for (std::size_t i = 0; i < sub.size(); ++i) {
      ASSERT_TRUE(std::isfinite(ys[i]));
      EXPECT_LE(std::fabs(double(ys[i]) - sub[i]), std::ldexp(1.0, -120) / 127) << spec;
      if (sub[i] == 0.0f) EXPECT_EQ(ys[i], 0.0f) << spec;  // level 0, and no sign but x's
      if (ys[i] != 0.0f) EXPECT_EQ(std::signbit(ys[i]), std::signbit(sub[i])) << spec << " " << i;
    }
  }
}

// Non-finite elements are encoded as zero and do not enter the scale.
TEST(Qsgd, NanAndInfDoNotPoisonTheGroup) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {0.5f, nan, -inf, 0.25f, inf, -0.5f, -nan, 0.125f};
  for (const char* spec : {"qsgd:group=8,rounding=nearest", "qsgd:group=8,scale=l2,rounding=nearest", "qsgd:group=4"}) {
    auto c = make(spec);
    Encoded e = encode(*c, f32(8), x.data(), 0, 8);
    const std::vector<float> y = decode(*c, f32(8), e, 0, 8);
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << spec << " " << i;
      if (!std::isfinite(x[i])) EXPECT_EQ(y[i], 0.0f) << spec << " " << i;
    }
    if (std::string(spec).find("l2") == std::string::npos && std::string(spec).find("nearest") != std::string::npos) {
      EXPECT_FLOAT_EQ(y[0], 0.5f);
      EXPECT_FLOAT_EQ(y[5], -0.5f);
    }
  }
  const std::vector<float> all_bad = {nan, inf, -inf, nan};
  for (float v : round_trip("qsgd:group=4", all_bad)) EXPECT_EQ(v, 0.0f);
}

// Narrow scale dtypes: the stored scale is rounded up, so no level exceeds s and the decoder's scale is
// the encoder's; scales beyond the type's range saturate.
TEST(Qsgd, NarrowScaleDtypes) {
  const std::vector<float> x = gaussian(512, 23, 3.7f);
  for (const char* sd : {"fp16", "bf16"}) {
    const std::string spec = std::string("qsgd:rounding=nearest,group=64,scale_dtype=") + sd;
    auto c = make(spec);
    Encoded e = encode(*c, f32(512), x.data(), 0, 512);
    ASSERT_EQ(e.scales.size(), 8u * 2);
    const std::vector<float> y = decode(*c, f32(512), e, 0, 512);
    for (uint64_t g = 0; g < 8; ++g) {
      uint16_t h;
      std::memcpy(&h, e.scales.data() + 2 * g, 2);
      float stored;
      convert_elements(std::string(sd) == "fp16" ? DType::kFloat16 : DType::kBFloat16, &h, DType::kFloat32, &stored, 1);
      ASSERT_GE(stored, max_abs(x.data() + 64 * g, 64)) << sd;
      for (uint64_t i = 64 * g; i < 64 * g + 64; ++i) ASSERT_LE(std::fabs(y[i] - x[i]), stored / 254 * 1.0001) << sd;
    }
  }
  // float16 scales saturate at 65504: larger values decode to at most 65504 (no Inf, no NaN).
  const std::vector<float> big = {1e6f, -2e5f, 10.0f, 0.0f};
  const std::vector<float> y = round_trip("qsgd:group=4,scale_dtype=fp16", big);
  EXPECT_NEAR(y[0], 65504.0f, 1.0f);
  EXPECT_NEAR(y[1], -65504.0f, 1.0f);
  EXPECT_TRUE(std::isfinite(y[2]));
}

// float16, bfloat16 and float64 inputs quantize their float32 values: same bytes as the float32 input.
TEST(Qsgd, OtherInputDtypesQuantizeTheirFloat32Values) {
  const uint64_t n = 777;
  const std::vector<float> g = gaussian(n, 29);
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    ByteBuffer in(n * dtype_size(d));
    convert_elements(DType::kFloat32, g.data(), d, in.data(), n);
    std::vector<float> as_f32(n);
    convert_elements(d, in.data(), DType::kFloat32, as_f32.data(), n);
    auto c = make("qsgd:bits=5,group=64");
    const TensorInfo t{"t", d, {n}};
    const Encoded e = encode(*c, t, in.data(), 0, n);
    const Encoded ref = encode(*c, f32(n), as_f32.data(), 0, n);
    EXPECT_EQ(e.codes, ref.codes) << dtype_name(d);
    EXPECT_EQ(e.scales, ref.scales) << dtype_name(d);
    ByteBuffer out(n * dtype_size(d));
    ASSERT_TRUE(c->decode(t, {ByteSpan(e.codes), ByteSpan(e.scales)}, 0, n, out.data()));
    const std::vector<float> y = decode(*c, f32(n), ref, 0, n);
    ByteBuffer want(n * dtype_size(d));
    convert_elements(DType::kFloat32, y.data(), d, want.data(), n);
    EXPECT_EQ(out, want) << dtype_name(d);
  }
}

TEST(Qsgd, CorruptStreamsAreRejected) {
  const std::vector<float> x = gaussian(13, 31);
  auto c = make("qsgd:bits=3,group=8");
  const TensorInfo t = f32(13);
  Encoded e = encode(*c, t, x.data(), 0, 13);
  std::vector<float> y(13);
  Encoded shortened = e;
  shortened.codes.pop_back();
  EXPECT_FALSE(c->decode(t, {ByteSpan(shortened.codes), ByteSpan(shortened.scales)}, 0, 13, y.data()));
  Encoded padded = e;  // 13 * 3 = 39 bits: the top bit of byte 4 is padding
  padded.codes.back() |= std::byte{0x80};
  Status s = c->decode(t, {ByteSpan(padded.codes), ByteSpan(padded.scales)}, 0, 13, y.data());
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("padding"), std::string::npos);
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Encoded b = e;
    std::memcpy(b.scales.data() + 4, &bad, 4);
    Status sb = c->decode(t, {ByteSpan(b.codes), ByteSpan(b.scales)}, 0, 13, y.data());
    EXPECT_FALSE(sb);
    EXPECT_NE(sb.message().find("scale"), std::string::npos);
  }
}

TEST(Qsgd, RoundTripThroughFiles) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(::testing::TempDir()) / "gcz_qsgd_files";
  fs::remove_all(d);
  fs::create_directories(d);
  const uint64_t n = 3000;
  const std::vector<float> x = gaussian(n, 37);
  {
    auto w = create_tensor_file((d / "in.safetensors").string(), {{"w", DType::kFloat32, {30, 100}}}, {});
    ASSERT_TRUE(w) << w.status().message();
    ASSERT_TRUE((*w)->begin(0));
    ASSERT_TRUE((*w)->write(x.data(), n));
    ASSERT_TRUE((*w)->end());
    ASSERT_TRUE((*w)->finish());
  }
  EncodeOptions o;
  o.spec = "qsgd:bits=4,group=100+zstd";
  o.device = DeviceRequest::kCpu;
  o.seed = 5;
  o.chunk_elements = 400;  // several chunks of lcm(100, 8) = 200
  auto report = encode_files({(d / "in.safetensors").string()}, (d / "x.gcz").string(), o);
  ASSERT_TRUE(report) << report.status().message();
  EXPECT_EQ(report->tensors.at(0).codec, "qsgd:bits=4,group=100,rounding=stochastic,scale=max,scale_dtype=fp32+zstd:level=3");
  DecodeOptions dopt;
  dopt.device = DeviceRequest::kCpu;
  ASSERT_TRUE(decode_file((d / "x.gcz").string(), (d / "out.safetensors").string(), dopt));
  auto r = open_tensor_file((d / "out.safetensors").string(), {});
  ASSERT_TRUE(r);
  std::vector<float> y(n);
  auto src = (*r)->open(0);
  ASSERT_TRUE(src);
  ASSERT_TRUE((*src)->read(0, n, y.data()));
  auto c = make("qsgd:bits=4,group=100", 5, tensor_key("w"));
  EXPECT_EQ(y, decode(*c, f32(n), encode(*c, f32(n), x.data(), 0, n), 0, n));
}

}  // namespace
}  // namespace gcz

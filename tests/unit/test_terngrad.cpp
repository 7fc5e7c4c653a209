// TernGrad: unbiasedness without clipping, the clip to ±c·sigma, deterministic rounding, the base-3 and
// 2-bit packings (known answers, exact sizes, round trips), the documented RNG draws, chunking, edge
// cases and bad parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>

#include "codecs/quant_uniforms.h"
#include "codecs/terngrad_span.h"
#include "cpu_features.h"
#include "gcz/codec.h"
#include "gcz/codec_spec.h"
#include "gcz/container.h"
#include "gcz/convert.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/terngrad_math.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace gcz {
namespace {

std::unique_ptr<Codec> make(const std::string& spec, uint64_t seed = 1, uint64_t key = 7) {
  auto s = parse_codec_spec(spec);
  EXPECT_TRUE(s) << spec;
  auto c = make_codec("terngrad", s->stages[0].params, Backend::kCpu);
  EXPECT_TRUE(c) << c.status().message();
  (*c)->set_context({seed, key});
  return std::move(*c);
}

struct Encoded {
  ByteBuffer trits, scales;
};

TensorInfo f32(uint64_t n) { return {"t", DType::kFloat32, {n}}; }

Encoded encode(Codec& c, const TensorInfo& t, const void* x, uint64_t first, uint64_t n) {
  std::vector<ByteBuffer> out(2);
  Status s = c.encode(t, x, first, n, out);
  EXPECT_TRUE(s) << s.message();
  return {out[0], out[1]};
}

std::vector<float> decode(Codec& c, const TensorInfo& t, const Encoded& e, uint64_t first, uint64_t n) {
  std::vector<float> y(n);
  Status s = c.decode(t, {ByteSpan(e.trits), ByteSpan(e.scales)}, first, n, y.data());
  EXPECT_TRUE(s) << s.message();
  return y;
}

std::vector<float> round_trip(const std::string& spec, const std::vector<float>& x, uint64_t seed = 1) {
  auto c = make(spec, seed);
  return decode(*c, f32(x.size()), encode(*c, f32(x.size()), x.data(), 0, x.size()), 0, x.size());
}

std::vector<float> gaussian(uint64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

float scale_of(const Encoded& e, uint64_t g = 0) {
  float s;
  std::memcpy(&s, e.scales.data() + 4 * g, 4);
  return s;
}

TEST(TernGrad, CanonicalParametersStreamsAndSizes) {
  auto c = make("terngrad");
  const Params p = c->params();
  EXPECT_EQ(std::get<double>(p.at("clip")), 2.5);
  EXPECT_EQ(std::get<std::string>(p.at("scale")), "tensor");
  EXPECT_EQ(std::get<std::string>(p.at("rounding")), "stochastic");
  EXPECT_EQ(std::get<std::string>(p.at("packing")), "base3");
  EXPECT_EQ(p.count("group"), 0u);  // only with scale=group
  EXPECT_EQ(c->stream_names(f32(1)), (std::vector<std::string>{"trits", "scales"}));
  EXPECT_EQ(c->chunk_unit(), 0u);
  EXPECT_EQ(*c->stream_size(f32(1001), 0, 0, 1001), 201u);  // ceil(1001 / 5)
  EXPECT_EQ(*c->stream_size(f32(1001), 1, 0, 1001), 4u);
  EXPECT_EQ(*c->stream_size(f32(0), 1, 0, 0), 0u);
  auto g = make("terngrad:scale=group,packing=2bit,clip=0");
  EXPECT_EQ(g->chunk_unit(), 128u);  // lcm(128, 4)
  EXPECT_EQ(*g->stream_size(f32(1001), 0, 0, 1001), 251u);  // ceil(1001 / 4)
  EXPECT_EQ(*g->stream_size(f32(1001), 1, 0, 1001), 8u * 4);
  EXPECT_EQ(make("terngrad:scale=group,group=100")->chunk_unit(), 100u);
  EXPECT_EQ(make("terngrad:scale=group,group=128")->chunk_unit(), 640u);  // lcm(128, 5)
  auto again = make_codec("terngrad", g->params(), Backend::kCpu);
  ASSERT_TRUE(again);
  EXPECT_EQ((*again)->params(), g->params());
}

TEST(TernGrad, BadParametersAreRejectedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"terngrad:clip=-1", "clip"},          {"terngrad:clip=x", "clip"},
      {"terngrad:scale=row", "scale"},       {"terngrad:scale=group,group=0", "group"},
      {"terngrad:group=64", "group"},        {"terngrad:rounding=nearest", "rounding"},
      {"terngrad:packing=3bit", "packing"},  {"terngrad:bits=2", "bits"},
  };
  for (const auto& [spec, key] : cases) {
    auto s = parse_codec_spec(spec);
    ASSERT_TRUE(s) << spec;
    auto c = make_codec("terngrad", s->stages[0].params, Backend::kCpu);
    ASSERT_FALSE(c) << spec;
    EXPECT_NE(c.status().message().find("terngrad"), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find(key), std::string::npos) << c.status().message();
  }
}

// Deterministic rounding without clipping: |x| / s >= 0.5 -> ±s; trits 0 zero, 1 plus, 2 minus.
TEST(TernGrad, PackingKnownAnswers) {
  const std::vector<float> x = {1.0f, -1.0f, 0.4f, 0.6f, -0.5f, 0.0f, 1.0f};
  auto b3 = make("terngrad:clip=0,rounding=deterministic");
  Encoded e = encode(*b3, f32(7), x.data(), 0, 7);
  ASSERT_EQ(e.trits.size(), 2u);
  EXPECT_EQ(static_cast<uint8_t>(e.trits[0]), 1 + 3 * 2 + 9 * 0 + 27 * 1 + 81 * 2);
  EXPECT_EQ(static_cast<uint8_t>(e.trits[1]), 0 + 3 * 1);
  EXPECT_EQ(scale_of(e), 1.0f);
  EXPECT_EQ(decode(*b3, f32(7), e, 0, 7), (std::vector<float>{1, -1, 0, 1, -1, 0, 1}));
  auto b2 = make("terngrad:clip=0,rounding=deterministic,packing=2bit");
  Encoded e2 = encode(*b2, f32(7), x.data(), 0, 7);
  ASSERT_EQ(e2.trits.size(), 2u);
  EXPECT_EQ(static_cast<uint8_t>(e2.trits[0]), 1 | 2 << 2 | 0 << 4 | 1 << 6);
  EXPECT_EQ(static_cast<uint8_t>(e2.trits[1]), 2 | 0 << 2 | 1 << 4);
}

// Any trit sequence survives both packings at the exact sizes ceil(n/5) and ceil(n/4).
TEST(TernGrad, PackingsRoundTripEveryLength) {
  std::mt19937 rng(3);
  for (uint64_t n = 0; n <= 64; ++n) {
    std::vector<float> x(n);
    for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 3) - 1);
    if (n > 0) x[0] = 1.0f;  // s = 1
    for (const char* packing : {"base3", "2bit"}) {
      auto c = make(std::string("terngrad:clip=0,rounding=deterministic,packing=") + packing);
      Encoded e = encode(*c, f32(n), x.data(), 0, n);
      EXPECT_EQ(e.trits.size(), std::string(packing) == "base3" ? (n + 4) / 5 : (n + 3) / 4);
      EXPECT_EQ(e.scales.size(), n > 0 ? 4u : 0u);
      EXPECT_EQ(decode(*c, f32(n), e, 0, n), x) << packing << " n=" << n;
    }
  }
}

// Trit i is nonzero iff Rng(seed, key, kStreamTernGrad).uniform(i) <= |x_i| / s.
TEST(TernGrad, StochasticRoundingUsesTheDocumentedDraws) {
  const uint64_t n = 103, seed = 5, key = 77;
  const std::vector<float> x = gaussian(n, 9);
  auto c = make("terngrad:clip=0,scale=group,group=5", seed, key);  // chunks of 5: not multiples of 4
  detail::Rng rng(seed, key, detail::kStreamTernGrad);
  for (uint64_t first = 0; first < n; first += 15) {
    const uint64_t count = std::min<uint64_t>(15, n - first);
    Encoded e = encode(*c, f32(n), x.data() + first, first, count);
    const std::vector<float> y = decode(*c, f32(n), e, first, count);
    for (uint64_t i = 0; i < count; ++i) {
      const float s = scale_of(e, i / 5), a = std::fabs(x[first + i]);
      const float p = a >= s ? 1.0f : a * (1.0f / s);  // the group's max is always ±s
      const bool on = rng.uniform(first + i) <= p;
      ASSERT_EQ(y[i], on ? std::copysign(s, x[first + i]) : 0.0f) << first + i;
    }
  }
}

// The shared math's trit_drawn is trit<true> with the uniform of 256 coarse + fine, and asks for the
// fine byte only when the coarse byte ties with the threshold's top byte.
TEST(TernGrad, TritDrawnIsTritWithTheWholeDraw) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> mag(0.0f, 1.2f);
  const float s = 0.9f, inv = 1.0f / s;
  const float special[] = {0.0f, -0.0f, s, -s, 2.0f, std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), 1e-42f};
  uint32_t asked = 0;
  for (int k = 0; k < 20000; ++k) {
    const float x = k < 8 ? special[k] : (k % 2 ? -1.0f : 1.0f) * mag(rng);
    const uint32_t coarse = k < 8 ? 0 : rng() & 0xFF, fine = rng() & 0xFF;
    bool called = false;
    const uint32_t got = detail::terngrad::trit_drawn(x, s, inv, coarse, [&] {
      called = true;
      return fine;
    });
    const float u = detail::Rng::to_uniform(static_cast<uint16_t>(256 * coarse + fine));
    ASSERT_EQ(got, detail::terngrad::trit<true>(x, s, inv, u)) << x << " " << coarse << " " << fine;
    asked += called ? 1 : 0;
  }
  EXPECT_GT(asked, 0u);
  EXPECT_LT(asked, 20000u / 50);  // about one in 256
}

// Values made so that every draw ties with its coarse byte (floor(2^17 p) >> 9 equals Rng::coarse8(i),
// and the fine byte decides): the vector loops note each one and settle it in the packed bytes with
// the whole 16-bit draw, so the trits are still those of the documented draws, for both packings,
// tensor and group scales, groups whose last elements take a masked vector step, and either
// instruction set. The tensor spans three of the codec's spans (65280 elements), the last partial.
TEST(TernGrad, DrawsTheCoarseByteCannotSettle) {
  const uint64_t n = 140003, seed = 31, key = 4;
  const detail::Rng rng(seed, key, detail::kStreamTernGrad);
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t threshold = 512 * rng.coarse8(i) + 1 + static_cast<uint32_t>(i % 510);
    const float p = static_cast<float>(threshold) * 0x1p-17f;  // exact, below 1
    x[i] = i % 3 == 0 ? -p : p;
  }
  // s = 1 for the tensor and every group: p = |x|.
  for (uint64_t i = 0; i < n; ++i) x[i] = i % 40 == 0 || i % 36 == 0 ? 1.0f : x[i];
  // Groups of 40 end in 8 elements, and groups of 36 in 4, that take a vector step of their own.
  for (const char* spec : {"terngrad:clip=0", "terngrad:clip=0,packing=2bit", "terngrad:clip=0,scale=group,group=320",
                           "terngrad:clip=0,scale=group,group=320,packing=2bit",
                           "terngrad:clip=0,scale=group,group=40", "terngrad:clip=0,scale=group,group=36"}) {
    for (const int avx2 : {1, 0}) {
      detail::allow_avx2_for_testing(avx2 == 1);
      auto c = make(spec, seed, key);
      const Encoded e = encode(*c, f32(n), x.data(), 0, n);
      const std::vector<float> y = decode(*c, f32(n), e, 0, n);
      uint64_t on_count = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const bool on = rng.uniform(i) <= std::fabs(x[i]);
        on_count += on ? 1 : 0;
        ASSERT_EQ(y[i], on ? std::copysign(1.0f, x[i]) : 0.0f) << spec << " " << avx2 << " " << i;
      }
      EXPECT_GT(on_count, n / 8) << spec;  // the fine bytes turn some on and leave some off
      EXPECT_LT(on_count, n - n / 8) << spec;
    }
    detail::allow_avx2_for_testing(true);
  }
}

// Without clipping, E[x̂] = x: mean over 2000 seeds within 5 sd (sd^2 = s^2 p (1 - p) / seeds).
TEST(TernGrad, StochasticRoundingIsUnbiasedWithoutClipping) {
  const uint64_t n = 300, seeds = 2000;
  for (const char* spec : {"terngrad:clip=0", "terngrad:clip=0,scale=group,group=64,packing=2bit"}) {
    const std::vector<float> x = gaussian(n, 41);
    std::vector<double> sum(n, 0.0);
    std::vector<float> scales(n);
    for (uint64_t seed = 0; seed < seeds; ++seed) {
      auto c = make(spec, seed);
      Encoded e = encode(*c, f32(n), x.data(), 0, n);
      const std::vector<float> y = decode(*c, f32(n), e, 0, n);
      for (uint64_t i = 0; i < n; ++i) {
        sum[i] += y[i];
        scales[i] = scale_of(e, e.scales.size() == 4 ? 0 : i / 64);
      }
    }
    for (uint64_t i = 0; i < n; ++i) {
      const double s = scales[i], p = std::fabs(x[i]) / s;
      EXPECT_NEAR(sum[i] / seeds, x[i], 5 * s * std::sqrt(p * (1 - p) / seeds) + 1e-6 * s) << spec << " " << i;
    }
  }
}

// The scale is min(max|x|, c * sigma), sigma the population sd of the finite elements (float64).
TEST(TernGrad, ClippingToCSigma) {
  std::vector<float> x = gaussian(4000, 43, 0.01f);
  x[17] = 5.0f;  // an outlier far beyond 2.5 sigma
  x[99] = std::numeric_limits<float>::quiet_NaN();
  double sum = 0, sq = 0, n = 0;
  for (float v : x) {
    if (std::isfinite(v)) sum += v, n += 1;
  }
  for (float v : x) {
    if (std::isfinite(v)) sq += (v - sum / n) * (v - sum / n);
  }
  const double sigma = std::sqrt(sq / n);
  for (double c : {2.5, 1.0}) {
    auto codec = make("terngrad:clip=" + std::to_string(c));
    Encoded e = encode(*codec, f32(x.size()), x.data(), 0, x.size());
    EXPECT_NEAR(scale_of(e), c * sigma, c * sigma * 1e-6);
    const std::vector<float> y = decode(*codec, f32(x.size()), e, 0, x.size());
    EXPECT_EQ(y[17], scale_of(e));  // clipped to s: p = 1
    EXPECT_EQ(y[99], 0.0f);
    for (float v : y) ASSERT_TRUE(v == 0.0f || std::fabs(v) == scale_of(e));
  }
  auto none = make("terngrad:clip=0");
  EXPECT_EQ(scale_of(encode(*none, f32(x.size()), x.data(), 0, x.size())), 5.0f);
  auto wide = make("terngrad:clip=1000");  // c * sigma above the max: no clipping
  EXPECT_EQ(scale_of(encode(*wide, f32(x.size()), x.data(), 0, x.size())), 5.0f);
  // Per group: each group's own sigma and max.
  auto grouped = make("terngrad:scale=group,group=1000,clip=2.5");
  Encoded eg = encode(*grouped, f32(x.size()), x.data(), 0, x.size());
  ASSERT_EQ(eg.scales.size(), 16u);
  EXPECT_LT(scale_of(eg, 0), 1.0f);  // the outlier's group is clipped
  for (uint64_t g = 1; g < 4; ++g) EXPECT_LT(scale_of(eg, g), 0.1f);
}

// An infinity among a block's last (n mod 8) elements, which the vector loop leaves to a scalar one, is
// left out of the moments as one in the vector loop is: sigma is that of the finite elements, on every
// instruction set, and equals the one with a NaN there.
TEST(TernGrad, AnInfinityInABlocksTailIsLeftOutOfSigma) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> finite = {0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 10.0f};
  double mean = 0, sq = 0;
  for (float v : finite) mean += v / 8.0;
  for (float v : finite) sq += (v - mean) * (v - mean);
  const double clipped = 2.5 * std::sqrt(sq / 8);  // 8.185..., below the max, 10
  for (const float last : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> x = finite;
    x.push_back(last);
    for (int avx2 = 0; avx2 < 2; ++avx2) {
      detail::allow_avx2_for_testing(avx2 == 1);
      auto c = make("terngrad");
      EXPECT_NEAR(scale_of(encode(*c, f32(x.size()), x.data(), 0, x.size())), clipped, clipped * 1e-6)
          << last << " avx2 " << avx2;
    }
    detail::allow_avx2_for_testing(true);
  }
}

// The scale rule itself (host and device share it): clip 0 never clips, whatever sigma is given.
TEST(TernGrad, ScaleFromStatsClipsOnlyForAPositiveClipAndSigma) {
  using detail::terngrad::scale_from_stats;
  EXPECT_EQ(scale_from_stats(5.0f, 0.01, 0.0), 5.0f);
  EXPECT_EQ(scale_from_stats(5.0f, 0.01, 2.5), static_cast<float>(2.5 * 0.01));
  EXPECT_EQ(scale_from_stats(5.0f, 0.0, 2.5), 5.0f);         // a constant: nothing to clip
  EXPECT_EQ(scale_from_stats(5.0f, 10.0, 2.5), 5.0f);        // c * sigma above the max
  EXPECT_EQ(scale_from_stats(1e-40f, 0.0, 0.0), 0x1p-120f);  // raised to the smallest scale
  EXPECT_EQ(scale_from_stats(0.0f, 0.0, 2.5), 0.0f);
}

TEST(TernGrad, DeterministicRoundingIsNearest) {
  const std::vector<float> x = gaussian(999, 47);
  auto c = make("terngrad:rounding=deterministic,clip=0,scale=group,group=100");
  Encoded e = encode(*c, f32(999), x.data(), 0, 999);
  const std::vector<float> y = decode(*c, f32(999), e, 0, 999);
  for (uint64_t i = 0; i < 999; ++i) {
    const float s = scale_of(e, i / 100);
    ASSERT_EQ(y[i], std::fabs(x[i]) * (1.0f / s) >= 0.5f ? std::copysign(s, x[i]) : 0.0f) << i;
    ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * s * (1 + 1e-6f));
  }
}

TEST(TernGrad, ChunkedEncodeEqualsWholeEncode) {
  const uint64_t n = 10007;
  const std::vector<float> x = gaussian(n, 53);
  for (const char* spec : {"terngrad:scale=group", "terngrad:scale=group,group=7,packing=2bit",
                           "terngrad:scale=group,group=3,rounding=deterministic",
                           "terngrad:scale=group,group=2000,clip=1", "terngrad:scale=group,group=96"}) {
    auto c = make(spec);
    const Encoded whole = encode(*c, f32(n), x.data(), 0, n);
    const std::vector<float> y = decode(*c, f32(n), whole, 0, n);
    for (uint64_t chunk : {c->chunk_unit(), 7 * c->chunk_unit()}) {
      Encoded parts;
      std::vector<float> ychunks;
      for (uint64_t first = 0; first < n; first += chunk) {
        const uint64_t count = std::min(chunk, n - first);
        Encoded e = encode(*c, f32(n), x.data() + first, first, count);
        const std::vector<float> yc = decode(*c, f32(n), e, first, count);
        parts.trits.insert(parts.trits.end(), e.trits.begin(), e.trits.end());
        parts.scales.insert(parts.scales.end(), e.scales.begin(), e.scales.end());
        ychunks.insert(ychunks.end(), yc.begin(), yc.end());
      }
      EXPECT_EQ(parts.trits, whole.trits) << spec << " chunk " << chunk;
      EXPECT_EQ(parts.scales, whole.scales) << spec << " chunk " << chunk;
      EXPECT_EQ(ychunks, y) << spec << " chunk " << chunk;
    }
  }
}

// The SSE2 and AVX2 loops (chosen at run time) write the same bytes and decode to the same values.
TEST(TernGrad, InstructionSetDoesNotChangeTheBytes) {
  const uint64_t n = 150011;  // three of the codec's spans (65280 elements), the last partial
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Data sets: all finite; non-finite early and late (the moments' checked blocks); a non-finite
  // first element (K is found later); subnormals, huge values, zeros, a constant stretch and -0.
  std::vector<std::vector<float>> sets(7, gaussian(n, 73));
  sets[1][10] = inf;
  sets[1][9000] = nan;
  sets[1][n - 3] = -inf;
  sets[2][0] = nan;
  sets[2][1] = -inf;
  for (uint64_t i = 0; i < 2000; ++i) sets[3][i] *= 1e-40f;
  for (uint64_t i = 2000; i < 2600; ++i) sets[3][i] = 0.0f;
  for (uint64_t i = 2600; i < 3000; ++i) sets[3][i] = -1.25f;
  for (uint64_t i = 3000; i < 3100; ++i) sets[3][i] *= 1e30f;
  sets[3][5000] = -0.0f;
  // Scales near the top of the range (1 / s is subnormal), at the smallest scale 2^-120 (the vector
  // loops' scaled 1 / s would overflow: the scalar loop takes over) and above it (the vector loops).
  for (float& v : sets[4]) v *= 5e37f;
  for (float& v : sets[5]) v *= 1e-37f;
  for (float& v : sets[6]) v *= 1e-36f;
  for (std::size_t d = 0; d < sets.size(); ++d) {
    const std::vector<float>& x = sets[d];
    for (const char* spec :
         {"terngrad", "terngrad:packing=2bit,rounding=deterministic", "terngrad:scale=group,group=300",
          "terngrad:scale=group,group=7,clip=1,packing=2bit", "terngrad:clip=0",
          "terngrad:scale=group,group=256,rounding=deterministic", "terngrad:scale=group,group=33",
          "terngrad:scale=group", "terngrad:scale=group,group=64,clip=0", "terngrad:scale=group,group=512",
          // Groups of 4 mod 8: the AVX2 loop must not sum the next group's first four elements.
          "terngrad:scale=group,group=36", "terngrad:scale=group,group=12"}) {
      Encoded e[2];
      std::vector<float> y[2];
      for (int avx2 = 0; avx2 < 2; ++avx2) {
        detail::allow_avx2_for_testing(avx2 == 1);
        auto c = make(spec);
        e[avx2] = encode(*c, f32(n), x.data(), 0, n);
        y[avx2] = decode(*c, f32(n), e[avx2], 0, n);
      }
      detail::allow_avx2_for_testing(true);
      EXPECT_EQ(e[0].trits, e[1].trits) << spec << " data " << d;
      EXPECT_EQ(e[0].scales, e[1].scales) << spec << " data " << d;
      EXPECT_EQ(y[0], y[1]) << spec << " data " << d;
    }
  }
}

// Group scales whose groups hold whole steps of 32: the AVX2 round loop takes each step's scale from a
// table laid out per span, then hands over to the steps after the last whole round (and the last
// few elements) with the scale where the rounds ended, whether or not they ended on a group's edge.
TEST(TernGrad, GroupScalesAcrossRoundsAndTailsMatchTheScalarLoops) {
  for (const uint64_t group : {32, 96, 128, 160, 320}) {
    for (const uint64_t n : std::vector<uint64_t>{31, 200, 995, 1000, 1120, 4077, 65280 + 200}) {
      const std::vector<float> x = gaussian(n, static_cast<uint32_t>(group + n));
      const std::string spec = "terngrad:scale=group,group=" + std::to_string(group);
      Encoded e[2];
      for (int avx2 = 0; avx2 < 2; ++avx2) {
        detail::allow_avx2_for_testing(avx2 == 1);
        auto c = make(spec);
        e[avx2] = encode(*c, f32(n), x.data(), 0, n);
      }
      detail::allow_avx2_for_testing(true);
      EXPECT_EQ(e[0].trits, e[1].trits) << spec << " n " << n;
      EXPECT_EQ(e[0].scales, e[1].scales) << spec << " n " << n;
    }
  }
}

// Why threads may take super-blocks: a PairwiseSum over the totals of super-blocks of 2^p blocks (the
// last partial) is the same tree, bit for bit, as one over all the blocks. Sums of values spread
// over 60 binary orders of magnitude make a different order visible, as super-blocks of 3 show.
TEST(TernGrad, PairwiseSumOfSuperBlocksIsTheSameTree) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-30, 30);
  bool three_differs = false;
  for (int m = 1; m <= 80; ++m) {
    std::vector<double> blocks(m);
    for (double& b : blocks) b = std::ldexp(unit(rng), exponent(rng));
    detail::PairwiseSum all;
    for (double b : blocks) all.add(b);
    for (int super : {1, 2, 4, 8, 16, 3}) {
      detail::PairwiseSum outer;
      for (int a = 0; a < m; a += super) {
        detail::PairwiseSum inner;
        for (int b = a; b < std::min(m, a + super); ++b) inner.add(blocks[b]);
        outer.add(inner.total());
      }
      if (super == 3) {
        three_differs |= outer.total() != all.total();
      } else {
        EXPECT_EQ(outer.total(), all.total()) << m << " blocks, super-blocks of " << super;
      }
    }
  }
  EXPECT_TRUE(three_differs);
}

// A tensor scale's codec splits the tensor over its threads, the moments in super-blocks of 2^18
// elements: the bytes are those of one thread, and the scale is that of one TernGradMoments fed the
// whole tensor (one pairwise tree over all its blocks). K comes from a later element (x[0] is NaN), and
// a later super-block holds non-finite values. bfloat16 input too.
TEST(TernGrad, TensorScaleThreadsKeepTheBytes) {
  const uint64_t n = 5 * (uint64_t{1} << 18) + 1234;  // 6 super-blocks, the last partial
  std::vector<float> x = gaussian(n, 91);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[700000] = std::numeric_limits<float>::infinity();
  x[n - 1] = 40.0f;
  for (const char* spec : {"terngrad", "terngrad:packing=2bit,rounding=deterministic", "terngrad:clip=0.5"}) {
    std::vector<Encoded> e;
    std::vector<std::vector<float>> y;
    for (unsigned threads : {1u, 2u, 3u}) {
      auto c = make(spec);
      c->set_threads(threads);
      e.push_back(encode(*c, f32(n), x.data(), 0, n));
      y.push_back(decode(*c, f32(n), e.back(), 0, n));
    }
    for (std::size_t k = 1; k < e.size(); ++k) {
      EXPECT_EQ(e[k].trits, e[0].trits) << spec << " threads " << k + 1;
      EXPECT_EQ(e[k].scales, e[0].scales) << spec << " threads " << k + 1;
      EXPECT_EQ(y[k], y[0]) << spec << " threads " << k + 1;
    }
    detail::TernGradMoments m;
    detail::terngrad_add_moments(x.data(), n, m);
    const double clip = std::string(spec) == "terngrad:clip=0.5" ? 0.5 : 2.5;
    EXPECT_EQ(scale_of(e[0]), m.scale(clip)) << spec;
    EXPECT_LT(scale_of(e[0]), 40.0f) << spec;  // clipped: the outlier does not set the scale
  }
  // bfloat16 input: each thread converts its spans into its own buffer.
  ByteBuffer bf(n * 2);
  convert_elements(DType::kFloat32, x.data(), DType::kBFloat16, bf.data(), n);
  const TensorInfo t{"t", DType::kBFloat16, {n}};
  std::vector<Encoded> e;
  std::vector<ByteBuffer> y;
  for (unsigned threads : {1u, 2u}) {
    auto c = make("terngrad");
    c->set_threads(threads);
    e.push_back(encode(*c, t, bf.data(), 0, n));
    y.emplace_back(n * 2);
    EXPECT_TRUE(c->decode(t, {ByteSpan(e.back().trits), ByteSpan(e.back().scales)}, 0, n, y.back().data()));
  }
  EXPECT_EQ(e[1].trits, e[0].trits);
  EXPECT_EQ(e[1].scales, e[0].scales);
  EXPECT_EQ(y[1], y[0]);
}

// The moments themselves, not only the float32 scales they lead to, are the same bits from the SSE2 and
// AVX2 loops: whole tensors (non-finite elements, tails of every length) and groups of many sizes.
TEST(TernGrad, MomentsAreBitExactAcrossInstructionSets) {
  std::vector<float> finite = gaussian(5000, 17, 3.0f);
  // Every seventh value near 1000 (K among them): d = x - K has up to 33 significant bits, so d * d
  // rounds, and a fused multiply-add would give other sums.
  for (uint64_t i = 0; i < 5000; i += 7) finite[i] += 1000.0f;
  std::vector<float> nan = finite;
  nan[4000] = std::numeric_limits<float>::quiet_NaN();
  // Values over 40 binary orders of magnitude: a lane that summed its elements in another order (or
  // two at once) would round differently.
  std::vector<float> spread(5000);
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (float& v : spread) v = std::ldexp(unit(rng), exponent(rng));
  for (const auto& [x, n] : std::vector<std::pair<const float*, uint64_t>>{{finite.data(), 1},
                                                                           {finite.data(), 7},
                                                                           {finite.data(), 8},
                                                                           {finite.data(), 255},
                                                                           {finite.data(), 256},
                                                                           {finite.data(), 3001},
                                                                           {finite.data(), 5000},
                                                                           {nan.data(), 5000},
                                                                           {spread.data(), 5000},
                                                                           {spread.data(), 999}}) {
    // SSE2, AVX2, and AVX-512F where the CPU has it (TernGrad.Avx512MomentsAtEveryLength says if not).
    detail::TernGradMoments m[3];
    std::vector<float> scales[3];
    for (int set = 0; set < 3; ++set) {
      detail::allow_avx2_for_testing(set >= 1);
      detail::allow_avx512_for_testing(set == 2);
      detail::terngrad_add_moments(x, n, m[set]);
      for (uint64_t group : {uint64_t{1}, uint64_t{5}, uint64_t{128}, uint64_t{250}, uint64_t{300}}) {
        std::vector<float> s((n + group - 1) / group);
        detail::terngrad_group_scales(x, n, group, 2.5, s.data());
        scales[set].insert(scales[set].end(), s.begin(), s.end());
      }
    }
    detail::allow_avx2_for_testing(true);
    detail::allow_avx512_for_testing(true);
    for (int set = 1; set < 3; ++set) {
      EXPECT_EQ(m[0].s1.total(), m[set].s1.total()) << n << ", set " << set;
      EXPECT_EQ(m[0].s2.total(), m[set].s2.total()) << n << ", set " << set;
      EXPECT_EQ(m[0].finite, m[set].finite) << n << ", set " << set;
      EXPECT_EQ(m[0].max_bits, m[set].max_bits) << n << ", set " << set;
      EXPECT_EQ(m[0].sigma(), m[set].sigma()) << n << ", set " << set;
      EXPECT_EQ(scales[0], scales[set]) << n << ", set " << set;
    }
  }
}

// The AVX-512F moments at every length of one to three blocks (whole registers of sixteen, a last
// eight, the scalar tail), with values over 40 binary orders of magnitude and a non-finite value in
// some blocks: the same bits as the AVX2 loop's. (The test above takes them too, where the CPU has
// AVX-512F.)
TEST(TernGrad, Avx512MomentsAtEveryLength) {
  if (!detail::cpu_has_avx512()) {
    GTEST_SKIP() << "this CPU lacks AVX-512F: TernGrad's AVX-512 moments were not compared with the AVX2 ones";
  }
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> x(768);
  for (float& v : x) v = std::ldexp(unit(rng), exponent(rng));
  std::vector<float> with_inf = x;
  with_inf[300] = std::numeric_limits<float>::infinity();
  for (const std::vector<float>* data : {&x, &with_inf}) {
    for (uint64_t n = 1; n <= data->size(); ++n) {
      detail::TernGradMoments m[2];
      for (int avx512 = 0; avx512 < 2; ++avx512) {
        detail::allow_avx512_for_testing(avx512 == 1);
        detail::terngrad_add_moments(data->data(), n, m[avx512]);
      }
      detail::allow_avx512_for_testing(true);
      ASSERT_EQ(m[0].s1.total(), m[1].s1.total()) << n;
      ASSERT_EQ(m[0].s2.total(), m[1].s2.total()) << n;
      ASSERT_EQ(m[0].finite, m[1].finite) << n;
      ASSERT_EQ(m[0].max_bits, m[1].max_bits) << n;
    }
  }
}

// The largest group on a small tensor: one scale, scratch sized by the data.
TEST(TernGrad, LargestGroupOnASmallTensor) {
  const std::vector<float> x = gaussian(1000, 89);
  auto g = make("terngrad:scale=group,group=16777216,clip=0,rounding=deterministic");
  auto t = make("terngrad:clip=0,rounding=deterministic");
  const Encoded eg = encode(*g, f32(1000), x.data(), 0, 1000), et = encode(*t, f32(1000), x.data(), 0, 1000);
  EXPECT_EQ(eg.trits, et.trits);
  EXPECT_EQ(eg.scales, et.scales);
  EXPECT_EQ(decode(*g, f32(1000), eg, 0, 1000), decode(*t, f32(1000), et, 0, 1000));
}

TEST(TernGrad, EmptyZeroDimSingleZerosAndConstants) {
  for (const char* spec : {"terngrad", "terngrad:scale=group,group=6,packing=2bit"}) {
    auto c = make(spec);
    Encoded e = encode(*c, f32(0), nullptr, 0, 0);
    EXPECT_TRUE(e.trits.empty() && e.scales.empty()) << spec;
    const TensorInfo scalar{"s", DType::kFloat32, {}};
    const float v = -3.25f;
    Encoded one = encode(*c, scalar, &v, 0, 1);
    EXPECT_EQ(decode(*c, scalar, one, 0, 1)[0], v) << spec;  // sigma = 0: no clip, p = 1
    for (uint64_t n : {1u, 4u, 5u, 6u, 13u, 1001u}) {
      for (float y : round_trip(spec, std::vector<float>(n, 0.0f))) ASSERT_EQ(y, 0.0f) << spec;
      for (float y : round_trip(spec, std::vector<float>(n, 0.125f))) ASSERT_EQ(y, 0.125f) << spec;
    }
  }
}

TEST(TernGrad, HugeTinySubnormalAndNonFinite) {
  const float big = std::numeric_limits<float>::max(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> huge = {big, -big, 1e38f, -3e37f, 0.0f};
  for (float y : round_trip("terngrad", huge)) ASSERT_TRUE(std::isfinite(y));
  const std::vector<float> tiny = {1e-30f, -3e-31f, 2e-32f, 0.0f};
  auto yt = round_trip("terngrad:clip=0,rounding=deterministic", tiny);
  EXPECT_EQ(yt, (std::vector<float>{1e-30f, 0.0f, 0.0f, 0.0f}));
  // Subnormal data gets the smallest scale 2^-120; stochastic rounding stays finite and mostly zero.
  for (float y : round_trip("terngrad:clip=0", {1e-40f, -3e-41f, 1.4e-45f})) {
    ASSERT_TRUE(y == 0.0f || std::fabs(y) == std::ldexp(1.0f, -120));
  }
  const std::vector<float> bad = {0.5f, std::nanf(""), -inf, 0.25f, inf, -0.5f};
  for (const char* spec : {"terngrad", "terngrad:scale=group,group=3", "terngrad:clip=0,rounding=deterministic"}) {
    const std::vector<float> y = round_trip(spec, bad);
    for (std::size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << spec;
      if (!std::isfinite(bad[i])) EXPECT_EQ(y[i], 0.0f) << spec;
    }
  }
  for (float y : round_trip("terngrad", {std::nanf(""), inf})) EXPECT_EQ(y, 0.0f);
}

TEST(TernGrad, OtherInputDtypesQuantizeTheirFloat32Values) {
  const uint64_t n = 777;
  const std::vector<float> g = gaussian(n, 59);
  for (const char* spec : {"terngrad", "terngrad:scale=group,group=50"}) {
    for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
      ByteBuffer in(n * dtype_size(d));
      convert_elements(DType::kFloat32, g.data(), d, in.data(), n);
      std::vector<float> as_f32(n);
      convert_elements(d, in.data(), DType::kFloat32, as_f32.data(), n);
      auto c = make(spec);
      const TensorInfo t{"t", d, {n}};
      const Encoded e = encode(*c, t, in.data(), 0, n);
      const Encoded ref = encode(*c, f32(n), as_f32.data(), 0, n);
      EXPECT_EQ(e.trits, ref.trits) << dtype_name(d);
      EXPECT_EQ(e.scales, ref.scales) << dtype_name(d);
      ByteBuffer out(n * dtype_size(d)), want(n * dtype_size(d));
      ASSERT_TRUE(c->decode(t, {ByteSpan(e.trits), ByteSpan(e.scales)}, 0, n, out.data()));
      const std::vector<float> y = decode(*c, f32(n), ref, 0, n);
      convert_elements(DType::kFloat32, y.data(), d, want.data(), n);
      EXPECT_EQ(out, want) << dtype_name(d);
    }
  }
}

TEST(TernGrad, CorruptStreamsAreRejected) {
  const std::vector<float> x = gaussian(13, 61);
  for (const char* packing : {"base3", "2bit"}) {
    auto c = make(std::string("terngrad:packing=") + packing);
    Encoded e = encode(*c, f32(13), x.data(), 0, 13);
    std::vector<float> y(13);
    auto fails = [&](const Encoded& b) { return !c->decode(f32(13), {ByteSpan(b.trits), ByteSpan(b.scales)}, 0, 13, y.data()); };
    Encoded invalid = e;
    invalid.trits[0] = std::byte{0xFF};  // base3: 255 > 242; 2bit: code 3
    EXPECT_TRUE(fails(invalid)) << packing;
    Encoded padded = e;  // 13 = 2 * 5 + 3 = 3 * 4 + 1: the last byte has unused places
    padded.trits.back() = std::string(packing) == "base3" ? std::byte{81} : std::byte{0x10};
    EXPECT_TRUE(fails(padded)) << packing;
    Encoded shortened = e;
    shortened.trits.pop_back();
    EXPECT_TRUE(fails(shortened)) << packing;
    for (float bad : {-1.0f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
      Encoded b = e;
      std::memcpy(b.scales.data(), &bad, 4);
      EXPECT_TRUE(fails(b)) << packing;
    }
  }
}

TEST(TernGrad, RoundTripThroughFiles) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(::testing::TempDir()) / "gcz_terngrad_files";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::vector<float> w = gaussian(3000, 67), b = gaussian(30, 71);
  {
    auto out = create_tensor_file((d / "in.safetensors").string(),
                                  {{"w", DType::kFloat32, {30, 100}}, {"b", DType::kFloat32, {30}}}, {});
    ASSERT_TRUE(out) << out.status().message();
    for (std::size_t i = 0; i < 2; ++i) {
      ASSERT_TRUE((*out)->begin(i));
      ASSERT_TRUE((*out)->write(i == 0 ? w.data() : b.data(), i == 0 ? 3000 : 30));
      ASSERT_TRUE((*out)->end());
    }
    ASSERT_TRUE((*out)->finish());
  }
  EncodeOptions o;
  o.spec = "terngrad+zstd";
  o.rules = {*parse_codec_rule("b=terngrad:scale=group,group=8,packing=2bit")};
  o.device = DeviceRequest::kCpu;
  o.seed = 9;
  o.chunk_elements = 64;
  auto report = encode_files({(d / "in.safetensors").string()}, (d / "x.gcz").string(), o);
  ASSERT_TRUE(report) << report.status().message();
  EXPECT_EQ(report->tensors.at(0).codec, "terngrad:clip=2.5,packing=base3,rounding=stochastic,scale=tensor+zstd:level=3");
  DecodeOptions dopt;
  dopt.device = DeviceRequest::kCpu;
  ASSERT_TRUE(decode_file((d / "x.gcz").string(), (d / "out.safetensors").string(), dopt));
  auto r = open_tensor_file((d / "out.safetensors").string(), {});
  ASSERT_TRUE(r);
  const std::vector<std::string> specs = {"terngrad", "terngrad:scale=group,group=8,packing=2bit"};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::vector<float>& x = i == 0 ? w : b;
    std::vector<float> y(x.size());
    auto src = (*r)->open(i);
    ASSERT_TRUE(src);
    ASSERT_TRUE((*src)->read(0, x.size(), y.data()));
    auto c = make(specs[i], 9, tensor_key(i == 0 ? "w" : "b"));
    EXPECT_EQ(y, decode(*c, f32(x.size()), encode(*c, f32(x.size()), x.data(), 0, x.size()), 0, x.size())) << i;
  }
}

// A tensor scale streams: a tensor of more than one chunk (2^24 elements) is gathered in slices
// (prepare), then encoded and decoded chunk by chunk with the scale written and read once. The file,
// metrics included, is byte for byte the one a single whole-tensor call writes, for any thread
// count, with the first finite element (the moments' shift) in the second slice, with non-finite
// elements, and from float64; and decoding gives what a whole-tensor decode gives.
TEST(TernGrad, StreamedTensorScaleWritesAndReadsTheWholeTensorsBytes) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(::testing::TempDir()) / "gcz_terngrad_streamed";
  fs::remove_all(d);
  fs::create_directories(d);
  // Two chunks, the second of several metric blocks; two prepare slices, the second of two super-blocks.
  const uint64_t n = (uint64_t{1} << 24) + 300001;
  std::vector<float> late = gaussian(n, 5);
  std::fill(late.begin(), late.begin() + (uint64_t{1} << 24) + 5, std::numeric_limits<float>::quiet_NaN());
  std::vector<double> wide(n);
  {
    const std::vector<float> g = gaussian(n, 6, 1e-3f);
    convert_elements(DType::kFloat32, g.data(), DType::kFloat64, wide.data(), n);
    wide[400000] = -std::numeric_limits<double>::infinity();
  }
  {
    auto out = create_tensor_file((d / "in.safetensors").string(),
                                  {{"late", DType::kFloat32, {n}}, {"wide", DType::kFloat64, {n}}}, {});
    ASSERT_TRUE(out) << out.status().message();
    const void* data[] = {late.data(), wide.data()};
    for (std::size_t i = 0; i < 2; ++i) {
      ASSERT_TRUE((*out)->begin(i));
      ASSERT_TRUE((*out)->write(data[i], n));
      ASSERT_TRUE((*out)->end());
    }
    ASSERT_TRUE((*out)->finish());
  }
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::pair<const char*, std::vector<unsigned>> runs[] = {
      {"terngrad", {1, 2, 3}}, {"terngrad:rounding=deterministic,packing=2bit,clip=0", {2}}};
  for (const auto& [spec, thread_counts] : runs) {
    EncodeOptions o;
    o.spec = spec;
    o.device = DeviceRequest::kCpu;
    o.seed = 11;
    o.chunk_elements = uint64_t{1} << 26;  // one chunk: the whole tensor in one call
    ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, (d / "whole.gcz").string(), o));
    o.chunk_elements = uint64_t{1} << 24;
    for (unsigned threads : thread_counts) {
      o.threads = threads;
      ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, (d / "streamed.gcz").string(), o));
      EXPECT_EQ(bytes(d / "streamed.gcz"), bytes(d / "whole.gcz")) << spec << ", " << threads << " threads";
    }
  }
  // Decoded in chunks, against one whole-tensor decode of the same streams.
  auto reader = GczReader::open((d / "streamed.gcz").string());
  ASSERT_TRUE(reader);
  for (std::size_t i = 0; i < 2; ++i) {
    const TensorInfo& t = (*reader)->index().tensors[i].info;
    auto decoded = decode_tensor(**reader, i, DeviceRequest::kCpu);
    ASSERT_TRUE(decoded) << decoded.status().message();
    std::vector<ByteBuffer> streams(2);
    std::vector<ByteSpan> spans;
    for (std::size_t s = 0; s < 2; ++s) {
      auto cursor = (*reader)->open_stream(i, s);
      ASSERT_TRUE(cursor);
      streams[s].resize((*reader)->index().tensors[i].streams[s].size);
      ASSERT_TRUE((*cursor)->read(streams[s].data(), streams[s].size()));
      spans.emplace_back(streams[s]);
    }
    auto c = make("terngrad:rounding=deterministic,packing=2bit,clip=0", 11, tensor_key(t.name));
    ByteBuffer want(n * dtype_size(t.dtype));
    ASSERT_TRUE(c->decode(t, spans, 0, n, want.data()));
    ASSERT_EQ(decoded->size(), want.size());
    EXPECT_EQ(std::memcmp(decoded->data(), want.data(), want.size()), 0) << t.name;
  }
}

}  // namespace
}  // namespace gcz

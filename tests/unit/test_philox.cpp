#include "gcz/detail/philox.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gcz::detail {
namespace {

// Known-answer vectors of Philox4x32-10 from its authors' test suite (Random123 kat_vectors).
TEST(Philox, KnownAnswers) {
  const Philox4x32 zero = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  const Philox4x32 ones = philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  const Philox4x32 pi = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

TEST(Philox, RngMapsCountersAsDocumented) {
  const uint64_t seed = 0x0123456789abcdefull, key = 0x1111222233334444ull;
  Rng rng(seed, key, kStreamQsgdRounding);
  const uint64_t k = seed ^ key;
  for (uint64_t i : {0ull, 1ull, 3ull, 4ull, 5ull, 1000003ull, (1ull << 34) + 6}) {
    const Philox4x32 b = philox4x32_10(static_cast<uint32_t>(i / 4), static_cast<uint32_t>((i / 4) >> 32),
                                       kStreamQsgdRounding, 0, static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32));
    EXPECT_EQ(rng.bits(i), b.v[i % 4]) << i;
  }
  EXPECT_NE(Rng(seed, key, kStreamRandomK).bits(0), rng.bits(0));
}

TEST(Philox, UniformIsInUnitIntervalAndRoughlyUniform) {
  Rng rng(7, 9, kStreamTernGrad);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = rng.uniform(static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  // Mean of n uniforms: sd = 1/sqrt(12 n) ~ 6.5e-4; allow 5 sd.
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / (12.0 * n)));
  EXPECT_EQ(Rng::to_uniform(0xFFFFFFFFu), 16777215.0f / 16777216.0f);
  EXPECT_EQ(Rng::to_uniform(0x000000FFu), 0.0f);
}

}  // namespace
}  // namespace gcz::detail

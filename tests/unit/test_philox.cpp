#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "codecs/quant_uniforms.h"
#include "cpu_features.h"
#include "gcz/detail/philox.h"

namespace gcz::detail {
namespace {

// The code paths the bulk draws can take: the AVX-512 kernel (where the CPU has AVX-512F: elsewhere
// the tests pass over it, and BulkDrawsTakeTheAvx512KernelWhereTheCpuHasIt says it skipped), the AVX2
// kernel (passed over likewise on a CPU without it), and the portable one.
struct BulkPath {
  const char* name;
  bool avx2, avx512;
};
constexpr BulkPath kBulkPaths[] = {{"avx512", true, true}, {"avx2", true, false}, {"portable", false, false}};
// Turns the path on; false where this CPU cannot take it.
bool use_path(const BulkPath& p) {
  allow_avx2_for_testing(p.avx2);
  allow_avx512_for_testing(p.avx512);
  return cpu_has_avx2() == p.avx2 && cpu_has_avx512() == p.avx512;
}
void use_fastest_path() { use_path(kBulkPaths[0]); }

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

// 16-bit draw i is 256 coarse8(i) + fine8(i): byte i mod 16 of block i / 16 of sub-stream 0 and of
// sub-stream 1 (counter word 3), bytes little-endian within the block's words; so the coarse byte is
// also byte i mod 4 of 32-bit draw i / 4.
TEST(Philox, Draw16IsACoarseAndAFineByte) {
  const uint64_t seed = 0x0123456789abcdefull, key = 0x5555aaaa5555aaaaull, k = seed ^ key;
  const Rng rng(seed, key, kStreamTernGrad);
  for (uint64_t i : {0ull, 1ull, 2ull, 7ull, 15ull, 16ull, 17ull, 1000001ull, (1ull << 35) + 3, (1ull << 40) + 14}) {
    uint32_t byte[2];
    for (uint32_t sub = 0; sub < 2; ++sub) {
      const uint32_t lo = static_cast<uint32_t>(i / 16), hi = static_cast<uint32_t>((i / 16) >> 32);
      const Philox4x32 b =
          philox4x32_10(lo, hi, kStreamTernGrad, sub, static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32));
      byte[sub] = (b.v[(i % 16) / 4] >> (8 * (i % 4))) & 0xFFu;
    }
    EXPECT_EQ(rng.coarse8(i), byte[0]) << i;
    EXPECT_EQ(rng.fine8(i), byte[1]) << i;
    EXPECT_EQ(rng.coarse8(i), (rng.bits(i / 4) >> (8 * (i % 4))) & 0xFFu) << i;
    EXPECT_EQ(rng.draw16(i), 256 * byte[0] + byte[1]) << i;
  }
  // Known answers (seed 0, tensor key 0, purpose 1), as docs/CODECS.md gives them.
  const Rng zero(0, 0, kStreamQsgdRounding);
  EXPECT_EQ(zero.draw16(0), 0xE1C1);
  EXPECT_EQ(zero.draw16(17), 0xF680);
}

// The coarse byte settles a Bernoulli draw exactly when it differs from the threshold's top byte,
// and then agrees with every fine byte; bernoulli_fine is the documented comparison. Every threshold
// (every p a float32 in [0, 1] can give) and coarse byte; the fine bytes at both ends suffice, since
// the comparison is monotone in the draw.
TEST(Philox, CoarseByteSettlesAllButTies) {
  for (uint32_t threshold = 0; threshold <= 131072; ++threshold) {
    for (uint32_t c = 0; c < 256; ++c) {
      const bool low = 2 * (256 * c) < threshold, high = 2 * (256 * c + 255) < threshold;
      const int coarse = coarse_bernoulli(c, threshold);
      ASSERT_EQ(coarse == -1, c == threshold >> 9) << threshold << " " << c;
      if (coarse != -1) {
        ASSERT_EQ(low, coarse == 1) << threshold << " " << c;
        ASSERT_EQ(high, coarse == 1) << threshold << " " << c;
      }
      ASSERT_EQ(bernoulli_fine(c, 0, threshold), low);
      ASSERT_EQ(bernoulli_fine(c, 255, threshold), high);
    }
  }
  for (const float p : {0.0f, 1.0f, 0.5f, 0x1p-17f, 0.3f, 1e-30f, 0.999999f}) {
    for (uint32_t d = 0; d < 65536; d += 257) {
      ASSERT_EQ(Rng::to_uniform(static_cast<uint16_t>(d)) <= p, bernoulli_fine(d >> 8, d & 255, bernoulli_threshold(p)))
          << p << " " << d;
    }
  }
}

TEST(Philox, UniformIsTheMidpointOfItsCell) {
  EXPECT_EQ(Rng::to_uniform(0), 0x1p-17f);
  EXPECT_EQ(Rng::to_uniform(1), 3 * 0x1p-17f);
  EXPECT_EQ(Rng::to_uniform(0xFFFF), 1.0f - 0x1p-17f);
  Rng rng(7, 9, kStreamTernGrad);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = rng.uniform(static_cast<uint64_t>(i));
    ASSERT_GT(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  // Mean of n uniforms: sd = 1/sqrt(12 n) ~ 6.5e-4; allow 5 sd.
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / (12.0 * n)));
}

// Over the 65536 equally likely draws, u <= p holds for floor(65536 p + 1/2) of them: the Bernoulli
// probability is within 2^-17 of p, and exact for p = 0 and p = 1. Counted for p on a grid, at cell
// midpoints and at the ends.
TEST(Philox, BernoulliProbabilityIsWithinTwoToTheMinus17OfP) {
  std::vector<float> ps = {0.0f, 1.0f, 0x1p-17f, 0x1p-16f, 0.5f, 1.0f - 0x1p-17f, 1e-30f, 0.999999f};
  for (int k = 0; k <= 1000; ++k) ps.push_back(static_cast<float>(k) / 1000.0f);
  for (uint32_t k = 0; k < 65536; k += 4099) ps.push_back(Rng::to_uniform(static_cast<uint16_t>(k)));
  for (const float p : ps) {
    uint32_t hits = 0, disagree = 0;
    for (uint32_t k = 0; k < 65536; ++k) {
      const bool on = Rng::to_uniform(static_cast<uint16_t>(k)) <= p;
      hits += on ? 1u : 0u;
      // The integer form the vector loops use: 2 k < floor(2^17 p).
      disagree += on != (2 * k < static_cast<uint32_t>(p * 131072.0f)) ? 1u : 0u;
    }
    EXPECT_EQ(hits, static_cast<uint32_t>(std::floor(65536.0 * p + 0.5))) << p;
    EXPECT_EQ(disagree, 0u) << p;
    EXPECT_LE(std::fabs(hits / 65536.0 - p), 0x1p-17) << p;
  }
  EXPECT_EQ(Rng(1, 2, kStreamQsgdRounding).bernoulli(5, 0.0f), false);
  EXPECT_EQ(Rng(1, 2, kStreamQsgdRounding).bernoulli(5, 1.0f), true);
}

// The bulk generator of the quantizers writes exactly coarse8, whatever the start, length and
// instruction set (AVX-512 calls of 32 blocks, AVX2 calls of 24 and of 8 blocks, the last through a
// buffer; SSE2; partial blocks).
TEST(Philox, BulkCoarseDrawsMatchCoarse8) {
  const uint64_t seed = 0xfeedfacecafebeefull, key = 0x0f0f0f0f12345678ull;
  const Rng rng(seed, key, kStreamQsgdRounding);
  for (const BulkPath& path : kBulkPaths) {
    if (!use_path(path)) continue;
    // ((2^32 - j) * 16: the blocks of a call cross 2^32, where the counter's high word steps, after
    // the first, second, third, fifth or thirteenth of them: in the first or second register of a
    // wide call.)
    for (const uint64_t first :
         {0ull, 1ull, 7ull, 16ull, 29ull, (1ull << 33) + 5, ((1ull << 32) - 1) << 4, ((1ull << 32) - 2) << 4,
          ((1ull << 32) - 3) << 4, ((1ull << 32) - 5) << 4, ((1ull << 32) - 13) << 4}) {
      for (const uint64_t n : {0ull,   1ull,   31ull,  63ull,  64ull,  65ull,  127ull,  128ull,  129ull,  383ull,
                               384ull, 385ull, 400ull, 401ull, 512ull, 530ull, 1000ull, 1541ull, 2576ull, 4099ull}) {
        std::vector<uint8_t> d(n + 1, 0xAB);
        fill_coarse8(seed, key, kStreamQsgdRounding, first, n, d.data());
        for (uint64_t k = 0; k < n; ++k) {
          ASSERT_EQ(d[k], rng.coarse8(first + k)) << path.name << " " << first << " " << n << " " << k;
        }
        ASSERT_EQ(d[n], 0xAB) << "wrote past the end";
      }
    }
  }
  use_fastest_path();
}

// FineDraws::gather gives fine8 of any list of elements (in any order, repeats included), however
// many: the AVX2 batches of 24 blocks, their partial last batch, and the scalar path.
TEST(Philox, GatheredFineDrawsMatchFine8) {
  const uint64_t seed = 77, key = 0xabcdef0123456789ull, first = (1ull << 36) + 3;
  const Rng rng(seed, key, kStreamTernGrad);
  const FineDraws fine{seed, key, kStreamTernGrad, first};
  std::mt19937_64 pick(5);
  for (const bool avx2 : {true, false}) {
    allow_avx2_for_testing(avx2);
    for (const uint64_t n : {0ull, 1ull, 5ull, 11ull, 12ull, 23ull, 24ull, 25ull, 64ull, 100ull}) {
      std::vector<uint64_t> k(n);
      for (uint64_t& v : k) v = pick() % 9000;
      if (n > 3) k[2] = k[1];
      std::vector<uint8_t> f(n + 1, 0xCD);
      fine.gather(k.data(), n, f.data());
      for (uint64_t j = 0; j < n; ++j) {
        ASSERT_EQ(f[j], rng.fine8(first + k[j])) << avx2 << " " << n << " " << j;
        ASSERT_EQ(f[j], fine.at(k[j]));
      }
      ASSERT_EQ(f[n], 0xCD) << "wrote past the end";
    }
  }
  allow_avx2_for_testing(true);
}

// The AVX2 kernels keep each thread's last keys: calls that alternate between seeds, tensors,
// purposes and the two sub-streams (a quantizer's coarse then fine draws, tensor after tensor, or
// QSGD then TernGrad) each get their own draws.
TEST(Philox, BulkDrawsFollowEveryChangeOfKey) {
  struct Key {
    uint64_t seed, tensor;
    uint32_t purpose;
  };
  const Key keys[] = {{1, 2, kStreamQsgdRounding},
                      {1, 2, kStreamTernGrad},
                      {1, 3, kStreamTernGrad},
                      {5, 3, kStreamTernGrad},
                      {uint64_t{1} << 32 | 1, 2, kStreamQsgdRounding},
                      {1, uint64_t{1} << 32 | 2, kStreamQsgdRounding}};
  const std::vector<uint64_t> elements = {0, 5, 17, 200, 383, 1000, 1001, 4000};
  for (int round = 0; round < 3; ++round) {
    for (const Key& key : keys) {
      const Rng rng(key.seed, key.tensor, key.purpose);
      std::vector<uint8_t> d(400);
      fill_coarse8(key.seed, key.tensor, key.purpose, 3, d.size(), d.data());
      for (uint64_t k = 0; k < d.size(); ++k) ASSERT_EQ(d[k], rng.coarse8(3 + k)) << round << " " << key.purpose;
      std::vector<uint8_t> f(elements.size());
      FineDraws{key.seed, key.tensor, key.purpose, 3}.gather(elements.data(), elements.size(), f.data());
      for (std::size_t j = 0; j < f.size(); ++j) {
        ASSERT_EQ(f[j], rng.fine8(3 + elements[j])) << round << " " << key.purpose;
      }
    }
  }
}

TEST(Philox, BulkDrawsMatchBits) {
  const uint64_t seed = 0x1234, key = 0x9876543210ull;
  const Rng rng(seed, key, kStreamRandomK);
  for (const BulkPath& path : kBulkPaths) {
    if (!use_path(path)) continue;
    // ((2^32 - j) * 4: a call's blocks cross 2^32 after the first, third or thirteenth.)
    for (const uint64_t first : {0ull, 1ull, 3ull, 4ull, 4096ull, (1ull << 33) + 2, ((1ull << 32) - 1) << 2,
                                 ((1ull << 32) - 3) << 2, ((1ull << 32) - 13) << 2}) {
      for (const uint64_t n : {0ull, 1ull, 15ull, 16ull, 17ull, 31ull, 32ull, 33ull, 95ull, 96ull, 97ull, 100ull,
                               128ull, 130ull, 300ull, 261ull, 4096ull}) {
        std::vector<uint32_t> d(n + 1, 0xABCDABCDu);
        fill_draws32(seed, key, kStreamRandomK, first, n, d.data());
        for (uint64_t k = 0; k < n; ++k) {
          ASSERT_EQ(d[k], rng.bits(first + k)) << path.name << " " << first << " " << n << " " << k;
        }
        ASSERT_EQ(d[n], 0xABCDABCDu) << "wrote past the end";
      }
    }
  }
  use_fastest_path();
}

// The AVX-512 kernel runs where the CPU has AVX-512F, unless a test turns it or the AVX2 paths off
// (the tests above then compare it with them).
TEST(Philox, BulkDrawsTakeTheAvx512KernelWhereTheCpuHasIt) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx2")) {
    GTEST_SKIP() << "this CPU lacks AVX-512F (or AVX2): the AVX-512 kernel cannot run here; the bulk-draw tests "
                    "check the AVX2 and portable paths";
  }
  EXPECT_TRUE(cpu_has_avx512());
  allow_avx512_for_testing(false);
  EXPECT_FALSE(cpu_has_avx512());
  allow_avx512_for_testing(true);
  allow_avx2_for_testing(false);
  EXPECT_FALSE(cpu_has_avx512()) << "the AVX-512 kernel needs the AVX2 paths' keys";
  use_fastest_path();
  EXPECT_TRUE(cpu_has_avx512());
#else
  GTEST_SKIP() << "not an x86-64 build: there is no AVX-512 kernel";
#endif
}

}  // namespace
}  // namespace gcz::detail

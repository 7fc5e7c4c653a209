// Random-K (docs/codecs/randomk.md): the indices are the k smallest Philox keys (checked against a
// full sort), the decoder draws the same ones from (seed, tensor key), they differ across tensors and
// seeds, each index is chosen with frequency k/n, scale=unbiased is unbiased, plus edge cases and a
// file round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "codecs/randomk.h"
#include "cpu_features.h"
#include "gcz/detail/philox.h"
#include "sparse_test_util.h"

namespace gcz {
namespace {

using sparse_test::from_doubles;
using sparse_test::make;
using sparse_test::to_doubles;

// The reference: sort (key, index) pairs, take the first k, sort the indices.
std::vector<uint64_t> reference_random_k(uint64_t seed, const std::string& name, uint64_t n, uint64_t k) {
  const detail::Rng rng(seed, tensor_key(name), detail::kStreamRandomK);
  std::vector<std::pair<uint32_t, uint64_t>> keyed(n);
  for (uint64_t i = 0; i < n; ++i) keyed[i] = {rng.bits(i), i};
  std::sort(keyed.begin(), keyed.end());
  std::vector<uint64_t> out;
  for (uint64_t j = 0; j < std::min(k, n); ++j) out.push_back(keyed[j].second);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<double> normal_values(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& e : v) e = normal(rng);
  return v;
}

// Encodes with `seed` and decodes with `decode_seed`; returns the decoded values.
std::vector<double> round_trip(const std::string& spec, const TensorInfo& t, const ByteBuffer& x, uint64_t seed,
                               uint64_t decode_seed) {
  auto c = make(spec);
  EXPECT_TRUE(c) << c.status().message();
  if (!c) return {};
  const std::vector<ByteBuffer> streams = sparse_test::encode(**c, t, x, seed);
  for (std::size_t s = 0; s < streams.size(); ++s) {
    EXPECT_EQ(streams[s].size(), *(*c)->stream_size(t, s, 0, *t.numel())) << "stream " << s;
  }
  ByteBuffer out;
  const Status s = sparse_test::decode(**c, t, streams, out, decode_seed);
  EXPECT_TRUE(s) << s.message();
  return to_doubles(t.dtype, out);
}

std::vector<uint64_t> nonzero(const std::vector<double>& v) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0.0) out.push_back(i);
  }
  return out;
}

TEST(RandomK, IndicesAreTheSmallestKeysTiesToTheLowerIndex) {
  for (uint64_t n : {1u, 5u, 64u, 1000u, 4097u}) {
    for (uint64_t k : {uint64_t{1}, n / 7 + 1, n / 2, n}) {
      if (k == 0) continue;
      const CodecContext ctx{12345, tensor_key("layer")};
      EXPECT_EQ(codecs::select_random_k(ctx, n, k), reference_random_k(12345, "layer", n, k)) << n << " " << k;
    }
  }
}

// Past 2^19 elements the draws split over threads (contiguous ranges of at least 2^18, joined in
// order): the same indices for any thread count, on the path that keeps only the keys below a bound
// (small k; its AVX2 filter and the portable one) and on the one that draws every key (k > n/4 or so).
TEST(RandomK, IndicesDoNotDependOnTheThreadCountOrTheCodePath) {
  const uint64_t n = (uint64_t{1} << 20) + 12345;
  const CodecContext ctx{2024, tensor_key("big")};
  for (uint64_t k : {uint64_t{1}, uint64_t{1000}, n / 7, n / 3, n / 2, n - 1}) {
    const std::vector<uint64_t> one = codecs::select_random_k(ctx, n, k, 1);
    ASSERT_EQ(one.size(), k);
    if (k == 1000 || k == n / 3) EXPECT_EQ(one, reference_random_k(2024, "big", n, k)) << k;
    for (bool vec : {false, true}) {
      detail::allow_avx2_for_testing(vec);
      for (unsigned threads : {1u, 2u, 3u, 7u}) {
        EXPECT_EQ(codecs::select_random_k(ctx, n, k, threads), one)
            << "k " << k << ", threads " << threads << ", vector path " << vec;
      }
    }
    detail::allow_avx2_for_testing(true);
  }
  // Eight ranges keeping a few keys among them, so that some range most likely keeps none.
  const uint64_t big = uint64_t{1} << 21;
  for (uint64_t k : {uint64_t{1}, uint64_t{3}}) {
    const std::vector<uint64_t> want = reference_random_k(2024, "big", big, k);
    EXPECT_EQ(codecs::select_random_k(ctx, big, k, 8), want) << k;
    EXPECT_EQ(codecs::select_random_k(ctx, big, k, 1), want) << k;
  }
}

TEST(RandomK, SameSeedSameIndicesInEncodeAndDecode) {
  const uint64_t n = 5000;
  const std::vector<double> x = normal_values(n, 1);  // no zeros, so the kept ones are the nonzero ones
  const TensorInfo t{"layer.weight", DType::kFloat32, {n}};
  const std::vector<double> xhat = round_trip("randomk", t, from_doubles(DType::kFloat32, x), 77, 77);
  const std::vector<uint64_t> want = reference_random_k(77, t.name, n, 50);
  EXPECT_EQ(nonzero(xhat), want);
  for (uint64_t i : want) EXPECT_EQ(xhat[i], static_cast<double>(static_cast<float>(x[i])));
}

TEST(RandomK, DifferentTensorsAndSeedsDrawDifferentIndices) {
  const CodecContext a{1, tensor_key("a")}, b{1, tensor_key("b")}, a2{2, tensor_key("a")};
  EXPECT_NE(codecs::select_random_k(a, 1000, 10), codecs::select_random_k(b, 1000, 10));
  EXPECT_NE(codecs::select_random_k(a, 1000, 10), codecs::select_random_k(a2, 1000, 10));
}

TEST(RandomK, DecodingWithAnotherSeedPutsValuesElsewhere) {
  // The seed really is used: values encoded under seed 5 land on seed 6's indices when decoded with 6.
  const uint64_t n = 1000;
  const TensorInfo t{"w", DType::kFloat32, {n}};
  const ByteBuffer x = from_doubles(DType::kFloat32, normal_values(n, 2));
  const std::vector<double> xhat = round_trip("randomk:k=20", t, x, 5, 6);
  EXPECT_EQ(nonzero(xhat), reference_random_k(6, "w", n, 20));
  EXPECT_NE(nonzero(xhat), reference_random_k(5, "w", n, 20));
}

TEST(RandomK, EachIndexIsChosenWithFrequencyKOverN) {
  // 4000 seeds, n = 64, k = 8: each count is Binomial(4000, 1/8), mean 500, sd 20.9. The bound is
  // 6 sd (the draws are fixed by the seeds, so this is not flaky; it fails only on a real bias).
  const uint64_t n = 64, k = 8, seeds = 4000;
  std::vector<uint64_t> count(n, 0);
  for (uint64_t s = 0; s < seeds; ++s) {
    const std::vector<uint64_t> idx = codecs::select_random_k({s, tensor_key("u")}, n, k);
    ASSERT_EQ(idx.size(), k);
    ASSERT_TRUE(std::adjacent_find(idx.begin(), idx.end(), std::greater_equal<>()) == idx.end());
    for (uint64_t i : idx) ++count[i];
  }
  for (uint64_t i = 0; i < n; ++i) EXPECT_NEAR(static_cast<double>(count[i]), 500.0, 6 * 20.9) << i;
}

TEST(RandomK, UnbiasedScaleIsUnbiased) {
  // x_hat_i = x_i * n / k with probability k / n: mean x_i, sd of the mean over S seeds
  // |x_i| * sqrt(n / k - 1) / sqrt(S) = 3 |x_i| / 141 here. Bound: 6 sd.
  const uint64_t n = 50, seeds = 20000;
  const TensorInfo t{"g", DType::kFloat32, {n}};
  const std::vector<double> x = normal_values(n, 3);
  const ByteBuffer b = from_doubles(DType::kFloat32, x);
  const std::vector<double> xf = to_doubles(DType::kFloat32, b);
  std::vector<double> sum(n, 0.0);
  for (uint64_t s = 0; s < seeds; ++s) {
    const std::vector<double> xhat = round_trip("randomk:k=5,scale=unbiased", t, b, s, s);
    ASSERT_EQ(xhat.size(), n);
    for (uint64_t i = 0; i < n; ++i) sum[i] += xhat[i];
  }
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(sum[i] / seeds, xf[i], 6 * 3 * std::fabs(xf[i]) / std::sqrt(double(seeds))) << i;
  }
}

TEST(RandomK, UnbiasedValuesAreScaledInFloat32) {
  const uint64_t n = 7;
  const std::vector<double> x = {0.1, -0.2, 0.3, 1e38, 5.0, -6.0, 7.0};
  const ByteBuffer b = from_doubles(DType::kFloat32, x);
  const std::vector<double> xhat = round_trip("randomk:k=3,scale=unbiased", {"s", DType::kFloat32, {n}}, b, 9, 9);
  const float scale = static_cast<float>(7.0 / 3.0);
  for (uint64_t i : reference_random_k(9, "s", n, 3)) {
    const float v = static_cast<float>(x[i]) * scale;
    EXPECT_EQ(xhat[i], std::isfinite(v) ? v : 0.0f) << i;  // 1e38 * 7/3 overflows: stored as +0
  }
}

// n / k is divided in float64, then rounded to float32: beyond 2^24 elements n itself is no float32.
TEST(RandomK, TheUnbiasedScaleIsDividedInFloat64) {
  EXPECT_EQ(codecs::randomk_scale(16777217, 5, true), 3355443.5f);  // 3355443.4, not 16777216 / 5
  EXPECT_EQ(codecs::randomk_scale((uint64_t{1} << 40) + 3, 3, true), static_cast<float>((0x1p40 + 3) / 3));
  EXPECT_EQ(codecs::randomk_scale(16777217, 5, false), 1.0f);
}

TEST(RandomK, ParametersStreamsAndCanonicalForm) {
  for (const std::string bad : {"randomk:k=0", "randomk:ratio=0", "randomk:ratio=2", "randomk:scale=yes",
                                "randomk:k=2,ratio=0.5", "randomk:seed=3", "randomk:values=(zstd)"}) {
    auto c = make(bad);
    ASSERT_FALSE(c) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(c.status().message().find("randomk"), std::string::npos) << c.status().message();
  }
  auto c = make("randomk");
  ASSERT_TRUE(c);
  EXPECT_EQ((CodecSpec{{{"randomk", (*c)->params()}}}).to_string(), "randomk:ratio=0.01,scale=none,values=fp32");
  EXPECT_EQ((*c)->stream_names({"w", DType::kFloat32, {9}}), std::vector<std::string>{"values.values"});
  EXPECT_EQ((*c)->chunk_unit(), 0u);
  auto c2 = make("randomk:k=4,scale=unbiased,values=(fp16)");
  ASSERT_TRUE(c2);
  EXPECT_EQ((CodecSpec{{{"randomk", (*c2)->params()}}}).to_string(), "randomk:k=4,scale=unbiased,values=fp16");
  EXPECT_EQ(*(*c2)->stream_size({"w", DType::kFloat32, {100}}, 0, 0, 100), 8u);
}

TEST(RandomK, EdgeShapesDtypesAndNonFinite) {
  auto c = make("randomk");
  ASSERT_TRUE(c);
  const TensorInfo empty{"e", DType::kFloat32, {3, 0}};
  EXPECT_TRUE(sparse_test::encode(**c, empty, {})[0].empty());
  for (const Shape& shape : {Shape{}, Shape{1}}) {
    EXPECT_EQ(round_trip("randomk", {"s", DType::kFloat32, shape}, from_doubles(DType::kFloat32, {4.0}), 1, 1),
              std::vector<double>{4.0});
  }
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> x = {std::nan(""), inf, -inf, 1.5, 0.0, -2.0, 1e-40};
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    // k = n keeps everything; non-finite values are stored as +0, so nothing non-finite comes out.
    const std::vector<double> all = round_trip("randomk:ratio=1", {"d", d, {7}}, from_doubles(d, x), 3, 3);
    const std::vector<double> xd = to_doubles(d, from_doubles(d, x));
    EXPECT_EQ(all, (std::vector<double>{0.0, 0.0, 0.0, 1.5, 0.0, -2.0, static_cast<float>(xd[6])})) << dtype_name(d);
  }
  // All zeros decode to zeros.
  EXPECT_EQ(round_trip("randomk:k=3", {"z", DType::kFloat32, {9}}, from_doubles(DType::kFloat32, std::vector<double>(9)),
                       1, 1),
            std::vector<double>(9, 0.0));
}

TEST(RandomK, FileBytesDoNotDependOnChunkingOrThreads) {
  const TensorInfo t{"w", DType::kFloat32, {70, 30}};
  const auto d = sparse_test::write_input("gcz_randomk_chunks", t, from_doubles(DType::kFloat32, normal_values(2100, 8)));
  const std::vector<char> whole = sparse_test::encode_file(d, "a.gcz", "randomk:ratio=0.05", 3);
  ASSERT_FALSE(whole.empty());
  EXPECT_EQ(sparse_test::encode_file(d, "b.gcz", "randomk:ratio=0.05", 3, 64, 2), whole);
  EXPECT_NE(sparse_test::encode_file(d, "c.gcz", "randomk:ratio=0.05", 4), whole);  // the seed is used
}

TEST(RandomK, FileRoundTripUsesTheRecordedSeed) {
  const uint64_t n = 3000;
  const TensorInfo t{"blocks.0.w", DType::kFloat16, {30, 100}};
  const ByteBuffer b = from_doubles(DType::kFloat16, normal_values(n, 4));
  const std::vector<double> xb = to_doubles(DType::kFloat16, b);
  for (uint64_t seed : {11u, 12u}) {
    const ByteBuffer out = sparse_test::file_round_trip("gcz_randomk_file", t, b, "randomk:ratio=0.02", seed);
    ASSERT_EQ(out.size(), b.size());
    std::vector<double> want(n, 0.0);
    for (uint64_t i : reference_random_k(seed, t.name, n, 60)) want[i] = xb[i];
    EXPECT_EQ(to_doubles(DType::kFloat16, out), want) << seed;
  }
}

}  // namespace
}  // namespace gcz

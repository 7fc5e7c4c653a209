#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu_features.h"
#include "gcz/detail/float_bits.h"
#include "gcz/metrics.h"

namespace gcz {
namespace {

TEST(Metrics, KnownValues) {
  const std::vector<double> x = {3.0, 4.0, 0.0, 0.0};
  const std::vector<double> y = {3.0, 3.0, 0.0, 1.0};  // error (0, -1, 0, 1)
  MetricsAccumulator acc;
  acc.add(DType::kFloat64, x.data(), y.data(), x.size());
  Metrics m = acc.finish(32, 8);
  EXPECT_DOUBLE_EQ(m.ratio, 4.0);
  EXPECT_DOUBLE_EQ(m.bits_per_element, 16.0);
  EXPECT_DOUBLE_EQ(m.rel_l2, std::sqrt(2.0) / 5.0);
  EXPECT_DOUBLE_EQ(m.cosine, 21.0 / (5.0 * std::sqrt(19.0)));
  EXPECT_DOUBLE_EQ(m.norm_ratio, std::sqrt(19.0) / 5.0);
  EXPECT_DOUBLE_EQ(m.max_abs_error, 1.0);
  EXPECT_DOUBLE_EQ(m.snr_db, 10.0 * std::log10(25.0 / 2.0));
  EXPECT_DOUBLE_EQ(m.mean_error, 0.0);
  EXPECT_EQ(m.nonfinite, 0u);
}

TEST(Metrics, ChunksAndMergeEqualOnePass) {
  std::vector<float> x(1000), y(1000);
  for (int i = 0; i < 1000; ++i) {
    x[i] = std::sin(0.1f * i);
    y[i] = x[i] + 0.01f * std::cos(0.3f * i);
  }
  MetricsAccumulator whole, a, b;
  whole.add(DType::kFloat32, x.data(), y.data(), 1000);
  a.add(DType::kFloat32, x.data(), y.data(), 300);
  b.add(DType::kFloat32, x.data() + 300, y.data() + 300, 700);
  a.merge(b);
  Metrics m1 = whole.finish(4000, 2000), m2 = a.finish(4000, 2000);
  EXPECT_NEAR(m1.rel_l2, m2.rel_l2, 1e-12);
  EXPECT_NEAR(m1.cosine, m2.cosine, 1e-12);
  EXPECT_EQ(m1.max_abs_error, m2.max_abs_error);
  EXPECT_EQ(m1.numel, 1000u);
}

TEST(Metrics, ZeroAndLosslessConventions) {
  const std::vector<float> z(8, 0.0f);
  MetricsAccumulator acc;
  acc.add(DType::kFloat32, z.data(), z.data(), z.size());
  Metrics m = acc.finish(32, 32);
  EXPECT_EQ(m.rel_l2, 0.0);
  EXPECT_EQ(m.cosine, 1.0);
  EXPECT_EQ(m.norm_ratio, 1.0);
  EXPECT_TRUE(std::isinf(m.snr_db));
  EXPECT_EQ(m.bits_per_element, 32.0);

  // No elements: reproduced exactly, as a zero tensor is, but the bytes it took are per nothing.
  const Metrics none = MetricsAccumulator{}.finish(0, 221);
  EXPECT_EQ(none.numel, 0u);
  EXPECT_EQ(none.ratio, 0.0);
  EXPECT_TRUE(std::isnan(none.bits_per_element));
  EXPECT_EQ(none.rel_l2, 0.0);
  EXPECT_EQ(none.cosine, 1.0);
}

// A zero x decoded as nonzero is no perfect result: its relative error and norm ratio are infinite.
TEST(Metrics, AZeroInputDecodedAsNonzero) {
  const std::vector<float> x(4, 0.0f), y = {0.0f, 0.5f, 0.0f, -0.5f};
  MetricsAccumulator acc;
  acc.add(DType::kFloat32, x.data(), y.data(), x.size());
  const Metrics m = acc.finish(16, 8);
  EXPECT_TRUE(std::isinf(m.rel_l2) && m.rel_l2 > 0);
  EXPECT_TRUE(std::isinf(m.norm_ratio) && m.norm_ratio > 0);
  EXPECT_EQ(m.cosine, 0.0);
  EXPECT_TRUE(std::isinf(m.snr_db) && m.snr_db < 0);
  EXPECT_EQ(m.max_abs_error, 0.5);
}

// The mean error is over the finite elements of x, the ones measured.
TEST(Metrics, MeanErrorIsOverTheFiniteInputs) {
  const std::vector<float> x = {1.0f, std::nanf(""), 3.0f, std::numeric_limits<float>::infinity(), 5.0f};
  const std::vector<float> y = {2.0f, 0.0f, 3.0f, 0.0f, 7.0f};  // errors 1, 0, 2 where x is finite
  MetricsAccumulator acc;
  acc.add(DType::kFloat32, x.data(), y.data(), x.size());
  EXPECT_DOUBLE_EQ(acc.finish(20, 10).mean_error, 1.0);
}

TEST(Metrics, NonFiniteInputIsCountedAndExcluded) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f, std::nanf(""), inf, 2.0f};
  const std::vector<float> y = {1.0f, std::nanf(""), inf, 2.0f};
  MetricsAccumulator acc;
  acc.add(DType::kFloat32, x.data(), y.data(), x.size());
  Metrics m = acc.finish(16, 8);
  EXPECT_EQ(m.nonfinite, 2u);
  EXPECT_EQ(m.decoded_nonfinite, 0u);  // x̂ is not finite only where x is not
  EXPECT_EQ(m.rel_l2, 0.0);
  EXPECT_NEAR(m.cosine, 1.0, 1e-15);
  EXPECT_FALSE(std::isnan(m.mean_error));
}

// An overflow of the dtype: x̂ infinite or NaN where x is finite is counted (the report warns of it).
TEST(Metrics, DecodedNonFiniteWhereTheInputIsFiniteIsCounted) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, std::nanf(""), 5.0f};
  const std::vector<float> y = {1.0f, inf, -inf, inf, std::nanf("")};
  MetricsAccumulator acc;
  acc.add(DType::kFloat32, x.data(), y.data(), x.size());
  const Metrics m = acc.finish(20, 10);
  EXPECT_EQ(m.nonfinite, 1u);
  EXPECT_EQ(m.decoded_nonfinite, 3u);
  EXPECT_TRUE(std::isinf(m.max_abs_error));
}

// float64 squares leave float64 beyond 1e±154: the ratios are then not measured (NaN), never the
// "lossless" a sum that underflowed to 0 would give, or the NaN an overflow gives by chance; x̂ = x
// keeps the lossless conventions at any magnitude.
TEST(Metrics, Float64BeyondWhatSquaresHoldIsNotMeasured) {
  auto metrics = [](const std::vector<double>& x, const std::vector<double>& y) {
    MetricsAccumulator acc;
    acc.add(DType::kFloat64, x.data(), y.data(), x.size());
    return acc.finish(8 * x.size(), 8 * x.size());
  };
  const std::vector<double> tiny(9, 1e-200), zeros(9, 0.0), huge = {1e200, 1, -2, 3, 4, 5, 6, 7, 8};
  for (const Metrics& m : {metrics(tiny, zeros), metrics(huge, {0, 1, -2, 3, 4, 5, 6, 7, 8})}) {
    EXPECT_TRUE(std::isnan(m.rel_l2) && std::isnan(m.cosine) && std::isnan(m.norm_ratio) && std::isnan(m.snr_db))
        << m.rel_l2 << " " << m.cosine << " " << m.norm_ratio << " " << m.snr_db;
  }
  EXPECT_EQ(metrics(tiny, zeros).max_abs_error, 1e-200);
  for (const std::vector<double>& x : {tiny, huge, zeros}) {
    const Metrics m = metrics(x, x);
    EXPECT_EQ(m.rel_l2, 0.0);
    EXPECT_EQ(m.cosine, 1.0);
    EXPECT_EQ(m.norm_ratio, 1.0);
    EXPECT_TRUE(std::isinf(m.snr_db));
  }
  // Within 2^±480 the sums hold, and the ratios are measured.
  const Metrics m = metrics(std::vector<double>(9, 1e-140), std::vector<double>(9, 2e-140));
  EXPECT_DOUBLE_EQ(m.rel_l2, 1.0);
  EXPECT_DOUBLE_EQ(m.norm_ratio, 2.0);
  EXPECT_DOUBLE_EQ(m.cosine, 1.0);
  // An error below 2^-480 that is below 2^-64 of x's largest element is measured (as about 0).
  std::vector<double> x(9, 1.0), y(9, 1.0);
  x[0] = 1e-150;
  y[0] = 2e-150;
  EXPECT_LT(metrics(x, y).rel_l2, 1e-149);
}

// A NaN in x̂ where x is finite: no ratio is measured (cosine had fallen to the zero-vector 0).
TEST(Metrics, ADecodedNanLeavesTheRatiosUnmeasured) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, y = {1, 2, 3, std::nanf(""), 5, 6, 7, 8};
  MetricsAccumulator acc;
  acc.add(DType::kFloat32, x.data(), y.data(), x.size());
  const Metrics m = acc.finish(32, 32);
  EXPECT_TRUE(std::isnan(m.rel_l2) && std::isnan(m.cosine) && std::isnan(m.norm_ratio) && std::isnan(m.snr_db));
  EXPECT_EQ(m.decoded_nonfinite, 1u);
}

TEST(Metrics, HalfPrecisionInputs) {
  const std::vector<uint16_t> x = {0x3C00, 0x4000};  // fp16 1, 2
  const std::vector<uint16_t> y = {0x3C00, 0x3C00};
  MetricsAccumulator acc;
  acc.add(DType::kFloat16, x.data(), y.data(), 2);
  EXPECT_DOUBLE_EQ(acc.finish(4, 4).max_abs_error, 1.0);
  const std::vector<uint16_t> bx = {0x3F80, 0x4000};  // bf16 1, 2
  MetricsAccumulator bacc;
  bacc.add(DType::kBFloat16, bx.data(), bx.data(), 2);
  EXPECT_DOUBLE_EQ(bacc.finish(4, 4).rel_l2, 0.0);
}

// Threads hand back block-aligned pieces of one tensor: appending them must give exactly what one
// pass gives, bit for bit, and so must any other split into add() calls.
TEST(Metrics, SplitsAndThreadPiecesGiveIdenticalResults) {
  const uint64_t n = 3 * MetricsAccumulator::kBlock + 12345;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.001f * static_cast<float>(i)) * 1e-3f;
    y[i] = x[i] * (1.0f + 1e-3f * std::cos(0.7f * static_cast<float>(i)));
  }
  MetricsAccumulator whole;
  whole.add(DType::kFloat32, x.data(), y.data(), n);
  MetricsAccumulator odd;
  for (uint64_t first = 0; first < n; first += 7777) {
    const uint64_t c = std::min<uint64_t>(7777, n - first);
    odd.add(DType::kFloat32, x.data() + first, y.data() + first, c);
  }
  const uint64_t b = MetricsAccumulator::kBlock;
  MetricsAccumulator head(0), mid(b), tail(3 * b);
  head.add(DType::kFloat32, x.data(), y.data(), b);
  mid.add(DType::kFloat32, x.data() + b, y.data() + b, 2 * b);
  tail.add(DType::kFloat32, x.data() + 3 * b, y.data() + 3 * b, n - 3 * b);
  head.append(std::move(mid));
  head.append(std::move(tail));
  for (const MetricsAccumulator* m : {&odd, &head}) {
    const Metrics a = whole.finish(1, 1), c = m->finish(1, 1);
    EXPECT_EQ(a.rel_l2, c.rel_l2);
    EXPECT_EQ(a.cosine, c.cosine);
    EXPECT_EQ(a.mean_error, c.mean_error);
    EXPECT_EQ(a.max_abs_error, c.max_abs_error);
    EXPECT_EQ(a.numel, c.numel);
  }
}

// Errors near float32's largest that cancel do not swallow the small ones, in any order: the mean is
// the exact sum's (the errors' sum is an integer here, so the mean is exact too), on both paths, in
// one add() and in pieces. Summed plainly, 3e38 + 1 − 3e38 gave 0.
TEST(Metrics, MeanErrorKeepsSmallErrorsBesideHugeOnesThatCancel) {
  const uint64_t n = MetricsAccumulator::kBlock + 4463;
  std::vector<float> y(n);
  const float huge = 3e38f;
  int64_t sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (i < 2000) {
      y[i] = i % 2 == 0 ? huge : -huge;
    } else {
      const int v = static_cast<int>(i % 9) - 3;  // -3 .. 5
      y[i] = static_cast<float>(v);
      sum += v;
    }
  }
  const double want = static_cast<double>(sum) / static_cast<double>(n);
  const std::vector<float> x(n, 0.0f);  // the error is x̂ itself
  std::mt19937 rng(3);
  for (int order = 0; order < 4; ++order) {
    if (order > 0) std::shuffle(y.begin(), y.end(), rng);
    for (bool vec : {false, true}) {
      detail::allow_avx2_for_testing(vec);
      MetricsAccumulator whole, pieces;
      whole.add(DType::kFloat32, x.data(), y.data(), n);
      for (uint64_t a = 0; a < n; a += 1001) {
        pieces.add(DType::kFloat32, x.data() + a, y.data() + a, std::min<uint64_t>(1001, n - a));
      }
      EXPECT_EQ(whole.finish(1, 1).mean_error, want) << "order " << order << ", vector path " << vec;
      EXPECT_EQ(pieces.finish(1, 1).mean_error, want) << "order " << order << ", vector path " << vec;
    }
    detail::allow_avx2_for_testing(true);
  }
  // A float64 sum that overflows is +Inf, its compensation (NaN) left out.
  const double big[] = {1e308, 1e308, 1e308, 1e308, 1e308, 1e308, 1e308, 1e308, 1e308}, zero[9] = {};
  for (bool vec : {false, true}) {
    detail::allow_avx2_for_testing(vec);
    MetricsAccumulator inf;
    inf.add(DType::kFloat64, zero, big, 9);
    EXPECT_EQ(inf.finish(1, 1).mean_error, std::numeric_limits<double>::infinity()) << "vector path " << vec;
  }
  detail::allow_avx2_for_testing(true);
}

// Every field of two Metrics, bit for bit (NaN equal to NaN).
void expect_same_bits(const Metrics& a, const Metrics& b, const std::string& where) {
  auto bits = [](double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    return std::isnan(v) ? uint64_t{1} : u;
  };
  EXPECT_EQ(bits(a.rel_l2), bits(b.rel_l2)) << where;
  EXPECT_EQ(bits(a.cosine), bits(b.cosine)) << where;
  EXPECT_EQ(bits(a.max_abs_error), bits(b.max_abs_error)) << where;
  EXPECT_EQ(bits(a.snr_db), bits(b.snr_db)) << where;
  EXPECT_EQ(bits(a.norm_ratio), bits(b.norm_ratio)) << where;
  EXPECT_EQ(bits(a.mean_error), bits(b.mean_error)) << where;
  EXPECT_EQ(a.nonfinite, b.nonfinite) << where;
  EXPECT_EQ(a.decoded_nonfinite, b.decoded_nonfinite) << where;
  EXPECT_EQ(a.numel, b.numel) << where;
}

// MetricsAccumulator::add on x and x-hat in every dtype (the float32 values rounded to it, or for
// float64 moved off float32's grid), from
// element `start` of a tensor, in pieces of `piece` elements, on the portable path and on the x86
// vector path: the same bits.
void check_paths_agree(const std::vector<float>& x, const std::vector<float>& y, uint64_t nonfinite,
                       uint64_t decoded_nonfinite) {
  const uint64_t n = x.size();
  std::vector<double> xd(n), yd(n);  // float64 values with bits below float32's, so products round
  for (uint64_t i = 0; i < n; ++i) {
    xd[i] = static_cast<double>(x[i]) * (1.0 + 0x1p-40 * static_cast<double>(i % 1000));
    yd[i] = static_cast<double>(y[i]) * (1.0 - 0x1p-41 * static_cast<double>(i % 777));
  }
  std::vector<uint16_t> xh(n), yh(n), xb(n), yb(n);
  for (uint64_t i = 0; i < n; ++i) {
    xh[i] = detail::f32_to_f16(x[i]);
    yh[i] = detail::f32_to_f16(y[i]);
    xb[i] = detail::f32_to_bf16(x[i]);
    yb[i] = detail::f32_to_bf16(y[i]);
  }
  struct Input {
    DType dtype;
    const void* x;
    const void* y;
  };
  const Input inputs[] = {{DType::kFloat32, x.data(), y.data()},
                          {DType::kFloat64, xd.data(), yd.data()},
                          {DType::kFloat16, xh.data(), yh.data()},
                          {DType::kBFloat16, xb.data(), yb.data()}};
  for (const Input& in : inputs) {
    const std::size_t esize = dtype_size(in.dtype);
    for (uint64_t start : {uint64_t{0}, uint64_t{1}, uint64_t{3}}) {
      for (uint64_t piece : {n, uint64_t{4097}, uint64_t{10}}) {
        Metrics m[2];
        for (int avx2 = 0; avx2 < 2; ++avx2) {
          detail::allow_avx2_for_testing(avx2 == 1);
          MetricsAccumulator acc(start);
          for (uint64_t a = 0; a < n; a += piece) {
            acc.add(in.dtype, static_cast<const std::byte*>(in.x) + a * esize,
                    static_cast<const std::byte*>(in.y) + a * esize, std::min(piece, n - a));
          }
          m[avx2] = acc.finish(1, 1);
        }
        detail::allow_avx2_for_testing(true);
        expect_same_bits(m[0], m[1], std::string(dtype_name(in.dtype)) + ", start " + std::to_string(start) +
                                         ", pieces of " + std::to_string(piece));
        EXPECT_EQ(m[1].nonfinite, nonfinite) << dtype_name(in.dtype);
        EXPECT_EQ(m[1].decoded_nonfinite, decoded_nonfinite) << dtype_name(in.dtype);
      }
    }
  }
}

// The x86 vector path gives every lane the operations the portable path gives it: the same bits for
// every dtype, with NaN and Inf in x (counted and left out), an Inf in x-hat, signed zeros, fp16
// subnormals, any start position and any split into add() calls.
TEST(Metrics, VectorPathMatchesPortablePathBitForBit) {
  if (!detail::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU: only the portable path runs";
  const uint64_t n = MetricsAccumulator::kBlock + 1037;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {  // magnitudes 2^-12 .. 2^12: within fp16's range, some subnormal there
    x[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 25) - 12);
    y[i] = x[i] + 0.01f * normal(rng) * std::fabs(x[i]);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (uint64_t i : {3u, 64u, 65u, 1000u}) x[i] = std::nanf("");
  for (uint64_t i : {5u, 66u, 2001u}) x[i] = -inf;
  y[4000] = -0.0f;
  x[4001] = -0.0f;
  check_paths_agree(x, y, 7, 0);
  y[7] = inf;  // a finite element decoded to Inf: the sums it enters are Inf or NaN on both paths
  y[8] = std::nanf("");
  y[3] = inf;  // where x is NaN: not counted again
  check_paths_agree(x, y, 7, 2);
}

// The vector path adds runs of elements without checking them while the sums of squares stay finite,
// and adds a run again, checked, where they end otherwise. The same bits wherever the non-finite
// elements fall: none at all, one at a run's first or last element, or one late in a block whose
// earlier runs were all finite; in x or in x-hat.
TEST(Metrics, UncheckedRunsGiveTheCheckedBits) {
  if (!detail::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU: only the portable path runs";
  const uint64_t n = 3 * MetricsAccumulator::kBlock + 517;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> x(n), y(n);
  for (uint64_t i = 0; i < n; ++i) {
    x[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 25) - 12);
    y[i] = x[i] + 0.01f * normal(rng) * std::fabs(x[i]);
  }
  check_paths_agree(x, y, 0, 0);
  const float inf = std::numeric_limits<float>::infinity();
  auto with = [&](std::vector<float> v, uint64_t i, float value) {
    v[i] = value;
    return v;
  };
  for (uint64_t i : {uint64_t{1023}, uint64_t{1024}, uint64_t{1027}, uint64_t{40000}, n - 600}) {
    check_paths_agree(with(x, i, std::nanf("")), y, 1, 0);
    check_paths_agree(with(x, i, -inf), y, 1, 0);
    check_paths_agree(x, with(y, i, inf), 0, 1);
    check_paths_agree(x, with(y, i, std::nanf("")), 0, 1);
  }
  // float64, one large element among small ones: an error whose square overflows where x and x-hat's
  // squares, and their sum, do not (the run stays unchecked; a checked run gives the same Inf), and a
  // square of x that overflows (the run is taken again, checked).
  std::vector<double> xd(8192, 0.5), yd(8192, 0.25);
  yd[5000] = 9e153;  // 8.1e307 squared; the error 1.8e154, 3.2e308 squared
  for (double big : {9e153, 1e200}) {
    xd[5000] = -big;
    Metrics m[2];
    for (int avx2 = 0; avx2 < 2; ++avx2) {
      detail::allow_avx2_for_testing(avx2 == 1);
      MetricsAccumulator acc;
      acc.add(DType::kFloat64, xd.data(), yd.data(), xd.size());
      m[avx2] = acc.finish(1, 1);
    }
    detail::allow_avx2_for_testing(true);
    expect_same_bits(m[0], m[1], "float64, |x| up to " + std::to_string(big));
  }
}

}  // namespace
}  // namespace gcz

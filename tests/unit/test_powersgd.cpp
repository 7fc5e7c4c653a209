// PowerSGD (codecs/powersgd.cpp, docs/codecs/powersgd.md): what power iteration guarantees (error falls
// with rank and iterations, exact on matrices of rank <= r, near the SVD optimum on a decaying
// spectrum), warm starts, the fallback plan, the exact decode formula, and edge cases. All data comes
// from fixed seeds; tolerances are stated at each check.
#include "codecs/powersgd.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu_features.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"
#include "gcz/detail/float_bits.h"
#include "gcz/detail/powersgd_math.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace gcz {
namespace {

using Matrix = std::vector<float>;  // row-major

std::unique_ptr<Codec> make(const std::string& spec) {
  auto s = parse_codec_spec(spec);
  EXPECT_TRUE(s) << s.status().message();
  auto c = make_codec(s->stages[0].name, s->stages[0].params, Backend::kCpu);
  EXPECT_TRUE(c) << spec << ": " << c.status().message();
  return c ? std::move(*c) : nullptr;
}

std::vector<ByteBuffer> encode(Codec& c, const TensorInfo& t, const void* src, uint64_t seed = 7) {
  c.set_context({seed, tensor_key(t.name)});
  std::vector<ByteBuffer> out(c.stream_names(t).size());
  Status s = c.encode(t, src, 0, *t.numel(), out);
  EXPECT_TRUE(s) << s.message();
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (c.exact_size(i)) EXPECT_EQ(out[i].size(), *c.stream_size(t, i, 0, *t.numel()));
  }
  return out;
}

ByteBuffer decode(Codec& c, const TensorInfo& t, const std::vector<ByteBuffer>& streams, uint64_t seed = 7) {
  c.set_context({seed, tensor_key(t.name)});
  std::vector<ByteSpan> in(streams.begin(), streams.end());
  ByteBuffer out(*t.byte_size());
  Status s = c.decode(t, in, 0, *t.numel(), out.data());
  EXPECT_TRUE(s) << s.message();
  return out;
}

// Encodes and decodes a float32 matrix.
Matrix round_trip(const std::string& spec, uint64_t n, uint64_t m, const Matrix& x, uint64_t seed = 7) {
  auto c = make(spec);
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  const ByteBuffer b = decode(*c, t, encode(*c, t, x.data(), seed), seed);
  Matrix out(x.size());
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

double rel_err(const Matrix& x, const Matrix& y) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

Matrix gaussian(uint64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  Matrix x(count);
  for (float& v : x) v = static_cast<float>(normal(rng));
  return x;
}

// Σ_k σ_k u_k v_kᵀ with orthonormal u (n) and v (m) from Gram–Schmidt on Gaussian vectors, in float64.
Matrix with_spectrum(uint64_t n, uint64_t m, const std::vector<double>& sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  auto basis = [&](uint64_t len) {
    std::vector<std::vector<double>> b;
    for (std::size_t k = 0; k < sigma.size(); ++k) {
      std::vector<double> v(len);
      for (double& e : v) e = normal(rng);
      for (const auto& u : b) {
        double d = 0;
        for (uint64_t i = 0; i < len; ++i) d += u[i] * v[i];
        for (uint64_t i = 0; i < len; ++i) v[i] -= d * u[i];
      }
      double nrm = 0;
      for (double e : v) nrm += e * e;
      for (double& e : v) e /= std::sqrt(nrm);
      b.push_back(v);
    }
    return b;
  };
  const auto u = basis(n), v = basis(m);
  Matrix x(n * m);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t j = 0; j < m; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < sigma.size(); ++k) s += sigma[k] * u[k][i] * v[k][j];
      x[i * m + j] = static_cast<float>(s);
    }
  }
  return x;
}

// Singular values (descending) by one-sided Jacobi (Hestenes) in float64.
std::vector<double> singular_values(const Matrix& x, uint64_t n, uint64_t m) {
  std::vector<std::vector<double>> col(m, std::vector<double>(n));
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t j = 0; j < m; ++j) col[j][i] = x[i * m + j];
  }
  for (int sweep = 0; sweep < 60; ++sweep) {
    bool rotated = false;
    for (uint64_t p = 0; p < m; ++p) {
      for (uint64_t q = p + 1; q < m; ++q) {
        double a = 0, b = 0, g = 0;
        for (uint64_t i = 0; i < n; ++i) a += col[p][i] * col[p][i], b += col[q][i] * col[q][i], g += col[p][i] * col[q][i];
        if (std::fabs(g) <= 1e-15 * std::sqrt(a * b)) continue;
        rotated = true;
        const double zeta = (b - a) / (2 * g);
        const double t = std::copysign(1.0, zeta) / (std::fabs(zeta) + std::sqrt(1 + zeta * zeta));
        const double c = 1 / std::sqrt(1 + t * t), s = c * t;
        for (uint64_t i = 0; i < n; ++i) {
          const double vp = col[p][i], vq = col[q][i];
          col[p][i] = c * vp - s * vq;
          col[q][i] = s * vp + c * vq;
        }
      }
    }
    if (!rotated) break;
  }
  std::vector<double> sv;
  for (const auto& c : col) {
    double s = 0;
    for (double e : c) s += e * e;
    sv.push_back(std::sqrt(s));
  }
  std::sort(sv.rbegin(), sv.rend());
  return sv;
}

// The best relative error of a rank-r approximation (Eckart–Young).
double optimal_err(const std::vector<double>& sv, std::size_t r) {
  double tail = 0, all = 0;
  for (std::size_t k = 0; k < sv.size(); ++k) (k >= r ? tail : all) += sv[k] * sv[k];
  return std::sqrt(tail / (tail + all));
}

std::vector<double> geometric(std::size_t k, double ratio) {
  std::vector<double> s(k);
  for (std::size_t i = 0; i < k; ++i) s[i] = std::pow(ratio, static_cast<double>(i));
  return s;
}

TEST(PowerSgd, ErrorFallsWithRankAndIterations) {
  const Matrix x = with_spectrum(128, 96, geometric(60, 0.93), 1);
  double last = 2;
  for (int r : {1, 2, 4, 8, 16}) {
    const double e = rel_err(x, round_trip("powersgd:rank=" + std::to_string(r) + ",min_rate=1", 128, 96, x));
    EXPECT_LT(e, last) << "rank " << r;
    last = e;
  }
  last = 2;
  for (int it : {1, 2, 4, 8}) {
    const double e = rel_err(x, round_trip("powersgd:rank=4,iters=" + std::to_string(it), 128, 96, x));
    EXPECT_LT(e, last) << "iters " << it;
    last = e;
  }
}

TEST(PowerSgd, ExactOnMatricesOfRankAtMostR) {
  // Rank 3 and rank 4 under rank 4, and rank 2 (rank-deficient input) under rank 8.
  for (std::size_t r0 : {3, 4}) {
    const Matrix x = with_spectrum(100, 70, geometric(r0, 0.5), 2);
    EXPECT_LT(rel_err(x, round_trip("powersgd:rank=4,iters=2", 100, 70, x)), 1e-4) << r0;
  }
  const Matrix y = with_spectrum(100, 70, {2.0, 0.1}, 3);
  const Matrix yh = round_trip("powersgd:rank=8,iters=2", 100, 70, y);
  for (float v : yh) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LT(rel_err(y, yh), 1e-5);
}

// Past 511 rows the encode's products go over groups of rows (3, 16 and 2 groups here; the 4500 x 1000
// matrix's on 3 threads): a low-rank matrix still comes back exactly, so every group's rows and
// partial products count.
TEST(PowerSgd, ExactOnLowRankMatricesWhoseRowsSplitIntoGroups) {
  for (const auto& [n, m] : {std::pair<uint64_t, uint64_t>{1000, 70}, {4500, 1000}, {520, 3000}}) {
    const Matrix x = with_spectrum(n, m, geometric(3, 0.5), 4);
    auto c = make("powersgd:rank=4,iters=2");
    c->set_threads(3);
    const TensorInfo t{"w", DType::kFloat32, {n, m}};
    const ByteBuffer b = decode(*c, t, encode(*c, t, x.data()));
    Matrix xh(x.size());
    std::memcpy(xh.data(), b.data(), b.size());
    EXPECT_LT(rel_err(x, xh), 1e-4) << n << " x " << m;
  }
}

TEST(PowerSgd, NearTheSvdOptimumOnADecayingSpectrum) {
  // A general matrix: Gaussian with columns scaled by 0.8^j, so its spectrum decays. After 4
  // iterations the rank-4 error is within 1.1x of the SVD's; it can never beat it.
  const uint64_t n = 120, m = 80;
  Matrix x = gaussian(n * m, 4);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t j = 0; j < m; ++j) x[i * m + j] *= static_cast<float>(std::pow(0.8, static_cast<double>(j)));
  }
  const double best = optimal_err(singular_values(x, n, m), 4);
  const double got = rel_err(x, round_trip("powersgd:rank=4,iters=4", n, m, x));
  EXPECT_LE(got, 1.1 * best);
  EXPECT_GE(got, best * (1 - 1e-5));
}

// The threads of this process (Linux: its tasks).
std::size_t process_threads() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// release_blas_threads stops OpenBLAS's workers, and PowerSGD on threads of its own writes the same
// bytes after it. (Counted as the process's threads: others a test binary may hold, run whole, stay.)
TEST(PowerSgd, ReleasingTheBlasThreadsStopsThemAndChangesNoByte) {
  const uint64_t n = 300, m = 200;
  const Matrix x = gaussian(n * m, 3);
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  auto c = make("powersgd:rank=4");
  ASSERT_TRUE(c);
  c->set_threads(3);
  const std::vector<ByteBuffer> want = encode(*c, t, x.data());
  const std::size_t before = process_threads();
  if (before == 1) GTEST_SKIP() << "no BLAS worker thread is running here (one core, or a BLAS without them)";
  release_blas_threads();
  const std::size_t after = process_threads();
  release_blas_threads();  // again: nothing left to stop
  EXPECT_EQ(process_threads(), after);
  EXPECT_EQ(encode(*c, t, x.data()), want);
  EXPECT_LT(after, before) << "no thread was stopped";
}

TEST(PowerSgd, DecodeIsTheStatedFloat64Sum) {
  // Factors stored as fp32 are read straight from the streams; every element must equal
  // powersgd_element rounded once to the dtype, bit for bit.
  const uint64_t n = 37, m = 53, r = 3;
  const ByteBuffer x64 = [&] {
    const Matrix g = with_spectrum(n, m, geometric(30, 0.7), 5);
    ByteBuffer b(n * m * 8);
    convert_elements(DType::kFloat32, g.data(), DType::kFloat64, b.data(), n * m);
    return b;
  }();
  double err32 = 0;
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    ByteBuffer x(n * m * dtype_size(d));
    convert_elements(DType::kFloat64, x64.data(), d, x.data(), n * m);
    auto c = make("powersgd:rank=3,min_rate=1");
    const TensorInfo t{"w", d, {n, m}};
    const auto streams = encode(*c, t, x.data());
    ASSERT_EQ(c->stream_names(t), (std::vector<std::string>{"p.values", "q.values"}));
    ASSERT_EQ(streams[0].size(), n * r * 4);
    ASSERT_EQ(streams[1].size(), m * r * 4);
    const float* p = reinterpret_cast<const float*>(streams[0].data());
    const float* q = reinterpret_cast<const float*>(streams[1].data());
    const ByteBuffer got = decode(*c, t, streams);
    std::vector<double> want(n * m);
    for (uint64_t i = 0; i < n; ++i) {
      for (uint64_t j = 0; j < m; ++j) want[i * m + j] = detail::powersgd_element(p + i * r, q + j * r, r);
    }
    ByteBuffer want_bytes(got.size());
    convert_elements(DType::kFloat64, want.data(), d, want_bytes.data(), n * m);
    EXPECT_EQ(got, want_bytes) << dtype_name(d);
    // The error is what float32 input gives, up to the input's own rounding (2^-8 for bfloat16).
    Matrix xf(n * m), yf(n * m);
    convert_elements(d, x.data(), DType::kFloat32, xf.data(), n * m);
    convert_elements(d, got.data(), DType::kFloat32, yf.data(), n * m);
    const double err = rel_err(xf, yf);
    if (d == DType::kFloat32) err32 = err;
    EXPECT_NEAR(err, err32, 0.01) << dtype_name(d);
  }
}

TEST(PowerSgd, DecodeIsTheStatedSumWhateverTheTilesThreadsAndVectorPath) {
  // Factors of wide-ranging magnitudes and signs, so that each sum depends on its order, on a matrix
  // of several pieces of rows (with a last short tile) and several column blocks (with a last short
  // panel) at rank 72: every element must be powersgd_element rounded once, bit for bit, on 1 and 3
  // threads, with the vector path and without.
  const uint64_t n = 131, m = 1100, r = 72;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::uniform_real_distribution<float> fraction(-2.0f, 2.0f);
  auto factor = [&](uint64_t count) {
    ByteBuffer b(count * 4);
    for (uint64_t i = 0; i < count; ++i) {
      const float v = std::ldexp(fraction(rng), exponent(rng));
      std::memcpy(b.data() + i * 4, &v, 4);
    }
    return b;
  };
  const std::vector<ByteBuffer> streams = {factor(n * r), factor(m * r)};
  const float* p = reinterpret_cast<const float*>(streams[0].data());
  const float* q = reinterpret_cast<const float*>(streams[1].data());
  std::vector<double> want(n * m);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t j = 0; j < m; ++j) want[i * m + j] = detail::powersgd_element(p + i * r, q + j * r, r);
  }
  for (DType d : {DType::kFloat32, DType::kFloat64}) {
    const TensorInfo t{"w", d, {n, m}};
    ByteBuffer want_bytes(n * m * dtype_size(d));
    convert_elements(DType::kFloat64, want.data(), d, want_bytes.data(), n * m);
    for (bool vec : {true, false}) {
      detail::allow_avx2_for_testing(vec);
      for (unsigned threads : {1u, 3u}) {
        auto c = make("powersgd:rank=72,min_rate=1");
        c->set_threads(threads);
        EXPECT_EQ(decode(*c, t, streams), want_bytes) << dtype_name(d) << " vector " << vec << " threads " << threads;
      }
    }
    detail::allow_avx2_for_testing(true);
  }
}

TEST(PowerSgd, NanSumsDecodeAsTheDefaultQuietNanOnEveryPath) {
  // Factors only a made-up file holds: NaNs of either sign and any payload, Infs (Inf·0 is a NaN).
  // Every NaN element decodes as the default quiet NaN of its dtype, on both paths and any thread count;
  // the other elements as the stated sum.
  const uint64_t n = 9, m = 13, r = 3;
  const uint32_t specials[] = {0x7fc00001u, 0xffc12345u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0u};
  std::mt19937 rng(5);
  auto factor = [&](uint64_t count) {
    ByteBuffer b(count * 4);
    for (uint64_t i = 0; i < count; ++i) {
      const uint32_t bits = rng() % 4 == 0 ? specials[rng() % 6] : detail::bit_cast<uint32_t>(float(rng() % 7) - 3.0f);
      std::memcpy(b.data() + i * 4, &bits, 4);
    }
    return b;
  };
  const std::vector<ByteBuffer> streams = {factor(n * r), factor(m * r)};
  const float* p = reinterpret_cast<const float*>(streams[0].data());
  const float* q = reinterpret_cast<const float*>(streams[1].data());
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  uint64_t nans = 0;
  for (bool vec : {true, false}) {
    detail::allow_avx2_for_testing(vec);
    for (unsigned threads : {1u, 3u}) {
      auto c = make("powersgd:rank=3,min_rate=1");
      c->set_threads(threads);
      const ByteBuffer got = decode(*c, t, streams);
      nans = 0;
      for (uint64_t i = 0; i < n; ++i) {
        for (uint64_t j = 0; j < m; ++j) {
          uint32_t bits;
          std::memcpy(&bits, got.data() + (i * m + j) * 4, 4);
          const double want = detail::powersgd_element(p + i * r, q + j * r, r);
          if (std::isnan(want)) {
            ++nans;
            EXPECT_EQ(bits, 0x7fc00000u) << i << ", " << j << " vector " << vec << " threads " << threads;
          } else {
            EXPECT_EQ(bits, detail::bit_cast<uint32_t>(static_cast<float>(want))) << i << ", " << j;
          }
        }
      }
    }
  }
  detail::allow_avx2_for_testing(true);
  EXPECT_GT(nans, n * m / 4);  // the test has NaNs to check
}

#if defined(__x86_64__)
// Decoding rounds each float64 sum to float32 to nearest even whatever the FPU's rounding mode (a
// bare cast followed it); encoding is the caller's arithmetic and is not asked to.
TEST(PowerSgd, DecodeIgnoresTheFpuRoundingMode) {
  const uint64_t n = 37, m = 53;
  const Matrix x = with_spectrum(n, m, geometric(30, 0.7), 5);
  auto c = make("powersgd:rank=3,min_rate=1");
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  const auto streams = encode(*c, t, x.data());
  const ByteBuffer want = decode(*c, t, streams);
  const unsigned saved = _mm_getcsr();
  _mm_setcsr((saved & ~0x6000u) | 0x2000u);  // round toward -infinity
  const ByteBuffer got = decode(*c, t, streams);
  _mm_setcsr(saved);
  EXPECT_EQ(got, want);
}
#endif

TEST(PowerSgd, StoredPIsOrthogonalAndBalanced) {
  const uint64_t n = 64, m = 48, r = 4;
  const Matrix x = with_spectrum(n, m, geometric(40, 0.9), 6);
  auto c = make("powersgd:rank=4,iters=2");
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  const auto s = encode(*c, t, x.data());
  const float* p = reinterpret_cast<const float*>(s[0].data());
  const float* q = reinterpret_cast<const float*>(s[1].data());
  for (uint64_t a = 0; a < r; ++a) {
    double maxp = 0, maxq = 0;
    for (uint64_t i = 0; i < n; ++i) maxp = std::max(maxp, std::fabs(double(p[i * r + a])));
    for (uint64_t j = 0; j < m; ++j) maxq = std::max(maxq, std::fabs(double(q[j * r + a])));
    EXPECT_GE(maxq / maxp, 0.5);  // powersgd_balance_shift: within a factor 4
    EXPECT_LT(maxq / maxp, 4.0);
    for (uint64_t b = 0; b < a; ++b) {
      double ab = 0, aa = 0, bb = 0;
      for (uint64_t i = 0; i < n; ++i) {
        ab += double(p[i * r + a]) * p[i * r + b], aa += double(p[i * r + a]) * p[i * r + a];
        bb += double(p[i * r + b]) * p[i * r + b];
      }
      EXPECT_LT(std::fabs(ab) / std::sqrt(aa * bb), 1e-6);
    }
  }
}

TEST(PowerSgd, ZeroMatrixZeroColumnAndZeroRow) {
  const uint64_t n = 40, m = 30;
  const Matrix z(n * m, 0.0f);
  auto c = make("powersgd");
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  const auto s = encode(*c, t, z.data());
  for (const ByteBuffer& b : s) {
    for (std::byte v : b) ASSERT_EQ(v, std::byte{0});  // +0 factors
  }
  ASSERT_TRUE(c->state());
  EXPECT_EQ(c->state()->shape, (Shape{m, 4}));
  EXPECT_EQ(decode(*c, t, s), ByteBuffer(n * m * 4, std::byte{0}));

  const Matrix k(n * m, -2.5f);  // constant: rank 1
  EXPECT_LT(rel_err(k, round_trip("powersgd", n, m, k)), 1e-6);

  Matrix x = with_spectrum(n, m, {1.0, 0.5}, 7);
  for (uint64_t i = 0; i < n; ++i) x[i * m + 5] = 0.0f;
  for (uint64_t j = 0; j < m; ++j) x[9 * m + j] = 0.0f;
  const Matrix y = round_trip("powersgd:rank=4,iters=2", n, m, x);
  for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(y[i * m + 5], 0.0f);
  for (uint64_t j = 0; j < m; ++j) EXPECT_EQ(y[9 * m + j], 0.0f);
  EXPECT_LT(rel_err(x, y), 1e-5);
}

TEST(PowerSgd, NonFiniteInputsCountAsZero) {
  const uint64_t n = 50, m = 40;
  Matrix x = gaussian(n * m, 8), zeroed = x;
  const float specials[] = {NAN, INFINITY, -INFINITY};
  for (int k = 0; k < 3; ++k) {
    x[k * 97] = specials[k];
    zeroed[k * 97] = 0.0f;
  }
  auto c = make("powersgd");
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  EXPECT_EQ(encode(*c, t, x.data()), encode(*c, t, zeroed.data()));
  const Matrix y = round_trip("powersgd", n, m, x);
  for (float v : y) ASSERT_TRUE(std::isfinite(v));
}

TEST(PowerSgd, ScalingByPowersOfTwoIsExactAndFarRangesWork) {
  const uint64_t n = 48, m = 32;
  const Matrix x = with_spectrum(n, m, geometric(20, 0.8), 9);
  const Matrix y = round_trip("powersgd", n, m, x);
  for (int k : {-100, 60, 100}) {
    Matrix xs = x;
    for (float& v : xs) v = std::ldexp(v, k);
    const Matrix ys = round_trip("powersgd", n, m, xs);
    for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(ys[i], std::ldexp(y[i], k)) << k << " " << i;
  }
  // Near FLT_MAX and all subnormal: finite, and as close as the input's precision allows.
  for (double top : {3.0e38, 1.0e-39}) {
    Matrix xs = x;
    float mx = 0;
    for (float v : x) mx = std::max(mx, std::fabs(v));
    for (float& v : xs) v = static_cast<float>(v / mx * top);
    const Matrix ys = round_trip("powersgd", n, m, xs);
    for (float v : ys) ASSERT_TRUE(std::isfinite(v)) << top;
    EXPECT_LT(rel_err(xs, ys), rel_err(x, y) + 0.02) << top;
  }
}

TEST(PowerSgd, Bf16AndFp16FactorsRoundTrip) {
  // On a rank-3 matrix fp32 factors are exact to float32 rounding, so what is left is the factor
  // codec's rounding: bf16 keeps 8 significant bits, fp16 11 (relative steps 2^-9 and 2^-12).
  const uint64_t n = 96, m = 64;
  const Matrix x = with_spectrum(n, m, {1.0, 0.6, 0.3}, 10);
  auto c = make("powersgd:factors=(bf16),iters=2");
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  const auto s = encode(*c, t, x.data());
  EXPECT_EQ(c->stream_names(t), (std::vector<std::string>{"p.values", "q.values"}));
  EXPECT_EQ(s[0].size(), n * 4 * 2);
  EXPECT_EQ(s[1].size(), m * 4 * 2);
  EXPECT_EQ(std::get<std::string>(c->params().at("factors")), "bf16");
  EXPECT_LT(rel_err(x, round_trip("powersgd:iters=2", n, m, x)), 1e-5);
  const double bf = rel_err(x, round_trip("powersgd:factors=(bf16),iters=2", n, m, x));
  EXPECT_GT(bf, 1e-4);
  EXPECT_LT(bf, 1e-2);
  const double h = rel_err(x, round_trip("powersgd:factors=(fp16),iters=2", n, m, x));
  EXPECT_LT(h, bf / 4);
}

TEST(PowerSgd, WarmStartTracksASlowlyChangingMatrix) {
  // Error feedback's use: step t starts from step t−1's Q. With one iteration per step, a warm chain
  // converges where a cold start each step does not.
  const uint64_t n = 128, m = 96;
  const Matrix base = with_spectrum(n, m, geometric(60, 0.9), 11);
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  std::optional<CodecState> state;
  double warm = 0, cold = 0;
  for (int step = 0; step < 6; ++step) {
    Matrix x = base;
    const Matrix noise = gaussian(n * m, 100 + step);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += 0.001f * noise[i];
    auto c = make("powersgd");
    if (state) ASSERT_TRUE(c->set_state(t, *state));
    const auto s = encode(*c, t, x.data());
    ByteBuffer b = decode(*c, t, s);
    Matrix y(x.size());
    std::memcpy(y.data(), b.data(), b.size());
    warm = rel_err(x, y);
    cold = rel_err(x, round_trip("powersgd", n, m, x));
    if (state) EXPECT_NE(s, encode(*make("powersgd"), t, x.data())) << step;
    state = c->state();
    ASSERT_TRUE(state);
    ASSERT_EQ(state->shape, (Shape{m, 4}));
  }
  EXPECT_LT(warm, cold * 0.9);
  EXPECT_LT(warm, optimal_err(geometric(60, 0.9), 4) * 1.05);

  // A state of another shape is ignored: the encode is the cold one.
  const Matrix x = base;
  auto c = make("powersgd");
  ASSERT_TRUE(c->set_state(t, CodecState{{m, 3}, std::vector<float>(m * 3, 1.0f)}));
  EXPECT_EQ(encode(*c, t, x.data()), encode(*make("powersgd"), t, x.data()));
}

TEST(PowerSgd, DeterministicAndSeeded) {
  const uint64_t n = 64, m = 64;
  const Matrix x = gaussian(n * m, 12);
  const TensorInfo t{"w", DType::kFloat32, {n, m}};
  const auto a = encode(*make("powersgd:rank=2,iters=3"), t, x.data(), 1);
  EXPECT_EQ(a, encode(*make("powersgd:rank=2,iters=3"), t, x.data(), 1));
  auto c = make("powersgd:rank=2,iters=3");
  EXPECT_EQ(encode(*c, t, x.data(), 1), encode(*c, t, x.data(), 1));  // encode does not warm itself
  EXPECT_NE(a, encode(*make("powersgd:rank=2,iters=3"), t, x.data(), 2));
}

// The encode's products go over groups of rows that depend on the shape alone (one per 256 rows, at
// most 16), on as many of the codec's threads as the work is worth (one per 2^22 multiply-adds): the
// same factors for any thread count, on one group and on many, tall and wide, on one thread and on
// several (4500 x 1000 at rank 5: up to 5).
TEST(PowerSgd, EncodeDoesNotDependOnTheThreadCount) {
  for (const auto& [n, m] :
       {std::pair<uint64_t, uint64_t>{300, 40}, {1000, 77}, {4500, 64}, {520, 3000}, {4500, 1000}}) {
    const Matrix x = gaussian(n * m, 21);
    const TensorInfo t{"w", DType::kFloat32, {n, m}};
    auto one = make("powersgd:rank=5,iters=2");
    const auto want = encode(*one, t, x.data());
    for (unsigned threads : {2u, 3u, 16u}) {
      auto c = make("powersgd:rank=5,iters=2");
      c->set_threads(threads);
      EXPECT_EQ(encode(*c, t, x.data()), want) << n << " x " << m << ", threads " << threads;
    }
  }
}

TEST(PowerSgd, GaussianStartHasUnitVariance) {
  const detail::Rng rng(3, 4, detail::kStreamPowerSgdInit);
  double s = 0, s2 = 0;
  const int count = 200000;
  for (int i = 0; i < count; ++i) {
    const double z = detail::powersgd_gaussian(rng, i);
    ASSERT_TRUE(std::isfinite(z));
    s += z, s2 += z * z;
  }
  EXPECT_NEAR(s / count, 0.0, 0.01);  // 4.5 standard errors
  EXPECT_NEAR(s2 / count, 1.0, 0.015);
}

TEST(PowerSgd, ViewLastAndHigherRankTensors) {
  // An [8, 4, 32] tensor whose 32 x 32 "last" view has rank 2.
  const Matrix x = with_spectrum(32, 32, {1.0, 0.3}, 13);
  auto last = make("powersgd:rank=2,view=last,iters=2,min_rate=1");
  auto first = make("powersgd:rank=2,view=first,min_rate=1");
  const TensorInfo t{"conv", DType::kFloat32, {8, 4, 32}};
  EXPECT_EQ(*last->stream_size(t, 0, 0, 1024), 32u * 2 * 4);
  EXPECT_EQ(*first->stream_size(t, 0, 0, 1024), 8u * 2 * 4);
  EXPECT_EQ(*first->stream_size(t, 1, 0, 1024), 128u * 2 * 4);
  const ByteBuffer b = decode(*last, t, encode(*last, t, x.data()));
  Matrix y(x.size());
  std::memcpy(y.data(), b.data(), b.size());
  EXPECT_LT(rel_err(x, y), 1e-5);
}

TEST(PowerSgd, PlanSendsWhatWouldNotShrinkToTheFallback) {
  const std::string pow = "powersgd:factors=fp32,fallback=fp16,iters=1,min_rate=2,rank=4,view=first";
  auto plan = [](const Shape& s, const std::string& params, DType d = DType::kFloat32) {
    auto spec = parse_codec_spec("powersgd" + params);
    auto r = powersgd_plan_for({"t", d, s}, spec->stages[0].params);
    EXPECT_TRUE(r) << r.status().message();
    return r ? *r : std::string();
  };
  EXPECT_EQ(plan({256, 64}, ""), pow);
  EXPECT_EQ(plan({}, ""), "fp16");      // 0-d
  EXPECT_EQ(plan({1}, ""), "fp16");     // 1 element
  EXPECT_EQ(plan({64}, ""), "fp16");    // a bias
  EXPECT_EQ(plan({0, 4}, ""), "fp16");  // empty
  EXPECT_EQ(plan({3, 5}, ""), "fp16");
  EXPECT_EQ(plan({1, 768}, ""), "fp16");
  EXPECT_EQ(plan({64}, ":fallback=(bf16)"), "bf16");
  EXPECT_EQ(plan({64}, ":fallback=none"), "none");
  // The boundary: 4·(16+16)·4 = 512 bytes of factors against 1024 bytes of float32 (rate exactly 2).
  EXPECT_EQ(plan({16, 16}, ""), "fp16");
  EXPECT_EQ(plan({16, 16}, ":min_rate=1.99").substr(0, 9), "powersgd:");
  EXPECT_EQ(plan({17, 16}, "").substr(0, 9), "powersgd:");
  EXPECT_EQ(plan({17, 16}, "", DType::kFloat16), "fp16");  // half the dense bytes
  EXPECT_EQ(plan({8, 4, 32}, ":view=last").substr(0, 9), "powersgd:");

  // Called directly on such a tensor, the codec refuses and names the fallback.
  auto c = make("powersgd");
  const TensorInfo bias{"b", DType::kFloat32, {64}};
  const Matrix x(64, 1.0f);
  std::vector<ByteBuffer> out(2);
  Status s = c->encode(bias, x.data(), 0, 64, out);
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("fallback 'fp16'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("it has fewer than 2 dimensions"), std::string::npos) << s.message();
  EXPECT_FALSE(c->stream_size(bias, 0, 0, 64));
}

// powersgd.md, step 3, written out from the text: for c = 0..r-1, the projections onto columns
// 0..c-1 subtracted twice in a row, then the column divided by its norm, or zeroed where the norm is
// at most 1e-8 of the largest column norm before any of this. Dot products in index order from +0.
std::vector<double> orthonormalized_as_documented(std::vector<double> v, uint64_t n, uint64_t r) {
  auto dot = [&](uint64_t a, uint64_t b) {
    double s = 0.0;
    for (uint64_t i = 0; i < n; ++i) s = s + v[a * n + i] * v[b * n + i];
    return s;
  };
  double largest = 0.0;
  for (uint64_t c = 0; c < r; ++c) largest = std::max(largest, std::sqrt(dot(c, c)));
  for (uint64_t c = 0; c < r; ++c) {
    for (int twice = 0; twice < 2; ++twice) {
      for (uint64_t k = 0; k < c; ++k) {
        const double d = dot(k, c);
        for (uint64_t i = 0; i < n; ++i) v[c * n + i] = v[c * n + i] - d * v[k * n + i];
      }
    }
    const double norm = std::sqrt(dot(c, c));
    for (uint64_t i = 0; i < n; ++i) v[c * n + i] = norm > 1e-8 * largest ? v[c * n + i] / norm : 0.0;
  }
  return v;
}

// The orthonormalization is the documented loop to the bit, on columns close to dependent (where a
// single pass or another order would round otherwise), and keeps them orthogonal to float64 rounding.
TEST(PowerSgd, OrthonormalizationIsTheDocumentedLoop) {
  const uint64_t n = 64, r = 4;
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  std::vector<double> v(n * r);
  for (uint64_t i = 0; i < n; ++i) {
    const double base = normal(rng);
    for (uint64_t c = 0; c < r; ++c) v[c * n + i] = base + 1e-6 * static_cast<double>(c) * normal(rng);
  }
  const std::vector<double> want = orthonormalized_as_documented(v, n, r);
  detail::powersgd_orthonormalize(v.data(), n, r);
  for (uint64_t i = 0; i < n * r; ++i) ASSERT_EQ(v[i], want[i]) << i;
  for (uint64_t a = 0; a < r; ++a) {
    for (uint64_t b = 0; b <= a; ++b) {
      double s = 0.0;
      for (uint64_t i = 0; i < n; ++i) s += v[a * n + i] * v[b * n + i];
      EXPECT_NEAR(s, a == b ? 1.0 : 0.0, 1e-12) << a << " " << b;
    }
  }
  // A column whose norm is exactly the threshold, 1e-8 of the largest, is zeroed; a little above, kept.
  for (const double scale : {1.0, 1.0 + 1e-12}) {
    std::vector<double> w = {1.0, 0.0, 0.0, 1e-8 * scale};  // two columns of two
    ASSERT_EQ(std::sqrt(w[3] * w[3]), w[3]);
    detail::powersgd_orthonormalize(w.data(), 2, 2);
    EXPECT_EQ(w[3], scale == 1.0 ? 0.0 : 1.0) << scale;
  }
}

// k = floor((e + eq - ep) / 2), rounding toward minus infinity for odd negative sums too.
TEST(PowerSgd, BalanceShiftIsTheFloorOfHalf) {
  for (const auto& [s, k] :
       std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {2, 1}, {3, 1}, {-1, -1}, {-2, -1}, {-3, -2}}) {
    EXPECT_EQ(detail::powersgd_balance_shift(s, 0, 0), k) << s;
    EXPECT_EQ(detail::powersgd_balance_shift(0, 5, s + 5), k) << s;  // the same sum from eq - ep
  }
}

TEST(PowerSgd, BadParametersAreRejected) {
  const std::pair<std::string, std::string> bad[] = {
      {"powersgd:rank=0", "rank"},
      {"powersgd:rank=1025", "rank"},
      {"powersgd:rank=two", "rank"},
      {"powersgd:iters=0", "iters"},
      {"powersgd:view=middle", "view"},
      {"powersgd:min_rate=0.5", "min_rate"},
      {"powersgd:min_rate=inf", "min_rate"},
      {"powersgd:factors=(zstd)", "factors"},
      {"powersgd:factors=(nope)", "factors"},
      {"powersgd:fallback=(powersgd)", "fallback"},
      {"powersgd:fallback=(fp16+zstd)", "fallback"},
      {"powersgd:fallback=(nope)", "fallback"},
      {"powersgd:ranks=4", "ranks"},
      {"powersgd:iters=65", "iters must be 1..64"},
  };
  for (const auto& [spec, word] : bad) {
    auto s = parse_codec_spec(spec);
    ASSERT_TRUE(s) << spec;
    auto c = make_codec("powersgd", s->stages[0].params, Backend::kCpu);
    ASSERT_FALSE(c) << spec;
    // An unknown codec name inside a parameter is kUnsupported, as make_codec says for any unknown name.
    EXPECT_TRUE(c.status().code() == StatusCode::kInvalidArgument || c.status().code() == StatusCode::kUnsupported)
        << spec;
    EXPECT_NE(c.status().message().find("powersgd"), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find(word), std::string::npos) << c.status().message();
    EXPECT_FALSE(powersgd_plan_for({"t", DType::kFloat32, {64, 64}}, s->stages[0].params)) << spec;
  }
  // The ends of the ranges are accepted.
  for (const char* spec : {"powersgd:rank=1", "powersgd:rank=1024", "powersgd:iters=1", "powersgd:iters=64"}) {
    EXPECT_TRUE(make_codec("powersgd", parse_codec_spec(spec)->stages[0].params, Backend::kCpu)) << spec;
  }
}

TEST(PowerSgd, ParamsAreCanonicalAndRebuildTheCodec) {
  auto c = make("powersgd:rank=3,factors=(fp16),fallback=(bf16),min_rate=1.5");
  const Params p = c->params();
  CodecSpec spec;
  spec.stages.push_back({"powersgd", p});
  EXPECT_EQ(spec.to_string(),
            "powersgd:factors=fp16,fallback=bf16,iters=1,min_rate=1.5,rank=3,view=first");
  auto again = make_codec("powersgd", p, Backend::kCpu);
  ASSERT_TRUE(again);
  const Matrix x = gaussian(64 * 48, 14);
  const TensorInfo t{"w", DType::kFloat32, {64, 48}};
  const auto s = encode(*c, t, x.data());
  EXPECT_EQ(decode(**again, t, s), decode(*c, t, s));
  // A factor stream of the wrong size is an error, not a crash.
  ByteBuffer out(*t.byte_size());
  const ByteBuffer short_p(s[0].begin(), s[0].end() - 2);
  EXPECT_FALSE(c->decode(t, {ByteSpan(short_p), ByteSpan(s[1])}, 0, *t.numel(), out.data()));
  EXPECT_FALSE(c->decode(t, {ByteSpan(s[0])}, 0, *t.numel(), out.data()));
}

TEST(PowerSgd, PipelineRoundTrip) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(::testing::TempDir()) / "gcz_powersgd_pipeline";
  fs::remove_all(d);
  fs::create_directories(d);
  const TensorInfo a{"layer.weight", DType::kFloat32, {96, 64}}, b{"head.weight", DType::kBFloat16, {64, 80}};
  const Matrix xa = gaussian(96 * 64, 15), xf = gaussian(64 * 80, 16);
  ByteBuffer xb(64 * 80 * 2);
  convert_elements(DType::kFloat32, xf.data(), DType::kBFloat16, xb.data(), xf.size());
  {
    auto w = create_tensor_file((d / "in.safetensors").string(), {a, b}, {});
    ASSERT_TRUE(w) << w.status().message();
    ASSERT_TRUE((*w)->begin(0) && (*w)->write(xa.data(), xa.size()) && (*w)->end());
    ASSERT_TRUE((*w)->begin(1) && (*w)->write(xb.data(), xf.size()) && (*w)->end());
    ASSERT_TRUE((*w)->finish());
  }
  EncodeOptions o;
  o.spec = "powersgd:rank=2+zstd";
  o.device = DeviceRequest::kCpu;
  o.seed = 5;
  o.chunk_elements = 100;  // ignored: powersgd takes whole tensors
  auto report = encode_files({(d / "in.safetensors").string()}, (d / "x.gcz").string(), o);
  ASSERT_TRUE(report) << report.status().message();
  ASSERT_TRUE(decode_file((d / "x.gcz").string(), (d / "out.safetensors").string(), {}));
  auto out = open_tensor_file((d / "out.safetensors").string(), {});
  ASSERT_TRUE(out) << out.status().message();
  for (std::size_t i = 0; i < 2; ++i) {
    const TensorInfo& t = (*out)->tensors()[i];
    ByteBuffer got(*t.byte_size());
    ASSERT_TRUE((*(*out)->open(i))->read(0, *t.numel(), got.data()));
    auto c = make("powersgd:rank=2");
    const void* src = i == 0 ? static_cast<const void*>(xa.data()) : xb.data();
    EXPECT_EQ(got, decode(*c, t, encode(*c, t, src, 5), 5)) << t.name;
    EXPECT_GT(report->tensors[i].metrics.rel_l2, 0.5);  // rank 2 of a Gaussian matrix loses most
  }
}

// Not a check: prints the time of rank 4 on 4096 x 4096 float32 (run with --gtest_also_run_disabled_tests).
TEST(PowerSgd, DISABLED_Speed4096) {
  const uint64_t n = 4096;
  const Matrix x = gaussian(n * n, 17);
  auto c = make("powersgd");
  const TensorInfo t{"w", DType::kFloat32, {n, n}};
  std::vector<ByteBuffer> s(2);
  ByteBuffer y(n * n * 4, std::byte{1});  // touched: time the codec, not page faults
  for (int run = 0; run < 3; ++run) {
    for (ByteBuffer& b : s) b.clear();
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c->encode(t, x.data(), 0, n * n, s));
    const auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c->decode(t, {ByteSpan(s[0]), ByteSpan(s[1])}, 0, n * n, y.data()));
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("powersgd rank 4, 4096 x 4096 float32: encode %.1f ms, decode %.1f ms\n",
                std::chrono::duration<double, std::milli>(t1 - t0).count(),
                std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
}

}  // namespace
}  // namespace gcz

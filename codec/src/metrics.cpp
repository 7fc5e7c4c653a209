#include "gcz/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu_features.h"
#include "gcz/detail/float_bits.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcz {
namespace {

inline double widen(double v) { return v; }
inline double widen(float v) { return v; }
struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };
inline double widen(F16 v) { return detail::f16_to_f32(v.bits); }
inline double widen(BF16 v) { return detail::bf16_to_f32(v.bits); }

// s + v into s, what that addition rounded off into c (Knuth's TwoSum: exact where s + v is finite),
// so that s + c keeps errors that cancel (1e38, 1, -1e38 sum to 1 in any order).
inline void add_compensated(double& s, double& c, double v) {
  const double t = s + v, vt = t - s;
  c += (s - (t - vt)) + (v - vt);
  s = t;
}

// Adds the pair (x, y) to lane l: a non-finite x contributes zeros and a count; so does a non-finite
// y where x is finite. Branch-free.
template <class Lanes, class Counts>
inline void add_one(Lanes& a, int l, double x_raw, double y_raw, Counts& c) {
  const bool finite = std::isfinite(x_raw);
  const double x = finite ? x_raw : 0.0;
  const double y = finite ? y_raw : 0.0;
  const double e = y - x;
  c.nonfinite += !finite;
  c.decoded_nonfinite += finite & !std::isfinite(y_raw);
  a.xx[l] += x * x;
  a.yy[l] += y * y;
  a.xy[l] += x * y;
  a.ee[l] += e * e;
  add_compensated(a.e[l], a.ec[l], e);
  const double abs = std::fabs(e), ax = std::fabs(x), ay = std::fabs(y);
  a.max_abs[l] = abs > a.max_abs[l] ? abs : a.max_abs[l];
  a.max_x[l] = ax > a.max_x[l] ? ax : a.max_x[l];
  a.max_y[l] = ay > a.max_y[l] ? ay : a.max_y[l];
}

#if defined(__x86_64__)
#define GCZ_METRICS_AVX2 [[gnu::always_inline, gnu::target("avx2,f16c")]] inline

// Four elements widened to float64, as widen() does (exact; a NaN stays a NaN).
GCZ_METRICS_AVX2 __m256d widen4(const double* p) { return _mm256_loadu_pd(p); }
GCZ_METRICS_AVX2 __m256d widen4(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
GCZ_METRICS_AVX2 __m256d widen4(const F16* p) {
  return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
GCZ_METRICS_AVX2 __m256d widen4(const BF16* p) {  // each bf16 in the high half of a float32
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)));
}

// The sums of four lanes, in registers.
struct Sums4 {
  __m256d xx, yy, xy, ee, e, ec, max_abs, max_x, max_y;
};

// add_one on four lanes at once, for n (a multiple of 4) elements whose first is in lane 0: lane l of
// each vector is a[l] of a sum, so every lane sees the same operations, in the same order, as
// add_one gives it. (max_pd(v, m) is v > m ? v : m, as add_one's max is.) kChecked = false leaves
// out add_one's checks of finiteness, its masks and counts: that is the same arithmetic wherever
// every x, and every y, is finite.
template <bool kChecked, class T>
GCZ_METRICS_AVX2 void add4(Sums4& s, const T* x, const T* y, uint64_t n, __m256i& finite_count, __m256i& decoded_bad) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFF));
  const __m256d inf = _mm256_set1_pd(std::numeric_limits<double>::infinity());
  for (uint64_t i = 0; i < n; i += 4) {
    __m256d xv = widen4(x + i), yv = widen4(y + i);
    if constexpr (kChecked) {
      const __m256d finite = _mm256_cmp_pd(_mm256_and_pd(xv, abs_mask), inf, _CMP_LT_OQ);  // false for NaN
      const __m256d y_finite = _mm256_cmp_pd(_mm256_and_pd(yv, abs_mask), inf, _CMP_LT_OQ);
      xv = _mm256_and_pd(xv, finite);  // +0.0 where not finite
      yv = _mm256_and_pd(yv, finite);
      finite_count = _mm256_sub_epi64(finite_count, _mm256_castpd_si256(finite));  // a true lane is -1
      decoded_bad = _mm256_sub_epi64(decoded_bad, _mm256_castpd_si256(_mm256_andnot_pd(y_finite, finite)));
    }
    const __m256d ev = _mm256_sub_pd(yv, xv);
    s.xx = _mm256_add_pd(s.xx, _mm256_mul_pd(xv, xv));
    s.yy = _mm256_add_pd(s.yy, _mm256_mul_pd(yv, yv));
    s.xy = _mm256_add_pd(s.xy, _mm256_mul_pd(xv, yv));
    s.ee = _mm256_add_pd(s.ee, _mm256_mul_pd(ev, ev));
    const __m256d t = _mm256_add_pd(s.e, ev), vt = _mm256_sub_pd(t, s.e);  // add_compensated
    s.ec = _mm256_add_pd(s.ec, _mm256_add_pd(_mm256_sub_pd(s.e, _mm256_sub_pd(t, vt)), _mm256_sub_pd(ev, vt)));
    s.e = t;
    s.max_abs = _mm256_max_pd(_mm256_and_pd(ev, abs_mask), s.max_abs);
    if constexpr (std::is_same_v<T, double>) {  // narrower dtypes' squares always hold (finish())
      s.max_x = _mm256_max_pd(_mm256_and_pd(xv, abs_mask), s.max_x);
      s.max_y = _mm256_max_pd(_mm256_and_pd(yv, abs_mask), s.max_y);
    }
  }
}

// Whether every lane of the sums of squares of x and of y is finite. A non-finite x makes its lane of
// xx Inf or NaN for good, as a non-finite y does yy's: where both stay finite over a run, every x and
// y of the run was finite.
GCZ_METRICS_AVX2 bool squares_finite(const Sums4& s) {
  const __m256d inf = _mm256_set1_pd(std::numeric_limits<double>::infinity());
  return _mm256_movemask_pd(_mm256_cmp_pd(_mm256_add_pd(s.xx, s.yy), inf, _CMP_LT_OQ)) == 0xF;
}

// Elements per run that add4 first takes unchecked; a run whose sums of squares end non-finite (or
// begin so) is taken again from its start, checked.
constexpr uint64_t kUncheckedRun = 1024;

template <class Lanes, class Counts, class T>
[[gnu::target("avx2,f16c")]] void accumulate_avx2(Lanes& a, const T* x, const T* y, uint64_t n, Counts& c) {
  Sums4 s{_mm256_loadu_pd(a.xx),      _mm256_loadu_pd(a.yy),    _mm256_loadu_pd(a.xy),
          _mm256_loadu_pd(a.ee),      _mm256_loadu_pd(a.e),     _mm256_loadu_pd(a.ec),
          _mm256_loadu_pd(a.max_abs), _mm256_loadu_pd(a.max_x), _mm256_loadu_pd(a.max_y)};
  __m256i finite_count = _mm256_setzero_si256(), decoded_bad = _mm256_setzero_si256();
  uint64_t checked = 0;  // elements added by the checked loop, which counts
  for (uint64_t i = 0; i < n; i += kUncheckedRun) {
    const uint64_t m = std::min(kUncheckedRun, n - i);
    if (squares_finite(s)) {
      const Sums4 before = s;
      add4<false>(s, x + i, y + i, m, finite_count, decoded_bad);
      if (squares_finite(s)) continue;
      s = before;
    }
    add4<true>(s, x + i, y + i, m, finite_count, decoded_bad);
    checked += m;
  }
  _mm256_storeu_pd(a.xx, s.xx);
  _mm256_storeu_pd(a.yy, s.yy);
  _mm256_storeu_pd(a.xy, s.xy);
  _mm256_storeu_pd(a.ee, s.ee);
  _mm256_storeu_pd(a.e, s.e);
  _mm256_storeu_pd(a.ec, s.ec);
  _mm256_storeu_pd(a.max_abs, s.max_abs);
  _mm256_storeu_pd(a.max_x, s.max_x);
  _mm256_storeu_pd(a.max_y, s.max_y);
  alignas(32) uint64_t counts[4], bad[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(counts), finite_count);
  _mm256_store_si256(reinterpret_cast<__m256i*>(bad), decoded_bad);
  c.nonfinite += checked - (counts[0] + counts[1] + counts[2] + counts[3]);
  c.decoded_nonfinite += bad[0] + bad[1] + bad[2] + bad[3];
}
#endif

// Element i of the tensor goes to lane i mod kLanes; `start` is the index of x[0] in the tensor.
template <int kLanes, class Lanes, class Counts, class T>
void accumulate(Lanes& a, uint64_t start, const T* x, const T* y, uint64_t n, Counts& c) {
  uint64_t i = 0;
  for (; i < n && (start + i) % kLanes != 0; ++i) {
    add_one(a, static_cast<int>((start + i) % kLanes), widen(x[i]), widen(y[i]), c);
  }
#if defined(__x86_64__)
  if (kLanes == 4 && detail::cpu_has_avx2()) {
    const uint64_t whole = (n - i) / 4 * 4;
    accumulate_avx2(a, x + i, y + i, whole, c);
    i += whole;
  }
#endif
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) add_one(a, l, widen(x[i + l]), widen(y[i + l]), c);
  }
  for (int l = 0; i < n; ++i, ++l) add_one(a, l, widen(x[i]), widen(y[i]), c);
}

}  // namespace

bool float64_squares_held(double max_ref, double max_other, double max_err) {
  auto held = [](double most) { return most == 0 || std::isinf(most) || (most >= 0x1p-480 && most <= 0x1p480); };
  return held(max_ref) && held(max_other) && (held(max_err) || (max_err < 0x1p-480 && max_err <= max_ref * 0x1p-64));
}

void MetricsAccumulator::close_block() {
  blocks_.push_back(open_);
  open_ = Lanes{};
  open_used_ = false;
}

void MetricsAccumulator::add(DType dtype, const void* x, const void* xhat, uint64_t n) {
  const std::size_t esize = dtype_size(dtype);
  const auto* px = static_cast<const std::byte*>(x);
  const auto* py = static_cast<const std::byte*>(xhat);
  while (n > 0) {
    // The part of this block still open.
    const uint64_t pos = start_ + numel_;
    const uint64_t m = std::min(n, kBlock - pos % kBlock);
    auto run = [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      accumulate<kLanes>(open_, pos, reinterpret_cast<const T*>(px), reinterpret_cast<const T*>(py), m, counts_);
    };
    switch (dtype) {
      case DType::kFloat64: run(static_cast<double*>(nullptr)); break;
      case DType::kFloat32: run(static_cast<float*>(nullptr)); break;
      case DType::kFloat16: run(static_cast<F16*>(nullptr)); break;
      case DType::kBFloat16: run(static_cast<BF16*>(nullptr)); break;
    }
    open_used_ = true;
    numel_ += m;
    n -= m;
    px += m * esize;
    py += m * esize;
    if ((start_ + numel_) % kBlock == 0) close_block();
  }
}

void MetricsAccumulator::append(MetricsAccumulator&& next) {
  // Precondition (the caller splits at block boundaries): this ends where `next` starts, with no
  // block open.
  blocks_.insert(blocks_.end(), next.blocks_.begin(), next.blocks_.end());
  open_ = next.open_;
  open_used_ = next.open_used_;
  numel_ += next.numel_;
  counts_.nonfinite += next.counts_.nonfinite;
  counts_.decoded_nonfinite += next.counts_.decoded_nonfinite;
}

void MetricsAccumulator::merge(const MetricsAccumulator& o) {
  if (open_used_) close_block();
  blocks_.insert(blocks_.end(), o.blocks_.begin(), o.blocks_.end());
  if (o.open_used_) blocks_.push_back(o.open_);
  numel_ += o.numel_;
  counts_.nonfinite += o.counts_.nonfinite;
  counts_.decoded_nonfinite += o.counts_.decoded_nonfinite;
}

Metrics MetricsAccumulator::finish(uint64_t bytes_in, uint64_t bytes_out) const {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  Metrics m;
  m.numel = numel_;
  m.nonfinite = counts_.nonfinite;
  m.decoded_nonfinite = counts_.decoded_nonfinite;
  m.bytes_in = bytes_in;
  m.bytes_out = bytes_out;
  m.ratio = bytes_out ? static_cast<double>(bytes_in) / static_cast<double>(bytes_out) : 0.0;
  // No elements, no bits per element: not measured (NaN), where 0 would say the bytes were free.
  m.bits_per_element = numel_ ? 8.0 * static_cast<double>(bytes_out) / static_cast<double>(numel_) : std::nan("");
  // Each block's lanes in order, then the blocks in order.
  double sum_xx = 0, sum_yy = 0, sum_xy = 0, sum_ee = 0, sum_e = 0, sum_ec = 0, max_abs = 0, max_x = 0, max_y = 0;
  auto fold = [&](const Lanes& a) {
    double b[6] = {};
    for (int l = 0; l < kLanes; ++l) {
      b[0] += a.xx[l];
      b[1] += a.yy[l];
      b[2] += a.xy[l];
      b[3] += a.ee[l];
      add_compensated(b[4], b[5], a.e[l]);
      b[5] += a.ec[l];
      max_abs = std::max(a.max_abs[l], max_abs);  // NaN-free: the lanes' maxima are never NaN
      max_x = std::max(a.max_x[l], max_x);
      max_y = std::max(a.max_y[l], max_y);
    }
    sum_xx += b[0];
    sum_yy += b[1];
    sum_xy += b[2];
    sum_ee += b[3];
    add_compensated(sum_e, sum_ec, b[4]);
    sum_ec += b[5];
  };
  for (const Lanes& a : blocks_) fold(a);
  if (open_used_) fold(open_);
  const double nx = std::sqrt(sum_xx), ny = std::sqrt(sum_yy), ne = std::sqrt(sum_ee);
  // Conventions for zero vectors: a zero x reproduced exactly is a perfect result.
  m.rel_l2 = nx > 0 ? ne / nx : (ne > 0 ? kInf : 0.0);
  m.cosine = (nx > 0 && ny > 0) ? sum_xy / (nx * ny) : (nx == 0 && ny == 0 ? 1.0 : 0.0);
  m.norm_ratio = nx > 0 ? ny / nx : (ny > 0 ? kInf : 1.0);
  m.snr_db = ne > 0 ? (nx > 0 ? 10.0 * std::log10(sum_xx / sum_ee) : -kInf) : kInf;
  // Only float64 tensors can leave what float64 squares hold (1e±144); their ratios are then not
  // measured (NaN, null in JSON), never a wrong "lossless". A NaN x̂ makes the sums NaN: the ratios
  // are NaN too, not the zero-vector conventions above.
  if (max_abs == 0 && !std::isnan(sum_ee)) {  // x̂ = x where x is finite, whatever the sums say
    m.rel_l2 = 0;
    m.cosine = m.norm_ratio = 1;
    m.snr_db = kInf;
  } else if (!float64_squares_held(max_x, max_y, max_abs) || std::isnan(sum_yy) || std::isnan(sum_ee)) {
    m.rel_l2 = m.cosine = m.norm_ratio = m.snr_db = std::nan("");
  }
  m.max_abs_error = max_abs;
  const uint64_t finite = numel_ - counts_.nonfinite;
  // Where the sum overflowed (or met a NaN), its compensation says nothing.
  const double total_e = std::isfinite(sum_e) ? sum_e + sum_ec : sum_e;
  m.mean_error = finite ? total_e / static_cast<double>(finite) : 0.0;
  return m;
}

}  // namespace gcz

#include "gcz/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gcz/detail/float_bits.h"

namespace gcz {
namespace {

inline double widen(double v) { return v; }
inline double widen(float v) { return v; }
struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };
inline double widen(F16 v) { return detail::f16_to_f32(v.bits); }
inline double widen(BF16 v) { return detail::bf16_to_f32(v.bits); }

// Adds the pair (x, y) to lane l: a non-finite x contributes zeros and a count. Branch-free.
template <class Lanes>
inline void add_one(Lanes& a, int l, double x_raw, double y_raw, uint64_t& nonfinite) {
  const bool finite = std::isfinite(x_raw);
  const double x = finite ? x_raw : 0.0;
  const double y = finite ? y_raw : 0.0;
  const double e = y - x;
  nonfinite += !finite;
  a.xx[l] += x * x;
  a.yy[l] += y * y;
  a.xy[l] += x * y;
  a.ee[l] += e * e;
  a.e[l] += e;
  const double abs = std::fabs(e);
  a.max_abs[l] = abs > a.max_abs[l] ? abs : a.max_abs[l];
}

// Element i of the tensor goes to lane i mod kLanes; `start` is the index of x[0] in the tensor.
template <int kLanes, class Lanes, class T>
void accumulate(Lanes& a, uint64_t start, const T* x, const T* y, uint64_t n, uint64_t& nonfinite) {
  uint64_t i = 0;
  for (; i < n && (start + i) % kLanes != 0; ++i) {
    add_one(a, static_cast<int>((start + i) % kLanes), widen(x[i]), widen(y[i]), nonfinite);
  }
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) add_one(a, l, widen(x[i + l]), widen(y[i + l]), nonfinite);
  }
  for (int l = 0; i < n; ++i, ++l) add_one(a, l, widen(x[i]), widen(y[i]), nonfinite);
}

}  // namespace

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
      accumulate<kLanes>(open_, pos, reinterpret_cast<const T*>(px), reinterpret_cast<const T*>(py), m, nonfinite_);
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
  nonfinite_ += next.nonfinite_;
}

void MetricsAccumulator::merge(const MetricsAccumulator& o) {
  if (open_used_) close_block();
  blocks_.insert(blocks_.end(), o.blocks_.begin(), o.blocks_.end());
  if (o.open_used_) blocks_.push_back(o.open_);
  numel_ += o.numel_;
  nonfinite_ += o.nonfinite_;
}

Metrics MetricsAccumulator::finish(uint64_t bytes_in, uint64_t bytes_out) const {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  Metrics m;
  m.numel = numel_;
  m.nonfinite = nonfinite_;
  m.bytes_in = bytes_in;
  m.bytes_out = bytes_out;
  m.ratio = bytes_out ? static_cast<double>(bytes_in) / static_cast<double>(bytes_out) : 0.0;
  m.bits_per_element = numel_ ? 8.0 * static_cast<double>(bytes_out) / static_cast<double>(numel_) : 0.0;
  // Each block's lanes in order, then the blocks in order.
  double sum_xx = 0, sum_yy = 0, sum_xy = 0, sum_ee = 0, sum_e = 0, max_abs = 0;
  auto fold = [&](const Lanes& a) {
    double b[5] = {};
    for (int l = 0; l < kLanes; ++l) {
      b[0] += a.xx[l];
      b[1] += a.yy[l];
      b[2] += a.xy[l];
      b[3] += a.ee[l];
      b[4] += a.e[l];
      max_abs = a.max_abs[l] > max_abs ? a.max_abs[l] : max_abs;
    }
    sum_xx += b[0];
    sum_yy += b[1];
    sum_xy += b[2];
    sum_ee += b[3];
    sum_e += b[4];
  };
  for (const Lanes& a : blocks_) fold(a);
  if (open_used_) fold(open_);
  const double nx = std::sqrt(sum_xx), ny = std::sqrt(sum_yy), ne = std::sqrt(sum_ee);
  // Conventions for zero vectors: a zero x reproduced exactly is a perfect result.
  m.rel_l2 = nx > 0 ? ne / nx : (ne > 0 ? kInf : 0.0);
  m.cosine = (nx > 0 && ny > 0) ? sum_xy / (nx * ny) : (nx == 0 && ny == 0 ? 1.0 : 0.0);
  m.norm_ratio = nx > 0 ? ny / nx : (ny > 0 ? kInf : 1.0);
  m.snr_db = ne > 0 ? (nx > 0 ? 10.0 * std::log10(sum_xx / sum_ee) : -kInf) : kInf;
  m.max_abs_error = max_abs;
  const uint64_t finite = numel_ - nonfinite_;
  m.mean_error = finite ? sum_e / static_cast<double>(finite) : 0.0;
  return m;
}

}  // namespace gcz

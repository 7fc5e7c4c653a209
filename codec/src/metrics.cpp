#include "gcz/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gcz/detail/float_bits.h"

namespace gcz {
namespace {

template <class Load>
void accumulate(uint64_t n, Load load, uint64_t& nonfinite, double& xx, double& yy, double& xy, double& ee,
                double& e_sum, double& max_abs) {
  // Branch-free: a non-finite x contributes zeros (and a count) instead of skipping the element.
  for (uint64_t i = 0; i < n; ++i) {
    const double x_raw = load(0, i);
    const bool finite = std::isfinite(x_raw);
    const double x = finite ? x_raw : 0.0;
    const double y = finite ? load(1, i) : 0.0;
    const double e = y - x;
    nonfinite += !finite;
    xx += x * x;
    yy += y * y;
    xy += x * y;
    ee += e * e;
    e_sum += e;
    const double a = std::fabs(e);
    max_abs = a > max_abs ? a : max_abs;
  }
}

}  // namespace

void MetricsAccumulator::add(DType dtype, const void* x, const void* xhat, uint64_t n) {
  const void* p[2] = {x, xhat};
  auto run = [&](auto load) {
    accumulate(n, load, nonfinite_, sum_xx_, sum_yy_, sum_xy_, sum_ee_, sum_e_, max_abs_);
  };
  switch (dtype) {
    case DType::kFloat64:
      run([&](int k, uint64_t i) { return static_cast<const double*>(p[k])[i]; });
      break;
    case DType::kFloat32:
      run([&](int k, uint64_t i) { return double{static_cast<const float*>(p[k])[i]}; });
      break;
    case DType::kFloat16:
      run([&](int k, uint64_t i) { return double{detail::f16_to_f32(static_cast<const uint16_t*>(p[k])[i])}; });
      break;
    case DType::kBFloat16:
      run([&](int k, uint64_t i) { return double{detail::bf16_to_f32(static_cast<const uint16_t*>(p[k])[i])}; });
      break;
  }
  numel_ += n;
}

void MetricsAccumulator::merge(const MetricsAccumulator& o) {
  numel_ += o.numel_;
  nonfinite_ += o.nonfinite_;
  sum_xx_ += o.sum_xx_;
  sum_yy_ += o.sum_yy_;
  sum_xy_ += o.sum_xy_;
  sum_ee_ += o.sum_ee_;
  sum_e_ += o.sum_e_;
  if (!(o.max_abs_ <= max_abs_)) max_abs_ = o.max_abs_;
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
  const double nx = std::sqrt(sum_xx_), ny = std::sqrt(sum_yy_), ne = std::sqrt(sum_ee_);
  // Conventions for zero vectors: a zero x reproduced exactly is a perfect result.
  m.rel_l2 = nx > 0 ? ne / nx : (ne > 0 ? kInf : 0.0);
  m.cosine = (nx > 0 && ny > 0) ? sum_xy_ / (nx * ny) : (nx == 0 && ny == 0 ? 1.0 : 0.0);
  m.norm_ratio = nx > 0 ? ny / nx : (ny > 0 ? kInf : 1.0);
  m.snr_db = ne > 0 ? (nx > 0 ? 10.0 * std::log10(sum_xx_ / sum_ee_) : -kInf) : kInf;
  m.max_abs_error = max_abs_;
  const uint64_t finite = numel_ - nonfinite_;
  m.mean_error = finite ? sum_e_ / static_cast<double>(finite) : 0.0;
  return m;
}

}  // namespace gcz

// gcz/metrics.h — what an encode cost and what it lost (DESIGN.md §5), accumulated in float64.
//
//   gcz::MetricsAccumulator acc;
//   acc.add(gcz::DType::kFloat32, x, xhat, n);   // any number of chunks
//   gcz::Metrics m = acc.finish(bytes_in, bytes_out);
//   m.rel_l2, m.cosine, m.snr_db, ...
//
// Non-finite input elements (NaN, ±Inf) are counted in `nonfinite` and left out of the error sums, so
// one NaN does not hide what happened to the rest of the tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "gcz/tensor.h"

namespace gcz {

struct Metrics {
  uint64_t numel = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  double ratio = 0;             // bytes_in / bytes_out
  double bits_per_element = 0;  // 8 * bytes_out / numel
  double rel_l2 = 0;            // ||x - x̂|| / ||x||
  double cosine = 0;            // <x, x̂> / (||x|| ||x̂||)
  double max_abs_error = 0;     // max |x_i - x̂_i|
  double snr_db = 0;            // 10 log10(||x||² / ||x - x̂||²)
  double norm_ratio = 0;        // ||x̂|| / ||x||
  double mean_error = 0;        // mean of x̂_i - x_i (bias)
  uint64_t nonfinite = 0;       // NaN/Inf elements in x, excluded from the sums
};

// Below this norm ratio the report warns of over-compression.
inline constexpr double kNormRatioWarning = 0.9;

class MetricsAccumulator {
 public:
  // Adds n elements of x and x̂, both of dtype `dtype`.
  void add(DType dtype, const void* x, const void* xhat, uint64_t n);
  void merge(const MetricsAccumulator& other);
  Metrics finish(uint64_t bytes_in, uint64_t bytes_out) const;

 private:
  // Sums are kept in kLanes interleaved partial sums (element i goes to lane i mod kLanes, counted over
  // the whole tensor) so the loop pipelines and vectorizes, while the result stays independent of how
  // the tensor was split into add() calls.
  static constexpr int kLanes = 4;
  struct Lanes {
    double xx[kLanes] = {}, yy[kLanes] = {}, xy[kLanes] = {}, ee[kLanes] = {}, e[kLanes] = {}, max_abs[kLanes] = {};
  };
  uint64_t numel_ = 0;
  uint64_t nonfinite_ = 0;
  Lanes lanes_;
  std::vector<Lanes> merged_;  // accumulators merged in, summed after our own in finish()
};

}  // namespace gcz

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
  double bits_per_element = 0;  // 8 * bytes_out / numel; NaN for no elements
  double rel_l2 = 0;            // ||x - x̂|| / ||x||
  double cosine = 0;            // <x, x̂> / (||x|| ||x̂||)
  double max_abs_error = 0;     // max |x_i - x̂_i|
  double snr_db = 0;            // 10 log10(||x||² / ||x - x̂||²)
  double norm_ratio = 0;        // ||x̂|| / ||x||
  double mean_error = 0;        // mean of x̂_i - x_i (bias)
  uint64_t nonfinite = 0;       // NaN/Inf elements in x, excluded from the sums
  uint64_t decoded_nonfinite = 0;  // elements where x is finite and x̂ is NaN/Inf (an overflow of the dtype)
};

// Whether float64 sums of squares hold what they sum, given the largest |x| (`max_ref`), the largest
// of another summed value (|x̂|; 0 where none) and the largest error: each is 0, Inf or within
// 2^±480 (its square a normal number, and 2^48 such squares finite), an error below 2^-480 also
// where it is below 2^-64 of max_ref (its square's underflow is then immaterial). Where not, a
// ratio of the sums is not measured (docs/CLI.md, "The report").
bool float64_squares_held(double max_ref, double max_other, double max_err);

// Below this norm ratio the report warns of over-compression.
inline constexpr double kNormRatioWarning = 0.9;

class MetricsAccumulator {
 public:
  // Element positions count from `start`, the index in its tensor of the first element added.
  explicit MetricsAccumulator(uint64_t start = 0) : start_(start) {}

  // Adds n elements of x and x̂, both of dtype `dtype`, at the next positions.
  void add(DType dtype, const void* x, const void* xhat, uint64_t n);
  // Continues this tensor with `next`, which starts where this one ends, at a block boundary (how
  // threads hand back their ranges of one tensor). The result is what adding in one go gives.
  void append(MetricsAccumulator&& next);
  // Adds another tensor's sums after this one's (for totals over tensors; order matters).
  void merge(const MetricsAccumulator& other);
  Metrics finish(uint64_t bytes_in, uint64_t bytes_out) const;

  // Sums are kept per block of kBlock positions, each in kLanes interleaved lanes (position p goes to
  // lane p mod kLanes), and the blocks are summed in order at the end. So the loop pipelines, and the
  // result depends only on the elements, never on how they were split into add() calls or threads.
  static constexpr uint64_t kBlock = 65536;

 private:
  static constexpr int kLanes = 4;
  struct Lanes {
    double xx[kLanes] = {}, yy[kLanes] = {}, xy[kLanes] = {}, ee[kLanes] = {}, e[kLanes] = {}, max_abs[kLanes] = {};
    double ec[kLanes] = {};                         // what the sums e rounded off (compensated summation)
    double max_x[kLanes] = {}, max_y[kLanes] = {};  // of |x| and |x̂|, for float64: whether its squares held
  };
  void close_block();

  struct Counts {  // elements counted, not summed: see Metrics
    uint64_t nonfinite = 0;
    uint64_t decoded_nonfinite = 0;
  };

  uint64_t start_ = 0;
  uint64_t numel_ = 0;
  Counts counts_;
  Lanes open_;                // the block being filled
  bool open_used_ = false;
  std::vector<Lanes> blocks_;  // closed blocks, in order
};

}  // namespace gcz

// sparse_common.h — what Top-K and Random-K share: how many elements they keep (parameter `ratio` or
// `k`), gathering the kept elements as float32 values, and scattering decoded values back.
//
//   GCZ_ASSIGN_OR_RETURN(SparseCount count, SparseCount::parse(params, "topk"));
//   uint64_t k = count.k(n);                          // max(1, floor(ratio * n)), at most n
//   std::vector<float> v = gather_values(t.dtype, src, idx, 1.0f);
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "gcz/codec.h"

namespace gcz::codecs {

// The number of kept elements, given as a ratio of n or as a count (docs/codecs/topk.md, "k").
class SparseCount {
 public:
  static constexpr double kDefaultRatio = 0.01;

  // Reads `ratio` (0 < ratio <= 1) or `k` (an integer >= 1), at most one of them; neither means
  // ratio = 0.01.
  static Result<SparseCount> parse(const Params& p, std::string_view codec);

  // k for a tensor of n elements: 0 when n is 0, else min(n, max(1, floor(ratio * n))) with the
  // product and floor in float64, or min(n, k).
  uint64_t k(uint64_t n) const;

  // Adds `ratio` or `k` to the canonical parameters.
  void add_params(Params& p) const;

 private:
  std::optional<double> ratio_;
  uint64_t k_ = 0;
};

// n for a whole-tensor codec's encode/decode call, which must cover [0, n) of `t`.
Result<uint64_t> whole_tensor(const TensorInfo& t, uint64_t first, uint64_t count, std::string_view codec);

// The float32 values of elements `idx` of `src` (n elements of `dtype`): v = float32(x) rounded to
// nearest even, then v = v * scale in float32 when scale != 1; a v that is not finite becomes +0, so
// NaN and Inf never reach a value codec.
std::vector<float> gather_values(DType dtype, const void* src, std::span<const uint64_t> idx, float scale);

// Writes n zeros of `dtype` to dst, then values[j] converted to `dtype` (round to nearest even) at
// element idx[j].
void scatter_values(DType dtype, std::span<const uint64_t> idx, const float* values, uint64_t n, void* dst);

}  // namespace gcz::codecs

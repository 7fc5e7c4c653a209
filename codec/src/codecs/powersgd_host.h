// The host PowerSGD's parts shared by powersgd.cpp (the power iterations, the codec) and
// powersgd_reconstruct.cpp (x̂ = P·Qᵀ).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gcz/tensor.h"

namespace gcz::detail {

// The n × m matrix view of a tensor.
struct PowerSgdDims {
  uint64_t n = 0, m = 0;
};

constexpr uint64_t kPowerSgdMinWorkPerThread = uint64_t{1} << 22;  // multiply-adds (~0.2 ms), against a thread's start

// How many of `threads` to run `pieces` pieces of an n × m × r product on: no more than the pieces,
// and one per kPowerSgdMinWorkPerThread multiply-adds.
inline unsigned powersgd_workers(unsigned threads, uint64_t pieces, PowerSgdDims d, uint64_t r) {
  const double work = static_cast<double>(d.n) * static_cast<double>(d.m) * static_cast<double>(r);
  return static_cast<unsigned>(
      std::min<double>({static_cast<double>(std::max(threads, 1u)), static_cast<double>(pieces),
                        std::max(1.0, work / static_cast<double>(kPowerSgdMinWorkPerThread))}));
}

// x̂ = P·Qᵀ (P n × r, Q m × r, row-major), rounded to `dtype` into dst (n·m elements), on up to
// `threads` threads; the bytes are the same for any thread count.
void powersgd_reconstruct(const std::vector<float>& p, const std::vector<float>& q, PowerSgdDims d, uint64_t r,
                          DType dtype, void* dst, unsigned threads);

}  // namespace gcz::detail

// gcz/detail/quant_reduce.h — the one summation order of the quantizers' float64 sums (QSGD's l2
// scale, TernGrad's sigma), fixed so that any backend reproduces the bits: the CPU with vector lanes,
// a GPU with one thread block per block of elements and a tree over the blocks.
//
// A range's element k belongs to block k / 256 (kSumBlock). Within a block, lane j (j = 0..7) adds the
// terms of elements k with k mod 8 == j in increasing k, starting from +0.0; the block's sum is
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). Block sums s_0 .. s_{m-1} are combined pairwise:
// P(s_0) = s_0; P(s_0 .. s_{m-1}) = P(s_0 .. s_{h-1}) + P(s_h .. s_{m-1}) with h the largest power of
// two below m.
//
// Super-blocks of 2^p blocks (the last may be partial) summed each with its own PairwiseSum, their
// totals then combined by another, give the same tree bit for bit: every split of the tree above a
// super-block falls between super-blocks. Threads take super-blocks that way.
//
//   gcz::detail::PairwiseSum sum;
//   for (each block) sum.add(combine_lanes(lanes));
//   double total = sum.total();
#pragma once

#include <cstdint>

#include "gcz/detail/hd.h"

namespace gcz::detail {

inline constexpr uint64_t kSumBlock = 256;

GCZ_HD double combine_lanes(const double* lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Block sums in, P(...) out, streaming: the stack holds the sums of complete power-of-two runs of
// blocks, largest first, like the digits of a binary counter.
class PairwiseSum {
 public:
  GCZ_HD void add(double block_sum) {
    for (uint64_t c = count_; c & 1u; c >>= 1) block_sum = stack_[--top_] + block_sum;  // left + right
    stack_[top_++] = block_sum;
    ++count_;
  }
  GCZ_HD double total() const {
    if (top_ == 0) return 0.0;
    double r = stack_[top_ - 1];
    for (int i = top_ - 2; i >= 0; --i) r = stack_[i] + r;
    return r;
  }

 private:
  double stack_[64] = {};
  int top_ = 0;
  uint64_t count_ = 0;
};

}  // namespace gcz::detail

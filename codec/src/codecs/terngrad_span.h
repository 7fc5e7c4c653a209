// The CPU loops of TernGrad: the moments behind the scale (count, max|x|, shifted sums for sigma;
// terngrad_moments.cpp), the trits of one span and their packing, and the way back (terngrad_span.cpp).
// Compiled for SSE2 and AVX2 (the moments also for AVX-512F) with the choice made at run time; all give
// the same bytes (the same float operations in the same order; the one fused multiply-add, x * 1 - K,
// rounds once like the subtraction it stands for).
//
//   TernGradMoments m;
//   terngrad_add_moments(x, n, m);                  // any number of times, whole 256-blocks but the last
//   float s = m.scale(clip);                        // scale_from_stats(max|x|, sigma, clip)
//   bool finite = terngrad_group_scales(x, n, group, clip, s);  // or: every group's scale
#pragma once

#include <cstdint>

#include "codecs/quant_uniforms.h"
#include "gcz/detail/quant_reduce.h"

namespace gcz::detail {

// Sums over a range of float32 values for its scale. With K the range's first finite element and
// d = x - K in float64 for each finite x: S1 = sum of d, S2 = sum of d^2 (gcz/detail/quant_reduce.h
// order), n_f the finite count, and max|x| over the finite elements.
struct TernGradMoments {
  double shift = 0.0;  // K
  bool has_shift = false;
  PairwiseSum s1, s2;
  uint64_t finite = 0;
  int32_t max_bits = 0;

  float max_abs() const;
  // Population sd: var = (S2 - (S1 * S1) / n_f) / n_f in float64, sigma = sqrt(var), 0 when var <= 0.
  double sigma() const;
  // The range's scale with clip factor `clip` (terngrad::scale_from_stats; sigma only when clip > 0).
  float scale(double clip) const;
};

// Adds x[0, n) to the range's moments; every call but the range's last adds a multiple of kSumBlock.
void terngrad_add_moments(const float* x, uint64_t n, TernGradMoments& m);
// Sets K from x[0, n) if it is not yet set and x holds a finite element (what terngrad_add_moments
// does first): to give K to moments computed in parts, which then start with it set.
void terngrad_find_shift(const float* x, uint64_t n, TernGradMoments& m);

// The scale of each group of `group` elements of x[0, n) (the last may be partial) into scales[0, ceil(n / group)):
// the same values as a TernGradMoments per group, computed without its per-range overhead. Returns
// whether every element of x[0, n) is finite.
bool terngrad_group_scales(const float* x, uint64_t n, uint64_t group, double clip, float* scales);

struct TernGradEncodeSpan {
  const float* x;       // len float32 values
  const uint8_t* u;     // len coarse draw bytes (stochastic rounding: Rng::coarse8), or any bytes; len + 32 readable
  FineDraws fine;       // the fine draw bytes, for the draws the coarse byte does not settle
  uint64_t len;         // a multiple of the trits per byte except at the end of the tensor
  uint64_t piece;       // elements per scale (the group, or len for a tensor scale)
  const float* scales;  // ceil(len / piece) scales
  bool stochastic;
  bool base3;
  bool finite;          // every element of x is finite (as its moments showed): the vector loops skip the test
  uint8_t* scratch;     // len + 5 bytes
  uint32_t* ties;       // scratch: tie_room(len, piece) words (note_ties: draws that wait for a fine byte)
  uint8_t* out;         // ceil(len / 5) or ceil(len / 4) bytes
};
void terngrad_encode_span(const TernGradEncodeSpan& job);

// The one-pass encode of a tensor scale (terngrad.cpp) makes a span's trits before the scale s is
// known, from a bracket [s_lo, s_hi] that s is expected to fall in. A larger scale never makes a
// trit more likely to be nonzero (the threshold byte d of the vector loops never rises with s, nor
// does p), so an element whose coarse draw byte u lies below d(s_hi) (deterministic: whose p(s_hi)
// >= 1/2) is nonzero under any s of the bracket, and one whose u lies above d(s_lo) (whose p(s_lo)
// < 1/2) is zero. The others (d(s_hi) <= u <= d(s_lo): those of the bracket's width, and the ties)
// are left zero in the packed bytes and kept as pending elements, which terngrad_settle_pending
// decides once s is known, exactly as the two-pass encode would.
struct TernGradPending {
  uint32_t e;  // bits 0..23: the element's offset from the piece's first element; bits 24..31: its u
  float x;
};
inline constexpr uint64_t kTernGradPendingReach = uint64_t{1} << 24;  // offsets a pending element can hold

struct TernGradBracketSpan {
  const float* x;    // len float32 values
  const uint8_t* u;  // stochastic: len coarse draw bytes (Rng::coarse8), len + 32 readable; else unused
  uint64_t len;      // a multiple of 5 except at the end of the tensor
  uint64_t at;       // the offset of x[0] from the piece's first element: at + len <= kTernGradPendingReach
  bool finite;       // every element of x is finite
  bool stochastic;   // the rounding: stochastic, else deterministic
  float s_lo, s_hi;  // 0 < s_lo <= s_hi, and terngrad_bracket_supported(s_lo)
  uint32_t* ties;    // scratch: tie_room(len, len) words
  uint8_t* out;      // ceil(len / 5) bytes: the base-3 trits, the pending ones zero
};
// Whether this CPU runs the one-pass loop, and a bracket from s_lo up suits it (the vector loops'
// constants of s_lo, and so of every larger scale, are finite).
bool terngrad_bracket_supported(float s_lo);
// The span's trits under a scale in [s_lo, s_hi], base 3; appends the pending elements to
// pending[count, ...), which has room for len more, and counts them in `count`.
void terngrad_bracket_span(const TernGradBracketSpan& j, TernGradPending* pending, uint64_t& count);
// Adds the trits of pending elements p[0, n) under the scale s into the piece's packed bytes `out`,
// whose fine draws are `fine` (first: the piece's first element; stochastic rounding only).
void terngrad_settle_pending(const TernGradPending* p, uint64_t n, float s, const FineDraws& fine, uint8_t* out,
                             bool stochastic = true);

struct TernGradDecodeSpan {
  const uint8_t* in;    // ceil(len / 5) or ceil(len / 4) bytes
  uint64_t len;
  uint64_t piece;
  const float* scales;  // ceil(len / piece) scales, checked finite and >= 0
  bool base3;
  uint8_t* scratch;     // len + 5 bytes
  float* y;             // len float32 values
};
// False on a byte that holds no valid trits (base3 >= 243, a 2-bit code 3) or nonzero padding.
bool terngrad_decode_span(const TernGradDecodeSpan& job);

}  // namespace gcz::detail

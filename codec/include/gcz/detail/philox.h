// gcz/detail/philox.h — the counter-based random generator every stochastic codec uses, on the host
// and on the device: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11), and the exact mapping from
// (seed, tensor, purpose, element) to uniform and Bernoulli draws stated in docs/CODECS.md.
//
//   gcz::detail::Rng rng(seed, gcz::tensor_key(name), gcz::detail::kStreamQsgdRounding);
//   float u = rng.uniform(i);          // element i's rounding uniform in (0, 1), 16 random bits
//   bool up = rng.bernoulli(i, p);     // u <= p: true with probability p, to within 2^-17
//   int c = coarse_bernoulli(rng.coarse8(i), bernoulli_threshold(p));  // the same, -1: see fine8
#pragma once

#include <cstdint>

#include "gcz/detail/hd.h"

namespace gcz::detail {

struct Philox4x32 {
  uint32_t v[4];
};

GCZ_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds of the counter `c` under key (k0, k1).
GCZ_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kM0, c0, hi0, lo0);
    mulhilo32(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// Byte k (0..15) of a block: byte k mod 4 of word k / 4, little-endian.
GCZ_HD uint32_t block_byte(const Philox4x32& w, uint32_t k) { return (w.v[k / 4] >> (8 * (k % 4))) & 0xFFu; }

// Purposes: one counter stream per kind of draw, so draws of different kinds never coincide.
// Fixed values (docs/CODECS.md); never reuse one.
inline constexpr uint32_t kStreamQsgdRounding = 1;
inline constexpr uint32_t kStreamTernGrad = 2;
inline constexpr uint32_t kStreamRandomK = 3;
inline constexpr uint32_t kStreamPowerSgdInit = 4;

// The draws of one (seed, tensor, purpose): key = seed XOR tensor_key split into 32-bit halves (low
// first), counter = (low 32 bits of b, high 32 bits of b, purpose, sub) for block b of sub-stream sub.
// 32-bit draw i is word i mod 4 of block i / 4 of sub-stream 0. The 16-bit draw of element i, which
// stochastic rounding compares with, is 256 coarse8(i) + fine8(i): two bytes, byte i mod 16 of block
// i / 16 of sub-stream 0 (coarse) and of sub-stream 1 (fine), bytes taken little-endian from the
// block's words. The coarse byte alone settles a Bernoulli draw unless it ties with p's own top byte
// (coarse_bernoulli), which happens for one element in 256; so a vectorized encoder makes one Philox
// block per 16 elements and the rare fine byte on demand, and every 16-bit draw is still uniform.
class Rng {
 public:
  GCZ_HD Rng(uint64_t seed, uint64_t tensor_key, uint32_t purpose)
      : k0_(static_cast<uint32_t>(seed ^ tensor_key)), k1_(static_cast<uint32_t>((seed ^ tensor_key) >> 32)),
        purpose_(purpose) {}

  // The four 32-bit words of block b of sub-stream `sub`.
  GCZ_HD Philox4x32 block(uint64_t b, uint32_t sub = 0) const {
    return philox4x32_10(static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), purpose_, sub, k0_, k1_);
  }
  GCZ_HD uint32_t bits(uint64_t i) const { return block(i >> 2).v[i & 3]; }

  // Byte i mod 16 (block_byte) of block i / 16 of sub-stream `sub`.
  GCZ_HD uint32_t byte(uint64_t i, uint32_t sub) const { return block_byte(block(i >> 4, sub), i & 15); }
  GCZ_HD uint32_t coarse8(uint64_t i) const { return byte(i, 0); }
  GCZ_HD uint32_t fine8(uint64_t i) const { return byte(i, 1); }
  GCZ_HD uint16_t draw16(uint64_t i) const { return static_cast<uint16_t>((coarse8(i) << 8) | fine8(i)); }

  // (k + 1/2) * 2^-16, the midpoint of k's 1/65536-wide cell of [0, 1): exact in float32.
  static GCZ_HD float to_uniform(uint16_t k) { return (static_cast<float>(k) + 0.5f) * (1.0f / 65536.0f); }
  GCZ_HD float uniform(uint64_t i) const { return to_uniform(draw16(i)); }
  // uniform(i) <= p, compared in float32: true for floor(65536 p + 1/2) of the 65536 values of
  // draw16(i) (p in [0, 1]), so with probability within 2^-17 of p; exactly 0 for p = 0 and 1 for
  // p = 1. Equivalently 2 draw16(i) < bernoulli_threshold(p), the form vector code computes.
  GCZ_HD bool bernoulli(uint64_t i, float p) const { return uniform(i) <= p; }

 private:
  uint32_t k0_, k1_, purpose_;
};

// floor(2^17 p) for p in [0, 1], exact (2^17 p is a float32; truncation is the floor): Rng::bernoulli
// is 2 draw16 < bernoulli_threshold(p), because (d + 1/2) 2^-16 <= p is 2 d + 1 <= 2^17 p.
GCZ_HD uint32_t bernoulli_threshold(float p) { return static_cast<uint32_t>(p * 131072.0f); }

// That Bernoulli draw from the coarse byte c of a draw 256 c + f alone: 1 or 0 when c differs from
// t = threshold >> 9 (2 draw16 lies in [512 c, 512 c + 510], wholly below the threshold or wholly at or
// above it), -1 when c = t and the fine byte decides: bernoulli_fine(c, f, threshold).
GCZ_HD int coarse_bernoulli(uint32_t c, uint32_t threshold) {
  const uint32_t t = threshold >> 9;
  return c < t ? 1 : (c > t ? 0 : -1);
}
GCZ_HD bool bernoulli_fine(uint32_t c, uint32_t f, uint32_t threshold) { return 2 * ((c << 8) | f) < threshold; }

}  // namespace gcz::detail

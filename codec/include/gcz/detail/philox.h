// gcz/detail/philox.h — the counter-based random generator every stochastic codec uses, on the host
// and on the device: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11), and the exact mapping from
// (seed, tensor, purpose, element) to uniform and Bernoulli draws stated in docs/CODECS.md.
//
//   gcz::detail::Rng rng(seed, gcz::tensor_key(name), gcz::detail::kStreamQsgdRounding);
//   float u = rng.uniform(i);          // element i's rounding uniform in (0, 1), 16 random bits
//   bool up = rng.bernoulli(i, p);     // u <= p: true with probability p, to within 2^-17
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

// Purposes: one counter stream per kind of draw, so draws of different kinds never coincide.
// Fixed values (docs/CODECS.md); never reuse one.
inline constexpr uint32_t kStreamQsgdRounding = 1;
inline constexpr uint32_t kStreamTernGrad = 2;
inline constexpr uint32_t kStreamRandomK = 3;
inline constexpr uint32_t kStreamPowerSgdInit = 4;

// The draws of one (seed, tensor, purpose): key = seed XOR tensor_key split into 32-bit halves (low
// first), counter = (low 32 bits of i / 4, high 32 bits of i / 4, purpose, 0); 32-bit draw i is word
// i mod 4. 16-bit draw i is the low (i even) or high (i odd) half of 32-bit draw i / 2, so that one
// Philox block serves eight stochastic roundings.
class Rng {
 public:
  GCZ_HD Rng(uint64_t seed, uint64_t tensor_key, uint32_t purpose)
      : k0_(static_cast<uint32_t>(seed ^ tensor_key)), k1_(static_cast<uint32_t>((seed ^ tensor_key) >> 32)),
        purpose_(purpose) {}

  // The four 32-bit draws 4b .. 4b + 3.
  GCZ_HD Philox4x32 block(uint64_t b) const {
    return philox4x32_10(static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), purpose_, 0u, k0_, k1_);
  }
  GCZ_HD uint32_t bits(uint64_t i) const { return block(i >> 2).v[i & 3]; }

  GCZ_HD uint16_t draw16(uint64_t i) const { return static_cast<uint16_t>(bits(i >> 1) >> (16 * (i & 1))); }

  // (k + 1/2) * 2^-16, the midpoint of k's 1/65536-wide cell of [0, 1): exact in float32.
  static GCZ_HD float to_uniform(uint16_t k) { return (static_cast<float>(k) + 0.5f) * (1.0f / 65536.0f); }
  GCZ_HD float uniform(uint64_t i) const { return to_uniform(draw16(i)); }
  // uniform(i) <= p, compared in float32: true for floor(65536 p + 1/2) of the 65536 values of
  // draw16(i) (p in [0, 1]), so with probability within 2^-17 of p; exactly 0 for p = 0 and 1 for
  // p = 1. Equivalently 2 draw16(i) < floor(2^17 p), which vector code computes with a truncating
  // conversion (2^17 p is exact in float32).
  GCZ_HD bool bernoulli(uint64_t i, float p) const { return uniform(i) <= p; }

 private:
  uint32_t k0_, k1_, purpose_;
};

}  // namespace gcz::detail

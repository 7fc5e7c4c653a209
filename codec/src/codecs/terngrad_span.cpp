// TernGrad span loops. Every helper is force-inlined into the entry points, which exist once for SSE2
// and once for AVX2, so each loop is compiled, and vectorized, per instruction set.
#include "codecs/terngrad_span.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "codecs/quant_uniforms.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/terngrad_math.h"

namespace gcz::detail {
namespace {

using namespace terngrad;

#define GCZ_CPU_INLINE [[gnu::always_inline]] inline

GCZ_CPU_INLINE uint32_t abs_bits(float x) { return bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

// GCC vector types: the eight lanes of the sums as two vectors of four, written out because the
// compiler does not vectorize the lane loop by itself. Same operations, lane by lane, as the scalar tail.
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef double D4 __attribute__((vector_size(32)));
typedef int64_t L4 __attribute__((vector_size(32)));

// d = x - k for the four finite x, 0 for the others. (Results by reference: returning a 32-byte vector
// from a function compiled without AVX would change its ABI.)
GCZ_CPU_INLINE void shifted4(const float* x, double k, D4& d) {
  F4 v;
  I4 bits;
  std::memcpy(&v, x, sizeof v);
  std::memcpy(&bits, x, sizeof bits);
  const I4 finite = (bits & 0x7FFFFFFF) < 0x7F800000;
  d = __builtin_convertvector(v, D4) - k;
  d = __builtin_convertvector(finite, L4) ? d : D4{0, 0, 0, 0};
}

// One block (at most kSumBlock elements) of S1 and S2.
GCZ_CPU_INLINE void add_block(const float* x, uint64_t n, double k, TernGradMoments& m) {
  D4 s1a = {0, 0, 0, 0}, s1b = s1a, s2a = s1a, s2b = s1a;  // lanes 0-3 and 4-7
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    D4 da, db;
    shifted4(x + i, k, da);
    shifted4(x + i + 4, k, db);
    s1a += da;
    s1b += db;
    s2a += da * da;
    s2b += db * db;
  }
  double s1[8] = {s1a[0], s1a[1], s1a[2], s1a[3], s1b[0], s1b[1], s1b[2], s1b[3]};
  double s2[8] = {s2a[0], s2a[1], s2a[2], s2a[3], s2b[0], s2b[1], s2b[2], s2b[3]};
  for (int j = 0; i < n; ++i, ++j) {
    const double d = abs_bits(x[i]) < 0x7F800000u ? static_cast<double>(x[i]) - k : 0.0;
    s1[j] += d;
    s2[j] += d * d;
  }
  m.s1.add(combine_lanes(s1));
  m.s2.add(combine_lanes(s2));
}

GCZ_CPU_INLINE void add_moments(const float* x, uint64_t n, TernGradMoments& m) {
  uint32_t count = 0;  // n <= 2^24
  int32_t mx = m.max_bits;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t a = abs_bits(x[i]);
    const bool finite = a < 0x7F800000u;
    count += finite ? 1u : 0u;
    mx = std::max(mx, finite ? static_cast<int32_t>(a) : 0);
  }
  m.finite += count;
  m.max_bits = mx;
  // K, the first finite element: elements before it are not finite and add nothing.
  for (uint64_t i = 0; !m.has_shift && i < n; ++i) {
    if (abs_bits(x[i]) < 0x7F800000u) {
      m.shift = x[i];
      m.has_shift = true;
    }
  }
  for (uint64_t b = 0; b < n; b += kSumBlock) add_block(x + b, std::min(kSumBlock, n - b), m.shift, m);
}

template <bool kStochastic>
GCZ_CPU_INLINE void trit_run(const float* x, const uint16_t* u, uint8_t* t, uint64_t n, float s) {
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (uint64_t i = 0; i < n; ++i) t[i] = static_cast<uint8_t>(trit<kStochastic>(x[i], s, inv, Rng::to_uniform(u[i])));
}

// Packs n trits; a partial last byte holds zero trits in its unused places.
GCZ_CPU_INLINE void pack(bool base3, const uint8_t* t, uint64_t n, uint8_t* out) {
  const uint64_t per = base3 ? 5 : 4, full = n / per;
  if (base3) {
    for (uint64_t j = 0; j < full; ++j) out[j] = pack_base3(t + 5 * j);
  } else {
    for (uint64_t j = 0; j < full; ++j) out[j] = pack_2bit(t + 4 * j);
  }
  if (const uint64_t rem = n % per) {
    uint8_t last[5] = {0, 0, 0, 0, 0};
    std::memcpy(last, t + per * full, rem);
    out[full] = base3 ? pack_base3(last) : pack_2bit(last);
  }
}

// The five trits of each base-3 byte (bytes 243..255 hold none: all zero here, rejected before use).
struct Base3Table {
  std::array<std::array<uint8_t, 5>, 256> trits{};
  Base3Table() {
    for (unsigned b = 0; b < 243; ++b) {
      for (unsigned k = 0, v = b; k < 5; ++k, v /= 3) trits[b][k] = static_cast<uint8_t>(v % 3);
    }
  }
};
const Base3Table kBase3;

// Unpacks n trits into t (room for a whole last byte); false on an invalid byte or code, or nonzero
// trits in a partial last byte.
GCZ_CPU_INLINE bool unpack(bool base3, const uint8_t* in, uint64_t n, uint8_t* t) {
  const uint64_t per = base3 ? 5 : 4, bytes = n / per + (n % per != 0);
  unsigned bad = 0;
  if (base3) {
    for (uint64_t j = 0; j < bytes; ++j) {
      bad |= in[j] >= 243 ? 1u : 0u;
      std::memcpy(t + 5 * j, kBase3.trits[in[j]].data(), 5);
    }
  } else {
    for (uint64_t j = 0; j < bytes; ++j) {
      const unsigned b = in[j];
      bad |= (b & (b >> 1) & 0x55u) != 0 ? 1u : 0u;  // a code 3
      for (int k = 0; k < 4; ++k) t[4 * j + k] = static_cast<uint8_t>((b >> (2 * k)) & 3u);
    }
  }
  for (uint64_t k = n; k < bytes * per; ++k) bad |= t[k];
  return bad == 0;
}

GCZ_CPU_INLINE void encode_span(const TernGradEncodeSpan& j) {
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.piece) {
    const uint64_t n = std::min(j.piece, j.len - a);
    if (j.stochastic) {
      trit_run<true>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g]);
    } else {
      trit_run<false>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g]);
    }
  }
  pack(j.base3, j.scratch, j.len, j.out);
}

GCZ_CPU_INLINE bool decode_span(const TernGradDecodeSpan& j) {
  if (!unpack(j.base3, j.in, j.len, j.scratch)) return false;
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.piece) {
    const uint64_t n = std::min(j.piece, j.len - a);
    const float s = j.scales[g];
    const uint8_t* t = j.scratch + a;
    float* y = j.y + a;
    for (uint64_t i = 0; i < n; ++i) y[i] = detrit(t[i], s);
  }
  return true;
}

void moments_sse2(const float* x, uint64_t n, TernGradMoments& m) { add_moments(x, n, m); }
void encode_sse2(const TernGradEncodeSpan& j) { encode_span(j); }
bool decode_sse2(const TernGradDecodeSpan& j) { return decode_span(j); }
#if defined(__x86_64__)
__attribute__((target("avx2"))) void moments_avx2(const float* x, uint64_t n, TernGradMoments& m) {
  add_moments(x, n, m);
}
__attribute__((target("avx2"))) void encode_avx2(const TernGradEncodeSpan& j) { encode_span(j); }
__attribute__((target("avx2"))) bool decode_avx2(const TernGradDecodeSpan& j) { return decode_span(j); }
#endif

}  // namespace

float TernGradMoments::max_abs() const { return bit_cast<float>(max_bits); }

double TernGradMoments::sigma() const {
  if (finite == 0) return 0.0;
  const double n = static_cast<double>(finite), a = s1.total();
  const double var = (s2.total() - (a * a) / n) / n;
  return var > 0.0 ? std::sqrt(var) : 0.0;
}

void terngrad_add_moments(const float* x, uint64_t n, TernGradMoments& m) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return moments_avx2(x, n, m);
#endif
  moments_sse2(x, n, m);
}

void terngrad_encode_span(const TernGradEncodeSpan& job) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return encode_avx2(job);
#endif
  encode_sse2(job);
}

bool terngrad_decode_span(const TernGradDecodeSpan& job) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return decode_avx2(job);
#endif
  return decode_sse2(job);
}

}  // namespace gcz::detail

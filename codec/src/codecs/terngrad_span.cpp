// TernGrad span loops: the trits of a span and their packing, and the way back. Every helper is
// force-inlined into the entry points, which exist once for SSE2 and once for AVX2, so each loop is
// compiled, and vectorized, per instruction set. (The moments behind the scales are in
// terngrad_moments.cpp, the packings in terngrad_pack.h.)
#include "codecs/terngrad_span.h"

#include <algorithm>
#include <cstring>

#include "codecs/quant_uniforms.h"
#include "codecs/span_inline.h"
#include "codecs/terngrad_pack.h"
#include "cpu_features.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/terngrad_math.h"

#if defined(__x86_64__)
#include "codecs/avx2_bytes.h"
#endif

namespace gcz::detail {
namespace {

using namespace terngrad;

// The trits of x[0, n), elements at .. at + n - 1 of the span: a stochastic draw takes each element's
// coarse draw byte u[i] and, when that does not settle it, its fine byte.
template <bool kStochastic>
GCZ_CPU_INLINE void trit_run(const float* x, const uint8_t* u, uint8_t* t, uint64_t n, float s, const FineDraws& fine,
                             uint64_t at) {
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  for (uint64_t i = 0; i < n; ++i) {
    if constexpr (kStochastic) {
      t[i] = static_cast<uint8_t>(trit_drawn(x[i], s, inv, u[i], [&] { return fine.at(at + i); }));
    } else {
      t[i] = static_cast<uint8_t>(trit<false>(x[i], s, inv, 0.0f));
    }
  }
}

// The trits of the span's elements noted in ties[0, 2 count) (note_ties; a zero trit so far), with
// the whole 16-bit draw, added into the packed bytes.
// A span of one scale (a tensor scale) takes its s and 1 / s once, not a division per tie for each.
template <bool kOneScale, bool kBase3>
GCZ_CPU_INLINE void settle_ties(const TernGradEncodeSpan& span, uint64_t count) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const TernGradEncodeSpan j = span;  // a copy: the byte stores cannot alias its fields
  const float s0 = j.scales[0], inv0 = s0 > 0.0f ? 1.0f / s0 : 0.0f;
  for_each_tie(j.ties, count, j.fine, [&](uint64_t e, uint32_t fine) {
    float s = s0, inv = inv0;
    if constexpr (!kOneScale) {
      s = j.scales[e / j.piece];
      inv = s > 0.0f ? 1.0f / s : 0.0f;
    }
    const uint16_t draw = static_cast<uint16_t>((uint32_t{j.u[e]} << 8) | fine);
    const uint32_t t = trit<true>(j.x[e], s, inv, Rng::to_uniform(draw));
    if constexpr (kBase3) {
      j.out[e / 5] = static_cast<uint8_t>(j.out[e / 5] + t * kPow3[e % 5]);
    } else {
      j.out[e / 4] = static_cast<uint8_t>(j.out[e / 4] | (t << (2 * (e % 4))));
    }
  });
}
GCZ_CPU_INLINE void settle_ties(const TernGradEncodeSpan& j, uint64_t count) {
  if (count == 0) return;
  if (j.piece >= j.len) {
    return j.base3 ? settle_ties<true, true>(j, count) : settle_ties<true, false>(j, count);
  }
  return j.base3 ? settle_ties<false, true>(j, count) : settle_ties<false, false>(j, count);
}

GCZ_CPU_INLINE void encode_span(const TernGradEncodeSpan& j) {
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.piece) {
    const uint64_t n = std::min(j.piece, j.len - a);
    if (j.stochastic) {
      trit_run<true>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a);
    } else {
      trit_run<false>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a);
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
void encode_sse2(const TernGradEncodeSpan& j) { encode_span(j); }
bool decode_sse2(const TernGradDecodeSpan& j) { return decode_span(j); }

// The settling of pending elements under the scale s (terngrad_settle_pending): trit_drawn's
// decisions, their fine bytes made for a batch at once.
struct Settling {
  float s, inv;
  uint8_t* out;
  // Adds trit t of pending element e into its packed byte.
  GCZ_CPU_INLINE void add(uint32_t e, uint32_t t) const {
    static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
    out[e / 5] = static_cast<uint8_t>(out[e / 5] + t * kPow3[e % 5]);
  }
  // Settles p's trit if its coarse byte decides it; else returns false.
  GCZ_CPU_INLINE bool coarse(const TernGradPending& p) const {
    const float y = finite_or_zero(p.x);
    const int on = coarse_bernoulli(p.e >> 24, bernoulli_threshold(trit_p(y, s, inv)));
    if (on < 0) return false;
    add(p.e & 0xFFFFFFu, trit_code(on != 0, y));
    return true;
  }
  // Settles p's trit with its fine byte f.
  GCZ_CPU_INLINE void with_fine(const TernGradPending& p, uint32_t f) const {
    const float y = finite_or_zero(p.x);
    add(p.e & 0xFFFFFFu, trit_code(bernoulli_fine(p.e >> 24, f, bernoulli_threshold(trit_p(y, s, inv))), y));
  }
};

// Settles p[0, n) in batches: `run` settles what it can of a batch's start by the coarse bytes,
// noting in wait[] those that need a fine byte, and returns how many elements it took; the rest of
// the batch goes one element at a time.
template <typename Run>
GCZ_CPU_INLINE void settle_pending(const TernGradPending* p, uint64_t n, float s, const FineDraws& fine, uint8_t* out,
                                   const Run& run) {
  constexpr uint64_t kBatch = 256;
  const Settling z{s, s > 0.0f ? 1.0f / s : 0.0f, out};
  uint64_t wait[kBatch], k[kBatch];
  uint8_t f[kBatch];
  for (uint64_t a = 0; a < n; a += kBatch) {
    const uint64_t m = std::min(kBatch, n - a);
    uint64_t waiting = 0;
    for (uint64_t i = run(p + a, m, z, waiting, wait); i < m; ++i) {
      if (!z.coarse(p[a + i])) wait[waiting++] = i;
    }
    for (uint64_t q = 0; q < waiting; ++q) k[q] = p[a + wait[q]].e & 0xFFFFFFu;
    fine.gather(k, waiting, f);
    for (uint64_t q = 0; q < waiting; ++q) z.with_fine(p[a + wait[q]], f[q]);
  }
}

#if defined(__x86_64__)
// One scale's constants for the trit loops, broadcast. The vector loops compute p times `pscale`:
// inv for deterministic rounding, inv * 2^8 for stochastic, where floor(2^8 p) is the top byte of the
// draw's threshold floor(2^17 p) / 2 (terngrad::trit_drawn). The products are those of terngrad::trit
// exactly scaled by 2^8 (a power of two commutes with the rounding of a product in the normal range,
// and a subnormal p gives floor 0 either way), unless inv * 2^8 overflows (s = 2^-120, the smallest
// scale, or next to it): `vector` is false then and the scalar loop runs.
//
// The vector loops also skip trit()'s rule p = 1 for a = s: there p = s * fl(1 / s) >= 1 - 2^-20
// (1 / s may be subnormal), which is >= 0.5, and whose threshold byte is 255 (as for p = 1 once
// saturated), so that the same draws are nonzero and the same ones tie (and are settled by trit()).
struct TritScale {
  __m256 s, pscale;
  bool vector;
};
// The pscale of eight scales s at once (finite, >= 0; inv = 1 / s, 0 for s = 0, which is not divided
// by); returns a bit per lane whose constants suit the vector loops.
template <bool kStochastic>
GCZ_AVX2_INLINE int trit_pscales8(__m256 s, __m256& pscale) {
  const __m256 one = _mm256_set1_ps(1.0f), positive = _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ);
  const __m256 inv = _mm256_and_ps(_mm256_div_ps(one, _mm256_blendv_ps(one, s, positive)), positive);
  pscale = kStochastic ? _mm256_mul_ps(inv, _mm256_set1_ps(256.0f)) : inv;
  return _mm256_movemask_ps(_mm256_cmp_ps(pscale, _mm256_set1_ps(3.40282346638528859812e+38f), _CMP_LE_OQ));
}
template <bool kStochastic>
GCZ_AVX2_INLINE TritScale trit_scale(float s) {
  TritScale c{_mm256_set1_ps(s), _mm256_setzero_ps(), false};
  c.vector = trit_pscales8<kStochastic>(c.s, c.pscale) == 0xFF;
  return c;
}

// p of eight elements (their bits xi) times c.pscale (any value for a non-finite x, which `finite`
// masks), with a = min(|x|, s). kFinite: the caller knows every element to be finite (TernGradEncodeSpan).
template <bool kFinite>
GCZ_AVX2_INLINE __m256 p8_avx2(__m256i xi, const TritScale& c, __m256i& finite) {
  const __m256 y = _mm256_castsi256_ps(_mm256_and_si256(xi, _mm256_set1_epi32(0x7FFFFFFF)));  // |x|
  const __m256 below_inf = _mm256_cmp_ps(y, _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
  finite = kFinite ? _mm256_set1_epi32(-1) : _mm256_castps_si256(below_inf);
  return _mm256_mul_ps(_mm256_min_ps(y, c.s), c.pscale);
}

// Which of the 32 elements whose bits are xi have a nonzero trit (terngrad::trit<kStochastic> lane by
// lane), as a byte mask in the packs' interleaved order (avx2::pack_interleaved): 0xFF where the trit
// is zero (stochastic) or where it is nonzero (deterministic); nonzero_only applies it.
// Stochastic: floor(2^8 p) narrows to a byte d, which the coarse draw bytes u meet: u < d is nonzero,
// u > d zero, and u = d (one element in 256) stays zero here and is noted in tie_mask (note_ties)
// for its fine byte to settle. The packs saturate d = 256 (p = 1) to 255, which is still
// exact: every u below 255 is nonzero then, and u = 255 is settled. A non-finite x has d = 0.
// Deterministic: p >= 1/2 and x finite.
template <bool kStochastic, bool kFinite>
GCZ_AVX2_INLINE __m256i trit_mask32(const __m256i* xi, const uint8_t* u, const TritScale& c, uint32_t& tie_mask) {
  __m256i fin[4];
  __m256 p[4];
  for (int k = 0; k < 4; ++k) p[k] = p8_avx2<kFinite>(xi[k], c, fin[k]);
  if constexpr (kStochastic) {
    __m256i top[4];
    for (int k = 0; k < 4; ++k) top[k] = _mm256_and_si256(_mm256_cvttps_epi32(p[k]), fin[k]);
    const __m256i d = avx2::pack_interleaved(top[0], top[1], top[2], top[3]);
    const __m256i draws = avx2::in_pack_order(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u)));
    tie_mask = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(d, draws)));  // the packs' order
    return _mm256_cmpeq_epi8(_mm256_subs_epu8(d, draws), _mm256_setzero_si256());  // u >= d
  } else {
    tie_mask = 0;
    __m256i on[4];
    for (int k = 0; k < 4; ++k) {
      on[k] = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(p[k], _mm256_set1_ps(0.5f), _CMP_GE_OQ)), fin[k]);
    }
    return avx2::pack_signed_interleaved(on[0], on[1], on[2], on[3]);
  }
}
template <bool kStochastic>
GCZ_AVX2_INLINE __m256i nonzero_only(__m256i mask, __m256i v) {
  return kStochastic ? _mm256_andnot_si256(mask, v) : _mm256_and_si256(mask, v);
}

// The elements' sign bits as bytes in the packs' order (the signed saturating packs keep each sign). A
// nonzero trit has |x| > 0, so its sign is x's sign bit.
GCZ_AVX2_INLINE __m256i signs32(const __m256i* xi) { return avx2::pack_signed_interleaved(xi[0], xi[1], xi[2], xi[3]); }

// The trits of the 32 elements whose bits are xi, as bytes at t: 1 - (x < 0 ? -1 : 0) is kPlus or
// kMinus where the trit is nonzero.
template <bool kStochastic, bool kFinite>
GCZ_AVX2_INLINE void trits32_avx2(const __m256i* xi, const uint8_t* u, const TritScale& c, uint8_t* t,
                                  uint32_t& tie_mask) {
  const __m256i mask = trit_mask32<kStochastic, kFinite>(xi, u, c, tie_mask);
  const __m256i code = _mm256_sub_epi8(_mm256_set1_epi8(1), _mm256_cmpgt_epi8(_mm256_setzero_si256(), signs32(xi)));
  const __m256i trits = nonzero_only<kStochastic>(mask, code);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(t), avx2::in_element_order(trits));
}

// The trits of x[0, n), elements at .. at + n - 1 of the span; the elements whose draw waits for a
// fine byte are noted in ties (note_ties). The last (n mod 32) elements take a masked step
// (avx2::steps32; their draw bytes are followed by others: u has room for 32 past any element).
template <bool kStochastic>
GCZ_AVX2_INLINE void trit_run_avx2(const float* x, const uint8_t* u, uint8_t* t, uint64_t n, float s,
                                   const FineDraws& fine, uint64_t at, uint32_t* ties, uint64_t& count) {
  const TritScale c = trit_scale<kStochastic>(s);
  if (!c.vector) return trit_run<kStochastic>(x, u, t, n, s, fine, at);
  avx2::steps32<true>(x, n, t, [&](const __m256i* xi, uint64_t i, uint8_t* trits, uint32_t keep) GCZ_AVX2_LAMBDA {
    uint32_t tie_mask;
    trits32_avx2<kStochastic, false>(xi, u + i, c, trits, tie_mask);
    if constexpr (kStochastic) note_ties(tie_mask & keep, at + i, ties, count);
  });
}

// The weighted trits of the 32 elements whose bits are xi (step k of a round), in element order.
template <bool kStochastic, bool kFinite>
GCZ_AVX2_INLINE __m256i weighted32_avx2(const __m256i* xi, const uint8_t* u, const TritScale& c, int k,
                                        uint32_t& tie_mask) {
  const __m256i mask = trit_mask32<kStochastic, kFinite>(xi, u, c, tie_mask);
  const __m256i w = _mm256_blendv_epi8(load256(kBase3Weights.w[0][k]), load256(kBase3Weights.w[1][k]), signs32(xi));
  return avx2::in_element_order(nonzero_only<kStochastic>(mask, w));
}

// Moves to the scale of the step of 32 elements about to start in a span whose pieces hold whole
// steps: g is the piece's scale, `left` the elements left in it, c its constants.
template <bool kStochastic>
GCZ_AVX2_INLINE void step_scale(const TernGradEncodeSpan& j, uint64_t& g, uint64_t& left, TritScale& c) {
  if (left == 0) {
    c = trit_scale<kStochastic>(j.scales[++g]);
    left = j.piece;
  }
  left -= 32;
}

// The bits of the 32 elements at x into xi, prefetching ahead (the span loops' step).
GCZ_AVX2_INLINE void load_step(const float* x, __m256i* xi) {
  avx2::prefetch_next_span(x);
  avx2::load32(x, xi);
}

// One step of 32 trits at element i, into the scratch; ties as for trit_run_avx2.
template <bool kStochastic, bool kFinite>
GCZ_AVX2_INLINE void trit_step(const TernGradEncodeSpan& j, uint64_t i, uint64_t& g, uint64_t& left, TritScale& c,
                               uint64_t& ties) {
  step_scale<kStochastic>(j, g, left, c);
  if (c.vector) {
    uint32_t tie_mask;
    __m256i xi[4];
    load_step(j.x + i, xi);
    trits32_avx2<kStochastic, kFinite>(xi, j.u + i, c, j.scratch + i, tie_mask);
    if constexpr (kStochastic) note_ties(tie_mask, i, j.ties, ties);
  } else {
    trit_run<kStochastic>(j.x + i, j.u + i, j.scratch + i, 32, j.scales[g], j.fine, i);
  }
}

// How the round loop finds each step's scale: kCheckScale, step_scale at every step; kOneScale, the
// span has one scale, c, and its vector loops apply (no step moves to another scale or checks c:
// with a tensor scale, the whole encode in cache went from 0.553 to 0.517 ns per element);
// kGroupTable, every group's constants were worked out beforehand (GroupTable) and all of them suit
// the vector loops.
enum ScaleMode { kCheckScale, kOneScale, kGroupTable };

// The scale constants of each group of a span whose groups hold whole steps of 32, in memory for the
// round loop to broadcast: s and pscale as trit_scale makes them, eight groups to a division.
struct GroupTable {
  // Spans of up to 65536 elements, in groups of 32 or more: every span of more than one scale that
  // terngrad.cpp makes, unless its groups are longer than a span (the others take the loop that
  // checks each step).
  static constexpr uint64_t kMaxSteps = 2048, kMaxGroups = kMaxSteps;
  alignas(32) float s[kMaxGroups], pscale[kMaxGroups];
  uint64_t magic;  // step t's group, t / (piece / 32), is (t * magic) >> 32 for every step of a span
  // Works out the constants of the span's groups; false if some group's do not suit the vector loops.
  template <bool kStochastic>
  GCZ_AVX2_INLINE bool make(const TernGradEncodeSpan& j) {
    if (j.len / 32 > kMaxSteps) return false;
    const uint64_t groups = (j.len + j.piece - 1) / j.piece, per = j.piece / 32;
    // (t * ceil(2^32 / per)) >> 32 = floor(t / per) while t * per < 2^32; here t, per <= 2^11.
    magic = ((uint64_t{1} << 32) + per - 1) / per;
    int ok = 0xFF;
    for (uint64_t g = 0; g < groups; g += 8) {
      alignas(32) float last[8] = {1, 1, 1, 1, 1, 1, 1, 1};  // lanes past the span's groups: a valid scale
      std::memcpy(last, j.scales + g, std::min<uint64_t>(8, groups - g) * sizeof(float));
      const __m256 scale = _mm256_load_ps(last);
      __m256 pscale8;
      ok &= trit_pscales8<kStochastic>(scale, pscale8);
      _mm256_store_ps(s + g, scale);
      _mm256_store_ps(pscale + g, pscale8);
    }
    return ok == 0xFF;
  }
  GCZ_AVX2_INLINE uint64_t group_of_step(uint64_t t) const { return (t * magic) >> 32; }
};

// Step k of the round at element i, as weighted trits; ties as for trit_run_avx2. g, left and c as
// for step_scale (kCheckScale); `table` the groups' constants (kGroupTable).
template <bool kStochastic, bool kFinite, ScaleMode kMode>
GCZ_AVX2_INLINE __m256i weighted_step(const TernGradEncodeSpan& j, uint64_t i, int k, uint64_t& g, uint64_t& left,
                                      TritScale& c, const GroupTable* table, uint64_t& ties) {
  if constexpr (kMode == kCheckScale) step_scale<kStochastic>(j, g, left, c);
  if constexpr (kMode == kGroupTable) {
    const uint64_t group = table->group_of_step(i / 32);
    c.s = _mm256_broadcast_ss(table->s + group);
    c.pscale = _mm256_broadcast_ss(table->pscale + group);
  }
  if (kMode != kCheckScale || c.vector) {
    uint32_t tie_mask;
    __m256i xi[4];
    load_step(j.x + i, xi);
    const __m256i w = weighted32_avx2<kStochastic, kFinite>(xi, j.u + i, c, k, tie_mask);
    if constexpr (kStochastic) note_ties(tie_mask, i, j.ties, ties);
    return w;
  }
  alignas(32) uint8_t t[32];
  trit_run<kStochastic>(j.x + i, j.u + i, t, 32, j.scales[g], j.fine, i);
  return weigh_trits(load256(t), k);
}

// The whole rounds of 160 elements from element 0, straight to their packed bytes; returns where they
// end. g, left, c, table and ties as for weighted_step.
template <bool kStochastic, bool kFinite, ScaleMode kMode>
GCZ_AVX2_INLINE uint64_t rounds_avx2(const TernGradEncodeSpan& j, uint64_t& g, uint64_t& left, TritScale& c,
                                     const GroupTable* table, uint64_t& ties) {
  uint64_t i = 0;
  for (; i + 160 <= j.len; i += 160) {
    __m256i w[5];
#pragma GCC unroll 5
    for (int k = 0; k < 5; ++k) {
      w[k] = weighted_step<kStochastic, kFinite, kMode>(j, i + 32 * k, k, g, left, c, table, ties);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(j.out + i / 5), base3_round(w));
  }
  if constexpr (kMode == kOneScale) left -= i;
  if (kMode == kGroupTable && i > 0) {  // where step_scale would have left them: the last step's piece
    g = (i - 1) / j.piece;
    left = j.piece * (g + 1) - i;
    c = trit_scale<kStochastic>(j.scales[g]);
  }
  return i;
}

// When every scale's piece holds whole steps of 32 (a tensor scale, a group that holds the span, or
// a group size that is a multiple of 32), whole rounds of 160 elements go from the input to their 32
// packed bytes in registers; the rest of the span takes the trit scratch and the scalar packing.
// Returns the ties noted.
template <bool kStochastic, bool kFinite>
GCZ_AVX2_INLINE uint64_t trit_pack_run_avx2(const TernGradEncodeSpan& span) {
  const TernGradEncodeSpan j = span;  // a copy: the byte stores cannot alias its fields
  uint64_t g = 0, left = j.piece, ties = 0;
  TritScale c = trit_scale<kStochastic>(j.scales[0]);
  uint64_t i;
  GroupTable table;
  if (j.piece >= j.len) {
    i = c.vector ? rounds_avx2<kStochastic, kFinite, kOneScale>(j, g, left, c, nullptr, ties)
                 : rounds_avx2<kStochastic, kFinite, kCheckScale>(j, g, left, c, nullptr, ties);
  } else if (table.make<kStochastic>(j)) {
    i = rounds_avx2<kStochastic, kFinite, kGroupTable>(j, g, left, c, &table, ties);
  } else {
    i = rounds_avx2<kStochastic, kFinite, kCheckScale>(j, g, left, c, nullptr, ties);
  }
  const uint64_t rounds = i;
  for (; i + 32 <= j.len; i += 32) trit_step<kStochastic, kFinite>(j, i, g, left, c, ties);
  if (left == 0 && i < j.len) ++g;
  trit_run<kStochastic>(j.x + i, j.u + i, j.scratch + i, j.len - i, j.scales[g], j.fine, i);  // the last (len mod 32)
  pack(true, j.scratch + rounds, j.len - rounds, j.out + rounds / 5);
  return ties;
}

// The trits, packed, then the ties settled in the packed bytes.
__attribute__((target("avx2"))) void encode_avx2(const TernGradEncodeSpan& j) {
  uint64_t ties = 0;
  if (j.base3 && (j.piece >= j.len || j.piece % 32 == 0)) {
    if (j.finite) {
      ties = j.stochastic ? trit_pack_run_avx2<true, true>(j) : trit_pack_run_avx2<false, true>(j);
    } else {
      ties = j.stochastic ? trit_pack_run_avx2<true, false>(j) : trit_pack_run_avx2<false, false>(j);
    }
  } else {
    for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.piece) {
      const uint64_t n = std::min(j.piece, j.len - a);
      if (j.stochastic) {
        trit_run_avx2<true>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a, j.ties, ties);
      } else {
        trit_run_avx2<false>(j.x + a, j.u + a, j.scratch + a, n, j.scales[g], j.fine, a, j.ties, ties);
      }
    }
    pack(j.base3, j.scratch, j.len, j.out);
  }
  settle_ties(j, ties);
}
__attribute__((target("avx2"))) bool decode_avx2(const TernGradDecodeSpan& j) { return decode_span(j); }

// The one-pass encode reads each chunk from memory in its moments, which prefetch it into L1 a little
// ahead (terngrad_moments.cpp). Its trit loop prefetches into L2 much further ahead, but only two
// cache lines of every eight: the L2 streamer fetches the others by itself. On a 2-core Xeon, 1 GiB,
// the encode ran at 5.0-5.1 GB/s with every line prefetched (as the two-pass loops do) and 5.7-6.2
// with two of every eight (with the trits in AVX-512, since left out, two of every four did as well
// as two of eight, and two of a page's 64 worse than every line).
GCZ_AVX2_INLINE void prefetch_some_ahead(const float* x) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(x) + sizeof(float) * avx2::kPrefetchAhead;  // maybe past the end
  if (ahead % 512 < 128) avx2::prefetch_ahead<avx2::kPrefetchAhead, _MM_HINT_T1, 2>(x);
}

// The weighted trits of the 32 elements whose bits are xi (step k of a round) under a scale in the
// bracket whose constants are lo (s_lo: the larger products) and hi, in element order; `pending`
// notes the others, in the packs' order (note_ties). Stochastic: nonzero where u < d(s_hi), pending
// where d(s_hi) <= u <= d(s_lo). Deterministic: nonzero where p(s_hi) >= 1/2, pending where only
// p(s_lo) is.
template <bool kFinite, bool kStochastic>
GCZ_AVX2_INLINE __m256i bracket_weighted32(const __m256i* xi, const uint8_t* u, const TritScale& lo,
                                           const TritScale& hi, int k, uint32_t& pending) {
  __m256i fin[4], big[4], small[4];
  for (int q = 0; q < 4; ++q) {
    const __m256 p_lo = p8_avx2<kFinite>(xi[q], lo, fin[q]), p_hi = p8_avx2<kFinite>(xi[q], hi, fin[q]);
    if constexpr (kStochastic) {
      big[q] = _mm256_and_si256(_mm256_cvttps_epi32(p_lo), fin[q]);
      small[q] = _mm256_and_si256(_mm256_cvttps_epi32(p_hi), fin[q]);
    } else {
      const __m256 half = _mm256_set1_ps(0.5f);
      big[q] = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(p_lo, half, _CMP_GE_OQ)), fin[q]);
      small[q] = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(p_hi, half, _CMP_GE_OQ)), fin[q]);
    }
  }
  __m256i zero_or_pending;  // 0xFF where the trit is not nonzero for sure
  if constexpr (kStochastic) {
    const __m256i d_big = avx2::pack_interleaved(big[0], big[1], big[2], big[3]);
    const __m256i d_small = avx2::pack_interleaved(small[0], small[1], small[2], small[3]);
    const __m256i draws = avx2::in_pack_order(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u)));
    const __m256i zero = _mm256_setzero_si256();
    zero_or_pending = _mm256_cmpeq_epi8(_mm256_subs_epu8(d_small, draws), zero);        // u >= d(s_hi)
    const __m256i not_above = _mm256_cmpeq_epi8(_mm256_subs_epu8(draws, d_big), zero);  // u <= d(s_lo)
    pending = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_and_si256(zero_or_pending, not_above)));
  } else {
    const __m256i on_lo = avx2::pack_signed_interleaved(big[0], big[1], big[2], big[3]);
    const __m256i on_hi = avx2::pack_signed_interleaved(small[0], small[1], small[2], small[3]);
    zero_or_pending = _mm256_cmpeq_epi8(on_hi, _mm256_setzero_si256());
    pending = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_and_si256(zero_or_pending, on_lo)));
  }
  const __m256i w = _mm256_blendv_epi8(load256(kBase3Weights.w[0][k]), load256(kBase3Weights.w[1][k]), signs32(xi));
  return avx2::in_element_order(_mm256_andnot_si256(zero_or_pending, w));
}

// The whole rounds of 160 elements of the span, packed; returns the pairs noted and, in `done`, where
// the rounds end.
template <bool kFinite, bool kStochastic>
GCZ_AVX2_INLINE uint64_t bracket_rounds_avx2(const TernGradBracketSpan& span, uint64_t& done) {
  const TernGradBracketSpan j = span;  // a copy: the byte stores cannot alias its fields
  const TritScale lo = trit_scale<kStochastic>(j.s_lo), hi = trit_scale<kStochastic>(j.s_hi);
  uint64_t i = 0, notes = 0;
  for (; i + 160 <= j.len; i += 160) {
    __m256i w[5];
#pragma GCC unroll 5
    for (int k = 0; k < 5; ++k) {
      __m256i xi[4];
      uint32_t mask;
      prefetch_some_ahead(j.x + i + 32 * k);
      avx2::load32(j.x + i + 32 * k, xi);
      w[k] = bracket_weighted32<kFinite, kStochastic>(xi, j.u + i + 32 * k, lo, hi, k, mask);
      note_ties(mask, i + 32 * k, j.ties, notes);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(j.out + i / 5), base3_round(w));
  }
  done = i;
  return notes;
}

__attribute__((target("avx2"))) bool bracket_scale_avx2(float s) { return trit_scale<true>(s).vector; }

__attribute__((target("avx2"))) void bracket_span_avx2(const TernGradBracketSpan& j, TernGradPending* pending,
                                                       uint64_t& count) {
  uint64_t done;
  const uint64_t notes =
      j.stochastic
          ? (j.finite ? bracket_rounds_avx2<true, true>(j, done) : bracket_rounds_avx2<false, true>(j, done))
          : (j.finite ? bracket_rounds_avx2<true, false>(j, done) : bracket_rounds_avx2<false, false>(j, done));
  auto keep = [&](uint64_t e) {
    const uint32_t u = j.stochastic ? j.u[e] : 0u;
    pending[count++] = {static_cast<uint32_t>(j.at + e) | (u << 24), j.x[e]};
  };
  for (uint64_t p = 0; p < notes; ++p) {
    for (uint32_t mask = j.ties[2 * p + 1]; mask != 0; mask &= mask - 1) {
      keep(j.ties[2 * p] + tie_element(static_cast<unsigned>(__builtin_ctz(mask))));
    }
  }
  // The last (len mod 160) elements, at the end of the tensor: all pending.
  std::memset(j.out + done / 5, 0, (j.len - done + 4) / 5);
  for (uint64_t e = done; e < j.len; ++e) keep(e);
}

// Settles eight pending elements at a time by their coarse bytes, without a branch per element:
// Settling::coarse lane by lane (trit_p, bernoulli_threshold, coarse_bernoulli), every lane's trit
// added (a waiting lane's as 0) and the waiting ones noted.
// Returns how many of b[0, m) it took (whole eights).
__attribute__((target("avx2"))) uint64_t settle_coarse_avx2(const TernGradPending* b, uint64_t m, const Settling& z,
                                                            uint64_t& waiting, uint64_t* wait) {
  const __m256 vs = _mm256_set1_ps(z.s), inv = _mm256_set1_ps(z.inv);
  const __m256 at_clip = _mm256_set1_ps(z.s > 0.0f ? 1.0f : 0.0f);
  // The shuffles below leave the eight records in the lanes' order 0 1 4 5 2 3 6 7: lane l holds kRecord[l].
  static constexpr uint8_t kRecord[8] = {0, 1, 4, 5, 2, 3, 6, 7};
  uint64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256 lo = _mm256_loadu_ps(reinterpret_cast<const float*>(b + i));
    const __m256 hi = _mm256_loadu_ps(reinterpret_cast<const float*>(b + i + 4));
    const __m256i e = _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256i xi = _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m256i abs = _mm256_and_si256(xi, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), abs);
    const __m256 y = _mm256_castsi256_ps(_mm256_and_si256(xi, finite));  // finite_or_zero
    const __m256 a = _mm256_min_ps(_mm256_castsi256_ps(_mm256_and_si256(abs, finite)), vs);
    const __m256 below = _mm256_cmp_ps(a, vs, _CMP_LT_OQ);
    const __m256 pr = _mm256_blendv_ps(at_clip, _mm256_mul_ps(a, inv), below);  // trit_p
    const __m256i t = _mm256_srli_epi32(_mm256_cvttps_epi32(_mm256_mul_ps(pr, _mm256_set1_ps(131072.0f))), 9);
    const __m256i u = _mm256_srli_epi32(e, 24);
    const __m256i on = _mm256_cmpgt_epi32(t, u), tie = _mm256_cmpeq_epi32(t, u);
    const __m256i negative = _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_LT_OQ));
    const __m256i code = _mm256_and_si256(on, _mm256_sub_epi32(_mm256_set1_epi32(1), negative));  // trit_code
    alignas(32) uint32_t ev[8], cv[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ev), _mm256_and_si256(e, _mm256_set1_epi32(0xFFFFFF)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(cv), code);
    for (int l = 0; l < 8; ++l) z.add(ev[l], cv[l]);
    for (int ties = _mm256_movemask_ps(_mm256_castsi256_ps(tie)); ties != 0; ties &= ties - 1) {
      wait[waiting++] = i + kRecord[__builtin_ctz(static_cast<unsigned>(ties))];
    }
  }
  return i;
}
#endif

}  // namespace

void terngrad_encode_span(const TernGradEncodeSpan& job) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return encode_avx2(job);
#endif
  encode_sse2(job);
}

bool terngrad_bracket_supported(float s_lo) {
#if defined(__x86_64__)
  return cpu_has_avx2() && s_lo > 0.0f && bracket_scale_avx2(s_lo);
#else
  (void)s_lo;
  return false;
#endif
}

void terngrad_bracket_span(const TernGradBracketSpan& job, TernGradPending* pending, uint64_t& count) {
#if defined(__x86_64__)
  bracket_span_avx2(job, pending, count);
#else
  (void)job;
  (void)pending;
  (void)count;
#endif
}

void terngrad_settle_pending(const TernGradPending* p, uint64_t n, float s, const FineDraws& fine, uint8_t* out,
                             bool stochastic) {
  if (!stochastic) {  // terngrad::trit<false>: few elements, one at a time
    const Settling z{s, s > 0.0f ? 1.0f / s : 0.0f, out};
    for (uint64_t i = 0; i < n; ++i) z.add(p[i].e & 0xFFFFFFu, trit<false>(p[i].x, z.s, z.inv, 0.0f));
    return;
  }
  const bool avx2 = cpu_has_avx2();
  settle_pending(p, n, s, fine, out,
                 [&](const TernGradPending* b, uint64_t m, const Settling& z, uint64_t& waiting, uint64_t* wait) {
#if defined(__x86_64__)
                   if (avx2) return settle_coarse_avx2(b, m, z, waiting, wait);
#endif
                   return uint64_t{0};
                 });
}

bool terngrad_decode_span(const TernGradDecodeSpan& job) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return decode_avx2(job);
#endif
  return decode_sse2(job);
}

}  // namespace gcz::detail

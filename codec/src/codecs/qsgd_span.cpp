// QSGD span loops. Every helper is force-inlined into the two entry points per code width (SSE2 and
// AVX2), so each loop is compiled, and vectorized, once per instruction set.
#include "codecs/qsgd_span.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codecs/quant_uniforms.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/qsgd_math.h"
#include "gcz/detail/quant_reduce.h"

namespace gcz::detail {
namespace {

using namespace qsgd;

#define GCZ_CPU_INLINE [[gnu::always_inline]] inline

GCZ_CPU_INLINE uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// max over the group of |x| (finite elements only), exact: a max over the bits as signed integers
// (|x| < 2^31 as bits), which vectorizes where a float max reduction would not.
GCZ_CPU_INLINE float group_max(const float* x, uint64_t n) {
  int32_t m = 0;
  for (uint64_t i = 0; i < n; ++i) m = std::max(m, static_cast<int32_t>(finite_abs_bits(x[i])));
  return bit_cast<float>(m);
}

// ||x_G||_2 of the finite elements, rounded up to float32: the squares (exact in float64) summed in
// the order of gcz/detail/quant_reduce.h, sqrt in float64.
GCZ_CPU_INLINE float group_l2(const float* x, uint64_t n) {
  PairwiseSum sum;
  for (uint64_t b = 0; b < n; b += kSumBlock) {
    const float* xb = x + b;
    const uint64_t m = std::min(kSumBlock, n - b);
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t i = 0;
    for (; i + 8 <= m; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const double a = finite_abs(xb[i + j]);
        lane[j] += a * a;
      }
    }
    for (int j = 0; i < m; ++i, ++j) {
      const double a = finite_abs(xb[i]);
      lane[j] += a * a;
    }
    sum.add(combine_lanes(lane));
  }
  return ceil_to_f32(std::sqrt(sum.total()));
}

// Rounds the (floored) scale up to the stored dtype, writes its bytes and returns its float32 value:
// the value the decoder reads, which the encoder then quantizes with.
GCZ_CPU_INLINE float store_scale(float scale, DType dtype, std::byte* out) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, &scale, 4);
    return scale;
  }
  const uint16_t h = scale == 0.0f ? 0 : dtype == DType::kFloat16 ? ceil_to_f16(scale) : ceil_to_bf16(scale);
  std::memcpy(out, &h, 2);
  return dtype == DType::kFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
}

GCZ_CPU_INLINE float load_scale(const std::byte* in, DType dtype) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, in, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, in, 2);
  return dtype == DType::kFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
}

template <int B, bool kStochastic>
GCZ_CPU_INLINE void quantize_run(const float* x, const uint16_t* u, uint8_t* c, uint64_t n, float scale) {
  const float s = static_cast<float>(levels(B)), inv = inverse_step(scale, levels(B));
  for (uint64_t i = 0; i < n; ++i) {
    c[i] = static_cast<uint8_t>(quantize<B, kStochastic>(x[i], inv, s, scale, Rng::to_uniform(u[i])));
  }
}

// Packs n codes into ceil(n * B / 8) bytes; the last byte's unused high bits are zero. Widths 4 and 2
// never cross a byte and get loops of their own that vectorize.
template <int B>
GCZ_CPU_INLINE void pack(const uint8_t* c, uint64_t n, uint8_t* out) {
  if constexpr (B == 4) {
    for (uint64_t j = 0; j < n / 2; ++j) out[j] = static_cast<uint8_t>(c[2 * j] | (c[2 * j + 1] << 4));
    if (n % 2) out[n / 2] = c[n - 1];
  } else if constexpr (B == 2) {
    for (uint64_t j = 0; j < n / 4; ++j) {
      out[j] = static_cast<uint8_t>(c[4 * j] | (c[4 * j + 1] << 2) | (c[4 * j + 2] << 4) | (c[4 * j + 3] << 6));
    }
    uint8_t last = 0;
    for (uint64_t k = n / 4 * 4; k < n; ++k) last = static_cast<uint8_t>(last | (c[k] << (2 * (k % 4))));
    if (n % 4) out[n / 4] = last;
  } else {
    const uint64_t full = n / 8;
    for (uint64_t k = 0; k < full; ++k) pack8<B>(c + 8 * k, out + B * k);
    if (const uint64_t rem = n % 8) {
      uint8_t codes[8] = {0, 0, 0, 0, 0, 0, 0, 0}, bytes[8];
      std::memcpy(codes, c + 8 * full, rem);
      pack8<B>(codes, bytes);
      std::memcpy(out + B * full, bytes, ceil_div(rem * B, 8));
    }
  }
}

// Unpacks n codes into c (room for n rounded up to 8); false if the padding bits of a partial last
// byte are not zero.
template <int B>
GCZ_CPU_INLINE bool unpack(const uint8_t* in, uint64_t n, uint8_t* c) {
  const uint64_t bytes = ceil_div(n * B, 8);
  if constexpr (B == 4 || B == 2) {
    constexpr int kPer = 8 / B;
    constexpr uint8_t kMask = (1u << B) - 1u;
    for (uint64_t j = 0; j < bytes; ++j) {
      for (int k = 0; k < kPer; ++k) c[kPer * j + k] = static_cast<uint8_t>((in[j] >> (B * k)) & kMask);
    }
  } else {
    const uint64_t full = n / 8;
    for (uint64_t k = 0; k < full; ++k) unpack8<B>(in + B * k, c + 8 * k);
    if (n % 8) {
      uint8_t last[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::memcpy(last, in + B * full, bytes - B * full);
      unpack8<B>(last, c + 8 * full);
    }
  }
  // The codes read from padding bits (and zero bits beyond the stream) must all be zero.
  const uint64_t unpacked = (B == 4 || B == 2) ? bytes * (8 / B) : ceil_div(n, 8) * 8;
  uint8_t pad = 0;
  for (uint64_t k = n; k < unpacked; ++k) pad |= c[k];
  return pad == 0;
}

template <int B>
GCZ_CPU_INLINE void encode_span(const QsgdEncodeSpan& j) {
  const uint64_t groups = ceil_div(j.len, j.group);
  const std::size_t ssize = dtype_size(j.scale_dtype);
  for (uint64_t g = 0; g < groups; ++g) {
    const float* xg = j.x + g * j.group;
    const uint64_t n = std::min(j.group, j.len - g * j.group);
    const float raw = floor_scale(j.l2_scale ? group_l2(xg, n) : group_max(xg, n));
    j.scale[g] = store_scale(raw, j.scale_dtype, j.scales + g * ssize);
  }
  uint8_t* c = B == 8 ? j.codes : j.scratch;  // 8-bit codes are their own packing
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.group) {
    const uint64_t n = std::min(j.group, j.len - a);
    if (j.stochastic) {
      quantize_run<B, true>(j.x + a, j.u + a, c + a, n, j.scale[g]);
    } else {
      quantize_run<B, false>(j.x + a, j.u + a, c + a, n, j.scale[g]);
    }
  }
  if (B != 8) pack<B>(c, j.len, j.codes);
}

template <int B>
GCZ_CPU_INLINE QsgdSpanError decode_span(const QsgdDecodeSpan& j) {
  const int s = levels(B);
  const uint64_t groups = ceil_div(j.len, j.group);
  const std::size_t ssize = dtype_size(j.scale_dtype);
  bool ok = true;
  for (uint64_t g = 0; g < groups; ++g) {
    const float scale = load_scale(j.scales + g * ssize, j.scale_dtype);
    ok = ok && scale >= 0.0f && scale <= kMaxFloat;
    j.step[g] = step(scale, s);
    j.scale[g] = scale;
  }
  if (!ok) return QsgdSpanError::kBadScale;
  const uint8_t* c = j.codes;
  if (B != 8) {
    if (!unpack<B>(j.codes, j.len, j.scratch)) return QsgdSpanError::kPadding;
    c = j.scratch;
  }
  for (uint64_t g = 0, a = 0; a < j.len; ++g, a += j.group) {
    const uint64_t n = std::min(j.group, j.len - a);
    const float st = j.step[g], sc = j.scale[g];
    for (uint64_t i = 0; i < n; ++i) j.y[a + i] = dequantize<B>(c[a + i], st, sc);
  }
  return QsgdSpanError::kNone;
}

template <int B>
void encode_sse2(const QsgdEncodeSpan& j) {
  encode_span<B>(j);
}
template <int B>
QsgdSpanError decode_sse2(const QsgdDecodeSpan& j) {
  return decode_span<B>(j);
}
#if defined(__x86_64__)
template <int B>
__attribute__((target("avx2"))) void encode_avx2(const QsgdEncodeSpan& j) {
  encode_span<B>(j);
}
template <int B>
__attribute__((target("avx2"))) QsgdSpanError decode_avx2(const QsgdDecodeSpan& j) {
  return decode_span<B>(j);
}
#endif

template <int B>
void encode_dispatch(const QsgdEncodeSpan& j) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return encode_avx2<B>(j);
#endif
  encode_sse2<B>(j);
}
template <int B>
QsgdSpanError decode_dispatch(const QsgdDecodeSpan& j) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return decode_avx2<B>(j);
#endif
  return decode_sse2<B>(j);
}

}  // namespace

void qsgd_encode_span(int bits, const QsgdEncodeSpan& job) {
  switch (bits) {
    case 2: return encode_dispatch<2>(job);
    case 3: return encode_dispatch<3>(job);
    case 4: return encode_dispatch<4>(job);
    case 5: return encode_dispatch<5>(job);
    case 6: return encode_dispatch<6>(job);
    case 7: return encode_dispatch<7>(job);
    default: return encode_dispatch<8>(job);
  }
}

QsgdSpanError qsgd_decode_span(int bits, const QsgdDecodeSpan& job) {
  switch (bits) {
    case 2: return decode_dispatch<2>(job);
    case 3: return decode_dispatch<3>(job);
    case 4: return decode_dispatch<4>(job);
    case 5: return decode_dispatch<5>(job);
    case 6: return decode_dispatch<6>(job);
    case 7: return decode_dispatch<7>(job);
    default: return decode_dispatch<8>(job);
  }
}

}  // namespace gcz::detail

// Probes of the math the CPU and CUDA backends share (gcz/detail/*_math.h, philox.h, quant_reduce.h,
// select.h, float_bits.h): each probe turns a record index into its own inputs and writes what the
// shared functions return for them as 64-bit words. The same probe runs on the host and, compiled by
// nvcc with the CUDA backend's flags, on the device (shared_math_device.cu); the two outputs must be
// equal bit for bit (test_cuda_shared_math.cpp). Inputs come from Philox draws of the index, after a
// run of fixed special values (zeros of both signs, subnormals, infinities, NaNs, ties).
#pragma once

#include <cstdint>

#include "gcz/detail/float_bits.h"
#include "gcz/detail/hd.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/powersgd_math.h"
#include "gcz/detail/qsgd_math.h"
#include "gcz/detail/quant_reduce.h"
#include "gcz/detail/select.h"
#include "gcz/detail/terngrad_math.h"

namespace gcz::test {

enum class Probe : int { kPhilox, kQsgd, kTernGrad, kReduce, kPowerSgd, kKeysAndCasts };

// Output words per record of each probe.
GCZ_HD constexpr int probe_words(Probe p) {
  switch (p) {
    case Probe::kPhilox:
      return 12;
    case Probe::kQsgd:
      return 16;
    case Probe::kTernGrad:
      return 8;
    case Probe::kReduce:
      return 4;
    case Probe::kPowerSgd:
      return 68;
    case Probe::kKeysAndCasts:
      return 10;
  }
  return 0;
}

// The probes' own source of input bits: Philox under a fixed key, so that the inputs are the same on
// both sides whatever the probe checks.
GCZ_HD uint32_t input_bits(uint64_t record, uint32_t k) {
  return detail::philox4x32_10(static_cast<uint32_t>(record), static_cast<uint32_t>(record >> 32), k, 0x67637A21u,
                               0x2545F491u, 0x9E3779B9u)
      .v[k & 3];
}
GCZ_HD float bits_float(uint32_t b) { return detail::bit_cast<float>(b); }
GCZ_HD uint64_t float_word(float f) { return detail::bit_cast<uint32_t>(f); }
GCZ_HD uint64_t double_word(double d) { return detail::bit_cast<uint64_t>(d); }

// A float32 input: the first records go through special values, then a mix of whole random bit
// patterns (every class of float, NaNs included) and values within a factor of 2^±8 of `around`, half
// of them within a factor of 2.
GCZ_HD float probe_float(uint64_t record, uint32_t k, float around) {
  constexpr uint32_t kSpecial[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x00800000u, 0x7F7FFFFFu,
                                   0xFF800000u, 0x7F800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x3F800000u,
                                   0xBF000000u, 0x33800000u, 0x477FF000u, 0x477FEFFFu};
  constexpr uint64_t kSpecials = sizeof(kSpecial) / sizeof(kSpecial[0]);
  const uint32_t b = input_bits(record, k);
  if (record < kSpecials * kSpecials)
    return bits_float(kSpecial[(k % 2 == 0 ? record : record / kSpecials) % kSpecials]);
  if (b % 4 == 0) return bits_float(input_bits(record, k + 16));
  const float unit = static_cast<float>(static_cast<int32_t>(input_bits(record, k + 32)) >> 8) * 0x1p-23f;  // [-1, 1)
  const int spread = static_cast<int>((b >> 8) % 34) - 8, shift = spread > 8 ? 0 : spread;  // 0 half the time
  return unit * around * (shift >= 0 ? static_cast<float>(1u << shift) : 1.0f / static_cast<float>(1u << -shift));
}

// Philox blocks and every draw derived from them; the PowerSGD Gaussian (float64 log, cos and sqrt).
GCZ_HD void probe_philox(uint64_t r, uint64_t* out) {
  const uint64_t seed = (static_cast<uint64_t>(input_bits(r, 0)) << 32) | input_bits(r, 1);
  const uint64_t key = r % 3 == 0 ? 0 : (static_cast<uint64_t>(input_bits(r, 2)) << 32) | input_bits(r, 3);
  const uint32_t purpose = 1 + static_cast<uint32_t>(r % 4);
  const uint64_t i = r % 5 == 0 ? r : (static_cast<uint64_t>(input_bits(r, 4)) << 32) | input_bits(r, 5);
  const detail::Rng rng(seed, key, purpose);
  const detail::Philox4x32 b0 = rng.block(i), b1 = rng.block(i, 1);
  out[0] = (static_cast<uint64_t>(b0.v[0]) << 32) | b0.v[1];
  out[1] = (static_cast<uint64_t>(b0.v[2]) << 32) | b0.v[3];
  out[2] = (static_cast<uint64_t>(b1.v[0]) << 32) | b1.v[1];
  out[3] = (static_cast<uint64_t>(b1.v[2]) << 32) | b1.v[3];
  out[4] = rng.bits(i);
  out[5] = (static_cast<uint64_t>(rng.coarse8(i)) << 16) | (rng.fine8(i) << 8) | rng.draw16(i);
  out[6] = float_word(rng.uniform(i));
  const float p = bits_float(0x3F800000u - (input_bits(r, 6) >> 9));     // in (0.5, 1]
  const float q = static_cast<float>(input_bits(r, 7) >> 8) * 0x1p-24f;  // in [0, 1)
  out[7] = (rng.bernoulli(i, p) ? 2u : 0u) | (rng.bernoulli(i, q) ? 1u : 0u);
  out[8] = (static_cast<uint64_t>(detail::bernoulli_threshold(p)) << 32) | detail::bernoulli_threshold(q);
  const uint32_t tq = detail::bernoulli_threshold(q);
  const int coarse = detail::coarse_bernoulli(rng.coarse8(i), tq);
  out[9] = static_cast<uint64_t>(coarse + 1) | (detail::bernoulli_fine(rng.coarse8(i), rng.fine8(i), tq) ? 4u : 0u);
  out[10] = float_word(detail::powersgd_gaussian(rng, i));
  out[11] = float_word(detail::powersgd_gaussian(rng, r));
}

template <int B>
GCZ_HD void qsgd_codes(float x, float scale, uint32_t coarse, uint32_t fine, uint64_t* out) {
  using namespace detail::qsgd;
  const int s = levels(B);
  const float inv = inverse_step(scale, s), st = step(scale, s);
  const float sf = static_cast<float>(s);
  const float u = detail::Rng::to_uniform(static_cast<uint16_t>((coarse << 8) | fine));
  const uint32_t up = quantize<B, true>(x, inv, sf, scale, u);
  const uint32_t near = quantize<B, false>(x, inv, sf, scale, u);
  const uint32_t drawn = quantize_drawn<B>(x, inv, sf, scale, coarse, [&] { return fine; });
  out[0] = (static_cast<uint64_t>(float_word(inv)) << 32) | float_word(st);
  out[1] = (static_cast<uint64_t>(up) << 32) | (static_cast<uint64_t>(near) << 16) | drawn;
  out[2] = (float_word(dequantize<B>(up, st, scale)) << 32) | float_word(dequantize<B>(near, st, scale));
  // Eight codes packed and unpacked: this one and seven from the input bits.
  uint8_t codes[8], packed[8] = {}, back[8];
  codes[0] = static_cast<uint8_t>(up);
  for (int k = 1; k < 8; ++k) codes[k] = static_cast<uint8_t>((coarse * 131u + fine * 7u + k * 29u) & ((1u << B) - 1u));
  pack8<B>(codes, packed);
  unpack8<B>(packed, back);
  uint64_t p = 0, b = 0;
  for (int k = 0; k < 8; ++k) {
    p |= static_cast<uint64_t>(packed[k]) << (8 * k);
    b |= static_cast<uint64_t>(back[k]) << (8 * k);
  }
  out[3] = p;
  out[4] = b;
}

// QSGD: scales (floor, rounding up to each stored dtype), codes of every width 2..8, both roundings
// and the coarse/fine draw, decoding, and packing.
GCZ_HD void probe_qsgd(uint64_t r, uint64_t* out) {
  using namespace detail::qsgd;
  const float raw_scale = finite_abs(probe_float(r, 1, 1e-3f));
  const double wide = static_cast<double>(raw_scale) * (1.0 + static_cast<double>(input_bits(r, 2)) * 0x1p-40);
  const float floored = floor_scale(raw_scale);
  out[0] = (static_cast<uint64_t>(finite_abs_bits(probe_float(r, 0, 1e-3f))) << 32) | float_word(floored);
  out[1] = (static_cast<uint64_t>(ceil_to_f16(floored)) << 48) | (static_cast<uint64_t>(ceil_to_bf16(floored)) << 32) |
           float_word(ceil_to_f32(wide));
  // The stored scale: float32 as it is, or rounded up to float16 or bfloat16 and widened back.
  const uint32_t kind = input_bits(r, 3) % 3;
  const float scale = kind == 0   ? floored
                      : kind == 1 ? detail::f16_to_f32(ceil_to_f16(floored))
                                  : detail::bf16_to_f32(ceil_to_bf16(floored));
  // x near the scale, at it, or anything.
  const uint32_t pick = input_bits(r, 4) % 8;
  const float x = pick == 0 ? scale : pick == 1 ? -scale : probe_float(r, 0, scale > 0.0f ? scale : 1.0f);
  const uint32_t draw = input_bits(r, 5);
  const uint32_t coarse = draw & 0xFFu, fine = (draw >> 8) & 0xFFu;
  const int bits = 2 + static_cast<int>(r % 7);
  out[2] = float_word(scale);
  out[3] = float_word(x);
  uint64_t* codes = out + 4;
  switch (bits) {
    case 2:
      qsgd_codes<2>(x, scale, coarse, fine, codes);
      break;
    case 3:
      qsgd_codes<3>(x, scale, coarse, fine, codes);
      break;
    case 4:
      qsgd_codes<4>(x, scale, coarse, fine, codes);
      break;
    case 5:
      qsgd_codes<5>(x, scale, coarse, fine, codes);
      break;
    case 6:
      qsgd_codes<6>(x, scale, coarse, fine, codes);
      break;
    case 7:
      qsgd_codes<7>(x, scale, coarse, fine, codes);
      break;
    default:
      qsgd_codes<8>(x, scale, coarse, fine, codes);
      break;
  }
  const LevelFrac lf = level_frac(x, inverse_step(scale, levels(bits)), static_cast<float>(levels(bits)), scale);
  out[9] = (static_cast<uint64_t>(lf.l) << 32) | float_word(lf.frac);
  out[10] = static_cast<uint64_t>(bits);
  for (int k = 11; k < 16; ++k) out[k] = 0;
}

// TernGrad: the clipped scale from the moments, both roundings and the coarse/fine draw, decoding, and
// both packings.
GCZ_HD void probe_terngrad(uint64_t r, uint64_t* out) {
  using namespace detail::terngrad;
  const float max_abs = detail::qsgd::finite_abs(probe_float(r, 0, 1e-2f));
  const double sigma =
      r % 11 == 0 ? 0.0 : static_cast<double>(max_abs) * static_cast<double>(input_bits(r, 1)) * 0x1p-33;
  constexpr double kClips[] = {0.0, 2.5, 1.0, 0.5, 3.0};
  const double clip = kClips[r % 5];
  const float s = scale_from_stats(max_abs, sigma, clip);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  const uint32_t pick = input_bits(r, 2) % 8;
  const float x = pick == 0 ? s : pick == 1 ? -s : probe_float(r, 3, s > 0.0f ? s : 1.0f);
  const uint32_t draw = input_bits(r, 4);
  const uint32_t coarse = draw & 0xFFu, fine = (draw >> 8) & 0xFFu;
  const float u = detail::Rng::to_uniform(static_cast<uint16_t>((coarse << 8) | fine));
  const uint32_t up = trit<true>(x, s, inv, u), near = trit<false>(x, s, inv, u);
  const uint32_t drawn = trit_drawn(x, s, inv, coarse, [&] { return fine; });
  out[0] = (float_word(s) << 32) | float_word(inv);
  out[1] = float_word(x);
  out[2] = (static_cast<uint64_t>(up) << 16) | (near << 8) | drawn;
  out[3] = (float_word(detrit(up, s)) << 32) | float_word(detrit(near, s));
  out[4] = float_word(trit_p(finite_or_zero(x), s, inv));
  uint8_t t[5];
  for (int k = 0; k < 5; ++k) t[k] = static_cast<uint8_t>((draw >> (16 + 3 * k)) % 3);
  out[5] = (static_cast<uint64_t>(pack_base3(t)) << 8) | pack_2bit(t);
  out[6] = (static_cast<uint64_t>(detail::bit_cast<uint64_t>(sigma)));
  out[7] = double_word(clip);
}

// The quantizers' float64 sums: a PairwiseSum over 1..300 block sums of very different magnitudes (so
// that the order of the additions shows in the bits), combine_lanes over eight lane sums, and the
// scalar formulas that turn sums into QSGD's l2 scale and TernGrad's sigma.
GCZ_HD double probe_double(uint64_t r, uint32_t k) {
  const uint64_t m = (static_cast<uint64_t>(input_bits(r, k)) << 32) | input_bits(r, k + 1);
  const int exponent = static_cast<int>(m % 81) - 40;
  const double mantissa = static_cast<double>(static_cast<int64_t>(m >> 11)) * 0x1p-52 - 1.0;  // [-1, 1)
  double scale = 1.0;
  for (int e = 0; e < (exponent < 0 ? -exponent : exponent); ++e) scale *= exponent < 0 ? 0.5 : 2.0;
  return mantissa * scale;
}
GCZ_HD void probe_reduce(uint64_t r, uint64_t* out) {
  detail::PairwiseSum sum;
  const uint64_t m = 1 + r % 300;
  for (uint64_t b = 0; b < m; ++b) sum.add(probe_double(r, static_cast<uint32_t>(2 * b)));
  out[0] = double_word(sum.total());
  double lanes[8];
  for (uint32_t k = 0; k < 8; ++k) lanes[k] = probe_double(r + 1000003, 2 * k);
  const double combined = detail::combine_lanes(lanes);
  out[1] = double_word(combined);
  // What the sums become: QSGD's l2 scale, TernGrad's sigma (var below 0 and n_f = 0 included).
  const double squares = combined < 0.0 ? -combined : combined;
  out[2] = float_word(detail::qsgd::l2_scale(squares * squares));
  out[3] = double_word(detail::terngrad::sigma_from_sums(sum.total(), squares, r % 7 == 0 ? 0 : r % 5000));
}

// PowerSGD: Gram–Schmidt of an n × r float64 matrix (n up to 16, r up to 4) with zero, repeated and
// scaled columns among Gaussian ones; x̂ elements from float32 factor rows; the size rule; the balancing
// shift.
GCZ_HD void probe_powersgd(uint64_t r, uint64_t* out) {
  const uint64_t n = 1 + r % 16, rank = 1 + (r / 16) % 4;
  const detail::Rng rng(r, 0x5EEDu, detail::kStreamPowerSgdInit);
  double v[64];
  for (uint64_t c = 0; c < rank; ++c) {
    const uint32_t kind = input_bits(r, static_cast<uint32_t>(c)) % 6;
    for (uint64_t i = 0; i < n; ++i) {
      const double g = detail::powersgd_gaussian(rng, c * n + i);
      v[c * n + i] = kind == 0 ? 0.0 : (kind == 1 && c > 0) ? v[i] * 3.0 : kind == 2 ? g * 1e-200 : g;
    }
  }
  detail::powersgd_orthonormalize(v, n, rank);
  for (uint64_t k = 0; k < 64; ++k) out[k] = k < n * rank ? double_word(v[k]) : 0;
  float p[4], q[4];
  for (int c = 0; c < 4; ++c) {
    p[c] = probe_float(r, static_cast<uint32_t>(c), 1.0f);
    q[c] = probe_float(r, static_cast<uint32_t>(c + 4), 1.0f);
  }
  out[64] = double_word(detail::powersgd_element(p, q, rank));
  const uint64_t rows = 1 + input_bits(r, 8) % 5000, cols = 1 + input_bits(r, 9) % 5000;
  const double min_rate = 1.0 + static_cast<double>(input_bits(r, 10) % 1000) / 100.0;
  out[65] = detail::powersgd_too_small(rows, cols, rank, 2 + 2 * (r % 2), min_rate) ? 1 : 0;
  const int e = static_cast<int>(input_bits(r, 11) % 301) - 150, ep = static_cast<int>(input_bits(r, 12) % 301) - 150,
            eq = static_cast<int>(input_bits(r, 13) % 301) - 150;
  out[66] = static_cast<uint64_t>(static_cast<int64_t>(detail::powersgd_balance_shift(e, ep, eq)));
  out[67] = n * 16 + rank;
}

// Top-K's magnitude keys of every dtype, and the float conversions the codecs call (narrowing from
// float64 and float32, widening back), from random bit patterns.
GCZ_HD void probe_keys_and_casts(uint64_t r, uint64_t* out) {
  const uint32_t b32 = detail::bit_cast<uint32_t>(probe_float(r, 0, 1.0f));
  const uint64_t b64 = (static_cast<uint64_t>(input_bits(r, 1)) << 32) | input_bits(r, 2);
  const double d = detail::bit_cast<double>(
      r % 2 ? b64 : detail::bit_cast<uint64_t>(static_cast<double>(bits_float(b32)) * (1.0 + 0x1p-30)));
  const uint16_t h = static_cast<uint16_t>(b32 >> (r % 3 == 0 ? 16 : 0));
  out[0] = detail::magnitude_key_f32(b32);
  out[1] = (static_cast<uint64_t>(detail::magnitude_key_f16(h)) << 32) | detail::magnitude_key_bf16(h);
  out[2] = detail::magnitude_key_f64(b64);
  out[3] = (static_cast<uint64_t>(detail::f64_to_f16(d)) << 16) | detail::f64_to_bf16(d);
  out[4] = float_word(detail::f64_to_f32(d));
  out[5] = (static_cast<uint64_t>(detail::f32_to_f16(bits_float(b32))) << 16) | detail::f32_to_bf16(bits_float(b32));
  out[6] = (float_word(detail::f16_to_f32(h)) << 32) | float_word(detail::bf16_to_f32(h));
  out[7] = double_word(detail::f32_to_f64(bits_float(b32)));
  out[8] = double_word(d);
  out[9] = b32;
}

GCZ_HD void run_probe(Probe p, uint64_t record, uint64_t* out) {
  switch (p) {
    case Probe::kPhilox:
      probe_philox(record, out);
      break;
    case Probe::kQsgd:
      probe_qsgd(record, out);
      break;
    case Probe::kTernGrad:
      probe_terngrad(record, out);
      break;
    case Probe::kReduce:
      probe_reduce(record, out);
      break;
    case Probe::kPowerSgd:
      probe_powersgd(record, out);
      break;
    case Probe::kKeysAndCasts:
      probe_keys_and_casts(record, out);
      break;
  }
}

}  // namespace gcz::test

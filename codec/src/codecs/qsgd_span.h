// The CPU loops of QSGD over one span (a whole number of groups, ~1.5K elements): scales, quantize, pack;
// and unpack, dequantize. Specialised per code width, and compiled for SSE2 and AVX2 with the choice
// made at run time; both give the same bytes (the same float32 operations, no FMA).
//
//   QsgdEncodeSpan job{x, u, fine, len, 128, false, true, DType::kFloat32, scales, scale, finite, scratch,
//                      ties, codes};
//   qsgd_encode_span(8, job);
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs/quant_uniforms.h"
#include "gcz/tensor.h"

namespace gcz::detail {

struct QsgdEncodeSpan {
  const float* x;       // len float32 values
  const uint8_t* u;     // len coarse draw bytes (stochastic rounding: Rng::coarse8), or any bytes; len + 32 readable
  FineDraws fine;       // the fine draw bytes, for the roundings the coarse byte does not settle
  uint64_t len;         // the span's elements; the span starts at a group and at a multiple of 8
  uint64_t group;
  bool l2_scale;
  bool stochastic;
  DType scale_dtype;
  std::byte* scales;    // out: ceil(len / group) stored scales
  float* scale;         // scratch: ceil(len / group) floats
  uint8_t* finite;      // scratch: ceil(len / group) flags
  uint8_t* scratch;     // scratch: len bytes (codes before packing)
  uint32_t* ties;       // scratch: tie_room(len, group) words (note_ties: roundings that wait for a fine byte)
  uint8_t* codes;       // out: ceil(len * bits / 8) bytes
};

struct QsgdDecodeSpan {
  const uint8_t* codes;  // ceil(len * bits / 8) bytes
  const std::byte* scales;
  uint64_t len;
  uint64_t group;
  DType scale_dtype;
  float* step;           // scratch: ceil(len / group) floats
  float* scale;          // scratch: ceil(len / group) floats
  uint8_t* scratch;      // scratch: len + 8 bytes
  float* y;              // out: len float32 values
};

void qsgd_encode_span(int bits, const QsgdEncodeSpan& job);

// Why a span cannot be decoded.
enum class QsgdSpanError { kNone, kBadScale, kPadding };
QsgdSpanError qsgd_decode_span(int bits, const QsgdDecodeSpan& job);

}  // namespace gcz::detail

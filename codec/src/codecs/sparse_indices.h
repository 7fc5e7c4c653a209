// sparse_indices.h — the `indices` stream of Top-K: k strictly ascending element indices below n, as
// delta varints or as a bitmap, whichever is smaller (docs/codecs/topk.md, "Stream indices").
//
//   ByteBuffer out;
//   encode_indices(idx, n, out);                                  // tag byte + body
//   Result<std::vector<uint64_t>> back = decode_indices(out, n, idx.size());
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gcz/codec.h"

namespace gcz::codecs {

// First byte of the stream: which encoding the body uses. Fixed values; never reuse one.
inline constexpr uint8_t kIndicesVarint = 0;
inline constexpr uint8_t kIndicesBitmap = 1;

// Bytes of the unsigned LEB128 encoding of v (1..10).
uint64_t varint_size(uint64_t v);

// The most bytes encode_indices writes for k indices below n: 0 when n is 0, else
// 1 + min(k * varint_size(n), ceil(n / 8)).
uint64_t indices_size_bound(uint64_t n, uint64_t k);

// Appends the encoding of `indices` (strictly ascending, all < n): nothing when n is 0, else the tag
// byte and the body of the smaller encoding (the bitmap when both have the same size).
void encode_indices(std::span<const uint64_t> indices, uint64_t n, ByteBuffer& out);

// Decodes a stream that must hold exactly k strictly ascending indices below n. A stream breaking a
// rule gives a format error naming it (docs/codecs/topk.md lists the rules).
Result<std::vector<uint64_t>> decode_indices(ByteSpan in, uint64_t n, uint64_t k);

}  // namespace gcz::codecs

#include "codecs/sparse_indices.h"

#include <algorithm>
#include <bit>
#include <string>

namespace gcz::codecs {
namespace {

Status bad(const std::string& rule) { return format_error("stream 'indices': " + rule); }

uint64_t bitmap_size(uint64_t n) { return n / 8 + (n % 8 != 0); }

uint64_t varint_body_size(std::span<const uint64_t> indices) {
  uint64_t bytes = 0, prev_plus_one = 0;
  for (uint64_t i : indices) {
    bytes += varint_size(i + 1 - prev_plus_one);
    prev_plus_one = i + 1;
  }
  return bytes;
}

void put_varint(uint64_t v, ByteBuffer& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::byte>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::byte>(v));
}

// Reads one varint at in[pos] (the body after the tag byte: messages name its offset in the stream,
// pos + 1); rejects truncation, more than 64 bits and redundant trailing zero groups (so every index
// list has exactly one encoding).
Result<uint64_t> get_varint(ByteSpan in, std::size_t& pos) {
  const std::size_t start = pos;
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    if (pos == in.size()) return bad("truncated varint at byte " + std::to_string(start + 1));
    const uint64_t byte = std::to_integer<uint64_t>(in[pos++]);
    const uint64_t group = byte & 0x7F;
    if (shift == 63 && group > 1) return bad("varint at byte " + std::to_string(start + 1) + " exceeds 64 bits");
    v |= group << shift;
    if ((byte & 0x80) == 0) {
      if (group == 0 && shift > 0) return bad("overlong varint at byte " + std::to_string(start + 1));
      return v;
    }
    if (shift == 63) return bad("varint at byte " + std::to_string(start + 1) + " exceeds 64 bits");
  }
}

Result<std::vector<uint64_t>> decode_varints(ByteSpan body, uint64_t n, uint64_t k) {
  std::vector<uint64_t> out;
  out.reserve(static_cast<std::size_t>(std::min<uint64_t>(k, body.size())));
  std::size_t pos = 0;
  uint64_t next = 0;  // the smallest index the next delta may reach: previous index + 1
  while (pos < body.size()) {
    if (out.size() == k) return bad("bytes left after " + std::to_string(k) + " indices");
    const std::size_t at = pos + 1;  // the varint's offset in the stream (the tag is byte 0), as get_varint's
    GCZ_ASSIGN_OR_RETURN(uint64_t delta, get_varint(body, pos));
    if (delta == 0) return bad("delta 0 at byte " + std::to_string(at) + ": indices must be strictly ascending");
    if (delta > n - next) return bad("index out of range (n = " + std::to_string(n) + ")");
    out.push_back(next + delta - 1);
    next += delta;
  }
  if (out.size() != k) {
    return bad("holds " + std::to_string(out.size()) + " indices, expected " + std::to_string(k));
  }
  return out;
}

Result<std::vector<uint64_t>> decode_bitmap(ByteSpan body, uint64_t n, uint64_t k) {
  if (body.size() != bitmap_size(n)) {
    return bad("bitmap of " + std::to_string(body.size()) + " bytes, expected ceil(n / 8) = " +
               std::to_string(bitmap_size(n)));
  }
  if (n % 8 != 0 && (std::to_integer<unsigned>(body.back()) >> (n % 8)) != 0) {
    return bad("bitmap sets bits past the last element");
  }
  uint64_t count = 0;
  for (std::byte b : body) count += static_cast<uint64_t>(std::popcount(std::to_integer<unsigned>(b)));
  if (count != k) return bad("bitmap sets " + std::to_string(count) + " bits, expected " + std::to_string(k));
  std::vector<uint64_t> out;
  out.reserve(k);
  for (std::size_t byte = 0; byte < body.size(); ++byte) {
    for (unsigned bits = std::to_integer<unsigned>(body[byte]); bits != 0; bits &= bits - 1) {
      out.push_back(uint64_t{byte} * 8 + static_cast<uint64_t>(std::countr_zero(bits)));
    }
  }
  return out;
}

}  // namespace

uint64_t varint_size(uint64_t v) {
  uint64_t bytes = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++bytes;
  }
  return bytes;
}

uint64_t indices_size_bound(uint64_t n, uint64_t k) {
  if (n == 0) return 0;
  // Every delta is at most n; k <= n <= 2^48 keeps the product far from overflow.
  return 1 + std::min(k * varint_size(n), bitmap_size(n));
}

void encode_indices(std::span<const uint64_t> indices, uint64_t n, ByteBuffer& out) {
  if (n == 0) return;
  const uint64_t bitmap = bitmap_size(n);
  if (varint_body_size(indices) < bitmap) {
    out.push_back(static_cast<std::byte>(kIndicesVarint));
    uint64_t prev_plus_one = 0;
    for (uint64_t i : indices) {
      put_varint(i + 1 - prev_plus_one, out);
      prev_plus_one = i + 1;
    }
    return;
  }
  out.push_back(static_cast<std::byte>(kIndicesBitmap));
  const std::size_t base = out.size();
  out.resize(base + bitmap, std::byte{0});
  for (uint64_t i : indices) out[base + i / 8] |= static_cast<std::byte>(1u << (i % 8));
}

Result<std::vector<uint64_t>> decode_indices(ByteSpan in, uint64_t n, uint64_t k) {
  if (n == 0) {
    if (!in.empty()) return bad("must be empty for an empty tensor");
    return std::vector<uint64_t>{};
  }
  const uint64_t bound = indices_size_bound(n, k);
  if (in.size() > bound) {
    return bad(std::to_string(in.size()) + " bytes exceed the bound of " + std::to_string(bound));
  }
  if (in.empty()) return bad("missing its tag byte");
  const unsigned tag = std::to_integer<unsigned>(in[0]);
  if (tag == kIndicesVarint) return decode_varints(in.subspan(1), n, k);
  if (tag == kIndicesBitmap) return decode_bitmap(in.subspan(1), n, k);
  return bad("unknown encoding tag " + std::to_string(tag) + " (0 = varint, 1 = bitmap)");
}

}  // namespace gcz::codecs

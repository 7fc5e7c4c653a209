// Internal: the fixed-size parts of a .gcz file (FORMAT.md §§2-3), encoded and decoded field by field.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "gcz/container.h"

namespace gcz::detail {

inline constexpr std::size_t kHeaderBytes = 64;
inline constexpr std::size_t kTrailerBytes = 32;
inline constexpr std::array<uint8_t, 8> kMagic = {0x89, 'G', 'C', 'Z', 0x0D, 0x0A, 0x1A, 0x0A};
inline constexpr std::array<uint8_t, 8> kEndMagic = {0x89, 'G', 'C', 'Z', 'E', 'N', 'D', 0x0A};

constexpr uint64_t align_up(uint64_t v) { return (v + kStreamAlignment - 1) / kStreamAlignment * kStreamAlignment; }

inline void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline std::array<uint8_t, kHeaderBytes> encode_header() {
  std::array<uint8_t, kHeaderBytes> h{};
  for (std::size_t i = 0; i < kMagic.size(); ++i) h[i] = kMagic[i];
  put_le(&h[8], kFormatVersionMajor, 2);
  put_le(&h[10], kFormatVersionMinor, 2);
  return h;  // flags and reserved stay zero
}

struct Trailer {
  uint64_t index_offset;
  uint64_t index_length;
  uint64_t index_xxh3;
};

inline std::array<uint8_t, kTrailerBytes> encode_trailer(uint64_t offset, uint64_t length, uint64_t xxh3) {
  std::array<uint8_t, kTrailerBytes> t{};
  put_le(&t[0], offset, 8);
  put_le(&t[8], length, 8);
  put_le(&t[16], xxh3, 8);
  for (std::size_t i = 0; i < kEndMagic.size(); ++i) t[24 + i] = kEndMagic[i];
  return t;
}

}  // namespace gcz::detail

// UTF-8 as gcz reads tensor names: by character where the bytes are valid, by byte where not.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

namespace gcz::detail {

// The character at s[i] and its length in bytes. A byte that starts no valid UTF-8 sequence (a
// stray continuation byte, a truncated, overlong or surrogate sequence) is a character of its own,
// U+DC80..U+DCFF, which no valid sequence decodes to.
inline std::pair<char32_t, std::size_t> utf8_char(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const std::pair<char32_t, std::size_t> stray{0xDC00u + b, 1};
  const std::size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (len == 0 || len > s.size() - i) return stray;
  char32_t c = len == 1 ? b : len == 2 ? (b & 0x1Fu) : len == 3 ? (b & 0x0Fu) : (b & 0x07u);
  for (std::size_t k = 1; k < len; ++k) {
    const auto t = static_cast<unsigned char>(s[i + k]);
    if ((t >> 6) != 2) return stray;
    c = (c << 6) | (t & 0x3Fu);
  }
  constexpr char32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kLeast[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return stray;
  return {c, len};
}

// Whether utf8_char's character stands for a stray byte (a valid sequence never decodes to these).
inline bool is_stray_byte(char32_t c) { return c >= 0xDC80 && c <= 0xDCFF; }

inline bool is_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto [c, n] = utf8_char(s, i);
    if (is_stray_byte(c)) return false;
    i += n;
  }
  return true;
}

// At most `most` bytes of s, cut where a character starts (a name shortened for a message).
inline std::string_view utf8_prefix(std::string_view s, std::size_t most) {
  if (s.size() <= most) return s;
  std::size_t cut = most;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

}  // namespace gcz::detail

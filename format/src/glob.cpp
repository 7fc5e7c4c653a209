// Shell patterns over UTF-8 names (gcz/pipeline.h, glob_match).
#include <cctype>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "gcz/detail/utf8.h"
#include "gcz/pipeline.h"

namespace gcz {
namespace {

constexpr std::size_t kNone = std::string_view::npos;
constexpr std::size_t kInvalid = kNone - 1;  // a pattern fnmatch calls an error: it matches nothing

// The POSIX class `name` ("digit", ...) as a test of an ASCII character in the C locale, or null for
// an unknown class.
using ClassTest = int (*)(int);
ClassTest class_test(std::string_view name) {
  static constexpr std::pair<std::string_view, ClassTest> kClasses[] = {
      {"alpha", [](int b) { return std::isalpha(b); }},
      {"digit", [](int b) { return std::isdigit(b); }},
      {"alnum", [](int b) { return std::isalnum(b); }},
      {"upper", [](int b) { return std::isupper(b); }},
      {"lower", [](int b) { return std::islower(b); }},
      {"space", [](int b) { return std::isspace(b); }},
      {"blank", [](int b) { return static_cast<int>(b == ' ' || b == '\t'); }},
      {"punct", [](int b) { return std::ispunct(b); }},
      {"xdigit", [](int b) { return std::isxdigit(b); }},
      {"cntrl", [](int b) { return std::iscntrl(b); }},
      {"graph", [](int b) { return std::isgraph(b); }},
      {"print", [](int b) { return std::isprint(b); }},
  };
  for (const auto& [n, test] : kClasses) {
    if (n == name) return test;
  }
  return nullptr;
}

// The character of pattern `p` at i, a backslash making the next one plain; and the index after it.
std::pair<char32_t, std::size_t> pattern_char(std::string_view p, std::size_t i) {
  if (p[i] == '\\' && i + 1 < p.size()) ++i;
  const auto [c, n] = detail::utf8_char(p, i);
  return {c, i + n};
}

// Matches the set `[...]` that starts at p[i] against c: the index after its `]`; kNone when no `]`
// closes it (then the `[` is a plain character); kInvalid for what fnmatch calls an error (an unknown
// class, a range cut off by the pattern's end). Inside, `[:class:]` is a POSIX class of ASCII
// characters, and `[.c.]` and `[=c=]` are the one character c (as in the C locale).
std::size_t match_set(std::string_view p, std::size_t i, char32_t c, bool& matched) {
  std::size_t j = i + 1;
  const bool negate = j < p.size() && (p[j] == '!' || p[j] == '^');
  if (negate) ++j;
  bool in = false;
  for (bool first = true; j < p.size(); first = false) {
    if (p[j] == ']' && !first) {
      matched = in != negate;
      return j + 1;
    }
    if (p[j] == '[' && j + 1 < p.size() && (p[j + 1] == ':' || p[j + 1] == '.' || p[j + 1] == '=')) {
      const char kind = p[j + 1];
      const std::size_t close = p.find(std::string{kind, ']'}, j + 2);
      if (close == kNone) return kInvalid;
      const std::string_view inner = p.substr(j + 2, close - j - 2);
      if (kind == ':') {
        const ClassTest test = class_test(inner);
        if (test == nullptr) return kInvalid;
        in = in || (c <= 0x7F && test(static_cast<int>(c)) != 0);
      } else {
        if (inner.empty() || detail::utf8_char(inner, 0).second != inner.size()) return kInvalid;
        in = in || detail::utf8_char(inner, 0).first == c;
      }
      j = close + 2;
      continue;
    }
    auto [lo, next] = pattern_char(p, j);
    char32_t hi = lo;
    if (next < p.size() && p[next] == '-' && (next + 1 == p.size() || p[next + 1] != ']')) {
      if (next + 1 == p.size()) return kInvalid;  // "[a-": the range has no end
      std::tie(hi, next) = pattern_char(p, next + 1);
    }
    in = in || (lo <= c && c <= hi);
    j = next;
  }
  return kNone;
}

}  // namespace

bool glob_match(std::string_view p, std::string_view s) {
  // Left to right; on a mismatch, the last `*` takes one more character and matching resumes after it.
  std::size_t pi = 0, si = 0, star = kNone, star_si = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = ++pi;
      star_si = si;
      continue;
    }
    const auto [c, n] = detail::utf8_char(s, si);
    bool ok = false;
    std::size_t next = kNone;
    if (pi < p.size()) {
      if (p[pi] == '?') {
        ok = true;
        next = pi + 1;
      } else if (p[pi] == '[') {
        next = match_set(p, pi, c, ok);
        if (next == kInvalid) return false;
      } else if (p[pi] == '\\' && pi + 1 == p.size()) {
        next = pi;  // a pattern ending in a lone backslash matches nothing, as with fnmatch
      }
      if (next == kNone) {
        char32_t want = 0;
        std::tie(want, next) = pattern_char(p, pi);
        ok = want == c;
      }
    }
    if (ok) {
      pi = next;
      si += n;
    } else if (star != kNone) {
      star_si += detail::utf8_char(s, star_si).second;
      pi = star;
      si = star_si;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace gcz

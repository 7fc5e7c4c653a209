// Shell patterns over UTF-8 names (gcz/pipeline.h, glob_match).
#include <string_view>
#include <tuple>
#include <utility>

#include "gcz/pipeline.h"
#include "utf8.h"

namespace gcz {
namespace {

constexpr std::size_t kNone = std::string_view::npos;

// The character of pattern `p` at i, a backslash making the next one plain; and the index after it.
std::pair<char32_t, std::size_t> pattern_char(std::string_view p, std::size_t i) {
  if (p[i] == '\\' && i + 1 < p.size()) ++i;
  const auto [c, n] = detail::utf8_char(p, i);
  return {c, i + n};
}

// Matches the set `[...]` that starts at p[i] against c: the index after its `]`, or kNone when no
// `]` closes it (then the `[` is a plain character).
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
    auto [lo, next] = pattern_char(p, j);
    char32_t hi = lo;
    if (next + 1 < p.size() && p[next] == '-' && p[next + 1] != ']') std::tie(hi, next) = pattern_char(p, next + 1);
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

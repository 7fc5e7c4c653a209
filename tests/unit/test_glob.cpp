// glob_match: shell patterns over UTF-8 tensor names (--rule, decode -t).
#include <fnmatch.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "gcz/pipeline.h"

namespace gcz {
namespace {

// On ASCII, glob_match is POSIX fnmatch without flags: compared on every pattern x name pair below.
TEST(Glob, AgreesWithFnmatchOnAscii) {
  const std::vector<std::string> patterns = {
      "", "*", "**", "?", "a", "a*", "*a", "*a*", "a?c", "a*c", "a**c", "*.bias", "layer?.weight", "layer*.w*",
      "[ab]", "[!ab]", "[^ab]", "[a-c]x", "[]]", "[]a]", "[!]]", "[a-]", "[-a]", "[z-a]", "[", "[a", "a[", "\\*",
      "\\?", "a\\", "\\[a]", "[\\]]", "[a\\-c]", "*[0-9]", "*/*", "enc*/layer[0-3]/*", "?*?", "*?*?*", "a*b*c*d",
      "layer[[:digit:]].*", "[[:alpha:]]", "[![:alpha:]]", "[[:upper:][:digit:]]", "[[:space:]]", "[[:punct:]]",
      "[[:bogus:]]", "[[:alpha:]", "[[.a.]]", "[[=a=]]", "[[.ab.]]", "[a-", "[a-b", "[a-]x", "[!a-", "*[a-", "[]-a]",
      "[--0]", "[[]", "[[a]", "[a[]"};
  const std::vector<std::string> names = {
      "", "a", "b", "c", "x", "ab", "ac", "abc", "aXc", "a/c", "a//c", "fc1.bias", "layer1.weight", "layer12.weight",
      "layer1.w", "]", "-", "z", "ax", "cx", "dx", "*", "?", "[", "a\\", "[a]", "\\", "x7", "x/y", "enc/layer2/w",
      "enc0/layer3/b/c", "abcd", "aXbXcXd", "abdc", "A", "7", " ", "!", "a-", "a-b", "[a-", "layer3.w", "d]", ":",
      "-x", "."};
  for (const std::string& p : patterns) {
    for (const std::string& n : names) {
      const bool want = fnmatch(p.c_str(), n.c_str(), 0) == 0;
      EXPECT_EQ(glob_match(p, n), want) << "pattern '" << p << "', name '" << n << "'";
    }
  }
}

// Random patterns and names over the characters that mean something in a pattern: still fnmatch.
TEST(Glob, AgreesWithFnmatchOnRandomAsciiPatterns) {
  std::mt19937 rng(12345);
  const std::string pattern_chars = "ab-*?[]!^:.=\\", name_chars = "ab-*?[]!:\\";
  const std::vector<std::string> pieces = {"[:alpha:]", "[:digit:]", "[.a.]", "[=b=]"};
  auto draw = [&](const std::string& chars, std::size_t most, bool classes) {
    std::string s;
    for (std::size_t n = rng() % (most + 1); n > 0; --n) {
      if (classes && rng() % 8 == 0) s += pieces[rng() % pieces.size()];
      else s += chars[rng() % chars.size()];
    }
    return s;
  };
  for (int i = 0; i < 200000; ++i) {
    const std::string p = draw(pattern_chars, 8, true), n = draw(name_chars, 6, false);
    ASSERT_EQ(glob_match(p, n), fnmatch(p.c_str(), n.c_str(), 0) == 0) << "pattern '" << p << "', name '" << n << "'";
  }
}

TEST(Glob, MatchesCharactersNotBytes) {
  const std::string name = "\xC3\xBCn\xC3\xAF";  // "ünï": 3 characters, 5 bytes
  EXPECT_TRUE(glob_match("???", name));
  EXPECT_FALSE(glob_match("?????", name));
  EXPECT_TRUE(glob_match("\xC3\xBCn?", name));
  EXPECT_FALSE(glob_match("\xC3\xBCn??", name));
  // After a '*' the match resumes at a character, not inside one: "€xy" is 3 characters.
  EXPECT_FALSE(glob_match("*??x?",
                          "\xE2\x82\xAC"
                          "xy"));
  EXPECT_TRUE(glob_match("*?x?",
                         "\xE2\x82\xAC"
                         "xy"));
  EXPECT_TRUE(glob_match("[\xC3\xBC]n\xC3\xAF", name));
  EXPECT_TRUE(glob_match("\xC3\xBCn[\xC3\xA0-\xC3\xBF]", name));  // ï in [à-ÿ], by code point
  EXPECT_FALSE(glob_match("\xC3\xBCn[!\xC3\xAF]", name));
  EXPECT_TRUE(glob_match("*\xC3\xAF", name));
  EXPECT_TRUE(glob_match("?\xF0\x9F\x98\x80?", "a\xF0\x9F\x98\x80" "b"));  // a 4-byte character
}

TEST(Glob, StrayBytesAreCharactersOfTheirOwn) {
  EXPECT_TRUE(glob_match("a?b", "a\xFF" "b"));
  EXPECT_TRUE(glob_match("a??b", "a\xC3" "xb"));  // a truncated sequence: 0xC3 alone, then 'x'
  EXPECT_FALSE(glob_match("a?b", "a\xC3" "xb"));
  EXPECT_TRUE(glob_match("a??b", "a\xC0\xBC" "b"));  // an overlong '<': two stray bytes
  EXPECT_FALSE(glob_match("a?b", "a\xC0\xBC" "b"));
  EXPECT_FALSE(glob_match("a??b", "a\xED\xA0\x80" "b"));  // a surrogate: three stray bytes
  EXPECT_TRUE(glob_match("a???b", "a\xED\xA0\x80" "b"));
  EXPECT_TRUE(glob_match("a\xFF" "b", "a\xFF" "b"));
  EXPECT_FALSE(glob_match("a\xFE" "b", "a\xFF" "b"));
}

TEST(Glob, NamesWithNulBytesAreMatchedWhole) {
  const std::string name("a\0b", 3);
  EXPECT_FALSE(glob_match("a", name));  // fnmatch would stop at the NUL and say yes
  EXPECT_TRUE(glob_match("a?b", name));
  EXPECT_TRUE(glob_match(std::string("a\0b", 3), name));
}

}  // namespace
}  // namespace gcz

// The tie notes of the stochastic span loops (quant_uniforms.h): the order of a mask's bits is the
// order in which the AVX2 packs leave 32 narrowed lanes, and for_each_tie maps it back to elements.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "codecs/quant_uniforms.h"
#include "cpu_features.h"

#if defined(__x86_64__)
#include "codecs/avx2_bytes.h"
#endif

namespace gcz::detail {
namespace {

TEST(TieNotes, TieElementIsAPermutationOfAStep) {
  std::vector<int> seen(32, 0);
  for (unsigned b = 0; b < 32; ++b) {
    ASSERT_LT(tie_element(b), 32u) << b;
    ++seen[tie_element(b)];
  }
  for (unsigned e = 0; e < 32; ++e) EXPECT_EQ(seen[e], 1) << e;
}

#if defined(__x86_64__)
// Byte b of pack_interleaved of the lanes of elements 0-7, 8-15, 16-23 and 24-31 is element
// tie_element(b): the order the loops' tie masks are taken in.
__attribute__((target("avx2"))) std::vector<uint8_t> packed_element_indices() {
  __m256i lanes[4];
  for (int k = 0; k < 4; ++k) {
    lanes[k] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * k));
  }
  std::vector<uint8_t> bytes(32);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(bytes.data()),
                      avx2::pack_interleaved(lanes[0], lanes[1], lanes[2], lanes[3]));
  return bytes;
}

TEST(TieNotes, TieElementIsThePacksOrder) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU: the packs' order cannot be observed";
  const std::vector<uint8_t> bytes = packed_element_indices();
  for (unsigned b = 0; b < 32; ++b) EXPECT_EQ(bytes[b], tie_element(b)) << "byte " << b;
}

// The last step of a group keeps the ties of its first `rest` elements only.
TEST(TieNotes, PackedKeepHoldsTheFirstElements) {
  for (unsigned rest = 0; rest <= 32; ++rest) {
    const uint32_t keep = avx2::kPackedKeep.mask[rest];
    EXPECT_EQ(static_cast<unsigned>(__builtin_popcount(keep)), rest) << rest;
    for (unsigned b = 0; b < 32; ++b) {
      EXPECT_EQ((keep >> b) & 1u, tie_element(b) < rest ? 1u : 0u) << "rest " << rest << " bit " << b;
    }
  }
}
#endif

// for_each_tie yields every noted element once, in the order noted, with the fine byte of that
// element, across for_each_tie's batches of 64.
TEST(TieNotes, ForEachTieYieldsEveryNotedElementWithItsFineByte) {
  std::vector<uint32_t> ties;
  std::vector<uint64_t> expected;
  for (uint32_t step = 0; step < 60; ++step) {  // 60 steps of 32, 1 to 3 ties each: more than a batch
    const uint32_t mask = (1u << (step % 32)) | (step % 3 == 0 ? 0x80000001u : 0u) | (step % 5 == 0 ? 0x10u : 0u);
    ties.push_back(32 * step);
    ties.push_back(mask);
    for (unsigned b = 0; b < 32; ++b) {
      if ((mask >> b) & 1u) expected.push_back(32 * step + tie_element(b));
    }
  }
  ASSERT_GT(expected.size(), std::size_t{64});
  const FineDraws fine{12345, 678, 2, 1000};
  std::vector<uint64_t> got;
  for_each_tie(ties.data(), ties.size() / 2, fine, [&](uint64_t e, uint32_t f) {
    EXPECT_EQ(f, fine.at(e)) << e;
    got.push_back(e);
  });
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace gcz::detail

// Replays the fuzz entry points over every file of the corrupt corpus and the golden files, and over
// deterministic mutations of a valid file, so the fuzz harnesses run in every test pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "fuzz_targets.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FuzzReplay, GczTargetSurvivesCorpusAndMutations) {
  const fs::path src(GCZ_SOURCE_DIR);
  auto files = files_under(src / "tests" / "golden");
  const auto corrupt = files_under(src / "tests" / "corrupt");
  files.insert(files.end(), corrupt.begin(), corrupt.end());
  std::size_t gcz_files = 0;
  for (const fs::path& p : files) {
    if (p.extension() != ".gcz") continue;
    const auto bytes = read_file(p);
    EXPECT_EQ(fuzz::gcz_file(bytes.data(), bytes.size()), 0) << p;
    ++gcz_files;
  }
  ASSERT_GT(gcz_files, 0u);
  // Mutations of golden files of several codecs: random byte overwrites, insertions, truncations.
  std::mt19937 rng(7);
  for (const char* name : {"fp16_zstd", "qsgd", "terngrad", "topk_qsgd_values", "randomk", "powersgd"}) {
    const auto base = read_file(src / "tests" / "golden" / (std::string(name) + ".gcz"));
    ASSERT_FALSE(base.empty()) << name;
    for (int k = 0; k < 150; ++k) {
      std::vector<uint8_t> m = base;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const std::size_t pos = rng() % m.size();
        switch (rng() % 3) {
          case 0:
            m[pos] = static_cast<uint8_t>(rng());
            break;
          case 1:
            m.insert(m.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<uint8_t>(rng()));
            break;
          default:
            m.resize(pos);
            break;
        }
        if (m.empty()) break;
      }
      EXPECT_EQ(fuzz::gcz_file(m.data(), m.size()), 0);
    }
  }
}

TEST(FuzzReplay, TensorTargetSurvivesCorpusAndMutations) {
  const fs::path src(GCZ_SOURCE_DIR);
  std::size_t n = 0;
  for (const fs::path& p : files_under(src / "tests")) {
    const std::string ext = p.extension().string();
    const int kind = ext == ".npy" ? 0 : ext == ".npz" ? 1 : ext == ".safetensors" ? 2 : ext == ".h5" ? 3 : -1;
    if (kind < 0) continue;
    auto bytes = read_file(p);
    bytes.insert(bytes.begin(), static_cast<uint8_t>(kind));
    EXPECT_EQ(fuzz::tensor_file(bytes.data(), bytes.size()), 0) << p;
    ++n;
    std::mt19937 rng(static_cast<unsigned>(n));
    for (int k = 0; k < 40 && bytes.size() > 1; ++k) {
      std::vector<uint8_t> m = bytes;
      const std::size_t pos = 1 + rng() % (m.size() - 1);
      if (k % 2)
        m[pos] = static_cast<uint8_t>(rng());
      else
        m.resize(pos);
      EXPECT_EQ(fuzz::tensor_file(m.data(), m.size()), 0) << p << " mutation " << k;
    }
  }
  EXPECT_GT(n, 0u);
}

}  // namespace
}  // namespace gcz

// Golden files (tests/golden, made by make_golden.py): files written by an earlier gcz must still
// decode to the same tensors, and today's encoder must still write the same stream bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gcz/container.h"
#include "gcz/pipeline.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

const fs::path kGolden = fs::path(GCZ_SOURCE_DIR) / "tests" / "golden";

struct GoldenSpec {
  std::string spec;
  uint64_t seed = 0;
  bool encode_exact = true;  // false where the encoder's bytes may differ by machine (PowerSGD's BLAS)
};

std::map<std::string, GoldenSpec> golden_specs() {
  std::ifstream in(kGolden / "specs.json");
  std::map<std::string, GoldenSpec> out;
  const nlohmann::json specs = nlohmann::json::parse(in);
  for (const auto& [k, v] : specs.items()) {
    out[k] = {v.at("spec").get<std::string>(), v.at("seed").get<uint64_t>(), v.at("encode_exact").get<bool>()};
  }
  return out;
}

std::vector<ByteBuffer> all_tensors(const fs::path& p) {
  auto r = open_tensor_file(p.string(), {});
  EXPECT_TRUE(r) << r.status().message();
  std::vector<ByteBuffer> out;
  if (!r) return out;
  for (std::size_t i = 0; i < (*r)->tensors().size(); ++i) {
    const TensorInfo& t = (*r)->tensors()[i];
    ByteBuffer b(*t.byte_size());
    auto src = (*r)->open(i);
    EXPECT_TRUE(src && (*src)->read(0, *t.numel(), b.data()));
    out.push_back(std::move(b));
  }
  return out;
}

TEST(Golden, EveryCodecHasAGoldenFile) {
  const auto specs = golden_specs();
  EXPECT_GE(specs.size(), 15u);
  for (const auto& [name, spec] : specs) {
    EXPECT_TRUE(fs::exists(kGolden / (name + ".gcz"))) << name;
    EXPECT_TRUE(fs::exists(kGolden / (name + ".expected.safetensors"))) << name;
  }
}

TEST(Golden, OldFilesVerifyAndDecodeToTheSameTensors) {
  const fs::path tmp = fs::path(::testing::TempDir()) / "gcz_golden_decode";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  for (const auto& [name, spec] : golden_specs()) {
    SCOPED_TRACE(name);
    auto r = GczReader::open((kGolden / (name + ".gcz")).string());
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_TRUE((*r)->verify(nullptr));
    EXPECT_EQ((*r)->index().metadata.at("golden"), "1");
    const fs::path out = tmp / (name + ".safetensors");
    DecodeOptions o;
    o.device = DeviceRequest::kCpu;
    ASSERT_TRUE(decode_file((kGolden / (name + ".gcz")).string(), out.string(), o));
    EXPECT_EQ(all_tensors(out), all_tensors(kGolden / (name + ".expected.safetensors")));
  }
}

TEST(Golden, TodaysEncoderWritesTheSameStreams) {
  for (const auto& [name, spec] : golden_specs()) {
    SCOPED_TRACE(name);
    if (!spec.encode_exact) continue;  // decoded and compared by the test above
    auto golden = GczReader::open((kGolden / (name + ".gcz")).string());
    ASSERT_TRUE(golden) << golden.status().message();
    const fs::path out = fs::path(::testing::TempDir()) / ("gcz_golden_" + name + ".gcz");
    EncodeOptions o;
    o.spec = spec.spec;
    o.seed = spec.seed;
    o.device = DeviceRequest::kCpu;
    ASSERT_TRUE(encode_files({(kGolden / "input.safetensors").string()}, out.string(), o));
    auto today = GczReader::open(out.string());
    ASSERT_TRUE(today) << today.status().message();
    const auto& a = (*golden)->index().tensors;
    const auto& b = (*today)->index().tensors;
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(chain_to_string(a[i].chain), chain_to_string(b[i].chain));
      ASSERT_EQ(a[i].streams.size(), b[i].streams.size());
      for (std::size_t s = 0; s < a[i].streams.size(); ++s) {
        EXPECT_EQ(a[i].streams[s].xxh3, b[i].streams[s].xxh3) << a[i].info.name;
        EXPECT_EQ(a[i].streams[s].offset, b[i].streams[s].offset) << a[i].info.name;
        EXPECT_EQ(a[i].streams[s].encoding, b[i].streams[s].encoding) << a[i].info.name;
      }
    }
    fs::remove(out);
  }
}

// Files of earlier minor versions (tests/golden/v1.<minor>, kept as written then): their stochastic
// codecs made other draws, which changes what an encoder writes but not how a reader decodes
// (FORMAT.md §8).
void check_old_golden_files(const std::string& version, uint16_t minor) {
  const fs::path dir = kGolden / ("v" + version), tmp = fs::path(::testing::TempDir()) / ("gcz_golden_v" + version);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".gcz") continue;
    SCOPED_TRACE(entry.path().string());
    ++files;
    auto r = GczReader::open(entry.path().string());
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_EQ((*r)->index().version_minor, minor);
    EXPECT_TRUE((*r)->verify(nullptr));
    const fs::path out = tmp / (entry.path().stem().string() + ".safetensors");
    DecodeOptions o;
    o.device = DeviceRequest::kCpu;
    ASSERT_TRUE(decode_file(entry.path().string(), out.string(), o));
    const fs::path expected = dir / (entry.path().stem().string() + ".expected.safetensors");
    EXPECT_EQ(all_tensors(out), all_tensors(expected));
  }
  EXPECT_EQ(files, 3);
}

TEST(Golden, Format10FilesStillDecode) { check_old_golden_files("1.0", 0); }
TEST(Golden, Format11FilesStillDecode) { check_old_golden_files("1.1", 1); }

}  // namespace
}  // namespace gcz

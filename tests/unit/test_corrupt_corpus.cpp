// The hostile-file corpus of tests/corrupt/ (made by tests/corrupt/make_corpus.py): every .gcz file
// that breaks a FORMAT.md §6 rule is rejected with that rule's StatusCode and a message
// "PATH: [tensor 'NAME': ]RULE: detail"; the valid ones open, verify and decode; hostile tensor dumps
// are refused by open_tensor_file; and no truncation or single-bit flip of a valid file crashes the
// reader or slips through.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "scratch_dir.h"
#include "gcz/container.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

const fs::path kCorrupt = fs::path(GCZ_SOURCE_DIR) / "tests" / "corrupt";

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Overwrites one byte of an existing file in place.
void put_byte(const fs::path& p, std::size_t pos, char value) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(pos));
  f.put(value);
}

// The rule names of FORMAT.md §6, read from the spec itself: the first `code` cell of each table row.
const std::vector<std::string>& spec_rules() {
  static const std::vector<std::string> rules = [] {
    std::vector<std::string> out;
    std::istringstream in(read_text(fs::path(GCZ_SOURCE_DIR) / "docs" / "FORMAT.md"));
    bool in_section = false;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("## ", 0) == 0) in_section = line.rfind("## 6.", 0) == 0;
      if (!in_section || line.rfind("| `", 0) != 0) continue;
      const std::size_t end = line.find('`', 3);
      if (end != std::string::npos) out.push_back(line.substr(3, end - 3));
    }
    return out;
  }();
  return rules;
}

// "RULE" or "RULE-VARIANT" -> RULE (the longest rule that fits); "" when none does.
std::string rule_of(const std::string& stem) {
  std::string best;
  for (const std::string& r : spec_rules()) {
    if ((stem == r || stem.rfind(r + "-", 0) == 0) && r.size() > best.size()) best = r;
  }
  return best;
}

StatusCode code_of(const std::string& rule) {
  if (rule == "bad-version" || rule == "unknown-codec") return StatusCode::kUnsupported;
  if (rule == "index-checksum" || rule == "stream-checksum") return StatusCode::kChecksumMismatch;
  return StatusCode::kFormatError;
}

// The rule named by a message of the form "PATH: [tensor 'NAME': ]RULE: detail", or "".
std::string rule_in_message(const std::string& message, const std::string& path) {
  if (message.rfind(path + ": ", 0) != 0) return "";
  std::string rest = message.substr(path.size() + 2);
  if (rest.rfind("tensor '", 0) == 0) {
    // The tensor name may hold anything; the rule follows the last "': " before a known rule.
    for (std::size_t p = rest.find("': "); p != std::string::npos; p = rest.find("': ", p + 1)) {
      const std::string tail = rest.substr(p + 3);
      for (const std::string& r : spec_rules()) {
        if (tail.rfind(r + ": ", 0) == 0) return r;
      }
    }
    return "";
  }
  for (const std::string& r : spec_rules()) {
    if (rest.rfind(r + ": ", 0) == 0) return r;
  }
  return "";
}

std::vector<std::string> files_in(const fs::path& dir, const std::string& ext) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && (ext.empty() || e.path().extension() == ext)) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_valid_name(const std::string& file) { return file.rfind("valid", 0) == 0; }

std::vector<std::string> bad_gcz_files() {
  std::vector<std::string> out;
  for (const std::string& f : files_in(kCorrupt / "gcz", ".gcz")) {
    if (!is_valid_name(f)) out.push_back(f);
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

// Reads every stream of every tensor to its end through open_stream/read; returns the decoded bytes.
Status read_all_streams(const GczReader& reader, std::vector<std::string>* decoded) {
  const auto& tensors = reader.index().tensors;
  std::vector<char> buf;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    for (std::size_t s = 0; s < tensors[t].streams.size(); ++s) {
      auto cursor = reader.open_stream(t, s);
      if (!cursor) return cursor.status();
      const uint64_t size = tensors[t].streams[s].size;
      std::string out;
      for (uint64_t done = 0; done < size;) {
        const uint64_t n = std::min<uint64_t>(size - done, 4096);
        buf.resize(n);
        Status st = (*cursor)->read(buf.data(), n);
        if (!st) return st;
        out.append(buf.data(), n);
        done += n;
      }
      if (decoded) decoded->push_back(std::move(out));
    }
  }
  return Status::ok();
}

// open, then verify, then every stream decoded, then every tensor through its codec: the first
// failure, or ok.
Status open_verify_decode(const std::string& path, std::vector<std::string>* decoded = nullptr) {
  auto reader = GczReader::open(path);
  if (!reader) return reader.status();
  GCZ_RETURN_IF_ERROR((*reader)->verify(nullptr));
  GCZ_RETURN_IF_ERROR(read_all_streams(**reader, decoded));
  for (std::size_t t = 0; t < (*reader)->index().tensors.size(); ++t) {
    GCZ_RETURN_IF_ERROR(check_tensor_data(**reader, t));
  }
  return Status::ok();
}

fs::path fresh_dir(const std::string& name) { return gcz::testing::scratch_dir("corrupt_" + name); }

// ------------------------------------------------------------------------------------------------

TEST(CorruptCorpus, EveryRuleOfTheSpecHasAFile) {
  ASSERT_EQ(spec_rules().size(), 22u) << "FORMAT.md §6 table not found or changed";
  const auto files = files_in(kCorrupt / "gcz", ".gcz");
  ASSERT_FALSE(files.empty()) << "no corpus under " << kCorrupt << ": run tests/corrupt/make_corpus.py";
  for (const std::string& r : spec_rules()) {
    EXPECT_TRUE(fs::exists(kCorrupt / "gcz" / (r + ".gcz"))) << "no corpus file for rule " << r;
  }
  for (const std::string& f : files) {
    const std::string stem = fs::path(f).stem().string();
    EXPECT_TRUE(is_valid_name(f) || !rule_of(stem).empty()) << f << " is named after no FORMAT.md §6 rule";
  }
}

class CorruptGcz : public ::testing::TestWithParam<std::string> {
 protected:
  std::string path() const { return (kCorrupt / "gcz" / GetParam()).string(); }
  std::string rule() const { return rule_of(fs::path(GetParam()).stem().string()); }
  void expect_rejected(const Status& s, const std::string& what) const {
    ASSERT_FALSE(s.is_ok()) << what << ": " << GetParam() << " was accepted (it breaks " << rule() << ")";
    EXPECT_EQ(s.code(), code_of(rule())) << what << ": " << s.message();
    EXPECT_NE(s.message().find(path()), std::string::npos) << what << ": no file path in: " << s.message();
    EXPECT_EQ(rule_in_message(s.message(), path()), rule())
        << what << ": expected 'PATH: [tensor 'NAME': ]" << rule() << ": ...', got: " << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << what << ": message is not one line";
  }
};

TEST_P(CorruptGcz, OpenVerifyAndDecodeFailWithTheRule) {
  expect_rejected(open_verify_decode(path()), "open+verify+decode");
}

// Without verify: decoding alone must catch every rule but the padding one (which only verify checks).
TEST_P(CorruptGcz, DecodingWithoutVerifyFailsWithTheRule) {
  auto reader = GczReader::open(path());
  Status s = reader ? read_all_streams(**reader, nullptr) : reader.status();
  for (std::size_t t = 0; s && t < (*reader)->index().tensors.size(); ++t) s = check_tensor_data(**reader, t);
  if (rule() == "nonzero-padding") {
    if (!s.is_ok()) expect_rejected(s, "decode");
    return;
  }
  expect_rejected(s, "open+decode");
}

// decode_file (what `gcz decode` runs) fails the same way and leaves nothing in the output directory.
TEST_P(CorruptGcz, DecodeFileFailsAndLeavesNoFile) {
  const fs::path dir = fresh_dir("decode_" + param_name({GetParam(), 0}));
  DecodeOptions o;
  o.device = DeviceRequest::kCpu;
  Status s = decode_file(path(), (dir / "out.safetensors").string(), o);
  if (rule() == "nonzero-padding" && s.is_ok()) {
    fs::remove_all(dir);
    return;
  }
  expect_rejected(s, "decode_file");
  if (!s.is_ok()) EXPECT_TRUE(fs::is_empty(dir)) << "decode_file failed but left files behind for " << GetParam();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Corrupt, CorruptGcz, ::testing::ValuesIn(bad_gcz_files()), param_name);

TEST(CorruptCorpus, ValidFilesOpenVerifyAndDecode) {
  int n = 0;
  for (const std::string& f : files_in(kCorrupt / "gcz", ".gcz")) {
    if (!is_valid_name(f)) continue;
    ++n;
    Status s = open_verify_decode((kCorrupt / "gcz" / f).string());
    EXPECT_TRUE(s.is_ok()) << f << ": " << s.message();
  }
  EXPECT_GE(n, 1);
}

TEST(CorruptCorpus, ValidGczHoldsWhatTheScriptWrote) {
  const std::string path = (kCorrupt / "gcz" / "valid.gcz").string();
  auto reader = GczReader::open(path);
  ASSERT_TRUE(reader) << reader.status().message();
  const FileIndex& idx = (*reader)->index();
  ASSERT_EQ(idx.tensors.size(), 3u);
  EXPECT_EQ(idx.tensors[0].info.name, "layer0.weight");
  EXPECT_EQ(idx.tensors[0].info.dtype, DType::kFloat32);
  EXPECT_EQ(idx.tensors[0].info.shape, (Shape{2, 3}));
  EXPECT_EQ(idx.tensors[1].info.dtype, DType::kFloat16);
  EXPECT_EQ(idx.tensors[1].streams[0].encoding, StreamEncoding::kZstd);
  EXPECT_EQ(idx.tensors[2].info.shape, Shape{});
  EXPECT_EQ(idx.metadata.at("step"), "0");
  std::vector<std::string> streams;
  Status s = read_all_streams(**reader, &streams);
  ASSERT_TRUE(s) << s.message();
  ASSERT_EQ(streams.size(), 3u);
  const uint16_t a[6] = {0x3800, 0xBD00, 0x4000, 0x0000, 0x8000, 0x7BFF};  // 0.5 -1.25 2 0 -0 65504
  EXPECT_EQ(streams[0], std::string(reinterpret_cast<const char*>(a), sizeof a));
  ASSERT_EQ(streams[1].size(), 80u);
  uint16_t b0 = 0;
  std::memcpy(&b0, streams[1].data(), 2);
  EXPECT_EQ(b0, 0x3C00);  // 1.0
  EXPECT_EQ(streams[1].substr(16), std::string(64, '\0'));
  double c = 0;
  ASSERT_EQ(streams[2].size(), 8u);
  std::memcpy(&c, streams[2].data(), 8);
  EXPECT_EQ(c, 0.125);
}

// ------------------------------------------------------------------------------------------------
// Hostile tensor dumps.

TEST(CorruptInputs, OpenTensorFileRefusesEveryInput) {
  const auto files = files_in(kCorrupt / "inputs", "");
  ASSERT_GE(files.size(), 10u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const std::string path = (kCorrupt / "inputs" / f).string();
    ReadOptions opt;
    if (fs::path(f).extension() == ".bin") {
      opt.raw_dtype = DType::kFloat32;
      opt.raw_shape = Shape{3, 3};
    }
    Status s = Status::ok();
    auto in = open_tensor_file(path, opt);
    if (in && (*in)->tensors().empty()) {
      // Opened with its one array skipped (a .npy of integers, as in a directory): the encoder refuses
      // an input with nothing else in it (exit 5, the README's code), as the CLI tests check.
      EXPECT_NE(f.find("int-dtype"), std::string::npos) << "opened with no tensor to read";
      EXPECT_EQ((*in)->skipped().size(), 1u);
      continue;
    }
    if (!in) {
      s = in.status();
    } else {
      // Whatever opened must fail on reading, without allocating what a hostile header claims.
      for (std::size_t i = 0; s.is_ok() && i < (*in)->tensors().size(); ++i) {
        const TensorInfo& t = (*in)->tensors()[i];
        auto bytes = t.byte_size();
        ASSERT_TRUE(bytes) << bytes.status().message();
        ASSERT_LE(*bytes, fs::file_size(path)) << "tensor '" << t.name << "' claims more bytes than the file has";
        auto src = (*in)->open(i);
        if (!src) {
          s = src.status();
          break;
        }
        std::vector<char> buf(*bytes);
        s = (*src)->read(0, *t.numel(), buf.data());
      }
    }
    ASSERT_FALSE(s.is_ok()) << "accepted";
    // As tests/corrupt/README.md lists them: exit 5 for what gcz does not handle, 4 for what breaks a rule.
    const bool unsupported = f.find("int-dtype") != std::string::npos || f.find("version") != std::string::npos;
    const StatusCode want = unsupported ? StatusCode::kUnsupported : StatusCode::kFormatError;
    EXPECT_EQ(s.code(), want) << s.message();
    EXPECT_NE(s.message().find(path), std::string::npos) << "no file path in: " << s.message();
  }
}

// ------------------------------------------------------------------------------------------------
// Sweeps over the valid files.

TEST(CorruptSweep, EveryTruncationOfAValidFileIsRejected) {
  const fs::path dir = fresh_dir("truncate");
  const fs::path p = dir / "t.gcz";
  for (const std::string& f : {"valid.gcz", "valid-empty.gcz", "valid-minor-version.gcz"}) {
    const std::string full = read_text(kCorrupt / "gcz" / f);
    ASSERT_FALSE(full.empty());
    write_bytes(p, full);
    // Shrinking one file in place is much cheaper than writing every prefix anew.
    for (std::size_t n = full.size(); n-- > 0;) {
      fs::resize_file(p, n);
      auto r = GczReader::open(p.string());
      ASSERT_FALSE(r) << f << " truncated to " << n << " bytes was accepted";
      ASSERT_NE(r.status().code(), StatusCode::kInternal) << r.status().message();
      ASSERT_FALSE(rule_in_message(r.status().message(), p.string()).empty())
          << f << " truncated to " << n << ": no rule in: " << r.status().message();
    }
  }
  fs::remove_all(dir);
}

// Every single-bit flip of valid.gcz is caught by open, verify or decoding, naming a rule, except in
// version_minor (bytes 10-11), which a reader MUST accept whatever it is; there the file must still
// decode to exactly the original bytes.
TEST(CorruptSweep, EveryBitFlipOfValidGczIsCaughtOrHarmless) {
  const std::string original = read_text(kCorrupt / "gcz" / "valid.gcz");
  ASSERT_FALSE(original.empty());
  std::vector<std::string> want;
  Status base = open_verify_decode((kCorrupt / "gcz" / "valid.gcz").string(), &want);
  ASSERT_TRUE(base) << base.message();
  const fs::path dir = fresh_dir("bitflip");
  const std::string p = (dir / "f.gcz").string();
  write_bytes(p, original);
  int passed = 0;
  for (std::size_t pos = 0; pos < original.size(); ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      put_byte(p, pos, static_cast<char>(original[pos] ^ (1 << bit)));
      std::vector<std::string> got;
      Status s = open_verify_decode(p, &got);
      put_byte(p, pos, original[pos]);
      const bool harmless = pos == 10 || pos == 11;
      if (harmless) {
        ASSERT_TRUE(s) << "flip of bit " << bit << " of version_minor rejected: " << s.message();
        ASSERT_EQ(got, want) << "flip at " << pos << " changed the decoded bytes";
        ++passed;
        continue;
      }
      ASSERT_FALSE(s.is_ok()) << "flip of bit " << bit << " at byte " << pos << " was not detected";
      ASSERT_NE(s.code(), StatusCode::kInternal) << s.message();
      ASSERT_FALSE(rule_in_message(s.message(), p).empty())
          << "flip of bit " << bit << " at byte " << pos << ": no rule in: " << s.message();
    }
  }
  EXPECT_EQ(passed, 16);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gcz

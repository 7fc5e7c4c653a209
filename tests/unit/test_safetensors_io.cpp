// .safetensors reading and writing: every float dtype (bfloat16 natively), skipped non-float tensors,
// metadata, header padding, and hostile headers (lengths, offsets, overlaps, duplicates, bad JSON).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"
#include "scratch_dir.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

json entry(const char* dtype, const Shape& shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

class SafetensorsTest : public gcz::testing::ScratchDirTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

  template <class T>
  std::vector<T> read_all(TensorFileReader& reader, std::size_t i) {
    auto src = reader.open(i);
    EXPECT_TRUE(src) << src.status().message();
    if (!src) return {};
    std::vector<T> out((*src)->info().numel().value());
    const Status s = (*src)->read(0, out.size(), out.data());
    EXPECT_TRUE(s.is_ok()) << s.message();
    return out;
  }

  // Opens bytes that must be rejected with kFormatError and a message naming the file (and `needle`).
  void expect_format_error(const std::string& bytes, const std::string& needle) {
    const std::string p = write("bad.safetensors", bytes);
    auto r = open_tensor_file(p, {});
    ASSERT_FALSE(r) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kFormatError) << r.status().message();
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }

};

TEST_F(SafetensorsTest, ReadsEveryFloatDtypeAndSkipsOthers) {
  const std::vector<float> f32 = {1, 2, 3, 4, 5, 6};
  const std::vector<double> f64 = {-1.5};
  const std::vector<uint16_t> f16 = {0x3C00, 0x4000};
  const std::vector<uint16_t> bf16 = {0x3F80, 0x4040, 0xBF80};
  std::string data = bytes_of(f32) + bytes_of(f64) + bytes_of(f16) + bytes_of(bf16) + std::string(8 + 3 + 2, '\x01');
  json h;
  h["__metadata__"] = {{"format", "pt"}};
  h["w"] = entry("F32", {2, 3}, 0, 24);
  h["d"] = entry("F64", {}, 24, 32);
  h["h"] = entry("F16", {2}, 32, 36);
  h["b"] = entry("BF16", {3}, 36, 42);
  h["step"] = entry("I64", {1}, 42, 50);
  h["mask"] = entry("BOOL", {3}, 50, 53);
  h["q"] = entry("F8_E4M3", {2}, 53, 55);
  auto r = open_tensor_file(write("m.safetensors", safetensors_bytes(h.dump(), data)), {});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->format(), TensorFileFormat::kSafetensors);
  const auto& t = (*r)->tensors();
  ASSERT_EQ(t.size(), 4u);  // in data order
  EXPECT_EQ(t[0].name, "w");
  EXPECT_EQ(t[0].shape, (Shape{2, 3}));
  EXPECT_EQ(t[1].name, "d");
  EXPECT_EQ(t[1].shape, Shape{});
  EXPECT_EQ(t[2].dtype, DType::kFloat16);
  EXPECT_EQ(t[3].dtype, DType::kBFloat16);
  EXPECT_EQ(read_all<float>(**r, 0), f32);
  EXPECT_EQ(read_all<double>(**r, 1), f64);
  EXPECT_EQ(read_all<uint16_t>(**r, 2), f16);
  EXPECT_EQ(read_all<uint16_t>(**r, 3), bf16);

  const auto& s = (*r)->skipped();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].name, "step");
  EXPECT_EQ(s[0].reason, "dtype I64 is not floating");
  EXPECT_EQ(s[1].name, "mask");
  EXPECT_EQ(s[2].name, "q");
  EXPECT_NE(s[2].reason.find("not supported"), std::string::npos);
}

TEST_F(SafetensorsTest, ReadsEmptyTensorsAndHeaderWithoutData) {
  json h;
  h["e"] = entry("F32", {0, 4}, 0, 0);
  h["f"] = entry("F16", {0}, 0, 0);
  auto r = open_tensor_file(write("e.safetensors", safetensors_bytes(h.dump(), "")), {});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 2u);
  EXPECT_TRUE(read_all<float>(**r, 0).empty());

  auto none = open_tensor_file(write("n.safetensors", safetensors_bytes("{}", "")), {});
  ASSERT_TRUE(none);
  EXPECT_TRUE((*none)->tensors().empty());
}

TEST_F(SafetensorsTest, WriterRoundTripsWithBfloat16) {
  const std::vector<uint16_t> bf = {0x3F80, 0x4000, 0xC000, 0x0001};
  const std::vector<float> f = {0.5f, 1.5f, 2.5f};
  const std::vector<double> d = {7};
  const std::vector<TensorInfo> infos = {{"model.layers.0.weight", DType::kBFloat16, {2, 2}},
                                         {"bias", DType::kFloat32, {3}},
                                         {"scale", DType::kFloat64, {}},
                                         {"none", DType::kFloat16, {0}}};
  const std::string p = dir_ + "/out.safetensors";
  auto w = create_tensor_file(p, infos, {});
  ASSERT_TRUE(w) << w.status().message();
  ASSERT_TRUE((*w)->begin(0).is_ok() && (*w)->write(bf.data(), 1).is_ok() && (*w)->write(bf.data() + 1, 3).is_ok() &&
              (*w)->end().is_ok());
  ASSERT_TRUE((*w)->begin(1).is_ok() && (*w)->write(f.data(), 3).is_ok() && (*w)->end().is_ok());
  ASSERT_TRUE((*w)->begin(2).is_ok() && (*w)->write(d.data(), 1).is_ok() && (*w)->end().is_ok());
  ASSERT_TRUE((*w)->begin(3).is_ok() && (*w)->end().is_ok());
  EXPECT_FALSE(fs::exists(p));
  ASSERT_TRUE((*w)->finish().is_ok());

  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padded with spaces only
  const json h = json::parse(header);
  EXPECT_EQ(h["model.layers.0.weight"]["dtype"], "BF16");
  EXPECT_EQ(h["bias"]["data_offsets"], json({8, 20}));
  EXPECT_EQ(bytes.size(), 8 + n + 8 + 12 + 8);

  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 4u);
  EXPECT_EQ((*r)->tensors()[0].dtype, DType::kBFloat16);
  EXPECT_EQ(read_all<uint16_t>(**r, 0), bf);
  EXPECT_EQ(read_all<float>(**r, 1), f);
  EXPECT_EQ(read_all<double>(**r, 2), d);
}

// __metadata__: strings read into metadata() and written back from WriteOptions; anything else in
// it is refused, as the format's own library refuses it.
TEST_F(SafetensorsTest, MetadataIsReadAndWrittenAndMustBeStrings) {
  const std::string data(8, '\0');
  const std::string tensor = "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
  auto r = open_tensor_file(
      write("m.safetensors", safetensors_bytes("{\"__metadata__\":{\"step\":\"3\",\"a\":\"\"}," + tensor + "}", data)),
      {});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->metadata(), (std::map<std::string, std::string>{{"a", ""}, {"step", "3"}}));
  EXPECT_EQ((*r)->tensors().size(), 1u);
  for (const std::string& bad : {"[\"x\"]", "{\"step\":3}", "{\"step\":null}", "{\"k\":{\"x\":\"y\"}}", "\"s\""}) {
    SCOPED_TRACE(bad);
    expect_format_error(safetensors_bytes("{\"__metadata__\":" + bad + "," + tensor + "}", data), "__metadata__");
  }
  auto plain = open_tensor_file(write("p.safetensors", safetensors_bytes("{" + tensor + "}", data)), {});
  ASSERT_TRUE(plain);
  EXPECT_TRUE((*plain)->metadata().empty());

  WriteOptions o;
  o.safetensors_metadata = {{"step", "3"}, {"note", "\u00e9t\u00e9"}};
  const std::string p = dir_ + "/mw.safetensors";
  auto w = create_tensor_file(p, {{"w", DType::kFloat32, {1}}}, o);
  ASSERT_TRUE(w) << w.status().message();
  const float one = 1;
  ASSERT_TRUE((*w)->begin(0).is_ok() && (*w)->write(&one, 1).is_ok() && (*w)->end().is_ok() && (*w)->finish().is_ok());
  auto back = open_tensor_file(p, {});
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ((*back)->metadata(), o.safetensors_metadata);
  EXPECT_EQ(read_all<float>(**back, 0), std::vector<float>{1});
}

TEST_F(SafetensorsTest, WriterRejectsReservedName) {
  auto w = create_tensor_file(dir_ + "/x.safetensors", {{"__metadata__", DType::kFloat32, {1}}}, {});
  ASSERT_FALSE(w);
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find(dir_ + "/x.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, RejectsBadHeaderLengths) {
  expect_format_error("\x01\x02\x03", "too short");
  expect_format_error(le64(1000) + "{}", "runs past the end of the file");
  expect_format_error(le64(uint64_t{1} << 62) + "{}", "100 MiB");
  expect_format_error(le64(~uint64_t{0}) + "{}", "100 MiB");
}

TEST_F(SafetensorsTest, RejectsBadJson) {
  expect_format_error(safetensors_bytes("{\"a\": ", ""), "not valid JSON");
  expect_format_error(safetensors_bytes("[1, 2]", ""), "not a JSON object");
  expect_format_error(safetensors_bytes("{\"a\": 5}", ""), "tensor 'a'");
  expect_format_error(safetensors_bytes("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", std::string(4, '\0')),
                      "data_offsets");
  expect_format_error(
      safetensors_bytes(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", std::string(4, '\0')),
      "shape dimension");
  expect_format_error(
      safetensors_bytes(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", std::string(4, '\0')),
      "shape dimension");
  const std::string dup = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                              "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  expect_format_error(safetensors_bytes(dup, std::string(8, '\0')), "tensor 'a': duplicate name in the header");
  // A field twice in an entry: which one counts would be up to the parser (the reference refuses it).
  const std::string field = R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})";
  expect_format_error(safetensors_bytes(field, std::string(4, '\0')),
                      "tensor 'a': an object of the safetensors header has the key 'dtype' twice");
  // __metadata__ is free-form: a key twice there is read (the last counts), as the reference does.
  const std::string meta =
      R"({"__metadata__": {"k": "1", "k": "2"}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_TRUE(open_tensor_file(write("meta.safetensors", safetensors_bytes(meta, std::string(4, '\0'))), {}));
  const std::string deep = "{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}";
  expect_format_error(safetensors_bytes(deep, ""),
                      "tensor 'a': arrays and objects in the safetensors header nest more");
}

TEST_F(SafetensorsTest, RejectsBadOffsets) {
  auto with = [](const json& h, std::size_t data_bytes) {
    return safetensors_bytes(h.dump(), std::string(data_bytes, '\0'));
  };
  expect_format_error(with({{"a", entry("F32", {4}, 0, 16)}}, 8), "run past the data section");
  expect_format_error(with({{"a", entry("F32", {4}, 8, 4)}}, 16), "begin after end");
  expect_format_error(with({{"a", entry("F32", {4}, 0, 12)}}, 16), "needs 16");
  expect_format_error(with({{"a", entry("I64", {4}, 0, 8)}}, 16), "needs 32");  // checked for skipped dtypes too
  expect_format_error(with({{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 4, 12)}}, 16), "overlap");
  // At the boundaries: one byte shared, one byte past the end (of a dtype whose size gcz does not know).
  expect_format_error(with({{"a", entry("U8", {8}, 0, 8)}, {"b", entry("U8", {8}, 7, 15)}}, 15),
                      "tensor 'b': data_offsets overlap those of tensor 'a'");
  expect_format_error(with({{"a", entry("F32", {1}, 0, 4)}, {"b", entry("I4", {2}, 4, 9)}}, 8),
                      "tensor 'b': data_offsets [4, 9] run past the data section (8 bytes)");
  expect_format_error(
      with({{"a", entry("F32", {1, 1}, 0, 4)}, {"b", entry("F32", {uint64_t{1} << 40, uint64_t{1} << 40}, 4, 8)}}, 8),
      "2^48");
  // The ranges tile the data section, as the reference implementation requires: no gap before,
  // between or after them. An empty tensor's range may point anywhere in it.
  expect_format_error(with({{"a", entry("F32", {1}, 4, 8)}}, 8),
                      "tensor 'a': data_offsets begin at 4, leaving bytes 0..3");
  expect_format_error(with({{"a", entry("F32", {1}, 0, 4)}, {"b", entry("F32", {1}, 8, 12)}}, 12),
                      "tensor 'b': data_offsets begin at 8, leaving bytes 4..7 of the data section to no tensor");
  expect_format_error(with({{"a", entry("F32", {1}, 0, 4)}}, 7), "the data section's last 3 bytes (from offset 4)");
  expect_format_error(with(json::object(), 2), "the data section's last 2 bytes (from offset 0)");
  EXPECT_TRUE(open_tensor_file(
      write(
          "empty_inside.safetensors",
          with({{"a", entry("F32", {2}, 0, 8)}, {"e", entry("F32", {0, 3}, 4, 4)}, {"z", entry("F32", {0}, 8, 8)}}, 8)),
      {}));
  // An empty tensor's nonzero dimensions are bounded as a full tensor's are.
  expect_format_error(with({{"e", entry("F32", {0, (uint64_t{1} << 48) + 1}, 0, 0)}}, 0),
                      "the product of its nonzero dimensions exceeds 2^48");
  EXPECT_TRUE(open_tensor_file(write("empty_at_limit.safetensors",
                                     with({{"e", entry("F32", {uint64_t{1} << 24, 0, uint64_t{1} << 24}, 0, 0)}}, 0)),
                               {}));
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The encoder reads a mapped payload in place when its elements are aligned (TensorSource::view)
// and copies it otherwise: the same tensor behind an aligned and a misaligned payload offset (the
// header padded with spaces) gives one view and one copy, and the same .gcz bytes, for a chunked
// and a whole-tensor codec, over several chunks.
TEST_F(SafetensorsTest, AlignedPayloadIsReadInPlaceAndEncodesAsACopyWould) {
  const uint64_t n = 5000;
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = std::sin(0.01f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 7));
  std::string header = json{{"w", entry("F32", {n}, 0, 4 * n)}}.dump();
  auto padded = [&](uint64_t remainder) {  // (8 + header length) mod 8 == remainder
    std::string h = header;
    while ((8 + h.size()) % 8 != remainder) h += ' ';
    return h;
  };
  const std::string aligned = write("aligned.safetensors", safetensors_bytes(padded(0), bytes_of(v)));
  const std::string misaligned = write("misaligned.safetensors", safetensors_bytes(padded(2), bytes_of(v)));

  for (const std::string* path : {&aligned, &misaligned}) {
    auto reader = open_tensor_file(*path, {});
    ASSERT_TRUE(reader) << reader.status().message();
    auto src = (*reader)->open(0);
    ASSERT_TRUE(src) << src.status().message();
    const std::byte* view = (*src)->view(10, n - 10);
    if (path == &aligned) {
      ASSERT_NE(view, nullptr);
      EXPECT_EQ(std::memcmp(view, v.data() + 10, 4 * (n - 10)), 0);
      EXPECT_EQ((*src)->view(10, n), nullptr);  // past the end: no view (read() reports the error)
    } else {
      EXPECT_EQ(view, nullptr);
    }
  }
  for (const char* spec : {"qsgd:group=100", "terngrad"}) {
    EncodeOptions o;
    o.spec = spec;
    o.threads = 2;
    o.chunk_elements = 1500;  // several chunks (a whole-tensor codec takes one)
    std::string out[2];
    for (int k = 0; k < 2; ++k) {
      const std::string gcz_path = dir_ + "/" + std::to_string(k) + ".gcz";
      auto r = encode_files({k == 0 ? aligned : misaligned}, gcz_path, o);
      ASSERT_TRUE(r) << r.status().message();
      out[k] = file_bytes(gcz_path);
    }
    ASSERT_FALSE(out[0].empty());
    EXPECT_EQ(out[0], out[1]) << spec;
  }
}

}  // namespace
}  // namespace gcz

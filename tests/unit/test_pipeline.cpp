// encode_files / decode_file end to end through real files: codec x dtype x shape round trips,
// determinism, chunking, rules, and the no-partial-output guarantee.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <tuple>

#include "gcz/codec.h"
#include "gcz/container.h"
#include "gcz/convert.h"
#include "gcz/detail/cast_codec.h"
#include "gcz/pipeline.h"
#include "scratch_dir.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) { return gcz::testing::scratch_dir("pipeline_" + name); }

// Deterministic test values in `dtype`, beginning with special values the codecs must carry.
ByteBuffer make_values(DType dtype, uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double specials[] = {0.0, -0.0, 1.0, -1.5, 65504.0, 65520.0, 1e-7, -3e-8, 1e38, 6e-8,
                             std::numeric_limits<double>::infinity(), std::nan("")};
  std::vector<double> v(n);
  for (uint64_t i = 0; i < n; ++i) {
    v[i] = i < std::size(specials) ? specials[i] : normal(rng) * std::pow(10.0, static_cast<int>(rng() % 9) - 6);
  }
  ByteBuffer out(n * dtype_size(dtype));
  convert_elements(DType::kFloat64, v.data(), dtype, out.data(), n);
  return out;
}

struct Case {
  std::string name;
  DType dtype;
  Shape shape;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::vector<Shape> shapes = {{}, {0}, {1}, {7}, {3, 5}, {0, 4}, {257, 33}};
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    for (std::size_t s = 0; s < shapes.size(); ++s) {
      out.push_back({std::string(dtype_name(d)) + "_" + std::to_string(s), d, shapes[s]});
    }
  }
  return out;
}

// Writes `cs` with their values to a .safetensors file.
void write_inputs(const fs::path& path, const std::vector<Case>& cs, std::vector<ByteBuffer>& values) {
  std::vector<TensorInfo> infos;
  for (const Case& c : cs) infos.push_back({c.name, c.dtype, c.shape});
  auto w = create_tensor_file(path.string(), infos, {});
  ASSERT_TRUE(w) << w.status().message();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const uint64_t n = *infos[i].numel();
    values.push_back(make_values(cs[i].dtype, n, static_cast<uint32_t>(i)));
    ASSERT_TRUE((*w)->begin(i));
    ASSERT_TRUE((*w)->write(values.back().data(), n));
    ASSERT_TRUE((*w)->end());
  }
  ASSERT_TRUE((*w)->finish());
}

ByteBuffer read_tensor(TensorFileReader& r, std::size_t i) {
  const TensorInfo& t = r.tensors()[i];
  ByteBuffer out(*t.byte_size());
  auto src = r.open(i);
  EXPECT_TRUE(src) << src.status().message();
  if (src) {
    Status s = (*src)->read(0, *t.numel(), out.data());
    EXPECT_TRUE(s) << s.message();
  }
  return out;
}

// What a cast codec must decode to: x converted to the stored dtype and back.
ByteBuffer expected_cast(const std::string& codec, DType dtype, const ByteBuffer& x) {
  const DType stored = detail::cast_codec_target(codec)->value_or(dtype);
  const uint64_t n = x.size() / dtype_size(dtype);
  ByteBuffer mid(n * dtype_size(stored)), out(x.size());
  convert_elements(dtype, x.data(), stored, mid.data(), n);
  convert_elements(stored, mid.data(), dtype, out.data(), n);
  return out;
}

std::vector<char> file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class CastRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(CastRoundTrip, EveryDtypeAndShapeDecodesToTheCastValues) {
  const fs::path d = temp_dir("rt_" + std::to_string(std::hash<std::string>{}(GetParam())));
  const std::vector<Case> cs = cases();
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", cs, values);
  EncodeOptions o;
  o.spec = GetParam();
  o.device = DeviceRequest::kCpu;
  o.chunk_elements = 100;  // several chunks for the larger tensors
  auto report = encode_files({(d / "in.safetensors").string()}, (d / "x.gcz").string(), o);
  ASSERT_TRUE(report) << report.status().message();
  ASSERT_EQ(report->tensors.size(), cs.size());
  EXPECT_EQ(report->total.bytes_out, fs::file_size(d / "x.gcz"));

  DecodeOptions dopt;
  dopt.device = DeviceRequest::kCpu;
  ASSERT_TRUE(decode_file((d / "x.gcz").string(), (d / "out.safetensors").string(), dopt));
  auto out = open_tensor_file((d / "out.safetensors").string(), {});
  ASSERT_TRUE(out) << out.status().message();
  ASSERT_EQ((*out)->tensors().size(), cs.size());
  const std::string codec = GetParam().substr(0, GetParam().find('+'));
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const TensorInfo& t = (*out)->tensors()[i];
    EXPECT_EQ(t.name, cs[i].name);
    EXPECT_EQ(t.dtype, cs[i].dtype);
    EXPECT_EQ(t.shape, cs[i].shape);
    EXPECT_EQ(read_tensor(**out, i), expected_cast(codec, cs[i].dtype, values[i])) << cs[i].name;
    const Metrics& m = report->tensors[i].metrics;
    if (codec == "none") EXPECT_EQ(m.rel_l2, 0.0) << cs[i].name;
    uint64_t nonfinite = 0;
    for (uint64_t k = 0; k < m.numel; ++k) nonfinite += !std::isfinite(element_as_double(t.dtype, values[i].data(), k));
    EXPECT_EQ(m.nonfinite, nonfinite) << cs[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, CastRoundTrip,
                         ::testing::Values("none", "fp32", "fp16", "bf16", "fp16+zstd", "bf16+zstd:level=7",
                                           "none+zstd:level=1"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(Pipeline, OutputIsDeterministicAndIndependentOfChunking) {
  const fs::path d = temp_dir("det");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", {{"a", DType::kFloat32, {1000, 10}}, {"b", DType::kFloat64, {333}}}, values);
  EncodeOptions o;
  o.device = DeviceRequest::kCpu;
  for (const char* spec : {"fp16", "bf16"}) {
    o.spec = spec;
    o.chunk_elements = 1 << 24;
    ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, (d / "one.gcz").string(), o));
    ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, (d / "again.gcz").string(), o));
    o.chunk_elements = 64;
    ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, (d / "chunked.gcz").string(), o));
    EXPECT_EQ(file_bytes(d / "one.gcz"), file_bytes(d / "again.gcz")) << spec;
    EXPECT_EQ(file_bytes(d / "one.gcz"), file_bytes(d / "chunked.gcz")) << spec;
  }
}

TEST(Pipeline, BytesDoNotDependOnTheThreadCount) {
  const fs::path d = temp_dir("threads");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", {{"a", DType::kFloat32, {600000}}, {"b", DType::kBFloat16, {70000, 3}}}, values);
  EncodeOptions o;
  o.device = DeviceRequest::kCpu;
  // Chunked codecs, and whole-tensor codecs (threads inside the codec, metrics measured in pieces).
  for (const char* spec : {"fp16", "bf16+zstd", "qsgd:bits=4,group=100", "terngrad:scale=group,group=50+zstd",
                           "terngrad", "topk:ratio=0.01"}) {
    o.spec = spec;
    // Several chunks, each split over the threads; chunk starts on and off metric-block boundaries.
    for (uint64_t chunk : {uint64_t{1} << 17, uint64_t{100000}}) {
      o.chunk_elements = chunk;
      std::vector<std::vector<char>> files;
      for (unsigned threads : {1u, 2u, 3u}) {
        o.threads = threads;
        const fs::path out = d / ("t" + std::to_string(threads) + ".gcz");
        ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, out.string(), o));
        files.push_back(file_bytes(out));
      }
      EXPECT_EQ(files[0], files[1]) << spec << " chunk " << chunk;
      EXPECT_EQ(files[0], files[2]) << spec << " chunk " << chunk;
    }
  }
}

TEST(Pipeline, EvalMeasuresTheSameBytesItWouldWrite) {
  const fs::path d = temp_dir("eval");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", {{"w", DType::kFloat32, {64, 64}}}, values);
  EncodeOptions o;
  o.spec = "fp16+zstd";
  auto eval = encode_files({(d / "in.safetensors").string()}, "", o);
  auto enc = encode_files({(d / "in.safetensors").string()}, (d / "w.gcz").string(), o);
  ASSERT_TRUE(eval && enc);
  EXPECT_EQ(eval->total.bytes_out, enc->total.bytes_out);
  EXPECT_EQ(eval->total.rel_l2, enc->total.rel_l2);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 2);  // in + w.gcz
}

// Adaptive compression through the API: the levels' files measured in turn, the first that fits the
// budget encoding the step (rules applied on top), the last where none does; a bad level fails first.
TEST(Pipeline, AdaptiveLevelsAreTriedLightestFirstUntilOneFits) {
  const fs::path d = temp_dir("adaptive");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", {{"w", DType::kFloat32, {64, 64}}, {"b", DType::kFloat32, {64}}}, values);
  const std::vector<std::string> in = {(d / "in.safetensors").string()};
  EncodeOptions o;
  o.rules = {*parse_codec_rule("b=none")};
  std::vector<uint64_t> bytes;
  for (const char* spec : {"fp32", "fp16", "qsgd:bits=2"}) {
    o.spec = spec;
    auto r = encode_files(in, "", o);
    ASSERT_TRUE(r) << r.status().message();
    bytes.push_back(r->total.bytes_out);
  }
  o.levels = {"fp32", "fp16", "qsgd:bits=2"};
  for (const auto& [budget, level, fits] : {std::tuple{bytes[0], 0u, true}, std::tuple{bytes[0] - 1, 1u, true},
                                            std::tuple{bytes[2], 2u, true}, std::tuple{bytes[2] - 1, 2u, false}}) {
    o.budget = budget;
    const fs::path out = d / ("level" + std::to_string(budget) + ".gcz");
    auto r = encode_files(in, out.string(), o);
    ASSERT_TRUE(r) << r.status().message();
    ASSERT_TRUE(r->adaptive);
    EXPECT_EQ(r->adaptive->level, level) << budget;
    EXPECT_EQ(r->adaptive->fits, fits) << budget;
    EXPECT_EQ(r->adaptive->bytes, std::vector<uint64_t>(bytes.begin(), bytes.begin() + level + 1)) << budget;
    EXPECT_EQ(fs::file_size(out), bytes[level]);
    EXPECT_EQ(r->tensors[0].codec.rfind(o.levels[level], 0), 0u) << r->tensors[0].codec;
    EXPECT_EQ(r->tensors[1].codec, "none");
  }
  o.levels = {"fp16", "qsgd:bits=9"};
  auto bad = encode_files(in, (d / "bad.gcz").string(), o);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("--adapt 'qsgd:bits=9'"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(fs::exists(d / "bad.gcz"));
}

TEST(Pipeline, RulesAndMinNumelChooseCodecs) {
  const fs::path d = temp_dir("rules");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors",
               {{"fc.weight", DType::kFloat32, {40, 40}}, {"fc.bias", DType::kFloat32, {40}},
                {"embed.weight", DType::kFloat32, {50, 40}}, {"tiny", DType::kFloat32, {3}}},
               values);
  EncodeOptions o;
  o.spec = "fp16";
  o.rules = {*parse_codec_rule("*.bias=fp32"), *parse_codec_rule("embed.*=bf16+zstd"), *parse_codec_rule("*=none")};
  o.min_numel = 10;
  auto r = encode_files({(d / "in.safetensors").string()}, "", o);
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ(r->tensors.size(), 4u);
  EXPECT_EQ(r->tensors[0].codec, "none");  // "*=none" is the first rule matching fc.weight
  EXPECT_EQ(r->tensors[1].codec, "fp32");
  EXPECT_EQ(r->tensors[2].codec, "bf16+zstd:level=3");
  EXPECT_EQ(r->tensors[3].codec, "none");
  EXPECT_FALSE(parse_codec_rule("nospec"));
  EXPECT_FALSE(parse_codec_rule("*.bias=fp17:x=("));
}

TEST(Pipeline, BadSpecFailsBeforeAnythingIsWritten) {
  const fs::path d = temp_dir("badspec");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", {{"w", DType::kFloat32, {4}}}, values);
  EncodeOptions o;
  o.spec = "fp16";
  o.rules = {{"w", "fp17"}};
  auto r = encode_files({(d / "in.safetensors").string()}, (d / "out.gcz").string(), o);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("fp17"), std::string::npos);
  EXPECT_FALSE(fs::exists(d / "out.gcz"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1);
}

TEST(Pipeline, OutputsThatWouldBeClobberedAreRefusedBeforeAnyWork) {
  const fs::path d = temp_dir("clobber");
  std::vector<ByteBuffer> values;
  const fs::path in = d / "in.safetensors";
  write_inputs(in, {{"w", DType::kFloat32, {4}}}, values);
  const auto before = fs::file_size(in);
  auto r = encode_files({in.string()}, in.string(), {});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("also an input"), std::string::npos) << r.status().message();
  EXPECT_EQ(fs::file_size(in), before);
  fs::create_directory(d / "dir.gcz");
  r = encode_files({in.string()}, (d / "dir.gcz").string(), {});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("is a directory"), std::string::npos) << r.status().message();
  EXPECT_FALSE(check_output_path((d / "missing" / "o.gcz").string()));
  EXPECT_FALSE(check_output_path(""));
  EXPECT_TRUE(check_output_path((d / "o.gcz").string()));
  EncodeOptions o;
  o.threads = kMaxThreads + 1;
  EXPECT_FALSE(encode_files({in.string()}, "", o));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 2);  // in + dir.gcz
}

TEST(Pipeline, TheReportSaysWhatEachRuleDid) {
  const fs::path d = temp_dir("unmatched");
  std::vector<ByteBuffer> values;
  write_inputs(
      d / "in.safetensors",
      {{"fc.weight", DType::kFloat32, {200}}, {"fc.bias", DType::kFloat32, {4}}, {"out.bias", DType::kFloat32, {200}}},
      values);
  EncodeOptions o;
  o.min_numel = 100;
  o.rules = {*parse_codec_rule("out.*=fp32"), *parse_codec_rule("*.bias=bf16"), *parse_codec_rule("embed.*=bf16"),
             *parse_codec_rule("fc.*=none")};
  auto r = encode_files({(d / "in.safetensors").string()}, "", o);
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ(r->rules.size(), 4u);
  EXPECT_EQ(r->rules[0].rule, "out.*=fp32");
  EXPECT_TRUE(r->rules[0].matched && r->rules[0].applied);
  // *.bias matches out.bias (taken by the rule before) and fc.bias (below min_numel): it chose nothing.
  EXPECT_TRUE(r->rules[1].matched);
  EXPECT_FALSE(r->rules[1].applied);
  EXPECT_FALSE(r->rules[2].matched);
  EXPECT_TRUE(r->rules[3].matched && r->rules[3].applied);  // fc.weight
}

TEST(Pipeline, UnfinishedOutputsAreRemovedOnRequest) {
  const fs::path d = temp_dir("unfinished");
  auto gz = GczWriter::create((d / "a.gcz").string());
  ASSERT_TRUE(gz) << gz.status().message();
  auto npz = create_tensor_file((d / "b.npz").string(), {{"w", DType::kFloat32, {4}}}, {});
  ASSERT_TRUE(npz) << npz.status().message();
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 2);  // the two temporaries
  remove_unfinished_outputs();
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 0);
}

TEST(Pipeline, DuplicateNamesAcrossInputsAreAnError) {
  const fs::path d = temp_dir("dup");
  std::vector<ByteBuffer> values;
  write_inputs(d / "a.safetensors", {{"w", DType::kFloat32, {4}}}, values);
  write_inputs(d / "b.safetensors", {{"w", DType::kFloat32, {4}}}, values);
  auto r = encode_files({(d / "a.safetensors").string(), (d / "b.safetensors").string()}, (d / "o.gcz").string(), {});
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos);
  EXPECT_FALSE(fs::exists(d / "o.gcz"));
}

TEST(Pipeline, DecodeSelectsTensorsByGlob) {
  const fs::path d = temp_dir("select");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", {{"a.weight", DType::kFloat32, {4}}, {"b.weight", DType::kFloat32, {5}}}, values);
  ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, (d / "x.gcz").string(), {}));
  DecodeOptions o;
  o.names = {"b.*"};
  ASSERT_TRUE(decode_file((d / "x.gcz").string(), (d / "b.npy").string(), o));
  auto r = open_tensor_file((d / "b.npy").string(), {});
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)->tensors().at(0).shape, (Shape{5}));
  o.names = {"zzz"};
  Status s = decode_file((d / "x.gcz").string(), (d / "z.npy").string(), o);
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("zzz"), std::string::npos);
  EXPECT_FALSE(fs::exists(d / "z.npy"));
}

// decode_tensor and check_tensor_data take a tensor's index: the one past the last is an argument error
// ("no tensor 2"), never a read past the end of the index.
TEST(Pipeline, ATensorIndexPastTheLastIsAnError) {
  const fs::path d = temp_dir("index");
  std::vector<ByteBuffer> values;
  write_inputs(d / "in.safetensors", {{"a", DType::kFloat32, {4}}, {"b", DType::kFloat32, {3}}}, values);
  ASSERT_TRUE(encode_files({(d / "in.safetensors").string()}, (d / "x.gcz").string(), {}));
  auto reader = GczReader::open((d / "x.gcz").string());
  ASSERT_TRUE(reader) << reader.status().message();
  ASSERT_EQ((*reader)->index().tensors.size(), 2u);
  auto last = decode_tensor(**reader, 1, DeviceRequest::kCpu);
  ASSERT_TRUE(last) << "the last tensor decodes: " << last.status().message();
  EXPECT_EQ(last->size(), 3 * sizeof(float));

  auto past = decode_tensor(**reader, 2, DeviceRequest::kCpu);
  ASSERT_FALSE(past) << "decode_tensor of index 2 of 2 tensors";
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(past.status().message(), "no tensor 2");
  EXPECT_TRUE(check_tensor_data(**reader, 1)) << "the last tensor's streams follow its codec";
  const Status checked = check_tensor_data(**reader, 2);
  ASSERT_FALSE(checked) << "check_tensor_data of index 2 of 2 tensors";
  EXPECT_EQ(checked.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(checked.message(), "no tensor 2");
}

}  // namespace
}  // namespace gcz

// run_bench on small synthetic data: what it measures and reports, and what it refuses before
// measuring anything. (No speed is asserted: the machines are shared.)
#include "gcz/bench.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "gcz/codec_spec.h"

namespace gcz {
namespace {

BenchOptions small(std::vector<unsigned> threads) {
  BenchOptions o;
  o.synthetic_bytes = 1 << 20;  // 256 rows of 1024 float32
  o.repeats = 1;
  o.threads = std::move(threads);
  return o;
}

bool positive_finite(double v) { return v > 0 && std::isfinite(v); }

TEST(Bench, YardsticksForEveryThreadCountAndRowsInOrder) {
  BenchOptions o = small({2, 1, 2});
  std::vector<std::size_t> rows_seen;
  o.progress = [&](const BenchResult& r) {
    rows_seen.push_back(r.rows.size());
    EXPECT_EQ(r.yardsticks.size(), 2u);  // measured before the first call
  };
  auto r = run_bench({"fp16", "qsgd"}, o);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->input_bytes, 1u << 20);
  EXPECT_EQ(r->tensors, 1u);
  EXPECT_EQ(r->backend, Backend::kCpu);

  // One yardstick per distinct thread count, ascending; 'x memcpy' divides by the 1-thread copy.
  ASSERT_EQ(r->yardsticks.size(), 2u);
  EXPECT_EQ(r->yardsticks[0].threads, 1u);
  EXPECT_EQ(r->yardsticks[1].threads, 2u);
  for (const BenchYardstick& y : r->yardsticks) {
    EXPECT_TRUE(positive_finite(y.memcpy_gbps)) << y.threads << ": " << y.memcpy_gbps;
    EXPECT_TRUE(positive_finite(y.read_gbps)) << y.threads << ": " << y.read_gbps;
  }
  EXPECT_EQ(r->memcpy_gbps, r->yardsticks[0].memcpy_gbps);

  // A row per spec and distinct thread count, in the order asked; the ratio is the streams' exact size.
  EXPECT_EQ(r->row_threads, (std::vector<unsigned>{2, 1}));
  ASSERT_EQ(r->rows.size(), 4u);
  const uint64_t n = (1 << 20) / 4;
  for (std::size_t i = 0; i < 4; ++i) {
    const BenchRow& row = r->rows[i];
    EXPECT_EQ(row.spec, i < 2 ? "fp16" : "qsgd");
    EXPECT_EQ(row.threads, i % 2 == 0 ? 2u : 1u);
    EXPECT_TRUE(positive_finite(row.encode_gbps)) << i;
    EXPECT_TRUE(positive_finite(row.decode_gbps)) << i;
    // fp16: 2 bytes per element; qsgd: 1 byte per element and a float32 scale per 128.
    const double expect = i < 2 ? 2.0 : 4.0 * n / (n + n / 128 * 4);
    EXPECT_DOUBLE_EQ(row.ratio, expect) << i;
  }
  // Progress: once the yardsticks are measured, then after every row.
  EXPECT_EQ(rows_seen, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
}

// An input smaller than a word, or than a 64-byte share per thread: every byte is still copied and
// read, by as many threads as have a share.
TEST(Bench, YardsticksOfATinyInputAreMeasured) {
  BenchOptions o = small({1, 2});
  o.inputs = {(std::filesystem::path(::testing::TempDir()) / "gcz_bench_tiny.npy").string()};
  const uint16_t one = 0x3C00;  // 1.0 in float16
  auto w = create_tensor_file(o.inputs[0], {{"x", DType::kFloat16, {1}}}, {});
  ASSERT_TRUE(w) << w.status().message();
  ASSERT_TRUE((*w)->begin(0) && (*w)->write(&one, 1) && (*w)->end() && (*w)->finish());
  auto r = run_bench({"fp16", "qsgd:bits=4"}, o);
  std::filesystem::remove(o.inputs[0]);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->input_bytes, 2u);
  ASSERT_EQ(r->yardsticks.size(), 2u);
  for (const BenchYardstick& y : r->yardsticks) {
    EXPECT_TRUE(positive_finite(y.memcpy_gbps)) << y.threads << ": " << y.memcpy_gbps;
    EXPECT_TRUE(positive_finite(y.read_gbps)) << y.threads << ": " << y.read_gbps;
  }
  ASSERT_EQ(r->rows.size(), 4u);
  EXPECT_DOUBLE_EQ(r->rows[0].ratio, 1.0);        // float16 kept as float16
  EXPECT_DOUBLE_EQ(r->rows[2].ratio, 2.0 / 5.0);  // a 4-bit code in a byte and a float32 scale
}

// The bundled sample holds 1-D tensors and small matrices that PowerSGD hands to its fallback: the
// bench encodes each tensor with the codec gcz encode would use, and its ratio is what their streams
// take.
TEST(Bench, TensorsACodecDoesNotSuitGoToItsFallback) {
  const std::string sample = (std::filesystem::path(GCZ_SOURCE_DIR) / "samples/grads/step_0000.safetensors").string();
  BenchOptions o = small({1, 2});
  o.inputs = {sample};
  auto r = run_bench({"powersgd"}, o);
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ(r->rows.size(), 2u);

  auto reader = open_tensor_file(sample, {});
  ASSERT_TRUE(reader) << reader.status().message();
  auto asked = parse_encoding_plan("powersgd");
  ASSERT_TRUE(asked);
  uint64_t in = 0, stored = 0;
  int fallbacks = 0;
  for (std::size_t i = 0; i < (*reader)->tensors().size(); ++i) {
    const TensorInfo& t = (*reader)->tensors()[i];
    const uint64_t n = *t.numel();
    ByteBuffer x(*t.byte_size());
    auto src = (*reader)->open(i);
    ASSERT_TRUE(src && (*src)->read(0, n, x.data())) << t.name;
    auto stage = stage_for_tensor(t, asked->codec);
    ASSERT_TRUE(stage) << t.name;
    fallbacks += stage->name != "powersgd";
    auto codec = make_codec(stage->name, stage->params, Backend::kCpu);
    ASSERT_TRUE(codec) << t.name;
    (*codec)->set_context({0, tensor_key(t.name)});
    std::vector<ByteBuffer> streams((*codec)->stream_names(t).size());
    ASSERT_TRUE((*codec)->encode(t, x.data(), 0, n, streams)) << t.name;
    in += x.size();
    for (const ByteBuffer& b : streams) stored += b.size();
  }
  ASSERT_GT(fallbacks, 0) << "the sample no longer has a tensor PowerSGD leaves to its fallback";
  EXPECT_EQ(r->input_bytes, in);
  for (const BenchRow& row : r->rows) EXPECT_DOUBLE_EQ(row.ratio, static_cast<double>(in) / stored) << row.threads;
}

TEST(Bench, RefusesBadOptionsAndSpecsBeforeMeasuring) {
  struct Case {
    std::vector<std::string> specs;
    BenchOptions options;
    const char* names;  // what the message has to name
  };
  BenchOptions zero_repeats = small({1});
  zero_repeats.repeats = 0;
  BenchOptions missing_input = small({1});  // the spec is refused before the inputs are read
  missing_input.inputs = {"/nonexistent/dir/grads.safetensors"};
  BenchOptions too_large = small({1});  // refused before a byte of it is made
  too_large.synthetic_bytes = bench_max_synthetic_bytes() + 1;
  std::vector<Case> cases = {
      {{"fp16"}, small({}), "thread counts"},
      {{"fp16"}, small({1, 0}), "thread counts"},
      {{"fp16"}, small({1, 1025}), "1..1024"},
      {{"fp16"}, zero_repeats, "repeats"},
      {{"fp16", "fp17"}, small({1}), "fp17"},
      {{"fp16", "qsgd:bits=9"}, small({1}), "qsgd:bits=9"},
      {{"fp16+zstd:level=0"}, small({1}), "level"},
      {{"fp17"}, missing_input, "fp17"},
      {{"fp16"}, too_large, "a fifth of the memory this process may use"},
  };
  for (Case& c : cases) {
    bool measured = false;
    c.options.progress = [&](const BenchResult&) { measured = true; };
    auto r = run_bench(c.specs, c.options);
    ASSERT_FALSE(r) << c.names;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
    EXPECT_NE(r.status().message().find(c.names), std::string::npos) << r.status().message();
    EXPECT_FALSE(measured) << c.names << ": measured before refusing";
  }
}

TEST(Bench, InputsWithNoElementsAreRefusedByName) {
  BenchOptions o = small({1});
  o.inputs = {(std::filesystem::path(::testing::TempDir()) / "gcz_bench_empty.npy").string()};
  auto w = create_tensor_file(o.inputs[0], {{"empty", DType::kFloat32, {0, 3}}}, {});
  ASSERT_TRUE(w) << w.status().message();
  ASSERT_TRUE((*w)->begin(0));
  ASSERT_TRUE((*w)->end());
  ASSERT_TRUE((*w)->finish());
  auto r = run_bench({"fp16"}, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(o.inputs[0]), std::string::npos) << r.status().message();
  std::filesystem::remove(o.inputs[0]);
}

TEST(Bench, MissingInputIsAnIoError) {
  BenchOptions o = small({1});
  o.inputs = {"/nonexistent/dir/grads.safetensors"};
  auto r = run_bench({"fp16"}, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().message();
}

}  // namespace
}  // namespace gcz

// Every encoder writes every byte of what it appends. A ByteBuffer grows without zeroing (codec.h), so
// a byte an encoder skipped would hold whatever the memory held before: here the streams' spare
// capacity is filled first with one pattern, then with another, and the bytes must not depend on it,
// nor on what the streams already held before the call.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gcz/codec.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"

namespace gcz {
namespace {

// Streams whose first `prefix` bytes are 0x5A and whose capacity past them (`room` bytes) was last
// filled with `fill`, then given up (clear keeps the capacity).
std::vector<ByteBuffer> dirty_streams(std::size_t count, std::size_t prefix, std::size_t room, std::byte fill) {
  std::vector<ByteBuffer> out(count);
  for (ByteBuffer& b : out) {
    b.assign(prefix + room, fill);
    b.resize(prefix);
    std::memset(b.data(), 0x5A, prefix);
  }
  return out;
}

// The CPU codec of a one-stage spec, keyed for tensor t.
std::unique_ptr<Codec> make(const std::string& spec_text, const TensorInfo& t) {
  auto spec = parse_codec_spec(spec_text);
  EXPECT_TRUE(spec) << spec_text;
  if (!spec) return nullptr;
  auto made = make_codec(spec->stages[0].name, spec->stages[0].params, Backend::kCpu);
  EXPECT_TRUE(made) << spec_text;
  if (!made) return nullptr;
  (*made)->set_context({11, tensor_key(t.name)});
  return std::move(*made);
}

// Encodes all of t (elements x) into streams made by dirty_streams; the status, and the streams.
std::pair<Status, std::vector<ByteBuffer>> encode_into(const std::string& spec, const TensorInfo& t,
                                                       const ByteBuffer& x, std::size_t prefix, std::byte fill) {
  const auto c = make(spec, t);
  if (!c) return {internal_error("no codec"), {}};
  std::vector<ByteBuffer> out = dirty_streams(c->stream_names(t).size(), prefix, 8 * *t.numel() + 4096, fill);
  Status s = c->encode(t, x.data(), 0, *t.numel(), out);
  return {std::move(s), std::move(out)};
}

TEST(StreamBytes, EncodersWriteEveryByteTheyAppend) {
  const char* specs[] = {
      "none",
      "fp32",
      "fp16",
      "bf16",
      "qsgd",
      "qsgd:bits=2",
      "qsgd:bits=3,group=7",
      "qsgd:bits=5,group=100,scale_dtype=bf16",
      "qsgd:bits=7,scale=l2,rounding=nearest,scale_dtype=fp16",
      "terngrad",
      "terngrad:rounding=deterministic",
      "terngrad:packing=2bit",
      "terngrad:scale=group,group=33",
      "terngrad:scale=group,group=50,packing=2bit",
      "topk:ratio=0.05",
      "topk:ratio=0.6",
      "topk:k=1,values=(qsgd:bits=4,group=16)",
      "topk:ratio=0.02,values=(bf16)",
      "randomk:ratio=0.05",
      "randomk:k=3,scale=unbiased,values=(qsgd:bits=8)",
      "powersgd:rank=2",
      "powersgd:rank=1,factors=(bf16)",
      "powersgd:rank=3,factors=(qsgd:bits=4)",
  };
  const std::vector<Shape> shapes = {{0}, {1}, {7}, {161}, {40, 33}, {3, 5, 7}, {4099}};
  std::mt19937_64 rng(5);
  int encoded = 0;
  for (const char* spec : specs) {
    for (const Shape& shape : shapes) {
      for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
        const TensorInfo t{"w", dtype, shape};
        const uint64_t n = *t.numel();
        std::normal_distribution<float> normal;
        std::vector<float> v(n);
        for (float& e : v) e = normal(rng);
        ByteBuffer x(n * dtype_size(dtype));
        convert_elements(DType::kFloat32, v.data(), dtype, x.data(), n);
        const std::string what =
            std::string(spec) + " " + shape_to_string(shape) + " " + std::string(dtype_name(dtype));
        const auto [status, zeros] = encode_into(spec, t, x, 0, std::byte{0x00});
        if (!status) {  // PowerSGD leaves the tensors it cannot shrink (1-D, tiny) to its fallback
          EXPECT_EQ(std::string(spec).rfind("powersgd", 0), 0u) << what << ": " << status.message();
          continue;
        }
        ++encoded;
        const auto ones = encode_into(spec, t, x, 0, std::byte{0xFF});
        ASSERT_TRUE(ones.first) << what;
        EXPECT_EQ(zeros, ones.second) << what;
        // Appended after bytes the streams already hold (a chunked codec's later chunks; eight, so that
        // typed stores into the stream stay aligned as they are after whole chunks).
        const auto [status8, after] = encode_into(spec, t, x, 8, std::byte{0xA5});
        ASSERT_TRUE(status8) << what;
        ASSERT_EQ(after.size(), zeros.size()) << what;
        for (std::size_t s = 0; s < after.size(); ++s) {
          ASSERT_EQ(after[s].size(), zeros[s].size() + 8) << what;
          EXPECT_EQ(ByteBuffer(after[s].begin() + 8, after[s].end()), zeros[s]) << what << " stream " << s;
        }
      }
    }
  }
  EXPECT_GE(encoded, 400);  // every case but PowerSGD's fallbacks
}

// A chunked codec encodes a tensor chunk by chunk into the same streams: the bytes are those of one
// call over the whole tensor, whatever the streams' memory held.
TEST(StreamBytes, ChunksAppendedToDirtyStreamsMatchOneCall) {
  for (const char* spec : {"fp16", "qsgd:bits=3,group=7", "qsgd", "terngrad:scale=group,group=33"}) {
    const TensorInfo t{"w", DType::kFloat32, {5000}};
    std::vector<float> v(5000);
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal;
    for (float& e : v) e = normal(rng);
    ByteBuffer x(v.size() * 4);
    std::memcpy(x.data(), v.data(), x.size());
    const auto [status, whole] = encode_into(spec, t, x, 0, std::byte{0x00});
    ASSERT_TRUE(status) << spec;
    const auto made = make(spec, t);
    ASSERT_TRUE(made) << spec;
    Codec& c = *made;
    const uint64_t unit = c.chunk_unit();
    ASSERT_GT(unit, 0u) << spec;
    std::vector<ByteBuffer> out = dirty_streams(c.stream_names(t).size(), 0, 64 * 1024, std::byte{0xC3});
    const uint64_t chunk = (1000 / unit + 1) * unit;
    for (uint64_t first = 0; first < 5000; first += chunk) {
      const uint64_t n = std::min<uint64_t>(chunk, 5000 - first);
      ASSERT_TRUE(c.encode(t, x.data() + first * 4, first, n, out)) << spec;
    }
    EXPECT_EQ(out, whole) << spec;
  }
}

}  // namespace
}  // namespace gcz

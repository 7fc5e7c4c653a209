// Helpers shared by test_topk.cpp and test_randomk.cpp: make a codec from a spec, run it on a tensor
// held in a byte buffer, convert test values between double and any dtype, and a file round trip.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gcz/codec.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace gcz::sparse_test {

// The codec of a one-stage spec, or the error making it.
inline Result<std::unique_ptr<Codec>> make(const std::string& spec) {
  auto s = parse_codec_spec(spec);
  if (!s) return s.status();
  return make_codec(s->stages[0].name, s->stages[0].params, Backend::kCpu);
}

inline ByteBuffer from_doubles(DType dtype, const std::vector<double>& v) {
  ByteBuffer out(v.size() * dtype_size(dtype));
  convert_elements(DType::kFloat64, v.data(), dtype, out.data(), v.size());
  return out;
}

inline std::vector<double> to_doubles(DType dtype, const ByteBuffer& b) {
  std::vector<double> out(b.size() / dtype_size(dtype));
  convert_elements(dtype, b.data(), DType::kFloat64, out.data(), out.size());
  return out;
}

inline std::vector<ByteBuffer> encode(Codec& c, const TensorInfo& t, const ByteBuffer& src, uint64_t seed = 0) {
  c.set_context({seed, tensor_key(t.name)});
  std::vector<ByteBuffer> out(c.stream_names(t).size());
  const Status s = c.encode(t, src.data(), 0, *t.numel(), out);
  EXPECT_TRUE(s) << s.message();
  return out;
}

inline Status decode(Codec& c, const TensorInfo& t, const std::vector<ByteBuffer>& in, ByteBuffer& dst,
                     uint64_t seed = 0) {
  c.set_context({seed, tensor_key(t.name)});
  std::vector<ByteSpan> spans(in.begin(), in.end());
  dst.assign(*t.byte_size(), std::byte{0x5A});  // garbage: decode must write every element
  return c.decode(t, spans, 0, *t.numel(), dst.data());
}

// Writes `x` as the one tensor of dir/in.safetensors; returns dir.
inline std::filesystem::path write_input(const std::string& dir_name, const TensorInfo& t, const ByteBuffer& x) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(::testing::TempDir()) / dir_name;
  fs::remove_all(d);
  fs::create_directories(d);
  auto w = create_tensor_file((d / "in.safetensors").string(), {t}, {});
  EXPECT_TRUE(w) << w.status().message();
  if (!w) return d;
  EXPECT_TRUE((*w)->begin(0));
  EXPECT_TRUE((*w)->write(x.data(), *t.numel()));
  EXPECT_TRUE((*w)->end());
  EXPECT_TRUE((*w)->finish());
  return d;
}

// Encodes dir/in.safetensors to dir/<out> and returns the .gcz bytes.
inline std::vector<char> encode_file(const std::filesystem::path& d, const std::string& out, const std::string& spec,
                                     uint64_t seed, uint64_t chunk_elements = uint64_t{1} << 24,
                                     unsigned threads = 1) {
  EncodeOptions o;
  o.spec = spec;
  o.seed = seed;
  o.device = DeviceRequest::kCpu;
  o.chunk_elements = chunk_elements;
  o.threads = threads;
  auto r = encode_files({(d / "in.safetensors").string()}, (d / out).string(), o);
  EXPECT_TRUE(r) << r.status().message();
  std::ifstream in(d / out, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Encodes `x` as one tensor file with `spec` and `seed`, decodes the .gcz, and returns the decoded
// tensor (empty on failure, with the failure reported).
inline ByteBuffer file_round_trip(const std::string& dir_name, const TensorInfo& t, const ByteBuffer& x,
                                  const std::string& spec, uint64_t seed) {
  const std::filesystem::path d = write_input(dir_name, t, x);
  if (encode_file(d, "x.gcz", spec, seed).empty()) return {};
  DecodeOptions dopt;
  dopt.device = DeviceRequest::kCpu;
  const Status s = decode_file((d / "x.gcz").string(), (d / "out.safetensors").string(), dopt);
  EXPECT_TRUE(s) << s.message();
  auto in = open_tensor_file((d / "out.safetensors").string(), {});
  EXPECT_TRUE(in) << in.status().message();
  if (!s || !in) return {};
  ByteBuffer out(*t.byte_size());
  auto src = (*in)->open(0);
  EXPECT_TRUE(src) << src.status().message();
  if (src) EXPECT_TRUE((*src)->read(0, *t.numel(), out.data()));
  return out;
}

}  // namespace gcz::sparse_test

// No codec trusts its streams: streams that pass their checksums but were not written by the encoder
// (valid streams with bytes flipped, overwritten, set to non-finite floats, and, where a stream's size
// depends on the data, cut short or extended) decode to some values or to a format error that names
// the codec. Never a crash, an out-of-range access (the sanitizer builds run this too) or another
// kind of error: the pipeline reports format errors as bad-stream-data with the file and tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gcz/codec.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"

namespace gcz {
namespace {

// One random change to one of the streams.
void mutate(const Codec& c, std::vector<ByteBuffer>& streams, std::mt19937_64& rng) {
  const std::size_t s = rng() % streams.size();
  ByteBuffer& b = streams[s];
  const int kind = static_cast<int>(rng() % 6);
  if (kind == 5 && !c.exact_size(s)) {  // a size the data decides: cut or extend it
    if (rng() % 2 && !b.empty()) {
      b.resize(rng() % b.size());
    } else {
      b.resize(b.size() + 1 + rng() % 16, std::byte{static_cast<unsigned char>(rng())});
    }
    return;
  }
  if (b.empty()) return;
  const std::size_t p = rng() % b.size();
  switch (kind) {
    case 0: b[p] ^= std::byte{static_cast<unsigned char>(1u << (rng() % 8))}; break;
    case 1: b[p] = std::byte{0xFF}; break;
    case 2: b[p] = std::byte{0}; break;
    case 3:
      for (std::size_t q = p; q < std::min(b.size(), p + 4); ++q) b[q] = std::byte{static_cast<unsigned char>(rng())};
      break;
    default: {  // at a 4-byte boundary, a float32 that is no valid scale, or an odd one
      const float bad[] = {NAN, INFINITY, -INFINITY, -1.0f, 3e38f, 1e-45f};
      const std::size_t q = p / 4 * 4;
      if (q + 4 <= b.size()) std::memcpy(b.data() + q, &bad[rng() % 6], 4);
    }
  }
}

TEST(HostileStreams, EveryDecoderGivesValuesOrAFormatErrorNamingIt) {
  struct Case {
    const char* spec;
    const char* named;  // what every error message must contain
    bool rejects;       // whether some byte patterns are invalid (else every stream decodes: floats, casts)
  };
  const Case cases[] = {
      {"qsgd", "qsgd", true},
      {"qsgd:bits=3,group=7", "qsgd", true},
      {"qsgd:bits=2,scale=l2,scale_dtype=fp16", "qsgd", true},
      {"qsgd:bits=5,group=100,scale_dtype=bf16", "qsgd", true},
      {"terngrad", "terngrad", true},
      {"terngrad:scale=group,group=33,packing=2bit", "terngrad", true},
      {"topk:ratio=0.05", "topk", true},
      {"topk:k=1", "topk", true},
      {"topk:ratio=0.3,values=(qsgd:bits=4,group=16)", "topk", true},
      {"topk:ratio=0.02,values=(fp16)", "topk", true},
      {"randomk:ratio=0.05", "randomk", false},
      {"randomk:k=3,scale=unbiased,values=(qsgd:bits=8)", "randomk", true},
      {"powersgd:rank=2", "powersgd", false},
      {"powersgd:rank=1,factors=(bf16)", "powersgd", false},
      {"powersgd:rank=3,factors=(qsgd:bits=4)", "powersgd", true},
      {"fp16", "fp16", false},
  };
  const std::vector<Shape> shapes = {{1}, {7}, {40, 33}, {513}, {3, 5, 7}};
  constexpr int kTries = 150;
  std::mt19937_64 rng(2024);
  for (const Case& k : cases) {
    auto spec = parse_codec_spec(k.spec);
    ASSERT_TRUE(spec) << k.spec;
    int errors = 0, tried = 0;
    for (const Shape& shape : shapes) {
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        const TensorInfo t{"w", dtype, shape};
        const uint64_t n = *t.numel();
        auto made = make_codec(spec->stages[0].name, spec->stages[0].params, Backend::kCpu);
        ASSERT_TRUE(made) << k.spec;
        Codec& c = **made;
        c.set_context({7, 99});
        std::normal_distribution<float> normal;
        std::vector<float> x(n);
        for (float& v : x) v = normal(rng);
        ByteBuffer src(n * dtype_size(dtype));
        convert_elements(DType::kFloat32, x.data(), dtype, src.data(), n);
        std::vector<ByteBuffer> streams(c.stream_names(t).size());
        if (!c.encode(t, src.data(), 0, n, streams)) continue;  // PowerSGD leaves 1-D tensors to its fallback
        ByteBuffer out(n * dtype_size(dtype));
        for (int i = 0; i < kTries; ++i) {
          std::vector<ByteBuffer> bad = streams;
          for (int m = 1 + static_cast<int>(rng() % 4); m > 0; --m) mutate(c, bad, rng);
          const std::vector<ByteSpan> in(bad.begin(), bad.end());
          const Status st = c.decode(t, in, 0, n, out.data());
          ++tried;
          if (st) continue;
          ++errors;
          ASSERT_EQ(st.code(), StatusCode::kFormatError) << k.spec << ": " << st.message();
          ASSERT_NE(st.message().find(k.named), std::string::npos) << k.spec << ": " << st.message();
        }
      }
    }
    EXPECT_GT(tried, 0) << k.spec;
    if (k.rejects) {
      EXPECT_GT(errors, tried / 20) << k.spec;  // many of the changes were caught
    } else {
      EXPECT_EQ(errors, 0) << k.spec;
    }
  }
}

}  // namespace
}  // namespace gcz

// Top-K (docs/codecs/topk.md): exactly the k largest magnitudes are kept (checked against a full
// sort), ties go to the lower index, the error is exactly the norm of the dropped elements, both index
// encodings, hostile index streams, value codecs, edge cases and a file round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "codecs/sparse_indices.h"
#include "codecs/topk.h"
#include "gcz/detail/select.h"
#include "parallel.h"
#include "sparse_test_util.h"

namespace gcz {
namespace {

using sparse_test::from_doubles;
using sparse_test::make;
using sparse_test::to_doubles;

// The reference: sort every index by (|x| descending, index ascending), non-finite last, take k.
std::vector<uint64_t> reference_top_k(const std::vector<double>& x, uint64_t k) {
  std::vector<uint64_t> order(x.size());
  std::iota(order.begin(), order.end(), uint64_t{0});
  auto rank = [&](uint64_t i) { return std::isfinite(x[i]) ? std::fabs(x[i]) : -1.0; };
  std::stable_sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) { return rank(a) > rank(b); });
  order.resize(std::min<uint64_t>(k, x.size()));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<double> normal_values(uint64_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& e : v) e = normal(rng);
  return v;
}

struct RoundTrip {
  std::vector<ByteBuffer> streams;
  std::vector<double> xhat;
};

RoundTrip round_trip(const std::string& spec, const TensorInfo& t, const ByteBuffer& x) {
  RoundTrip r;
  auto c = make(spec);
  EXPECT_TRUE(c) << c.status().message();
  if (!c) return r;
  r.streams = sparse_test::encode(**c, t, x);
  for (std::size_t s = 0; s < r.streams.size(); ++s) {
    auto size = (*c)->stream_size(t, s, 0, *t.numel());
    EXPECT_TRUE(size);
    if ((*c)->exact_size(s)) EXPECT_EQ(r.streams[s].size(), *size) << "stream " << s;
    else EXPECT_LE(r.streams[s].size(), *size) << "stream " << s;
  }
  ByteBuffer out;
  const Status s = sparse_test::decode(**c, t, r.streams, out);
  EXPECT_TRUE(s) << s.message();
  r.xhat = to_doubles(t.dtype, out);
  return r;
}

TEST(TopK, SelectionMatchesAFullSortForEveryDtypeWithManyTies) {
  uint32_t seed = 1;
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    for (uint64_t n : {1u, 2u, 7u, 100u, 1000u, 4099u}) {
      for (uint64_t k : {uint64_t{1}, uint64_t{3}, n / 10 + 1, n / 2 + 1, n - 1, n}) {
        if (k == 0 || k > n) continue;
        // Few distinct magnitudes (many ties), both signs, zeros, and a wide range of exponents.
        std::mt19937 rng(seed++);
        std::vector<double> x(n);
        for (double& e : x) {
          const int m = static_cast<int>(rng() % 9);
          e = (rng() % 2 ? -1.0 : 1.0) * (m == 0 ? 0.0 : std::ldexp(m, static_cast<int>(rng() % 7) - 3));
        }
        const ByteBuffer b = from_doubles(d, x);
        const std::vector<double> exact = to_doubles(d, b);
        EXPECT_EQ(codecs::select_top_k(d, b.data(), n, k), reference_top_k(exact, k))
            << dtype_name(d) << " n=" << n << " k=" << k;
      }
    }
  }
}

TEST(TopK, SelectionOfAMostlyConstantTensorMatchesAFullSort) {
  // One magnitude fills most of the threshold bucket: the selection's low-memory path.
  const uint64_t n = 30000;
  std::mt19937 rng(99);
  for (DType d : {DType::kFloat32, DType::kFloat64}) {
    std::vector<double> x(n);
    for (double& e : x) e = rng() % 10 == 0 ? std::ldexp(static_cast<double>(rng() % 1000), -9) : -1.0;
    const ByteBuffer b = from_doubles(d, x);
    for (uint64_t k : {10u, 3000u, 20000u, 29999u}) {
      EXPECT_EQ(codecs::select_top_k(d, b.data(), n, k), reference_top_k(x, k)) << dtype_name(d) << " k=" << k;
    }
  }
}

// Keys that change between the passes (an input rewritten under its memory map) give some wrong
// selection of at most k ascending indices, never a write past the buffers the first pass sized (the
// branch-free passes write every index; ASan checks the bounds).
TEST(TopK, KeysThatChangeBetweenPassesStayInBounds) {
  const uint64_t n = 100000;
  for (uint32_t later : {0u, 0x80000000u, 0xFFFFFFFFu}) {
    for (uint64_t k : {uint64_t{20}, uint64_t{5000}, uint64_t{60000}}) {
      for (bool spread : {false, true}) {  // few distinct keys (the dense path), or many (sparse)
        uint64_t calls = 0;
        auto key_at = [&](uint64_t i) -> uint32_t {
          if (++calls > n) return later;  // after the histogram
          if (spread) return static_cast<uint32_t>(i * 2654435761u);
          return i < 10 ? 0u : i < 10010 ? 0x80000000u : 0xF0000000u;
        };
        for (unsigned parts : {1u, 3u}) {  // in ranges, taken in order (key_at counts its calls)
          calls = 0;
          const std::vector<uint64_t> idx = detail::select_smallest<uint32_t>(n, k, key_at, parts);
          EXPECT_LE(idx.size(), k);
          EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
        }
      }
    }
  }
}

// The passes split into ranges (taken in order, or on threads) select what one pass over the whole
// does: each range's share of the kept elements and of the ties comes from its own histogram. Both
// paths: keys of few distinct values (a bucket of more than an eighth of them) and spread keys; more
// ranges than elements; k at the edges.
TEST(TopK, SelectionInRangesAndOnThreadsMatchesOnePass) {
  std::mt19937 rng(17);
  const auto threaded = [](unsigned parts, const auto& f) { detail::run_each(parts, f); };
  for (uint64_t n : {uint64_t{3}, uint64_t{1000}, uint64_t{70001}}) {
    for (bool few : {true, false}) {
      std::vector<uint32_t> keys(n);
      for (uint32_t& key : keys) key = few ? (rng() % 5) << 28 : static_cast<uint32_t>(rng());
      const auto key_at = [&](uint64_t i) { return keys[i]; };
      for (uint64_t k : {uint64_t{1}, n / 3 + 1, n / 2, n - 1}) {
        if (k == 0) continue;
        const std::vector<uint64_t> want = detail::select_smallest<uint32_t>(n, k, key_at);
        ASSERT_EQ(want.size(), k);
        for (unsigned parts : {2u, 3u, 7u}) {
          EXPECT_EQ(detail::select_smallest<uint32_t>(n, k, key_at, parts), want)
              << "n=" << n << " k=" << k << " few=" << few << " parts=" << parts;
          EXPECT_EQ(detail::select_smallest<uint32_t>(n, k, key_at, parts, threaded), want)
              << "n=" << n << " k=" << k << " few=" << few << " parts=" << parts << ", threads";
        }
      }
    }
  }
  // Through the codec's entry point, with enough elements for three threads.
  const uint64_t n = 3 * (uint64_t{1} << 18) + 5;
  std::vector<double> x(n);
  for (double& e : x) e = std::ldexp(static_cast<double>(rng() % 64), static_cast<int>(rng() % 4));
  const ByteBuffer b = from_doubles(DType::kFloat32, x);
  for (uint64_t k : {uint64_t{100}, n / 10, n / 2}) {
    EXPECT_EQ(codecs::select_top_k(DType::kFloat32, b.data(), n, k, 3),
              codecs::select_top_k(DType::kFloat32, b.data(), n, k, 1))
        << "k=" << k;
  }
}

TEST(TopK, ErrorIsExactlyTheNormOfTheDroppedElements) {
  const uint64_t n = 10007;
  const std::vector<double> x = normal_values(n, 7);
  const TensorInfo t{"w", DType::kFloat32, {n}};
  const ByteBuffer b = from_doubles(DType::kFloat32, x);
  const std::vector<double> xf = to_doubles(DType::kFloat32, b);
  const RoundTrip r = round_trip("topk", t, b);  // ratio 0.01: k = 100
  const std::vector<uint64_t> kept = reference_top_k(xf, 100);
  std::vector<bool> is_kept(n, false);
  for (uint64_t i : kept) is_kept[i] = true;
  double err = 0.0, dropped = 0.0;
  for (uint64_t i = 0; i < n; ++i) {
    err += (xf[i] - r.xhat[i]) * (xf[i] - r.xhat[i]);
    if (!is_kept[i]) dropped += xf[i] * xf[i];
    EXPECT_EQ(r.xhat[i], is_kept[i] ? xf[i] : 0.0) << i;
  }
  EXPECT_EQ(err, dropped);
}

TEST(TopK, EqualMagnitudesKeepTheLowestIndices) {
  const uint64_t n = 50;
  std::vector<double> x(n);
  for (uint64_t i = 0; i < n; ++i) x[i] = i % 3 == 0 ? -0.5 : 0.5;
  const RoundTrip r = round_trip("topk:k=7", {"w", DType::kFloat32, {n}}, from_doubles(DType::kFloat32, x));
  for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(r.xhat[i], i < 7 ? x[i] : 0.0) << i;
}

TEST(TopK, KAtLeastNKeepsEverythingLosslessly) {
  for (const std::string spec : {"topk:k=1000", "topk:ratio=1", "topk:k=37"}) {
    const std::vector<double> x = normal_values(37, 3);
    const ByteBuffer b = from_doubles(DType::kFloat32, x);
    const RoundTrip r = round_trip(spec, {"w", DType::kFloat32, {37}}, b);
    EXPECT_EQ(r.xhat, to_doubles(DType::kFloat32, b)) << spec;
    EXPECT_EQ(std::to_integer<int>(r.streams[0][0]), codecs::kIndicesBitmap) << spec;
  }
}

TEST(TopK, KFollowsTheFloat64FloorRule) {
  auto k_of = [](const std::string& spec, uint64_t n) {
    auto c = make(spec);
    EXPECT_TRUE(c);
    // The fp32 values stream holds 4 bytes per kept element.
    return *(*c)->stream_size({"w", DType::kFloat32, {n}}, 1, 0, n) / 4;
  };
  EXPECT_EQ(k_of("topk", 99), 1u);                 // floor(0.99) = 0 -> at least 1
  EXPECT_EQ(k_of("topk", 1000), 10u);
  EXPECT_EQ(k_of("topk:ratio=0.29", 100), 28u);    // 0.29 * 100 = 28.999999999999996 in float64
  EXPECT_EQ(k_of("topk:ratio=0.07", 100), 7u);     // 7.000000000000001
  EXPECT_EQ(k_of("topk:k=5", 3), 3u);
  EXPECT_EQ(k_of("topk:k=5", 0), 0u);
}

TEST(TopK, ParametersAreCheckedAndCanonical) {
  for (const std::string bad : {"topk:k=0", "topk:ratio=0", "topk:ratio=1.5", "topk:ratio=-0.1", "topk:k=-3",
                                "topk:k=1.5", "topk:ratio=abc", "topk:k=3,ratio=0.5", "topk:kk=3",
                                "topk:values=(zstd)", "topk:values=(fp16+zstd)", "topk:values=(fp16:x=1)"}) {
    auto c = make(bad);
    ASSERT_FALSE(c) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(c.status().message().find("topk"), std::string::npos) << c.status().message();
  }
  EXPECT_NE(make("topk:k=0").status().message().find("'k'"), std::string::npos);
  EXPECT_NE(make("topk:ratio=0").status().message().find("'ratio'"), std::string::npos);
  EXPECT_NE(make("topk:values=(nosuch)").status().message().find("values='nosuch'"), std::string::npos);

  auto c = make("topk");
  ASSERT_TRUE(c);
  CodecSpec spec{{{"topk", (*c)->params()}}};
  EXPECT_EQ(spec.to_string(), "topk:ratio=0.01,values=fp32");
  auto c2 = make("topk:k=12,values=(bf16)");
  ASSERT_TRUE(c2);
  spec = {{{"topk", (*c2)->params()}}};
  EXPECT_EQ(spec.to_string(), "topk:k=12,values=bf16");
  EXPECT_EQ((*c2)->stream_names({"w", DType::kFloat32, {4}}), (std::vector<std::string>{"indices", "values.values"}));
  EXPECT_EQ((*c2)->chunk_unit(), 0u);
  EXPECT_FALSE((*c2)->exact_size(0));
  EXPECT_TRUE((*c2)->exact_size(1));
}

TEST(TopK, DensePicksTheBitmapSparsePicksVarintsAndBothDecode) {
  const uint64_t n = 1000;
  const std::vector<double> x = normal_values(n, 11);
  const ByteBuffer b = from_doubles(DType::kFloat32, x);
  const std::vector<double> xf = to_doubles(DType::kFloat32, b);
  const TensorInfo t{"w", DType::kFloat32, {n}};
  for (uint64_t k : {3u, 50u, 200u, 500u}) {
    const RoundTrip r = round_trip("topk:k=" + std::to_string(k), t, b);
    const int tag = std::to_integer<int>(r.streams[0][0]);
    // The bitmap takes 125 bytes; 50 deltas take at most 100, 200 deltas at least 200.
    EXPECT_EQ(tag, k <= 50 ? codecs::kIndicesVarint : codecs::kIndicesBitmap) << k;
    if (tag == codecs::kIndicesBitmap) EXPECT_EQ(r.streams[0].size(), 126u);
    const std::vector<uint64_t> kept = reference_top_k(xf, k);
    std::vector<double> want(n, 0.0);
    for (uint64_t i : kept) want[i] = xf[i];
    EXPECT_EQ(r.xhat, want) << k;
  }
}

TEST(TopK, IndexEncodingsRoundTripAndPickTheSmaller) {
  const std::vector<uint64_t> idx = {0, 1, 127, 128, 300, 16700, 16701, 99999};
  ByteBuffer out;
  codecs::encode_indices(idx, 100000, out);
  // Deltas from -1: 1, 1, 126, 1, 172, 16400, 1, 83298 -> 1+1+1+1+2+3+1+3 bytes after the tag.
  ASSERT_EQ(out.size(), 14u);
  EXPECT_EQ(std::to_integer<int>(out[0]), codecs::kIndicesVarint);
  EXPECT_EQ(std::to_integer<int>(out[5]), 0xAC);  // 172 = 0b1'0101100: low group first, continuation set
  EXPECT_EQ(std::to_integer<int>(out[6]), 0x01);
  auto back = codecs::decode_indices(out, 100000, idx.size());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(*back, idx);

  // Equal sizes go to the bitmap: n = 8 -> 1 bitmap byte, one index -> 1 varint byte.
  ByteBuffer tie;
  codecs::encode_indices(std::vector<uint64_t>{5}, 8, tie);
  ASSERT_EQ(tie.size(), 2u);
  EXPECT_EQ(std::to_integer<int>(tie[0]), codecs::kIndicesBitmap);
  EXPECT_EQ(std::to_integer<int>(tie[1]), 0x20);  // LSB-first: element 5 is bit 5
  EXPECT_EQ(*codecs::decode_indices(tie, 8, 1), std::vector<uint64_t>{5});
  EXPECT_EQ(codecs::indices_size_bound(0, 0), 0u);
  EXPECT_EQ(codecs::indices_size_bound(1000, 3), 1u + 3 * 2);
  EXPECT_EQ(codecs::indices_size_bound(1000, 900), 1u + 125);
  // Seven bits a byte: the sizes change at 2^7, 2^14, ..., up to ten bytes for 2^63 and above.
  for (const auto& [v, size] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1}, {127, 1}, {128, 2}, {16383, 2}, {16384, 3}, {(uint64_t{1} << 63) - 1, 9}, {uint64_t{1} << 63, 10}}) {
    EXPECT_EQ(codecs::varint_size(v), size) << v;
  }
}

ByteBuffer bytes(std::initializer_list<int> v) {
  ByteBuffer out;
  for (int b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

TEST(TopK, HostileIndexStreamsAreRejectedNamingTheRule) {
  struct Bad {
    ByteBuffer stream;
    uint64_t n, k;
    std::string rule;
  };
  const std::vector<Bad> cases = {
      {bytes({}), 100, 3, "missing its tag byte"},
      {bytes({2, 1, 1, 1}), 100, 3, "unknown encoding tag 2"},
      {bytes({0, 1, 1, 0x81}), 100, 3, "truncated varint"},
      {bytes({0, 1, 0, 1}), 100, 3, "strictly ascending"},      // a repeated index
      {bytes({0, 5, 1, 95}), 100, 3, "index out of range"},     // 4, 5, 100
      {bytes({0, 0xE5, 0x00, 1}), 1000, 2, "overlong varint"},  // 101 with a redundant zero group
      {bytes({0, 1, 1}), 100, 3, "holds 2 indices, expected 3"},
      {bytes({0, 1, 1, 1, 1}), 1000, 3, "bytes left after 3 indices"},
      {bytes({0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}), 10000, 10, "exceeds 64 bits"},
      {bytes({1, 7}), 10, 3, "bitmap of 1 bytes, expected ceil(n / 8) = 2"},
      {bytes({1, 7, 0x04}), 10, 3, "bitmap sets bits past the last element"},
      {bytes({1, 7, 0x01}), 10, 3, "bitmap sets 4 bits, expected 3"},
      {bytes({0, 1, 1, 1, 1, 1}), 16, 3, "exceed the bound of 3"},
      {bytes({0, 1, 1, 1}), 16, 3, "4 bytes exceed the bound of 3"},  // one byte past the bitmap's size
      {bytes({0, 1, 0}), 16, 2, "delta 0 at byte 2"},                 // offsets in the stream: the tag is byte 0
      {bytes({0, 1, 0x81}), 16, 2, "truncated varint at byte 2"},
      // A tenth byte may only add bit 63: 0x02 would be bit 64. An eleventh byte is never read.
      {bytes({0, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02, 0x01}), uint64_t{1} << 40, 2,
       "varint at byte 1 exceeds 64 bits"},
      {bytes({0, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}), uint64_t{1} << 40, 2,
       "varint at byte 1 exceeds 64 bits"},
      {bytes({0}), 0, 0, "must be empty for an empty tensor"},
  };
  for (const Bad& c : cases) {
    auto r = codecs::decode_indices(c.stream, c.n, c.k);
    ASSERT_FALSE(r) << c.rule;
    EXPECT_EQ(r.status().code(), StatusCode::kFormatError) << c.rule;
    EXPECT_NE(r.status().message().find(c.rule), std::string::npos) << r.status().message();
  }
}

TEST(TopK, DecodeRejectsAHostileIndicesStreamInsideTheCodec) {
  const uint64_t n = 100;
  const TensorInfo t{"w", DType::kFloat32, {n}};
  const ByteBuffer x = from_doubles(DType::kFloat32, normal_values(n, 5));
  auto c = make("topk:k=3");
  ASSERT_TRUE(c);
  std::vector<ByteBuffer> streams = sparse_test::encode(**c, t, x);
  streams[0] = bytes({0, 1, 1, 120});
  ByteBuffer out;
  const Status s = sparse_test::decode(**c, t, streams, out);
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("topk: stream 'indices': index out of range"), std::string::npos) << s.message();
  streams = sparse_test::encode(**c, t, x);
  streams[1].pop_back();  // a short values stream
  EXPECT_EQ(sparse_test::decode(**c, t, streams, out).code(), StatusCode::kFormatError);
}

TEST(TopK, NarrowValueCodecsRoundTheKeptValues) {
  const uint64_t n = 300;
  const std::vector<double> x = normal_values(n, 13, 100.0);
  const ByteBuffer b = from_doubles(DType::kFloat32, x);
  const std::vector<double> xf = to_doubles(DType::kFloat32, b);
  const std::vector<uint64_t> kept = reference_top_k(xf, 30);
  for (DType stored : {DType::kFloat16, DType::kBFloat16}) {
    const std::string name = stored == DType::kFloat16 ? "fp16" : "bf16";
    const RoundTrip r = round_trip("topk:k=30,values=(" + name + ")", {"w", DType::kFloat32, {n}}, b);
    std::vector<double> want(n, 0.0);
    for (uint64_t i : kept) want[i] = to_doubles(stored, from_doubles(stored, {xf[i]}))[0];
    EXPECT_EQ(r.xhat, want) << name;
    EXPECT_EQ(r.streams[1].size(), 30u * 2) << name;
  }
}

TEST(TopK, QsgdValuesRoundTrip) {
  if (!make("qsgd:bits=8")) GTEST_SKIP() << "qsgd is not registered in this build";
  const uint64_t n = 5000;
  const std::vector<double> x = normal_values(n, 17);
  const ByteBuffer b = from_doubles(DType::kFloat32, x);
  const std::vector<double> xf = to_doubles(DType::kFloat32, b);
  const RoundTrip r = round_trip("topk:k=500,values=(qsgd:bits=8)", {"w", DType::kFloat32, {n}}, b);
  ASSERT_EQ(r.xhat.size(), n);
  const std::vector<uint64_t> kept = reference_top_k(xf, 500);
  std::vector<bool> is_kept(n, false);
  double max_abs = 0.0;
  for (uint64_t i : kept) {
    is_kept[i] = true;
    max_abs = std::max(max_abs, std::fabs(xf[i]));
  }
  // 8-bit QSGD has s = 127 levels per sign of a scale no larger than the largest kept |x|: each kept
  // value moves by less than one level (plus float32 rounding); the dropped ones decode to 0.
  for (uint64_t i = 0; i < n; ++i) {
    if (is_kept[i]) {
      EXPECT_LE(std::fabs(r.xhat[i] - xf[i]), max_abs / 127.0 * (1 + 1e-5)) << i;
    } else {
      EXPECT_EQ(r.xhat[i], 0.0) << i;
    }
  }
}

TEST(TopK, EdgeShapesAndValues) {
  // Empty: no bytes at all; 0-d and 1 element: the one element is kept.
  RoundTrip r = round_trip("topk", {"e", DType::kFloat32, {0, 4}}, {});
  for (const ByteBuffer& s : r.streams) EXPECT_TRUE(s.empty());
  for (const Shape& shape : {Shape{}, Shape{1}}) {
    r = round_trip("topk", {"s", DType::kFloat32, shape}, from_doubles(DType::kFloat32, {-2.5}));
    EXPECT_EQ(r.xhat, std::vector<double>{-2.5});
  }
  // All zeros: zeros come back (never NaN), and the kept "largest" are the lowest indices.
  r = round_trip("topk:k=4", {"z", DType::kFloat32, {13}}, from_doubles(DType::kFloat32, std::vector<double>(13, 0.0)));
  EXPECT_EQ(r.xhat, std::vector<double>(13, 0.0));
  // Huge, tiny and subnormal magnitudes rank by value.
  const std::vector<double> x = {1e-45, -3e38, 1e-40, 2e-38, -1e-45, 3e38, 0.0, -1e-30};
  r = round_trip("topk:k=5", {"m", DType::kFloat32, {8}}, from_doubles(DType::kFloat32, x));
  const std::vector<double> xf = to_doubles(DType::kFloat32, from_doubles(DType::kFloat32, x));
  EXPECT_EQ(r.xhat, (std::vector<double>{0.0, xf[1], xf[2], xf[3], 0.0, xf[5], 0.0, xf[7]}));
}

TEST(TopK, EveryInputDtypeDecodesToItsOwnDtype) {
  const std::vector<double> x = {0.5, -7.0, 0.25, 3.0, -0.125, 1.0, 2.0};
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    const RoundTrip r = round_trip("topk:k=3", {"d", d, {7}}, from_doubles(d, x));
    EXPECT_EQ(r.xhat, (std::vector<double>{0.0, -7.0, 0.0, 3.0, 0.0, 0.0, 2.0})) << dtype_name(d);
  }
  // A float64 beyond the float32 range ranks first but is stored as +0 (no Inf in the values).
  const RoundTrip r = round_trip("topk:k=2", {"d", DType::kFloat64, {3}}, from_doubles(DType::kFloat64, {1e300, 1, 2}));
  EXPECT_EQ(r.xhat, (std::vector<double>{0.0, 0.0, 2.0}));
}

TEST(TopK, NonFiniteElementsRankLastAndDecodeAsZero) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> x = {nan, 1.0, -inf, -3.0, inf, 0.0, 2.0};
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    RoundTrip r = round_trip("topk:k=3", {"n", d, {7}}, from_doubles(d, x));
    EXPECT_EQ(r.xhat, (std::vector<double>{0.0, 1.0, 0.0, -3.0, 0.0, 0.0, 2.0})) << dtype_name(d);
    // k = n keeps the non-finite elements too, as +0: nothing non-finite comes out.
    r = round_trip("topk:ratio=1", {"n", d, {7}}, from_doubles(d, x));
    EXPECT_EQ(r.xhat, (std::vector<double>{0.0, 1.0, 0.0, -3.0, 0.0, 0.0, 2.0})) << dtype_name(d);
  }
}

TEST(TopK, EncodingIsDeterministic) {
  const ByteBuffer x = from_doubles(DType::kFloat32, normal_values(4099, 23));
  const TensorInfo t{"w", DType::kFloat32, {4099}};
  EXPECT_EQ(round_trip("topk:ratio=0.05", t, x).streams, round_trip("topk:ratio=0.05", t, x).streams);
}

TEST(TopK, FileBytesDoNotDependOnChunkingOrThreads) {
  const TensorInfo t{"w", DType::kFloat32, {70, 30}};
  const auto d = sparse_test::write_input("gcz_topk_chunks", t, from_doubles(DType::kFloat32, normal_values(2100, 31)));
  const std::vector<char> whole = sparse_test::encode_file(d, "a.gcz", "topk:ratio=0.05", 0);
  ASSERT_FALSE(whole.empty());
  EXPECT_EQ(sparse_test::encode_file(d, "b.gcz", "topk:ratio=0.05", 0, 64, 2), whole);
}

TEST(TopK, FileRoundTrip) {
  const uint64_t n = 2000;
  const std::vector<double> x = normal_values(n, 29);
  const TensorInfo t{"layer.weight", DType::kBFloat16, {40, 50}};
  const ByteBuffer b = from_doubles(DType::kBFloat16, x);
  const ByteBuffer out = sparse_test::file_round_trip("gcz_topk_file", t, b, "topk:ratio=0.1,values=(bf16)+zstd", 0);
  ASSERT_EQ(out.size(), b.size());
  const std::vector<double> xb = to_doubles(DType::kBFloat16, b);
  std::vector<double> want(n, 0.0);
  for (uint64_t i : reference_top_k(xb, 200)) want[i] = xb[i];
  EXPECT_EQ(to_doubles(DType::kBFloat16, out), want);
}

}  // namespace
}  // namespace gcz

#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "gcz/container.h"
#include "index_json.h"
#include "layout.h"
#include "scratch_dir.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) { return gcz::testing::scratch_dir("container_" + name); }

ByteBuffer bytes_of(const std::vector<uint16_t>& v) {
  ByteBuffer b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TensorRecord fp16_record(const std::string& name, Shape shape, std::optional<int> zstd_level = std::nullopt) {
  TensorRecord r;
  r.info = {name, DType::kFloat32, std::move(shape)};
  r.chain = {{"fp16", {}}};
  if (zstd_level) r.chain.push_back({"zstd", {{"level", int64_t{*zstd_level}}}});
  r.streams = {{.name = "values"}};
  return r;
}

ByteBuffer read_all(const GczReader& r, std::size_t t, std::size_t s) {
  const StreamRecord& rec = r.index().tensors[t].streams[s];
  ByteBuffer out(rec.size);
  auto c = r.open_stream(t, s);
  EXPECT_TRUE(c) << c.status().message();
  if (c) {
    Status st = (*c)->read(out.data(), out.size());
    EXPECT_TRUE(st) << st.message();
  }
  return out;
}

TEST(Container, EmptyFileRoundTrips) {
  const fs::path p = temp_dir("empty") / "e.gcz";
  auto w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  auto size = (*w)->finish({{"step", "7"}});
  ASSERT_TRUE(size) << size.status().message();
  EXPECT_EQ(*size, fs::file_size(p));
  auto r = GczReader::open(p.string());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_TRUE((*r)->index().tensors.empty());
  EXPECT_EQ((*r)->index().metadata.at("step"), "7");
  EXPECT_TRUE((*r)->verify(nullptr));
  auto none = (*r)->open_stream(0, 0);  // no tensor 0: an error, not an exception
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
}

// Metadata that is not UTF-8 would be written as U+FFFD, two keys perhaps as one, and the file not
// read back: finish() refuses it and leaves no file.
TEST(Container, MetadataThatIsNotUtf8IsRefused) {
  const fs::path p = temp_dir("meta") / "m.gcz";
  for (const auto& metadata : {std::map<std::string, std::string>{{"\xff", "1"}, {"\xfe", "2"}},
                               std::map<std::string, std::string>{{"k", "v\xc3"}}}) {
    auto w = GczWriter::create(p.string());
    ASSERT_TRUE(w);
    auto size = (*w)->finish(metadata);
    ASSERT_FALSE(size);
    EXPECT_EQ(size.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(size.status().message().find("not UTF-8 text"), std::string::npos) << size.status().message();
    w->reset();
    EXPECT_FALSE(fs::exists(p));
  }
}

// finish() checks the index as a reader would: a record its reader refuses fails there, with the
// reader's rule, and leaves no file; so does the counting writer of eval. Calls out of order are the
// caller's mistake, kInvalidArgument.
TEST(Container, AFileItsReaderWouldRefuseIsNotWritten) {
  const fs::path p = temp_dir("refused") / "r.gcz";
  struct Case {
    std::string what, rule;
    std::function<void(TensorRecord&)> edit;
    std::size_t bytes = 8;  // fp16 of 4 elements
    StatusCode code = StatusCode::kInvalidArgument;
  };
  const std::vector<Case> cases = {
      {"a codec the format lacks", "unknown-codec", [](TensorRecord& r) { r.chain[0].name = "fp17"; }, 8,
       StatusCode::kUnsupported},
      {"a codec parameter out of range", "unknown-codec",
       [](TensorRecord& r) {
         r.chain = {{"qsgd", {{"bits", int64_t{99}}}}};
       },
       8, StatusCode::kUnsupported},
      {"another codec's streams", "bad-streams", [](TensorRecord& r) { r.streams = {{.name = "codes"}}; }},
      {"a stream of the wrong size", "stream-size", [](TensorRecord&) {}, 9},
      {"more than 32 dimensions", "bad-shape", [](TensorRecord& r) { r.info.shape.assign(33, 1); }, 2},
  };
  for (const Case& c : cases) {
    for (const std::string& path : {p.string(), std::string()}) {
      auto w = GczWriter::create(path);
      ASSERT_TRUE(w);
      TensorRecord rec = fp16_record("t", {4});
      c.edit(rec);
      ASSERT_TRUE((*w)->begin_tensor(rec)) << c.what;
      ASSERT_TRUE((*w)->append(0, ByteBuffer(c.bytes))) << c.what;
      ASSERT_TRUE((*w)->end_tensor()) << c.what;
      auto size = (*w)->finish({});
      ASSERT_FALSE(size) << c.what;
      EXPECT_EQ(size.status().code(), c.code) << c.what;
      const std::string named = path.empty() ? "the .gcz" : path;
      EXPECT_NE(size.status().message().find(named +
                                             ": what was written would not be read back: tensor 't': " + c.rule + ": "),
                std::string::npos)
          << c.what << ": " << size.status().message();
      EXPECT_EQ((*w)->finish({}).status().code(), StatusCode::kInvalidArgument);  // no second try
      EXPECT_EQ((*w)->commit().code(), StatusCode::kInvalidArgument);
      w->reset();
      EXPECT_FALSE(fs::exists(p)) << c.what;
    }
  }
  // A second tensor of one name: refused before its streams.
  auto w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("t", {4})));
  ASSERT_TRUE((*w)->append(0, ByteBuffer(8)));
  ASSERT_TRUE((*w)->end_tensor());
  const Status twice = (*w)->begin_tensor(fp16_record("t", {4}));
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("tensor 't': the file has a tensor of this name already"), std::string::npos)
      << twice.message();
  EXPECT_TRUE((*w)->finish({}));  // the first is written
  w->reset();
  auto r = GczReader::open(p.string());
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)->index().tensors.size(), 1u);
  // A name that is not UTF-8 would be another in the index: refused at once.
  w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  const Status bad_name = (*w)->begin_tensor(fp16_record("t\xff", {4}));
  EXPECT_EQ(bad_name.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_name.message().find("a .gcz tensor name is UTF-8 text"), std::string::npos) << bad_name.message();
  EXPECT_EQ((*w)->append(0, ByteBuffer(8)).code(), StatusCode::kInvalidArgument);  // no tensor open
  EXPECT_EQ((*w)->end_tensor().status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("t", {4})));
  EXPECT_EQ((*w)->finish({}).status().code(), StatusCode::kInvalidArgument);  // a tensor open
  EXPECT_EQ((*w)->commit().code(), StatusCode::kInvalidArgument);
}

TEST(Container, StreamsAreAlignedChecksummedAndReadBack) {
  const fs::path p = temp_dir("streams") / "s.gcz";
  std::mt19937 rng(1);
  std::vector<uint16_t> a(100), b(3);
  for (auto& v : a) v = static_cast<uint16_t>(rng());
  for (auto& v : b) v = static_cast<uint16_t>(rng());
  auto w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("a", {10, 10})));
  const ByteBuffer ab = bytes_of(a), bb = bytes_of(b);
  ASSERT_TRUE((*w)->append(0, ByteSpan(ab).first(60)));
  ASSERT_TRUE((*w)->append(0, ByteSpan(ab).subspan(60)));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("b", {3})));
  ASSERT_TRUE((*w)->append(0, bb));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->finish({}));

  auto r = GczReader::open(p.string());
  ASSERT_TRUE(r) << r.status().message();
  const auto& t = (*r)->index().tensors;
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].streams[0].offset, 64u);
  EXPECT_EQ(t[1].streams[0].offset, detail::align_up(64 + 200));
  EXPECT_EQ(read_all(**r, 0, 0), ab);
  EXPECT_EQ(read_all(**r, 1, 0), bb);
  EXPECT_EQ((*r)->find("b"), &t[1]);
  EXPECT_EQ((*r)->find("c"), nullptr);
  EXPECT_TRUE((*r)->verify(nullptr));
  // Not a byte past a stream's end, in one read or after the last.
  ByteBuffer more(bb.size() + 1);
  auto whole = (*r)->open_stream(1, 0);
  ASSERT_TRUE(whole);
  EXPECT_EQ((*whole)->read(more.data(), more.size()).code(), StatusCode::kFormatError);
  auto after = (*r)->open_stream(1, 0);
  ASSERT_TRUE(after);
  ASSERT_TRUE((*after)->read(more.data(), bb.size()));
  EXPECT_EQ((*after)->read(more.data(), 1).code(), StatusCode::kFormatError);
}

TEST(Container, ZstdIsKeptOnlyWhereItShrinks) {
  const fs::path p = temp_dir("zstd") / "z.gcz";
  std::mt19937 rng(2);
  std::vector<uint16_t> zeros(4096, 0), noise(4096);
  for (auto& v : noise) v = static_cast<uint16_t>(rng());
  auto w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  const ByteBuffer zb = bytes_of(zeros), nb = bytes_of(noise);
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("zeros", {4096}, 3)));
  ASSERT_TRUE((*w)->append(0, ByteSpan()));  // an empty first append decides nothing
  for (int k = 0; k < 4; ++k) ASSERT_TRUE((*w)->append(0, ByteSpan(zb).subspan(k * 2048, 2048)));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("noise", {4096}, 3)));
  ASSERT_TRUE((*w)->append(0, nb));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->finish({}));
  auto r = GczReader::open(p.string());
  ASSERT_TRUE(r) << r.status().message();
  const auto& t = (*r)->index().tensors;
  EXPECT_EQ(t[0].streams[0].encoding, StreamEncoding::kZstd);
  EXPECT_LT(t[0].streams[0].length, 200u);
  EXPECT_EQ(t[1].streams[0].encoding, StreamEncoding::kRaw);
  EXPECT_EQ(read_all(**r, 0, 0), zb);
  EXPECT_EQ(read_all(**r, 1, 0), nb);
  EXPECT_TRUE((*r)->verify(nullptr));
}

// The length of the zstd frame the writer makes of a stream's first chunk: flushed, not ended.
std::size_t flushed_frame_length(const ByteBuffer& bytes, int level) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ByteBuffer out(ZSTD_compressBound(bytes.size()) + 64);
  ZSTD_inBuffer ib{bytes.data(), bytes.size(), 0};
  ZSTD_outBuffer ob{out.data(), out.size(), 0};
  const std::size_t left = ZSTD_compressStream2(cctx, &ob, &ib, ZSTD_e_flush);
  ZSTD_freeCCtx(cctx);
  EXPECT_EQ(left, 0u);
  return ob.pos;
}

// A frame no shorter than the raw bytes is not kept; one a byte shorter is. Noise whose first m
// bytes are zeros: once zstd compresses it at all, its frame shrinks a byte for each zero (the
// noise is stored as literals), from longer than the bytes to shorter, so some m makes it exactly
// as long. The bytes are few: zstd compresses a block only where that saves srcSize / 64 + 2 bytes,
// more than the frame's 9 bytes of headers for a block over 448 bytes.
TEST(Container, ZstdIsKeptOnlyWhereItIsShorterNotWhereItIsAsLong) {
  constexpr std::size_t n = 256;
  std::mt19937 rng(5);
  ByteBuffer noise(n);
  for (auto& b : noise) b = static_cast<std::byte>(rng());
  auto with_zeros = [&](std::size_t m) {
    ByteBuffer b = noise;
    std::memset(b.data(), 0, m);
    return b;
  };
  std::optional<std::size_t> equal, shorter;
  for (std::size_t m = 0; m < n && !(equal && shorter); ++m) {
    const std::size_t len = flushed_frame_length(with_zeros(m), 3);
    if (len == n && !equal) equal = m;
    if (len == n - 1 && !shorter) shorter = m;
  }
  ASSERT_TRUE(equal && shorter) << "no run of zeros made a frame of exactly " << n << " or " << n - 1 << " bytes";

  const fs::path p = temp_dir("zstd_equal") / "z.gcz";
  auto w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  const ByteBuffer eb = with_zeros(*equal), sb = with_zeros(*shorter);
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("equal", {n / 2}, 3)));
  ASSERT_TRUE((*w)->append(0, eb));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("shorter", {n / 2}, 3)));
  ASSERT_TRUE((*w)->append(0, sb));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->finish({}));
  auto r = GczReader::open(p.string());
  ASSERT_TRUE(r) << r.status().message();
  const auto& t = (*r)->index().tensors;
  EXPECT_EQ(t[0].streams[0].encoding, StreamEncoding::kRaw);
  EXPECT_EQ(t[0].streams[0].length, n);
  EXPECT_EQ(t[1].streams[0].encoding, StreamEncoding::kZstd);
  EXPECT_EQ(read_all(**r, 0, 0), eb);
  EXPECT_EQ(read_all(**r, 1, 0), sb);
  EXPECT_TRUE((*r)->verify(nullptr));
}

TEST(Container, SecondStreamsFollowTheFirstInLayoutOrder) {
  const fs::path p = temp_dir("multi") / "m.gcz";
  auto w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  TensorRecord rec = fp16_record("t", {70});  // 8-bit QSGD: 70 bytes of codes, one group's 4-byte scale
  rec.chain = {{"qsgd", {}}};
  rec.streams = {{.name = "codes"}, {.name = "scales"}};
  ASSERT_TRUE((*w)->begin_tensor(rec));
  const ByteBuffer one(70, std::byte{1}), two(2, std::byte{2});
  ASSERT_TRUE((*w)->append(1, two));  // interleaved appends, as a chunked codec makes them
  ASSERT_TRUE((*w)->append(0, one));
  ASSERT_TRUE((*w)->append(1, two));
  auto stored = (*w)->end_tensor();
  ASSERT_TRUE(stored);
  const auto& s = (*stored)->streams;
  EXPECT_EQ(s[0].offset, 64u);
  EXPECT_EQ(s[0].length, 70u);
  EXPECT_EQ(s[1].offset, 192u);
  EXPECT_EQ(s[1].length, 4u);
  ASSERT_TRUE((*w)->finish({}));
  std::ifstream in(p, std::ios::binary);
  std::vector<char> file((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(file[191], 0);
  EXPECT_EQ(file[192], 2);
  EXPECT_EQ(file[195], 2);
}

TEST(Container, EmptyAndScalarTensors) {
  const fs::path p = temp_dir("edge") / "e.gcz";
  auto w = GczWriter::create(p.string());
  ASSERT_TRUE(w);
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("empty", {0, 5}, 3)));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->begin_tensor(fp16_record("scalar", {})));
  const ByteBuffer one = bytes_of({0x3C00});
  ASSERT_TRUE((*w)->append(0, one));
  ASSERT_TRUE((*w)->end_tensor());
  ASSERT_TRUE((*w)->finish({}));
  auto r = GczReader::open(p.string());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->index().tensors[0].streams[0].length, 0u);
  EXPECT_EQ((*r)->index().tensors[1].streams[0].offset, 64u);
  EXPECT_EQ(read_all(**r, 1, 0), one);
  EXPECT_TRUE((*r)->verify(nullptr));
}

TEST(Container, AbandonedWriteLeavesNothing) {
  const fs::path d = temp_dir("abandon");
  {
    auto w = GczWriter::create((d / "x.gcz").string());
    ASSERT_TRUE(w);
    ASSERT_TRUE((*w)->begin_tensor(fp16_record("a", {1})));
    ASSERT_TRUE((*w)->append(0, bytes_of({1})));
  }
  EXPECT_TRUE(fs::is_empty(d));
}

TEST(Container, CountingWriterMatchesTheFileSize) {
  const fs::path p = temp_dir("count") / "c.gcz";
  auto write = [](const std::string& path) {
    auto w = GczWriter::create(path);
    EXPECT_TRUE((*w)->begin_tensor(fp16_record("a", {100}, 5)));
    std::vector<uint16_t> v(100);
    for (int i = 0; i < 100; ++i) v[i] = static_cast<uint16_t>(i * 37);
    EXPECT_TRUE((*w)->append(0, bytes_of(v)));
    EXPECT_TRUE((*w)->end_tensor());
    return *(*w)->finish({});
  };
  EXPECT_EQ(write(""), write(p.string()));
  EXPECT_EQ(write(p.string()), fs::file_size(p));
}

// FORMAT.md caps the index at 64 MiB: an index of exactly that is written and read, one a byte
// longer is not written. (Metadata pads an empty file's index to the length wanted.)
TEST(Container, AnIndexOfExactly64MiBIsWrittenAndReadOneByteMoreIsNot) {
  const fs::path dir = temp_dir("index_cap");
  auto write = [&](const fs::path& p, std::size_t pad) {
    auto w = GczWriter::create(p.string());
    EXPECT_TRUE(w) << w.status().message();
    return (*w)->finish({{"pad", std::string(pad, 'x')}});
  };
  ASSERT_TRUE(write(dir / "small.gcz", 0));
  const uint64_t index_without_pad = fs::file_size(dir / "small.gcz") - 64 - 32;  // header, trailer
  const std::size_t pad = kMaxIndexBytes - index_without_pad;

  auto size = write(dir / "cap.gcz", pad);
  ASSERT_TRUE(size) << size.status().message();
  EXPECT_EQ(*size, 64 + kMaxIndexBytes + 32);
  auto r = GczReader::open((dir / "cap.gcz").string());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->index().metadata.at("pad").size(), pad);

  auto over = write(dir / "over.gcz", pad + 1);
  ASSERT_FALSE(over);
  EXPECT_NE(over.status().message().find("the index would exceed 64 MiB"), std::string::npos)
      << over.status().message();
  EXPECT_FALSE(fs::exists(dir / "over.gcz"));
  fs::remove_all(dir);  // 64 MiB
}

TEST(Container, IndexJsonRoundTrips) {
  FileIndex idx;
  idx.producer = "gcz test";
  idx.metadata["k"] = "v";
  TensorRecord t = fp16_record("w", {2, 3});
  t.seed = 0xFFFFFFFFFFFFFFFFull;
  t.chain.push_back({"zstd", {{"level", int64_t{9}}}});
  t.streams[0] = {"values", StreamEncoding::kZstd, 64, 10, 12, 0x0123456789abcdefull};
  idx.tensors.push_back(t);
  auto back = detail::parse_index(detail::serialize_index(idx), kFormatVersionMajor, "mem");
  ASSERT_TRUE(back) << back.status().message();
  const TensorRecord& b = back->tensors.at(0);
  EXPECT_EQ(b.info.name, "w");
  EXPECT_EQ(b.info.shape, (Shape{2, 3}));
  EXPECT_EQ(b.seed, t.seed);
  EXPECT_EQ(b.rng, kRngName);
  EXPECT_EQ(chain_to_string(b.chain), "fp16+zstd:level=9");
  EXPECT_EQ(b.streams[0].xxh3, 0x0123456789abcdefull);
  EXPECT_EQ(b.streams[0].encoding, StreamEncoding::kZstd);
  EXPECT_EQ(back->metadata.at("k"), "v");
}

// An object with a key twice is index-json at any depth, the empty key included; the same key in two
// objects is not.
TEST(Container, IndexObjectsWithAKeyTwiceAreRefused) {
  FileIndex idx;
  idx.producer = "gcz test";
  idx.tensors = {fp16_record("a", {2}), fp16_record("b", {2})};
  const std::string text = detail::serialize_index(idx);
  ASSERT_TRUE(detail::parse_index(text, kFormatVersionMajor, "mem"));  // "name" etc. in both tensors
  auto refused = [&](const std::string& edited) {
    auto r = detail::parse_index(edited, kFormatVersionMajor, "mem");
    return !r && r.status().message().find("index-json: an object of the index has the key") != std::string::npos;
  };
  const std::size_t meta = text.find("\"metadata\":{}");
  ASSERT_NE(meta, std::string::npos) << text;
  std::string edited = text;
  edited.replace(meta, 13, "\"metadata\":{\"\":\"x\",\"\":\"y\"}");
  EXPECT_TRUE(refused(edited)) << edited;
  edited = text;
  edited.replace(text.find("\"seed\":"), 7, "\"seed\":0,\"seed\":");  // in the first tensor
  EXPECT_TRUE(refused(edited)) << edited;
  edited = text;
  edited.insert(1, "\"producer\":\"x\",");  // at the top
  EXPECT_TRUE(refused(edited)) << edited;
}

}  // namespace
}  // namespace gcz

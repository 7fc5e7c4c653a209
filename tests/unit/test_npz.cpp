// .npz reading and writing: stored and deflated members (archives built here with minizip), ranged and
// backward reads of deflated members, Fortran-order and big-endian members, skipped members, size
// mismatches, damaged archives, and writer round trips.
#include <gtest/gtest.h>
#include <minizip/unzip.h>
#include <minizip/zip.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "scratch_dir.h"
#include "gcz/tensor_io.h"
#include "npy.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string npy_with_dict(const std::string& dict, const std::string& payload) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  return out + header + payload;
}

std::string npy_f(const char* descr, const std::string& shape, const std::string& payload, bool fortran = false) {
  return npy_with_dict(std::string("{'descr': '") + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                           ", 'shape': " + shape + ", }",
                       payload);
}

struct ZipMember {
  std::string name;
  std::string bytes;
  bool deflate = false;
};

void write_zip(const std::string& path, const std::vector<ZipMember>& members) {
  zipFile zf = zipOpen64(path.c_str(), APPEND_STATUS_CREATE);
  ASSERT_NE(zf, nullptr);
  for (const ZipMember& m : members) {
    zip_fileinfo zi{};
    ASSERT_EQ(zipOpenNewFileInZip64(zf, m.name.c_str(), &zi, nullptr, 0, nullptr, 0, nullptr,
                                    m.deflate ? Z_DEFLATED : 0, m.deflate ? Z_DEFAULT_COMPRESSION : 0, 0),
              ZIP_OK);
    ASSERT_EQ(zipWriteInFileInZip(zf, m.bytes.data(), static_cast<unsigned>(m.bytes.size())), ZIP_OK);
    ASSERT_EQ(zipCloseFileInZip(zf), ZIP_OK);
  }
  ASSERT_EQ(zipClose(zf, nullptr), ZIP_OK);
}

class NpzTest : public gcz::testing::ScratchDirTest {
 protected:
  std::unique_ptr<TensorFileReader> open_ok(const std::string& path) {
    auto r = open_tensor_file(path, {});
    EXPECT_TRUE(r) << r.status().message();
    return r ? std::move(r).value() : nullptr;
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

};

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.25f - 3.0f;
  return v;
}

TEST_F(NpzTest, ReadsStoredAndDeflatedMembers) {
  const auto a = ramp(12);
  const std::vector<double> b = {1, 2, 3};
  const std::vector<uint16_t> c = {0x3C00, 0x4000};
  const std::string p = dir_ + "/g.npz";
  write_zip(p, {{"a.npy", npy_f("<f4", "(3, 4)", bytes_of(a)), false},
                {"layer/b.npy", npy_f("<f8", "(3,)", bytes_of(b)), true},
                {"c.npy", npy_f("<f2", "(2,)", bytes_of(c)), true},
                {"ids.npy", npy_f("<i8", "(2,)", std::string(16, '\0')), true},
                {"README.txt", "hello", false}});
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->format(), TensorFileFormat::kNpz);
  ASSERT_EQ(r->tensors().size(), 3u);
  EXPECT_EQ(r->tensors()[0].name, "a");
  EXPECT_EQ(r->tensors()[0].shape, (Shape{3, 4}));
  EXPECT_EQ(r->tensors()[1].name, "layer/b");
  EXPECT_EQ(r->tensors()[1].dtype, DType::kFloat64);
  EXPECT_EQ(r->tensors()[2].dtype, DType::kFloat16);
  EXPECT_EQ(read_all<float>(*r, 0), a);
  EXPECT_EQ(read_all<double>(*r, 1), b);
  EXPECT_EQ(read_all<uint16_t>(*r, 2), c);
  ASSERT_EQ(r->skipped().size(), 2u);
  EXPECT_EQ(r->skipped()[0].name, "ids");
  EXPECT_EQ(r->skipped()[0].reason, "dtype <i8 is not floating");
  EXPECT_EQ(r->skipped()[1].name, "README.txt");
}

TEST_F(NpzTest, ReadsDeflatedMemberInRangesForwardAndBackward) {
  const auto v = ramp(100000);
  const std::string p = dir_ + "/big.npz";
  write_zip(p, {{"v.npy", npy_f("<f4", "(100000,)", bytes_of(v)), true}});
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  auto src = r->open(0);
  ASSERT_TRUE(src);
  std::vector<float> part(1000);
  // Forward with a gap, then backward (reopens the member), then to the very end.
  for (uint64_t first : {uint64_t{0}, uint64_t{5000}, uint64_t{70000}, uint64_t{10}, uint64_t{99000}}) {
    ASSERT_TRUE((*src)->read(first, part.size(), part.data()).is_ok()) << first;
    for (std::size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], v[first + i]) << first;
  }
  EXPECT_EQ((*src)->read(99999, 2, part.data()).code(), StatusCode::kInvalidArgument);
}

TEST_F(NpzTest, InterleavedSourcesShareTheArchive) {
  const auto x = ramp(5000);
  std::vector<float> y(x.rbegin(), x.rend());
  const std::string p = dir_ + "/two.npz";
  write_zip(p, {{"x.npy", npy_f("<f4", "(5000,)", bytes_of(x)), true},
                {"y.npy", npy_f("<f4", "(5000,)", bytes_of(y)), true}});
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  auto sx = r->open(0);
  auto sy = r->open(1);
  ASSERT_TRUE(sx && sy);
  std::vector<float> bx(500), by(500);
  for (uint64_t first = 0; first < 5000; first += 500) {
    ASSERT_TRUE((*sx)->read(first, 500, bx.data()).is_ok());
    ASSERT_TRUE((*sy)->read(first, 500, by.data()).is_ok());
    for (std::size_t i = 0; i < 500; ++i) {
      ASSERT_EQ(bx[i], x[first + i]);
      ASSERT_EQ(by[i], y[first + i]);
    }
  }
}

TEST_F(NpzTest, ReadsFortranAndBigEndianMembers) {
  // (2, 3) column-major: C order 0..5 is stored as 0, 3, 1, 4, 2, 5.
  const std::vector<double> fortran = {0, 3, 1, 4, 2, 5};
  std::vector<float> be = {1.5f, -2.5f};
  detail::byte_swap_elements(be.data(), be.size(), 4);
  const std::string p = dir_ + "/layouts.npz";
  write_zip(p, {{"fd.npy", npy_f("<f8", "(2, 3)", bytes_of(fortran), true), true},
                {"fs.npy", npy_f("<f8", "(2, 3)", bytes_of(fortran), true), false},
                {"bd.npy", npy_f(">f4", "(2,)", bytes_of(be)), true},
                {"bs.npy", npy_f(">f4", "(2,)", bytes_of(be)), false}});
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->tensors().size(), 4u);
  const std::vector<double> c_order = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(read_all<double>(*r, 0), c_order);
  EXPECT_EQ(read_all<double>(*r, 1), c_order);
  EXPECT_EQ(read_all<float>(*r, 2), (std::vector<float>{1.5f, -2.5f}));
  EXPECT_EQ(read_all<float>(*r, 3), (std::vector<float>{1.5f, -2.5f}));
  auto src = r->open(0);
  double two[2];
  ASSERT_TRUE((*src)->read(3, 2, two).is_ok());
  EXPECT_EQ(two[0], 3);
  EXPECT_EQ(two[1], 4);
}

TEST_F(NpzTest, ReadsZeroDimAndEmptyMembers) {
  const std::string p = dir_ + "/z.npz";
  write_zip(p, {{"s.npy", npy_f("<f4", "()", bytes_of(std::vector<float>{9})), true},
                {"e.npy", npy_f("<f4", "(0, 3)", ""), false}});
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  EXPECT_EQ(read_all<float>(*r, 0), std::vector<float>{9});
  EXPECT_TRUE(read_all<float>(*r, 1).empty());
}

TEST_F(NpzTest, RejectsMemberShorterThanItsHeader) {
  for (bool deflate : {false, true}) {
    const std::string p = dir_ + "/short.npz";
    fs::remove(p);
    write_zip(p, {{"w.npy", npy_f("<f4", "(10,)", bytes_of(ramp(4))), deflate}});
    auto r = open_tensor_file(p, {});
    ASSERT_FALSE(r);
    EXPECT_EQ(r.status().code(), StatusCode::kFormatError);
    EXPECT_NE(r.status().message().find(p + ": tensor 'w'"), std::string::npos) << r.status().message();
  }
}

// A deflated member's archive rewritten in place while it was read is reported (what was read may
// mix two versions of it); one renamed over is not: minizip and the mapping hold what was opened.
TEST_F(NpzTest, ADeflatedMembersArchiveRewrittenInPlaceIsChanged) {
  const std::string p = dir_ + "/d.npz", q = dir_ + "/e.npz";
  for (const std::string& path : {p, q})
    write_zip(path, {{"w.npy", npy_f("<f4", "(100,)", bytes_of(ramp(100))), true}});
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  auto src = r->open(0);
  ASSERT_TRUE(src) << src.status().message();
  std::vector<float> got(100);
  ASSERT_TRUE((*src)->read(0, 100, got.data()));
  EXPECT_EQ(got, ramp(100));
  EXPECT_TRUE((*src)->check_unchanged());
  std::ofstream(p, std::ios::binary | std::ios::app) << "more";  // in place, longer
  const Status changed = (*src)->check_unchanged();
  EXPECT_EQ(changed.code(), StatusCode::kIoError);
  EXPECT_EQ(changed.message(), p + ": the file changed while gcz read it (was it rewritten in place? replace a file "
                                   "by renaming a new one over it)");

  auto r2 = open_ok(q);
  ASSERT_TRUE(r2);
  auto src2 = r2->open(0);
  ASSERT_TRUE(src2) << src2.status().message();
  fs::rename(p, q);  // another file under the name
  ASSERT_TRUE((*src2)->read(0, 100, got.data()));
  EXPECT_EQ(got, ramp(100));
  EXPECT_TRUE((*src2)->check_unchanged());
}

TEST_F(NpzTest, RejectsMemberWithBadNpyHeader) {
  const std::string p = dir_ + "/bad.npz";
  write_zip(p, {{"w.npy", "\x93NUMPY\x01", true}});
  auto r = open_tensor_file(p, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kFormatError);
  EXPECT_NE(r.status().message().find(p + ": tensor 'w'"), std::string::npos) << r.status().message();
}

TEST_F(NpzTest, RejectsDamagedArchives) {
  const std::string p = dir_ + "/d.npz";
  write_zip(p, {{"w.npy", npy_f("<f4", "(1000,)", bytes_of(ramp(1000))), true}});
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Cut off the central directory: not readable as a zip at all.
  std::ofstream(dir_ + "/cut.npz", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto cut = open_tensor_file(dir_ + "/cut.npz", {});
  ASSERT_FALSE(cut);
  EXPECT_EQ(cut.status().code(), StatusCode::kFormatError);
  EXPECT_NE(cut.status().message().find(dir_ + "/cut.npz"), std::string::npos);

  // Corrupt the compressed data: reading fails with an error (bad stream or CRC), never garbage.
  bytes[bytes.size() / 3] = static_cast<char>(bytes[bytes.size() / 3] ^ 0x5A);
  std::ofstream(dir_ + "/flip.npz", std::ios::binary) << bytes;
  auto r = open_tensor_file(dir_ + "/flip.npz", {});
  if (r) {
    auto src = (*r)->open(0);
    ASSERT_TRUE(src);
    std::vector<float> out(1000);
    const Status s = (*src)->read(0, 1000, out.data());
    EXPECT_EQ(s.code(), StatusCode::kFormatError) << s.message();
  } else {
    EXPECT_EQ(r.status().code(), StatusCode::kFormatError);
  }
}

TEST_F(NpzTest, WriterRoundTripsStoredMembers) {
  const auto a = ramp(60);
  const std::vector<double> s = {2.5};
  const std::vector<uint16_t> h = {0x3C00, 0x3800, 0xFC00};
  const std::vector<TensorInfo> infos = {{"layer1/w", DType::kFloat32, {3, 4, 5}},
                                         {"scalar", DType::kFloat64, {}},
                                         {"empty", DType::kFloat32, {0}},
                                         {"half", DType::kFloat16, {3}}};
  const std::string p = dir_ + "/out.npz";
  auto w = create_tensor_file(p, infos, {});
  ASSERT_TRUE(w) << w.status().message();
  ASSERT_TRUE((*w)->begin(0).is_ok());
  ASSERT_TRUE((*w)->write(a.data(), 25).is_ok());
  ASSERT_TRUE((*w)->write(a.data() + 25, 35).is_ok());
  ASSERT_TRUE((*w)->end().is_ok());
  ASSERT_TRUE((*w)->begin(1).is_ok());
  ASSERT_TRUE((*w)->write(s.data(), 1).is_ok());
  ASSERT_TRUE((*w)->end().is_ok());
  ASSERT_TRUE((*w)->begin(2).is_ok());
  ASSERT_TRUE((*w)->end().is_ok());
  ASSERT_TRUE((*w)->begin(3).is_ok());
  ASSERT_TRUE((*w)->write(h.data(), 3).is_ok());
  ASSERT_TRUE((*w)->end().is_ok());
  EXPECT_FALSE(fs::exists(p));
  ASSERT_TRUE((*w)->finish().is_ok());

  auto r = open_ok(p);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->tensors().size(), 4u);
  for (std::size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(r->tensors()[i].name, infos[i].name);
    EXPECT_EQ(r->tensors()[i].dtype, infos[i].dtype);
    EXPECT_EQ(r->tensors()[i].shape, infos[i].shape);
  }
  EXPECT_EQ(read_all<float>(*r, 0), a);
  EXPECT_EQ(read_all<double>(*r, 1), s);
  EXPECT_TRUE(read_all<float>(*r, 2).empty());
  EXPECT_EQ(read_all<uint16_t>(*r, 3), h);

  // Members are stored (method 0), as numpy's savez writes them.
  unzFile uz = unzOpen64(p.c_str());
  ASSERT_NE(uz, nullptr);
  ASSERT_EQ(unzLocateFile(uz, "layer1/w.npy", 1), UNZ_OK);
  unz_file_info64 fi{};
  ASSERT_EQ(unzGetCurrentFileInfo64(uz, &fi, nullptr, 0, nullptr, 0, nullptr, 0), UNZ_OK);
  EXPECT_EQ(fi.compression_method, 0u);
  EXPECT_EQ(fi.uncompressed_size, detail::make_npy_header(DType::kFloat32, {3, 4, 5}).size() + 60 * 4);
  unzClose(uz);
}

TEST_F(NpzTest, RefusesBfloat16UnlessWidened) {
  const std::string p = dir_ + "/b.npz";
  const std::vector<TensorInfo> infos = {{"ok", DType::kFloat32, {1}}, {"bf", DType::kBFloat16, {2}}};
  auto refused = create_tensor_file(p, infos, {});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.status().message().find(p + ": tensor 'bf' is bfloat16"), std::string::npos);
  EXPECT_FALSE(fs::exists(p));

  WriteOptions widen;
  widen.widen_bf16 = true;
  auto w = create_tensor_file(p, infos, widen);
  ASSERT_TRUE(w);
  const float one = 1;
  const std::vector<uint16_t> bf = {0x4000, 0xBF00};  // 2, -0.5
  ASSERT_TRUE((*w)->begin(0).is_ok() && (*w)->write(&one, 1).is_ok() && (*w)->end().is_ok());
  ASSERT_TRUE((*w)->begin(1).is_ok() && (*w)->write(bf.data(), 2).is_ok() && (*w)->end().is_ok());
  ASSERT_TRUE((*w)->finish().is_ok());
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->tensors()[1].dtype, DType::kFloat32);
  EXPECT_EQ(read_all<float>(*r, 1), (std::vector<float>{2.0f, -0.5f}));
}

TEST_F(NpzTest, AbandonedWriterLeavesNothing) {
  {
    auto w = create_tensor_file(dir_ + "/gone.npz", {{"a", DType::kFloat32, {2}}}, {});
    ASSERT_TRUE(w);
    const float v = 1;
    ASSERT_TRUE((*w)->begin(0).is_ok());
    ASSERT_TRUE((*w)->write(&v, 1).is_ok());
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

}  // namespace
}  // namespace gcz

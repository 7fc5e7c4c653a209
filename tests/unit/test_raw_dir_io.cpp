// Raw binary and directory I/O, plus what every path gets: format detection, missing files and unknown
// extensions.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "file_util.h"
#include "gcz/tensor_io.h"
#include "scratch_dir.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class IoTestBase : public gcz::testing::ScratchDirTest {
 protected:
  std::string write(const std::string& rel, const std::string& bytes) {
    const fs::path p = fs::path(dir_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
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

  // Writes tensors whose elements are given as raw bytes, one string per tensor.
  Status write_tensors(const std::string& path, const std::vector<TensorInfo>& infos,
                       const std::vector<std::string>& data, const WriteOptions& options = {}) {
    auto w = create_tensor_file(path, infos, options);
    if (!w) return w.status();
    for (std::size_t i = 0; i < infos.size(); ++i) {
      GCZ_RETURN_IF_ERROR((*w)->begin(i));
      GCZ_RETURN_IF_ERROR((*w)->write(data[i].data(), infos[i].numel().value()));
      GCZ_RETURN_IF_ERROR((*w)->end());
    }
    return (*w)->finish();
  }

};

using RawIoTest = IoTestBase;
using DirIoTest = IoTestBase;

ReadOptions raw_options(DType dtype, Shape shape) {
  ReadOptions o;
  o.raw_dtype = dtype;
  o.raw_shape = std::move(shape);
  return o;
}

TEST_F(RawIoTest, ReadsWithDtypeAndShape) {
  std::vector<float> v(6);
  std::iota(v.begin(), v.end(), 1.0f);
  const std::string p = write("grad.bin", bytes_of(v));
  auto r = open_tensor_file(p, raw_options(DType::kFloat32, {2, 3}));
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->format(), TensorFileFormat::kRaw);
  EXPECT_EQ((*r)->tensors()[0].name, "grad");
  EXPECT_EQ((*r)->tensors()[0].shape, (Shape{2, 3}));
  EXPECT_EQ(read_all<float>(**r, 0), v);

  // Any extension is raw when a dtype and shape are given.
  const std::string q = write("dump.dat", bytes_of(std::vector<uint16_t>{0x3F80, 0x4000}));
  auto bf = open_tensor_file(q, raw_options(DType::kBFloat16, {2}));
  ASSERT_TRUE(bf) << bf.status().message();
  EXPECT_EQ(read_all<uint16_t>(**bf, 0), (std::vector<uint16_t>{0x3F80, 0x4000}));
}

TEST_F(RawIoTest, RejectsSizeMismatch) {
  const std::string p = write("short.raw", std::string(20, '\0'));
  for (const Shape& shape : {Shape{6}, Shape{4}}) {
    auto r = open_tensor_file(p, raw_options(DType::kFloat32, shape));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.status().code(), StatusCode::kFormatError);
    EXPECT_NE(r.status().message().find(p + ": raw file is 20 bytes"), std::string::npos) << r.status().message();
  }
}

TEST_F(RawIoTest, NeedsDtypeAndShape) {
  const std::string p = write("x.bin", std::string(8, '\0'));
  auto none = open_tensor_file(p, {});
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find(p), std::string::npos);
  ReadOptions only_dtype;
  only_dtype.raw_dtype = DType::kFloat32;
  EXPECT_FALSE(open_tensor_file(p, only_dtype));
  auto absurd = open_tensor_file(p, raw_options(DType::kFloat32, {uint64_t{1} << 40, uint64_t{1} << 40}));
  ASSERT_FALSE(absurd);
  EXPECT_NE(absurd.status().message().find(p), std::string::npos);
}

// A dtype without a shape, or a shape without a dtype, is an argument error that says both are needed,
// whichever is missing: the 4-byte file, which a float32 scalar would fit, is not read as one.
TEST_F(RawIoTest, DtypeOrShapeAloneIsAnArgumentError) {
  const std::string p = write("one.bin", std::string(4, '\0'));
  ReadOptions only_dtype, only_shape;
  only_dtype.raw_dtype = DType::kFloat32;
  only_shape.raw_shape = Shape{1};
  for (const auto& [what, options] : {std::pair{"only a dtype", only_dtype}, std::pair{"only a shape", only_shape}}) {
    auto r = open_tensor_file(p, options);
    ASSERT_FALSE(r) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what << ": " << r.status().message();
    EXPECT_NE(r.status().message().find(p + ": raw binary input needs both an element dtype and a shape"),
              std::string::npos)
        << what << ": " << r.status().message();
  }
}

TEST_F(RawIoTest, WriterRoundTripsIncludingBfloat16) {
  const std::string bf = bytes_of(std::vector<uint16_t>{1, 2, 3, 4});
  const std::string p = dir_ + "/out.raw";
  ASSERT_TRUE(write_tensors(p, {{"out", DType::kBFloat16, {2, 2}}}, {bf}).is_ok());
  std::ifstream in(p, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), bf);

  auto two = create_tensor_file(dir_ + "/two.bin", {{"a", DType::kFloat32, {1}}, {"b", DType::kFloat32, {1}}}, {});
  ASSERT_FALSE(two);
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);
}

// A SIGBUS handler can name the mapped input an address is in, for as long as it is mapped.
TEST_F(RawIoTest, MappedInputsAreNamedByAddress) {
  const std::string a = write("a.bin", std::string(10000, 'a')), b = write("b.bin", std::string(3, 'b'));
  auto ma = detail::MappedFile::open(a);
  auto mb = detail::MappedFile::open(b);
  ASSERT_TRUE(ma && mb);
  const std::byte* pa = (*ma)->data();
  EXPECT_STREQ(mapped_input_at(pa), a.c_str());
  EXPECT_STREQ(mapped_input_at(pa + 9999), a.c_str());
  EXPECT_STREQ(mapped_input_at((*mb)->data() + 2), b.c_str());
  EXPECT_EQ(mapped_input_at(&a), nullptr);  // not a mapping of ours
  ma->reset();
  EXPECT_EQ(mapped_input_at(pa), nullptr);
  EXPECT_STREQ(mapped_input_at((*mb)->data()), b.c_str());
}

// A file rewritten in place since it was mapped is changed; one removed or renamed over is not
// (the mapping holds what was opened, whole).
TEST_F(RawIoTest, AMappedFileRewrittenInPlaceIsChanged) {
  const std::string a = write("a.bin", std::string(1000, 'a'));
  auto m = detail::MappedFile::open(a);
  ASSERT_TRUE(m);
  EXPECT_TRUE((*m)->check_unchanged());
  {
    std::fstream f(a, std::ios::in | std::ios::out | std::ios::binary);  // the same length, other bytes
    f.seekp(10);
    f << "zz";
  }
  fs::last_write_time(a, fs::last_write_time(a) + std::chrono::seconds(1));  // a later write, however coarse the clock
  const Status changed = (*m)->check_unchanged();
  EXPECT_EQ(changed.code(), StatusCode::kIoError);
  EXPECT_EQ(changed.message(), a + ": the file changed while gcz read it (was it rewritten in place? replace a file "
                                   "by renaming a new one over it)");
  write("a.bin", std::string(1001, 'a'));  // a longer one, in place
  EXPECT_FALSE((*m)->check_unchanged());

  const std::string b = write("b.bin", "bbbb"), c = write("c.bin", "cc");
  auto mb = detail::MappedFile::open(b);
  ASSERT_TRUE(mb);
  fs::rename(c, b);  // another file under the name
  EXPECT_TRUE((*mb)->check_unchanged());
  fs::remove(b);
  EXPECT_TRUE((*mb)->check_unchanged());
}

TEST_F(DirIoTest, ReadsATreeOfFilesSortedByPath) {
  // Build the inputs with the writers (each tested on its own elsewhere).
  const std::vector<float> a = {1, 2, 3};
  const std::vector<double> x = {4, 5};
  const std::vector<float> y = {6};
  const std::vector<uint16_t> z = {0x3F80};
  const std::string root = dir_ + "/grads";
  fs::create_directories(root + "/sub/deeper");
  ASSERT_TRUE(write_tensors(root + "/a.npy", {{"a", DType::kFloat32, {3}}}, {bytes_of(a)}).is_ok());
  ASSERT_TRUE(write_tensors(root + "/sub/b.npz", {{"x", DType::kFloat64, {2}}, {"y", DType::kFloat32, {1}}},
                            {bytes_of(x), bytes_of(y)})
                  .is_ok());
  ASSERT_TRUE(write_tensors(root + "/sub/deeper/c.safetensors", {{"z", DType::kBFloat16, {1}}}, {bytes_of(z)}).is_ok());
  ASSERT_TRUE(write_tensors(root + "/m.h5", {{"g/w", DType::kFloat32, {3}}}, {bytes_of(a)}).is_ok());
  write("grads/notes.txt", "hello");
  const std::string ids_header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }\n";
  write("grads/ids.npy", std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(ids_header.size()) + '\0' +
                             ids_header + std::string(8, '\0'));

  auto r = open_tensor_file(root, {});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->format(), TensorFileFormat::kDirectory);
  std::vector<std::string> names;
  for (const auto& t : (*r)->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "m/g/w", "sub/b/x", "sub/b/y", "sub/deeper/c/z"}));
  EXPECT_EQ(read_all<float>(**r, 0), a);
  EXPECT_EQ(read_all<float>(**r, 1), a);
  EXPECT_EQ(read_all<double>(**r, 2), x);
  EXPECT_EQ(read_all<float>(**r, 3), y);
  EXPECT_EQ(read_all<uint16_t>(**r, 4), z);
  auto src = (*r)->open(3);
  ASSERT_TRUE(src);
  EXPECT_EQ((*src)->info().name, "sub/b/y");
  // A member's elements where its file holds them in place, as that file's own source gives them
  // (an encoder then reads them without a copy).
  auto mapped = (*r)->open(0);
  ASSERT_TRUE(mapped);
  const auto* at = reinterpret_cast<const float*>((*mapped)->view(0, a.size()));
  ASSERT_NE(at, nullptr);
  EXPECT_EQ(std::vector<float>(at, at + a.size()), a);
  EXPECT_TRUE((*mapped)->check_unchanged());

  std::vector<std::string> skipped;
  for (const auto& s : (*r)->skipped()) skipped.push_back(s.name + ": " + s.reason);
  EXPECT_EQ(skipped, (std::vector<std::string>{"ids: dtype <i8 is not floating",
                                               "notes.txt: not a tensor file; known: .npy .npz .safetensors .h5 "
                                               ".hdf5 (.bin .raw with a dtype and shape)"}));
}

// A member file rewritten between the listing and the read is refused, not read under the names it
// had: here its two tensors of one shape swap names (and then one changes shape).
TEST_F(DirIoTest, AFileChangedSinceTheListingIsRefused) {
  const std::string root = dir_ + "/changing";
  fs::create_directories(root);
  const std::vector<float> one = {1, 1}, two = {2, 2};
  ASSERT_TRUE(write_tensors(root + "/a.npz", {{"x", DType::kFloat32, {2}}, {"y", DType::kFloat32, {2}}},
                            {bytes_of(one), bytes_of(two)})
                  .is_ok());
  for (const auto& rewritten : {std::vector<TensorInfo>{{"y", DType::kFloat32, {2}}, {"x", DType::kFloat32, {2}}},
                                std::vector<TensorInfo>{{"x", DType::kFloat32, {1, 2}}, {"y", DType::kFloat32, {2}}}}) {
    ASSERT_TRUE(write_tensors(root + "/a.npz", {{"x", DType::kFloat32, {2}}, {"y", DType::kFloat32, {2}}},
                              {bytes_of(one), bytes_of(two)})
                    .is_ok());
    auto r = open_tensor_file(root, {});
    ASSERT_TRUE(r) << r.status().message();
    ASSERT_EQ((*r)->tensors().size(), 2u);
    ASSERT_TRUE(write_tensors(root + "/a.npz", rewritten, {bytes_of(two), bytes_of(one)}).is_ok());
    auto src = (*r)->open(0);
    ASSERT_FALSE(src) << rewritten[0].name;
    EXPECT_EQ(src.status().code(), StatusCode::kFormatError);
    EXPECT_NE(src.status().message().find("a.npz: the file changed while the directory was being read"),
              std::string::npos)
        << src.status().message();
  }
}

TEST_F(DirIoTest, RejectsDuplicateNames) {
  const std::string root = dir_ + "/dup";
  fs::create_directories(root + "/x");
  ASSERT_TRUE(write_tensors(root + "/x/y.npy", {{"y", DType::kFloat32, {1}}}, {std::string(4, '\0')}).is_ok());
  ASSERT_TRUE(write_tensors(root + "/x.npz", {{"y", DType::kFloat32, {1}}}, {std::string(4, '\0')}).is_ok());
  auto r = open_tensor_file(root, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kFormatError);
  EXPECT_NE(r.status().message().find(root + ": tensor 'x/y'"), std::string::npos) << r.status().message();
}

TEST_F(DirIoTest, WriterRoundTripsWithSubdirectories) {
  const std::vector<float> w = {1, 2, 3, 4};
  const std::vector<uint16_t> bf = {0x4080};  // 4
  const std::string out = dir_ + "/out/";
  const std::vector<TensorInfo> infos = {
      {"layer1/weight", DType::kFloat32, {2, 2}}, {"layer1/bf", DType::kBFloat16, {1}}, {"top", DType::kFloat32, {}}};
  const Status refused = write_tensors(out, infos, {bytes_of(w), bytes_of(bf), bytes_of(w)});
  EXPECT_EQ(refused.code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.message().find("tensor 'layer1/bf' is bfloat16"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/out"));

  WriteOptions widen;
  widen.widen_bf16 = true;
  ASSERT_TRUE(write_tensors(out, infos, {bytes_of(w), bytes_of(bf), bytes_of(w)}, widen).is_ok());
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/out/layer1/weight.npy"));
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/out/top.npy"));
  auto r = open_tensor_file(dir_ + "/out", {});
  ASSERT_TRUE(r) << r.status().message();
  std::vector<std::string> names;
  for (const auto& t : (*r)->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"layer1/bf", "layer1/weight", "top"}));
  EXPECT_EQ(read_all<float>(**r, 0), std::vector<float>{4.0f});
  EXPECT_EQ(read_all<float>(**r, 1), w);
  EXPECT_EQ(read_all<float>(**r, 2), std::vector<float>{1.0f});
  // Only the output directory remains: no temporaries next to it.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(DirIoTest, WriterUsesEmptyButRefusesNonEmptyTarget) {
  fs::create_directories(dir_ + "/empty");
  EXPECT_TRUE(write_tensors(dir_ + "/empty", {{"t", DType::kFloat32, {1}}}, {std::string(4, '\0')}).is_ok());
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/empty/t.npy"));

  auto again = create_tensor_file(dir_ + "/empty", {{"u", DType::kFloat32, {1}}}, {});
  ASSERT_FALSE(again);
  EXPECT_NE(again.status().message().find(dir_ + "/empty: the output directory exists and is not empty"),
            std::string::npos);
}

TEST_F(DirIoTest, WriterRejectsEscapingNamesAndLeavesNothing) {
  for (const char* bad : {"../evil", "a/../../b", "/etc/x", "a//b", "./a"}) {
    auto w = create_tensor_file(dir_ + "/o/", {{bad, DType::kFloat32, {1}}}, {});
    ASSERT_FALSE(w) << bad;
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(w.status().message().find(std::string("tensor '") + bad + "'"), std::string::npos);
  }
  {
    auto w = create_tensor_file(dir_ + "/o/", {{"a", DType::kFloat32, {2}}}, {});
    ASSERT_TRUE(w);
    const float v = 1;
    ASSERT_TRUE((*w)->begin(0).is_ok() && (*w)->write(&v, 1).is_ok());
  }  // abandoned
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(DirIoTest, MissingFileAndUnknownExtension) {
  const std::string missing = dir_ + "/nope.npy";
  auto r = open_tensor_file(missing, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_EQ(r.status().message(), missing + ": cannot open: No such file or directory");

  const std::string odd = write("weights.pt", "pickle");
  auto u = open_tensor_file(odd, {});
  ASSERT_FALSE(u);
  EXPECT_EQ(u.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(u.status().message().find(odd + ": unknown tensor file extension '.pt'"), std::string::npos);
  EXPECT_NE(u.status().message().find(".npy .npz .safetensors .h5 .hdf5 .bin .raw"), std::string::npos);

  auto w = create_tensor_file(dir_ + "/out.xyz", {{"t", DType::kFloat32, {1}}}, {});
  ASSERT_FALSE(w);
  EXPECT_EQ(w.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(w.status().message().find(dir_ + "/out.xyz"), std::string::npos);
}

TEST_F(DirIoTest, FormatFromPath) {
  EXPECT_EQ(tensor_format_from_path("a.npy"), TensorFileFormat::kNpy);
  EXPECT_EQ(tensor_format_from_path("A.NPZ"), TensorFileFormat::kNpz);
  EXPECT_EQ(tensor_format_from_path("m.safetensors"), TensorFileFormat::kSafetensors);
  EXPECT_EQ(tensor_format_from_path("m.h5"), TensorFileFormat::kHdf5);
  EXPECT_EQ(tensor_format_from_path("m.hdf5"), TensorFileFormat::kHdf5);
  EXPECT_EQ(tensor_format_from_path("g.bin"), TensorFileFormat::kRaw);
  EXPECT_EQ(tensor_format_from_path("g.raw"), TensorFileFormat::kRaw);
  EXPECT_EQ(tensor_format_from_path("out/"), TensorFileFormat::kDirectory);
  EXPECT_EQ(tensor_format_from_path(dir_), TensorFileFormat::kDirectory);
  EXPECT_EQ(tensor_format_from_path("g.pt"), std::nullopt);
  EXPECT_STREQ(tensor_file_format_name(TensorFileFormat::kSafetensors), "safetensors");
  EXPECT_STREQ(tensor_file_format_name(TensorFileFormat::kDirectory), "directory");
}

}  // namespace
}  // namespace gcz

// HDF5 reading and writing: files built here with the HDF5 C API (nested groups, every float layout
// including IEEE half and bfloat16, big-endian storage, scalar and empty datasets, non-float datasets),
// ranged reads across hyperslab boundaries, and writer round trips.
#include <gtest/gtest.h>

#if __has_include(<hdf5.h>)
#include <hdf5.h>
#else
#include <hdf5/serial/hdf5.h>
#endif

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <tuple>

#include "gcz/tensor_io.h"
#include "scratch_dir.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

// A 2-byte float type with the given exponent/mantissa split (5/10 IEEE half, 8/7 bfloat16).
hid_t small_float_type(std::size_t exponent, std::size_t mantissa, std::size_t bias) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, mantissa, exponent, 0, mantissa);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, bias);
  return t;
}

void add_dataset(hid_t file, const char* name, hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
                 const void* data, bool scalar = false) {
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t space = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t ds = H5Dcreate2(file, name, file_type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(ds, 0) << name;
  if (data) {
    ASSERT_GE(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0) << name;
  }
  H5Dclose(ds);
  H5Sclose(space);
  H5Pclose(lcpl);
}

// A float32 dataset of `chunks` chunks of 2^18 elements (1 MiB each) of which only the first `written`
// are written: the others are never allocated, and read as the fill value.
void add_sparse_dataset(hid_t file, const char* name, hsize_t chunks, hsize_t written) {
  const hsize_t chunk = hsize_t{1} << 18, dims = chunks * chunk, count = written * chunk, start = 0;
  hid_t space = H5Screate_simple(1, &dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  hid_t ds = H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(ds, 0) << name;
  const std::vector<float> v(count, 0.25f);
  hid_t mem = H5Screate_simple(1, &count, nullptr);
  ASSERT_GE(H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &count, nullptr), 0) << name;
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, v.data()), 0) << name;
  EXPECT_EQ(H5Dget_storage_size(ds), count * sizeof(float)) << name << ": only the written chunks are stored";
  H5Sclose(mem);
  H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(space);
}

class Hdf5Test : public gcz::testing::ScratchDirTest {
 protected:
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

TEST_F(Hdf5Test, ReadsFloatDatasetsInNestedGroupsAndSkipsOthers) {
  const std::string p = dir_ + "/model.h5";
  std::vector<float> w(12);
  std::iota(w.begin(), w.end(), 1.0f);
  const std::vector<double> b = {0.5, -0.25, 8};
  const std::vector<uint16_t> half = {0x3C00, 0xC000, 0x7C00};  // 1, -2, +Inf
  const std::vector<uint16_t> bf = {0x3F80, 0x4040};            // 1, 3
  const std::vector<float> be = {1.25f, -7.5f};
  const std::vector<int32_t> ints = {1, 2};
  const double scalar = 3.75;
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t h16 = small_float_type(5, 10, 15);
    hid_t b16 = small_float_type(8, 7, 127);
    add_dataset(f, "encoder/layer0/weight", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {3, 4}, w.data());
    add_dataset(f, "encoder/layer0/bias", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {3}, b.data());
    add_dataset(f, "half", h16, h16, {3}, half.data());
    add_dataset(f, "brain", b16, b16, {2}, bf.data());
    add_dataset(f, "big_endian", H5T_IEEE_F32BE, H5T_NATIVE_FLOAT, {2}, be.data());
    add_dataset(f, "step", H5T_STD_I32LE, H5T_NATIVE_INT32, {2}, ints.data());
    add_dataset(f, "scalar", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {}, &scalar, /*scalar=*/true);
    add_dataset(f, "empty", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {0, 4}, nullptr);
    H5Tclose(h16);
    H5Tclose(b16);
    H5Fclose(f);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->format(), TensorFileFormat::kHdf5);
  std::vector<std::string> names;
  for (const auto& t : (*r)->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"big_endian", "brain", "empty", "encoder/layer0/bias",
                                             "encoder/layer0/weight", "half", "scalar"}));
  const auto& t = (*r)->tensors();
  EXPECT_EQ(t[0].dtype, DType::kFloat32);
  EXPECT_EQ(t[1].dtype, DType::kBFloat16);
  EXPECT_EQ(t[2].shape, (Shape{0, 4}));
  EXPECT_EQ(t[3].dtype, DType::kFloat64);
  EXPECT_EQ(t[4].shape, (Shape{3, 4}));
  EXPECT_EQ(t[5].dtype, DType::kFloat16);
  EXPECT_EQ(t[6].shape, Shape{});
  EXPECT_EQ(read_all<float>(**r, 0), be);
  EXPECT_EQ(read_all<uint16_t>(**r, 1), bf);
  EXPECT_TRUE(read_all<float>(**r, 2).empty());
  EXPECT_EQ(read_all<double>(**r, 3), b);
  EXPECT_EQ(read_all<float>(**r, 4), w);
  EXPECT_EQ(read_all<uint16_t>(**r, 5), half);
  EXPECT_EQ(read_all<double>(**r, 6), std::vector<double>{scalar});
  ASSERT_EQ((*r)->skipped().size(), 1u);
  EXPECT_EQ((*r)->skipped()[0].name, "step");
  EXPECT_NE((*r)->skipped()[0].reason.find("integer"), std::string::npos);
}

// A hostile .h5 may keep a dataset's data in any file it names (/etc/passwd) or map it from other
// files: such datasets are skipped, not read. Links other than hard links are noted as skipped.
TEST_F(Hdf5Test, SkipsDataKeptOutsideTheFileAndNotesLinks) {
  const std::string p = dir_ + "/links.h5", outside = dir_ + "/outside.bin";
  const std::vector<float> v = {1, 2, 3, 4};
  {
    std::ofstream(outside, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), 16);
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    add_dataset(f, "ok", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {4}, v.data());
    const hsize_t n = 4;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_external(dcpl, outside.c_str(), 0, 16), 0);
    hid_t ext = H5Dcreate2(f, "external_storage", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ext, 0);
    H5Dclose(ext);
    H5Pclose(dcpl);
    H5Sclose(space);
    ASSERT_GE(H5Lcreate_soft("/ok", f, "soft", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_soft("/nowhere", f, "dangling", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_external("other.h5", "/t", f, "elsewhere", H5P_DEFAULT, H5P_DEFAULT), 0);
    H5Fclose(f);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 1u);
  EXPECT_EQ((*r)->tensors()[0].name, "ok");
  std::map<std::string, std::string> skipped;
  for (const SkippedTensor& s : (*r)->skipped()) skipped[s.name] = s.reason;
  ASSERT_EQ(skipped.size(), 4u);
  EXPECT_NE(skipped["external_storage"].find("HDF5 external storage"), std::string::npos);
  EXPECT_NE(skipped["soft"].find("a soft link"), std::string::npos);
  EXPECT_NE(skipped["dangling"].find("a soft link"), std::string::npos);
  EXPECT_NE(skipped["elsewhere"].find("an external link"), std::string::npos);
}

// A file rewritten in place while its datasets were read is reported (what was read may mix two
// versions of it); one renamed over, or removed, is not: HDF5 holds the file it opened.
TEST_F(Hdf5Test, AFileRewrittenInPlaceIsChanged) {
  const std::string p = dir_ + "/g.h5", q = dir_ + "/other.h5";
  const std::vector<float> w = {1, 2, 3};
  for (const std::string& path : {p, q}) {
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    add_dataset(f, "w", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {3}, w.data());
    H5Fclose(f);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  auto src = (*r)->open(0);
  ASSERT_TRUE(src) << src.status().message();
  std::vector<float> got(3);
  ASSERT_TRUE((*src)->read(0, 3, got.data()));
  EXPECT_EQ(got, w);
  EXPECT_TRUE((*src)->check_unchanged());
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);  // the same length, another byte
    f.seekg(-1, std::ios::end);
    const char last = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(last ^ 1));
  }
  fs::last_write_time(p, fs::last_write_time(p) + std::chrono::seconds(1));  // however coarse the clock
  const Status changed = (*src)->check_unchanged();
  EXPECT_EQ(changed.code(), StatusCode::kIoError);
  EXPECT_EQ(changed.message(), p + ": the file changed while gcz read it (was it rewritten in place? replace a file "
                                   "by renaming a new one over it)");

  auto r2 = open_tensor_file(q, {});
  ASSERT_TRUE(r2) << r2.status().message();
  auto src2 = (*r2)->open(0);
  ASSERT_TRUE(src2) << src2.status().message();
  fs::rename(p, q);  // another file under the name
  EXPECT_TRUE((*src2)->check_unchanged());
  ASSERT_TRUE((*src2)->read(0, 3, got.data()));
  EXPECT_EQ(got, w);
  fs::remove(q);
  EXPECT_TRUE((*src2)->check_unchanged());
}

// A virtual dataset maps its elements from datasets in other files, which a hostile .h5 can name as it
// likes: skipped with a note, like external storage, even when the file it maps from is there and
// HDF5 itself would read it. (Virtual datasets need the 1.10 file format, set through the bounds.)
TEST_F(Hdf5Test, SkipsAVirtualDataset) {
  const std::string p = dir_ + "/vds.h5", source = dir_ + "/source.h5";
  const std::vector<float> v = {1, 2, 3, 4};
  {
    hid_t f = H5Fcreate(source.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    add_dataset(f, "data", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {4}, v.data());
    H5Fclose(f);
  }
  {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    ASSERT_GE(H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), 0);
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    ASSERT_GE(f, 0);
    add_dataset(f, "ok", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {4}, v.data());
    const hsize_t n = 4;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_virtual(dcpl, space, source.c_str(), "/data", space), 0);
    hid_t vds = H5Dcreate2(f, "mapped", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(vds, 0);
    std::vector<float> through(4);
    ASSERT_GE(H5Dread(vds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, through.data()), 0);
    EXPECT_EQ(through, v) << "HDF5 reads the virtual dataset from the source file";
    H5Dclose(vds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
    H5Pclose(fapl);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 1u) << "the virtual dataset is not read";
  EXPECT_EQ((*r)->tensors()[0].name, "ok");
  ASSERT_EQ((*r)->skipped().size(), 1u);
  EXPECT_EQ((*r)->skipped()[0].name, "mapped");
  EXPECT_NE((*r)->skipped()[0].reason.find("a virtual dataset (its data is mapped from other datasets or files)"),
            std::string::npos)
      << (*r)->skipped()[0].reason;
}

// A float of IEEE float32's size and fields but another exponent bias (126: each bit pattern means twice
// its float32 value) is none of the layouts gcz reads: skipped with the reason, not read as float32.
TEST_F(Hdf5Test, SkipsAFloatWithAnotherExponentBias) {
  const std::string p = dir_ + "/bias.h5";
  const std::vector<float> v = {1.0f, -3.0f};
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t odd = H5Tcopy(H5T_IEEE_F32LE);
    ASSERT_GE(H5Tset_ebias(odd, 126), 0);
    add_dataset(f, "odd_bias", odd, odd, {2}, v.data());  // the bits of 1 and -3, which now mean 2 and -6
    add_dataset(f, "ieee", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {2}, v.data());
    H5Tclose(odd);
    H5Fclose(f);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 1u) << "the float with exponent bias 126 is not read as float32";
  EXPECT_EQ((*r)->tensors()[0].name, "ieee");
  EXPECT_EQ(read_all<float>(**r, 0), v);
  ASSERT_EQ((*r)->skipped().size(), 1u);
  EXPECT_EQ((*r)->skipped()[0].name, "odd_bias");
  EXPECT_EQ((*r)->skipped()[0].reason, "HDF5 float of 4 bytes has a layout other than IEEE float16/32/64 or bfloat16");
}

// A failed read says what HDF5 found (here a deflate stream with corrupted bytes), not "unknown".
TEST_F(Hdf5Test, AFailedReadSaysWhy) {
#if H5_VERSION_GE(1, 10, 5)
  const std::string p = dir_ + "/gz.h5";
  std::vector<float> v(64 * 64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i));
  haddr_t at = 0;
  hsize_t size = 0;
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[2] = {64, 64}, chunk[2] = {32, 32};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 2, chunk);
    H5Pset_deflate(dcpl, 6);
    hid_t ds = H5Dcreate2(f, "w", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    unsigned mask = 0;
    hsize_t offset[2] = {};
    ASSERT_GE(H5Dflush(ds), 0);
    ASSERT_GE(H5Dget_chunk_info(ds, space, 0, offset, &mask, &at, &size), 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
  }
  {
    std::fstream file(p, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(at + size / 3));
    const char junk[16] = {'\x55', '\x55', '\x55', '\x55', '\x55', '\x55', '\x55', '\x55',
                           '\x55', '\x55', '\x55', '\x55', '\x55', '\x55', '\x55', '\x55'};
    file.write(junk, sizeof junk);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  auto src = (*r)->open(0);
  ASSERT_TRUE(src);
  std::vector<float> out(v.size());
  const Status s = (*src)->read(0, out.size(), out.data());
  ASSERT_FALSE(s);
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("tensor 'w': HDF5 read failed: "), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("unknown HDF5 error"), std::string::npos) << s.message();
#else
  GTEST_SKIP() << "H5Dget_chunk_info, which finds the chunk to damage, needs HDF5 1.10.5";
#endif
}

// A chunked dataset never written reads as its fill value: 1 KiB of file can claim 4 TiB. Such a
// dataset is refused (exit 5) when it claims more than 1024 times what it stores, past 1 GiB; one that
// stores its data is read.
TEST_F(Hdf5Test, RefusesADatasetThatClaimsFarMoreThanItStores) {
  const std::string p = dir_ + "/lazy.h5";
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[1] = {hsize_t{1} << 40}, chunk[1] = {hsize_t{1} << 16};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    hid_t ds = H5Dcreate2(f, "lazy", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    const std::vector<float> v(1000, 0.5f);
    add_dataset(f, "small", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1000}, v.data());
    H5Fclose(f);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("tensor 'lazy': the dataset claims 4398046511104 bytes but stores 0"),
            std::string::npos)
      << r.status().message();
}

// The two sides of that line, past 1 GiB: 2 MiB of written chunks may claim 2 GiB (exactly 1024 times,
// opened; only its start and end are read, the rest never is), 1 MiB may not claim 1025 MiB.
TEST_F(Hdf5Test, ADatasetMayClaimUpTo1024TimesWhatItStores) {
  const std::string at_line = dir_ + "/at_line.h5", past_line = dir_ + "/past_line.h5";
  for (const auto& [path, chunks, written] : {std::tuple{at_line, 2048, 2}, std::tuple{past_line, 1025, 1}}) {
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0) << path;
    add_sparse_dataset(f, "w", chunks, written);
    H5Fclose(f);
  }
  auto r = open_tensor_file(at_line, {});
  ASSERT_TRUE(r) << "2 GiB claimed on 2 MiB stored is 1024 times, which may be read: " << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 1u);
  EXPECT_EQ((*r)->tensors()[0].shape, Shape{uint64_t{1} << 29});
  auto src = (*r)->open(0);
  ASSERT_TRUE(src) << src.status().message();
  std::vector<float> ends(2, -1.0f);
  ASSERT_TRUE((*src)->read(0, 1, &ends[0]).is_ok());
  ASSERT_TRUE((*src)->read((uint64_t{1} << 29) - 1, 1, &ends[1]).is_ok());
  EXPECT_EQ(ends, (std::vector<float>{0.25f, 0.0f})) << "a written element, then one of an unwritten chunk";

  auto refused = open_tensor_file(past_line, {});
  ASSERT_FALSE(refused) << "1025 MiB claimed on 1 MiB stored is past 1024 times";
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.status().message().find("tensor 'w': the dataset claims 1074790400 bytes but stores 1048576"),
            std::string::npos)
      << refused.status().message();
}

// 32 dimensions, the most gcz (like HDF5) allows, are read. HDF5 neither writes nor reads a 33rd: a
// dataspace patched to rank 33 fails to open, an error naming the dataset. The file is written in the
// earliest format (object headers without checksums), so the rank can be patched in place.
TEST_F(Hdf5Test, Reads32DimensionsAndRefusesA33rd) {
  const std::string p = dir_ + "/rank32.h5";
  const float v = 2.5f;
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    add_dataset(f, "x", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, std::vector<hsize_t>(32, 1), &v);
    H5Fclose(f);
  }
  {
    auto r = open_tensor_file(p, {});
    ASSERT_TRUE(r) << "32 dimensions are allowed: " << r.status().message();
    ASSERT_EQ((*r)->tensors().size(), 1u) << "the 32-dimension dataset is read, not skipped";
    EXPECT_EQ((*r)->tensors()[0].shape, Shape(32, 1));
    EXPECT_EQ(read_all<float>(**r, 0), std::vector<float>{v});
  }  // closed before the file is patched

  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The dataspace message (version 1): version, rank, flags, 5 reserved bytes, then the 32 dimensions
  // and the 32 maxima, 8 bytes each.
  std::string ones;
  for (int k = 0; k < 64; ++k) ones += std::string("\x01\0\0\0\0\0\0\0", 8);
  const std::size_t at = bytes.find(ones);
  ASSERT_TRUE(at != std::string::npos && at >= 8) << "no dataspace message of 32 dimensions of 1 in the file";
  ASSERT_EQ(bytes[at - 8], 1) << "dataspace message version";
  ASSERT_EQ(bytes[at - 7], 32) << "dataspace rank";
  bytes[at - 7] = 33;
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto refused = open_tensor_file(p, {});
  ASSERT_FALSE(refused) << "a dataspace of 33 dimensions";
  EXPECT_EQ(refused.status().code(), StatusCode::kFormatError);
  EXPECT_NE(refused.status().message().find(p + ": tensor 'x': cannot open the dataset"), std::string::npos)
      << refused.status().message();
}

// A damaged dataspace whose dimension exceeds its own maximum, which HDF5 1.10 reads regardless (and
// then allocates without bound): refused when the file is opened. The file is written in the
// earliest format (object headers without checksums) and one dimension is patched in place.
TEST_F(Hdf5Test, RefusesADimensionPastItsMaximum) {
  const std::string p = dir_ + "/dims.h5";
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<float> v(4 * 16, 1.0f);
    add_dataset(f, "x", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {4, 16}, v.data());
    H5Fclose(f);
  }
  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The dataspace message: the dimensions (4, 16), then the maxima (4, 16), 8 bytes each.
  std::string pattern(32, '\0');
  for (int k = 0; k < 4; ++k) pattern[8 * k] = static_cast<char>(k % 2 == 0 ? 4 : 16);
  const std::size_t at = bytes.find(pattern);
  ASSERT_NE(at, std::string::npos) << "no dataspace message (4, 16) / (4, 16) in the file";
  bytes[at + 8 + 4] = 4;  // dimension 1 becomes 16 + 2^34
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto r = open_tensor_file(p, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kFormatError);
  EXPECT_NE(r.status().message().find("tensor 'x': dimension 1 of the dataspace is 17179869200, past its maximum 16"),
            std::string::npos)
      << r.status().message();
}

// Names are UTF-8: the links of the datasets, and of the groups their paths make, say so.
TEST_F(Hdf5Test, WriterMarksLinkNamesUtf8) {
  const std::string p = dir_ + "/names.h5";
  const std::string name = "\xC3\xBC/\xE5\x90\x8D x/w";  // "ü/名 x/w"
  auto wr = create_tensor_file(p, {{name, DType::kFloat32, {1}}}, {});
  ASSERT_TRUE(wr) << wr.status().message();
  const float v = 1.5f;
  ASSERT_TRUE((*wr)->begin(0).is_ok() && (*wr)->write(&v, 1).is_ok() && (*wr)->end().is_ok());
  ASSERT_TRUE((*wr)->finish().is_ok());
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  for (const std::string link : {std::string("\xC3\xBC"), name.substr(0, name.rfind('/')), name}) {
#if H5_VERSION_GE(1, 12, 0)
    H5L_info2_t info;
    ASSERT_GE(H5Lget_info2(f, link.c_str(), &info, H5P_DEFAULT), 0) << link;
#else
    H5L_info_t info;
    ASSERT_GE(H5Lget_info(f, link.c_str(), &info, H5P_DEFAULT), 0) << link;
#endif
    EXPECT_EQ(info.cset, H5T_CSET_UTF8) << link;
  }
  H5Fclose(f);
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->tensors()[0].name, name);
}

// Contiguous and in chunks of 2 x 3 x 2 (which no range lines up with): the same elements.
TEST_F(Hdf5Test, ReadsEveryRangeOfA3dDataset) {
  const std::string p = dir_ + "/cube.h5";
  std::vector<double> v(3 * 4 * 5);
  std::iota(v.begin(), v.end(), 0.0);
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    add_dataset(f, "cube", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {3, 4, 5}, v.data());
    const hsize_t dims[3] = {3, 4, 5}, chunk[3] = {2, 3, 2};
    hid_t space = H5Screate_simple(3, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 3, chunk);
    hid_t ds = H5Dcreate2(f, "cube_chunked", H5T_IEEE_F64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
  }
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 2u);
  for (std::size_t t = 0; t < 2; ++t) {
    auto src = (*r)->open(t);
    ASSERT_TRUE(src);
    for (uint64_t first = 0; first <= v.size(); ++first) {
      for (uint64_t count = 0; first + count <= v.size(); ++count) {
        std::vector<double> part(count, -1);
        ASSERT_TRUE((*src)->read(first, count, part.data()).is_ok()) << first << "+" << count;
        for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(part[i], v[first + i]) << t << ": " << first << "+" << count;
      }
    }
    double one;
    EXPECT_EQ((*src)->read(60, 1, &one).code(), StatusCode::kInvalidArgument);
  }
}

TEST_F(Hdf5Test, WriterRoundTripsInChunks) {
  std::vector<float> w(2 * 3 * 7);
  std::iota(w.begin(), w.end(), -5.0f);
  const std::vector<uint16_t> h = {0x3C00, 0x0001, 0xFBFF};
  const double s = -1e-300;
  const std::vector<TensorInfo> infos = {{"net/block.1/conv/weight", DType::kFloat32, {2, 3, 7}},
                                         {"net/half", DType::kFloat16, {3}},
                                         {"s", DType::kFloat64, {}},
                                         {"net/empty", DType::kFloat32, {5, 0}}};
  const std::string p = dir_ + "/out.h5";
  auto wr = create_tensor_file(p, infos, {});
  ASSERT_TRUE(wr) << wr.status().message();
  ASSERT_TRUE((*wr)->begin(0).is_ok());
  for (std::size_t done = 0; done < w.size();) {  // odd-sized pieces cross row and plane boundaries
    const std::size_t n = std::min<std::size_t>(5, w.size() - done);
    ASSERT_TRUE((*wr)->write(w.data() + done, n).is_ok());
    done += n;
  }
  ASSERT_TRUE((*wr)->end().is_ok());
  ASSERT_TRUE((*wr)->begin(1).is_ok() && (*wr)->write(h.data(), 3).is_ok() && (*wr)->end().is_ok());
  ASSERT_TRUE((*wr)->begin(2).is_ok() && (*wr)->write(&s, 1).is_ok() && (*wr)->end().is_ok());
  ASSERT_TRUE((*wr)->begin(3).is_ok() && (*wr)->end().is_ok());
  EXPECT_FALSE(fs::exists(p));
  ASSERT_TRUE((*wr)->finish().is_ok());

  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ((*r)->tensors().size(), 4u);
  // Listed by path: net/block.1/conv/weight, net/empty, net/half, s.
  EXPECT_EQ((*r)->tensors()[0].name, "net/block.1/conv/weight");
  EXPECT_EQ((*r)->tensors()[0].shape, (Shape{2, 3, 7}));
  EXPECT_EQ(read_all<float>(**r, 0), w);
  EXPECT_EQ((*r)->tensors()[1].shape, (Shape{5, 0}));
  EXPECT_EQ((*r)->tensors()[2].dtype, DType::kFloat16);
  EXPECT_EQ(read_all<uint16_t>(**r, 2), h);
  EXPECT_EQ(read_all<double>(**r, 3), std::vector<double>{s});

  // The half dataset is stored in 2 bytes per element, as an IEEE half type.
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "net/half", H5P_DEFAULT);
  hid_t t = H5Dget_type(ds);
  EXPECT_EQ(H5Tget_size(t), 2u);
  std::size_t spos, epos, esize, mpos, msize;
  H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize);
  EXPECT_EQ(esize, 5u);
  EXPECT_EQ(msize, 10u);
  H5Tclose(t);
  H5Dclose(ds);
  H5Fclose(f);
}

TEST_F(Hdf5Test, RefusesBfloat16UnlessWidened) {
  const std::string p = dir_ + "/b.h5";
  auto refused = create_tensor_file(p, {{"g/bf", DType::kBFloat16, {2}}}, {});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.status().message().find(p + ": tensor 'g/bf' is bfloat16"), std::string::npos);

  WriteOptions widen;
  widen.widen_bf16 = true;
  auto w = create_tensor_file(p, {{"g/bf", DType::kBFloat16, {2}}}, widen);
  ASSERT_TRUE(w) << w.status().message();
  const std::vector<uint16_t> bf = {0x3F80, 0xC0A0};  // 1, -5
  ASSERT_TRUE((*w)->begin(0).is_ok() && (*w)->write(bf.data(), 2).is_ok() && (*w)->end().is_ok());
  ASSERT_TRUE((*w)->finish().is_ok());
  auto r = open_tensor_file(p, {});
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)->tensors()[0].dtype, DType::kFloat32);
  EXPECT_EQ(read_all<float>(**r, 0), (std::vector<float>{1.0f, -5.0f}));
}

TEST_F(Hdf5Test, WriterRejectsClashingAndBadNames) {
  const std::string p = dir_ + "/clash.h5";
  auto clash = create_tensor_file(p, {{"a", DType::kFloat32, {1}}, {"a/b", DType::kFloat32, {1}}}, {});
  ASSERT_FALSE(clash);
  EXPECT_NE(clash.status().message().find(p + ": tensor 'a/b'"), std::string::npos) << clash.status().message();
  for (const char* bad : {"/abs", "a//b", "x/../y", "."}) {
    auto r = create_tensor_file(p, {{bad, DType::kFloat32, {1}}}, {});
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(fs::is_empty(dir_));  // no file and no temporary left behind
}

TEST_F(Hdf5Test, RejectsNonHdf5AndMissingFiles) {
  const std::string p = dir_ + "/fake.h5";
  std::ofstream(p, std::ios::binary) << "this is not an HDF5 file";
  auto r = open_tensor_file(p, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), StatusCode::kFormatError);
  EXPECT_NE(r.status().message().find(p), std::string::npos);

  auto missing = open_tensor_file(dir_ + "/missing.hdf5", {});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_EQ(missing.status().message(), dir_ + "/missing.hdf5: cannot open: No such file or directory");
}

}  // namespace
}  // namespace gcz

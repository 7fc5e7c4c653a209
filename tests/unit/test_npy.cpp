// .npy reading and writing: header versions and dict variants, dtypes, byte order, Fortran order, 0-d and
// empty arrays, non-floating arrays, hostile headers, and writer round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "scratch_dir.h"
#include "gcz/detail/float_bits.h"
#include "gcz/tensor_io.h"
#include "npy.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A .npy file around `dict`, padded the way numpy pads (total header a multiple of 64, '\n' last).
std::string npy_bytes(const std::string& dict, const std::string& payload, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + payload;
}

std::string dict_for(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
}

class NpyTest : public gcz::testing::ScratchDirTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

  std::unique_ptr<TensorFileReader> open_ok(const std::string& path) {
    auto r = open_tensor_file(path, {});
    EXPECT_TRUE(r) << r.status().message();
    return r ? std::move(r).value() : nullptr;
  }

  template <class T>
  std::vector<T> read_all(TensorFileReader& reader, std::size_t i) {
    auto src = reader.open(i);
    EXPECT_TRUE(src) << src.status().message();
    const uint64_t n = (*src)->info().numel().value();
    std::vector<T> out(n);
    const Status s = (*src)->read(0, n, out.data());
    EXPECT_TRUE(s.is_ok()) << s.message();
    return out;
  }

  // The error an open of these bytes gives; checks it names the file.
  Status open_error(const std::string& name, const std::string& bytes) {
    const std::string p = write(name, bytes);
    auto r = open_tensor_file(p, {});
    EXPECT_FALSE(r);
    if (r) return Status::ok();
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
    return r.status();
  }

  std::vector<std::string> leftover_files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    return names;
  }

};

TEST_F(NpyTest, ReadsFloat32Version1) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  auto r = open_ok(write("grad.npy", npy_bytes(dict_for("<f4", "(2, 3)"), bytes_of(v))));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->format(), TensorFileFormat::kNpy);
  ASSERT_EQ(r->tensors().size(), 1u);
  EXPECT_EQ(r->tensors()[0].name, "grad");
  EXPECT_EQ(r->tensors()[0].dtype, DType::kFloat32);
  EXPECT_EQ(r->tensors()[0].shape, (Shape{2, 3}));
  EXPECT_TRUE(r->skipped().empty());
  EXPECT_EQ(read_all<float>(*r, 0), v);

  auto src = r->open(0);
  ASSERT_TRUE(src);
  float part[2];
  ASSERT_TRUE((*src)->read(3, 2, part).is_ok());
  EXPECT_EQ(part[0], 4);
  EXPECT_EQ(part[1], 5);
  (*src)->release(6);  // dropping the pages must not change what a later read sees
  ASSERT_TRUE((*src)->read(0, 2, part).is_ok());
  EXPECT_EQ(part[0], 1);
  const Status past_end = (*src)->read(5, 2, part);
  EXPECT_EQ(past_end.code(), StatusCode::kInvalidArgument);
}

TEST_F(NpyTest, ReadsFloat16AndFloat64) {
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x7BFF};
  auto r16 = open_ok(write("h.npy", npy_bytes(dict_for("<f2", "(3,)"), bytes_of(h))));
  ASSERT_TRUE(r16);
  EXPECT_EQ(r16->tensors()[0].dtype, DType::kFloat16);
  EXPECT_EQ(read_all<uint16_t>(*r16, 0), h);

  const std::vector<double> d = {1.5, -2.25, 1e300};
  auto r64 = open_ok(write("d.npy", npy_bytes(dict_for("<f8", "(3,)"), bytes_of(d))));
  ASSERT_TRUE(r64);
  EXPECT_EQ(r64->tensors()[0].dtype, DType::kFloat64);
  EXPECT_EQ(read_all<double>(*r64, 0), d);
}

TEST_F(NpyTest, ReadsVersion2And3Headers) {
  const std::vector<float> v = {7, 8};
  for (int major : {2, 3}) {
    auto r =
        open_ok(write("v" + std::to_string(major) + ".npy", npy_bytes(dict_for("<f4", "(2,)"), bytes_of(v), major)));
    ASSERT_TRUE(r);
    EXPECT_EQ(read_all<float>(*r, 0), v) << "version " << major;
  }
}

TEST_F(NpyTest, AcceptsDictVariants) {
  const std::vector<float> v = {1, 2, 3, 4};
  const std::vector<std::string> dicts = {
      "{'shape': (2, 2), 'fortran_order': False, 'descr': '<f4'}",         // any key order, no trailing comma
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,2)}",  // double quotes, tight tuple
      "{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , 2 , ) , }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 2L), }",  // Python 2 longs
  };
  for (std::size_t i = 0; i < dicts.size(); ++i) {
    auto r = open_ok(write("v" + std::to_string(i) + ".npy", npy_bytes(dicts[i], bytes_of(v))));
    ASSERT_TRUE(r) << dicts[i];
    EXPECT_EQ(r->tensors()[0].shape, (Shape{2, 2})) << dicts[i];
    EXPECT_EQ(read_all<float>(*r, 0), v) << dicts[i];
  }
}

TEST_F(NpyTest, SwapsBigEndian) {
  std::vector<float> v = {1.5f, -3.0f, 1e-20f};
  std::vector<float> swapped = v;
  detail::byte_swap_elements(swapped.data(), swapped.size(), 4);
  auto r = open_ok(write("be.npy", npy_bytes(dict_for(">f4", "(3,)"), bytes_of(swapped))));
  ASSERT_TRUE(r);
  EXPECT_EQ(read_all<float>(*r, 0), v);

  std::vector<double> d = {2.0, -0.125};
  std::vector<double> dsw = d;
  detail::byte_swap_elements(dsw.data(), dsw.size(), 8);
  auto r64 = open_ok(write("be8.npy", npy_bytes(dict_for(">f8", "(2,)"), bytes_of(dsw))));
  ASSERT_TRUE(r64);
  EXPECT_EQ(read_all<double>(*r64, 0), d);

  auto r16 = open_ok(write("be2.npy", npy_bytes(dict_for(">f2", "(1,)"), std::string("\x3C\x00", 2))));
  ASSERT_TRUE(r16);
  EXPECT_EQ(read_all<uint16_t>(*r16, 0), std::vector<uint16_t>{0x3C00});
}

TEST_F(NpyTest, TransposesFortranOrder) {
  // C-order values 0..23 of shape (2, 3, 4), stored column-major: element (i, j, k) at i + 2j + 6k.
  const Shape shape = {2, 3, 4};
  std::vector<double> fortran(24);
  for (uint64_t i = 0; i < 2; ++i)
    for (uint64_t j = 0; j < 3; ++j)
      for (uint64_t k = 0; k < 4; ++k) fortran[i + 2 * j + 6 * k] = static_cast<double>(i * 12 + j * 4 + k);
  auto r = open_ok(write("f.npy", npy_bytes(dict_for("<f8", "(2, 3, 4)", true), bytes_of(fortran))));
  ASSERT_TRUE(r);
  std::vector<double> expected(24);
  std::iota(expected.begin(), expected.end(), 0.0);
  EXPECT_EQ(read_all<double>(*r, 0), expected);

  auto src = r->open(0);
  ASSERT_TRUE(src);
  for (uint64_t first = 0; first < 24; ++first) {
    for (uint64_t count = 0; first + count <= 24; ++count) {
      std::vector<double> part(count);
      ASSERT_TRUE((*src)->read(first, count, part.data()).is_ok());
      for (uint64_t n = 0; n < count; ++n) ASSERT_EQ(part[n], static_cast<double>(first + n));
    }
  }
}

TEST_F(NpyTest, FortranOrderBigEndianFloat32) {
  // (2, 2) column-major and big-endian: C order [[1, 2], [3, 4]] is stored as 1, 3, 2, 4.
  std::vector<float> stored = {1, 3, 2, 4};
  detail::byte_swap_elements(stored.data(), stored.size(), 4);
  auto r = open_ok(write("fb.npy", npy_bytes(dict_for(">f4", "(2, 2)", true), bytes_of(stored))));
  ASSERT_TRUE(r);
  EXPECT_EQ(read_all<float>(*r, 0), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(NpyTest, ReadsZeroDimAndEmptyArrays) {
  auto scalar = open_ok(write("s.npy", npy_bytes(dict_for("<f4", "()"), bytes_of(std::vector<float>{42}))));
  ASSERT_TRUE(scalar);
  EXPECT_EQ(scalar->tensors()[0].shape, Shape{});
  EXPECT_EQ(read_all<float>(*scalar, 0), std::vector<float>{42});

  for (const char* shape : {"(0,)", "(3, 0)"}) {
    auto empty = open_ok(write("e.npy", npy_bytes(dict_for("<f4", shape), "")));
    ASSERT_TRUE(empty) << shape;
    EXPECT_EQ(empty->tensors()[0].numel().value(), 0u);
    EXPECT_TRUE(read_all<float>(*empty, 0).empty());
  }
}

// Listed as skipped, as in an .npz or a directory (the encoder refuses an input of nothing else).
TEST_F(NpyTest, SkipsNonFloatingArray) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"'<i8'", "dtype <i8 is not floating"},
      {"'|b1'", "dtype |b1 is not floating"},
      {"'<c8'", "dtype <c8 is not floating"},
      {"'|O'", "dtype |O is not floating"},
      {"[('a', '<f4'), ('b', '<i4')]", "structured dtype is not floating"},
      {"'<f16'", "dtype <f16 is not supported (float16, float32 and float64 are)"},
  };
  for (const auto& [descr, reason] : cases) {
    const std::string dict = "{'descr': " + descr + ", 'fortran_order': False, 'shape': (2,), }";
    auto r = open_tensor_file(write("x.npy", npy_bytes(dict, std::string(32, '\0'))), {});
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_TRUE((*r)->tensors().empty()) << descr;
    ASSERT_EQ((*r)->skipped().size(), 1u) << descr;
    EXPECT_EQ((*r)->skipped()[0].name, "x");
    EXPECT_EQ((*r)->skipped()[0].reason, reason);
  }
}

TEST_F(NpyTest, RejectsTruncatedHeader) {
  const std::string full = npy_bytes(dict_for("<f4", "(2,)"), bytes_of(std::vector<float>{1, 2}));
  for (std::size_t cut : {std::size_t{3}, std::size_t{9}, std::size_t{40}}) {
    const Status s = open_error("t.npy", full.substr(0, cut));
    EXPECT_EQ(s.code(), StatusCode::kFormatError) << cut;
  }
  EXPECT_NE(open_error("t.npy", full.substr(0, 40)).message().find("truncated"), std::string::npos);
}

TEST_F(NpyTest, RejectsTruncatedPayload) {
  const Status s = open_error("p.npy", npy_bytes(dict_for("<f4", "(2, 3)"), bytes_of(std::vector<float>{1, 2, 3})));
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("payload truncated"), std::string::npos) << s.message();
  // One byte short of the last element.
  const std::string whole = bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6});
  const Status one = open_error("p.npy", npy_bytes(dict_for("<f4", "(2, 3)"), whole.substr(0, whole.size() - 1)));
  EXPECT_NE(one.message().find("23 bytes after the header, but shape [2, 3] of <f4 needs 24"), std::string::npos)
      << one.message();
}

// 32 dimensions, what a .gcz holds, are read; 33 are refused (numpy has allowed 64 since 2.0).
TEST_F(NpyTest, ReadsThirtyTwoDimensionsAndRefusesThirtyThree) {
  std::string ones = "(1,";
  for (int i = 1; i < 32; ++i) ones += " 1,";
  auto r32 = open_ok(write("r32.npy", npy_bytes(dict_for("<f4", ones + ")"), bytes_of(std::vector<float>{7}))));
  ASSERT_TRUE(r32);
  EXPECT_EQ(r32->tensors()[0].shape, Shape(32, 1));
  EXPECT_EQ(read_all<float>(*r32, 0), std::vector<float>{7});
  const Status s = open_error("r33.npy", npy_bytes(dict_for("<f4", ones + " 1)"), bytes_of(std::vector<float>{7})));
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("33 dimensions, more than 32"), std::string::npos) << s.message();
}

TEST_F(NpyTest, RejectsAbsurdShapes) {
  for (const char* shape :
       {"(4294967296, 4294967296, 4294967296)", "(99999999999999999999999,)", "(281474976710656, 2)"}) {
    const Status s = open_error("big.npy", npy_bytes(dict_for("<f4", shape), ""));
    EXPECT_EQ(s.code(), StatusCode::kFormatError) << shape;
  }
}

TEST_F(NpyTest, RejectsMalformedHeaders) {
  const std::vector<std::string> dicts = {
      "{'descr': '<f4', 'shape': (2,), }",                                        // missing key
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",      // unknown key
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",  // duplicate key
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk",             // trailing text
      "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",                      // not a bool
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2)}",                   // not a tuple
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",                 // negative
      "{'descr': 'zz', 'fortran_order': False, 'shape': (2,)}",                   // unknown descr
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",                   // unclosed
      "['descr', '<f4']",                                                         // not a dict
  };
  for (const std::string& d : dicts) {
    const Status s = open_error("m.npy", npy_bytes(d, std::string(8, '\0')));
    EXPECT_EQ(s.code(), StatusCode::kFormatError) << d << " -> " << s.message();
  }
}

TEST_F(NpyTest, RejectsBadMagicVersionAndHugeHeader) {
  EXPECT_EQ(open_error("a.npy", "PK\x03\x04 not numpy at all").code(), StatusCode::kFormatError);
  std::string v4 = npy_bytes(dict_for("<f4", "(1,)"), bytes_of(std::vector<float>{1}));
  v4[6] = 4;
  EXPECT_EQ(open_error("b.npy", v4).code(), StatusCode::kUnsupported);
  std::string huge = "\x93NUMPY";
  huge += '\x02';
  huge += '\0';
  huge += std::string("\x00\x00\x00\x40", 4);  // a 1 GiB header length
  const Status s = open_error("c.npy", huge + std::string(64, ' '));
  EXPECT_EQ(s.code(), StatusCode::kFormatError);
  EXPECT_NE(s.message().find("1 MiB"), std::string::npos) << s.message();
}

TEST_F(NpyTest, HeaderMatchesNumpyLayout) {
  const std::string h = detail::make_npy_header(DType::kFloat32, {3, 4});
  EXPECT_EQ(h.size() % 64, 0u);
  EXPECT_EQ(h.back(), '\n');
  EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_NE(h.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"), std::string::npos);
  EXPECT_NE(detail::make_npy_header(DType::kFloat16, {5}).find("'shape': (5,)"), std::string::npos);
  EXPECT_NE(detail::make_npy_header(DType::kFloat64, {}).find("'shape': ()"), std::string::npos);
}

TEST_F(NpyTest, WriterRoundTripsEveryDtypeInChunks) {
  std::vector<float> f(1000);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.5f - 7;
  const std::string p = dir_ + "/out.npy";
  auto w = create_tensor_file(p, {{"out", DType::kFloat32, {10, 100}}}, {});
  ASSERT_TRUE(w) << w.status().message();
  ASSERT_TRUE((*w)->begin(0).is_ok());
  ASSERT_TRUE((*w)->write(f.data(), 333).is_ok());
  ASSERT_TRUE((*w)->write(f.data() + 333, 667).is_ok());
  ASSERT_TRUE((*w)->end().is_ok());
  EXPECT_FALSE(fs::exists(p));  // nothing at the final name before finish()
  ASSERT_TRUE((*w)->finish().is_ok());
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->tensors()[0].shape, (Shape{10, 100}));
  EXPECT_EQ(read_all<float>(*r, 0), f);

  const std::vector<double> d = {1, -2};
  const std::vector<uint16_t> h = {0x3C00, 0x8001};
  for (auto [dtype, bytes] : {std::pair{DType::kFloat64, bytes_of(d)}, std::pair{DType::kFloat16, bytes_of(h)}}) {
    const std::string q = dir_ + "/t.npy";
    fs::remove(q);
    auto w2 = create_tensor_file(q, {{"t", dtype, {2}}}, {});
    ASSERT_TRUE(w2);
    ASSERT_TRUE((*w2)->begin(0).is_ok());
    ASSERT_TRUE((*w2)->write(bytes.data(), 2).is_ok());
    ASSERT_TRUE((*w2)->end().is_ok());
    ASSERT_TRUE((*w2)->finish().is_ok());
    auto r2 = open_ok(q);
    ASSERT_TRUE(r2);
    EXPECT_EQ(r2->tensors()[0].dtype, dtype);
    auto src = r2->open(0);
    std::string raw(bytes.size(), '\0');
    ASSERT_TRUE((*src)->read(0, 2, raw.data()).is_ok());
    EXPECT_EQ(raw, bytes);
  }
}

TEST_F(NpyTest, WriterRoundTripsZeroDimAndEmpty) {
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{4, 0}}) {
    const std::string p = dir_ + "/z.npy";
    fs::remove(p);
    auto w = create_tensor_file(p, {{"z", DType::kFloat32, shape}}, {});
    ASSERT_TRUE(w);
    const float one = 3.5f;
    ASSERT_TRUE((*w)->begin(0).is_ok());
    if (shape.empty()) ASSERT_TRUE((*w)->write(&one, 1).is_ok());
    ASSERT_TRUE((*w)->end().is_ok());
    ASSERT_TRUE((*w)->finish().is_ok());
    auto r = open_ok(p);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->tensors()[0].shape, shape);
    EXPECT_EQ(read_all<float>(*r, 0).size(), shape.empty() ? 1u : 0u);
  }
}

TEST_F(NpyTest, RefusesBfloat16UnlessWidened) {
  const std::string p = dir_ + "/b.npy";
  auto refused = create_tensor_file(p, {{"b", DType::kBFloat16, {3}}}, {});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(
      refused.status().message(),
      p + ": tensor 'b' is bfloat16, which .npy cannot hold; pass --widen to write float32, or write .safetensors");
  // .npz and a directory name themselves.
  for (const auto& [out, holder] :
       {std::pair<std::string, std::string>{dir_ + "/b.npz", ".npz"}, {dir_ + "/d/", "a directory of .npy files"}}) {
    auto r = create_tensor_file(out, {{"b", DType::kBFloat16, {3}}}, {});
    ASSERT_FALSE(r) << out;
    EXPECT_NE(r.status().message().find("which " + holder + " cannot hold"), std::string::npos) << r.status().message();
  }

  const std::vector<uint16_t> bf = {0x3F80, 0xC040, 0x7F80};  // 1, -3, +Inf
  WriteOptions widen;
  widen.widen_bf16 = true;
  auto w = create_tensor_file(p, {{"b", DType::kBFloat16, {3}}}, widen);
  ASSERT_TRUE(w) << w.status().message();
  ASSERT_TRUE((*w)->begin(0).is_ok());
  ASSERT_TRUE((*w)->write(bf.data(), 3).is_ok());
  ASSERT_TRUE((*w)->end().is_ok());
  ASSERT_TRUE((*w)->finish().is_ok());
  auto r = open_ok(p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->tensors()[0].dtype, DType::kFloat32);
  const auto back = read_all<float>(*r, 0);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -3.0f);
  EXPECT_TRUE(std::isinf(back[2]));
}

TEST_F(NpyTest, WriterEnforcesProtocolAndLeavesNothingOnFailure) {
  const std::string p = dir_ + "/w.npy";
  auto two = create_tensor_file(p, {{"a", DType::kFloat32, {1}}, {"b", DType::kFloat32, {1}}}, {});
  ASSERT_FALSE(two);
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);

  {
    auto w = create_tensor_file(p, {{"w", DType::kFloat32, {4}}}, {});
    ASSERT_TRUE(w);
    const float v[5] = {};
    EXPECT_EQ((*w)->begin(1).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE((*w)->begin(0).is_ok());
    EXPECT_EQ((*w)->write(v, 5).code(), StatusCode::kInvalidArgument);  // more than the shape holds
    ASSERT_TRUE((*w)->write(v, 2).is_ok());
    EXPECT_EQ((*w)->end().code(), StatusCode::kInvalidArgument);  // incomplete
    EXPECT_FALSE((*w)->finish().is_ok());
  }
  {
    auto w = create_tensor_file(p, {{"w", DType::kFloat32, {4}}}, {});
    ASSERT_TRUE(w);
    ASSERT_TRUE((*w)->begin(0).is_ok());
    // abandoned without finish()
  }
  EXPECT_TRUE(leftover_files().empty());
}

}  // namespace
}  // namespace gcz

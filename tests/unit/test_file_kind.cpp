// What a file's first bytes say it is (format/src/file_kind.h), and the notes built from it.
#include <gtest/gtest.h>

#include <string>

#include "file_kind.h"

namespace gcz::detail {
namespace {

FileKind kind_of(const std::string& bytes) {
  return sniff_file_kind(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
}

// A zip local file header whose first member is `name` (sizes and CRC left zero).
std::string zip_starting_with(const std::string& name) {
  std::string h("PK\x03\x04", 4);
  h += std::string(22, '\0');
  h += static_cast<char>(name.size() & 0xff);
  h += static_cast<char>(name.size() >> 8);
  h += std::string(2, '\0');
  return h + name;
}

TEST(FileKind, KnowsEachFormatByItsFirstBytes) {
  EXPECT_EQ(kind_of(std::string("\x89GCZ\r\n\x1a\n", 8) + std::string(56, '\0')), FileKind::kGcz);
  EXPECT_EQ(kind_of(std::string("\x93NUMPY\x01\x00", 8)), FileKind::kNpy);
  EXPECT_EQ(kind_of(std::string("\x89HDF\r\n\x1a\n", 8)), FileKind::kHdf5);
  EXPECT_EQ(kind_of(zip_starting_with("archive/data.pkl")), FileKind::kTorch);
  EXPECT_EQ(kind_of(zip_starting_with("data.pkl")), FileKind::kTorch);
  EXPECT_EQ(kind_of(zip_starting_with("w.npy")), FileKind::kNpz);
  EXPECT_EQ(kind_of(zip_starting_with("readme.txt")), FileKind::kZip);
  // A name cut off by the bytes looked at is not taken for a whole one.
  EXPECT_EQ(kind_of(zip_starting_with("archive/data.pkl").substr(0, 40)), FileKind::kZip);
  // Even where what is there of it reads as one: "data.pkl" or "w.npy" of a longer name.
  EXPECT_EQ(kind_of(zip_starting_with("data.pkl.orig/more").substr(0, 38)), FileKind::kZip);
  EXPECT_EQ(kind_of(zip_starting_with("w.npy.bak").substr(0, 35)), FileKind::kZip);
  EXPECT_EQ(kind_of(std::string("PK\x03\x04", 4)), FileKind::kZip);
  for (char protocol : {'\x02', '\x03', '\x04', '\x05'}) {
    EXPECT_EQ(kind_of(std::string("\x80") + protocol + "}q\x00."), FileKind::kPickle) << int(protocol);
  }
  EXPECT_EQ(kind_of(std::string("\x80\x01", 2)), FileKind::kUnknown);
  EXPECT_EQ(kind_of(std::string("\x80\x06", 2)), FileKind::kUnknown);
  EXPECT_EQ(kind_of(std::string("\x02\x00\x00\x00\x00\x00\x00\x00{}", 10)), FileKind::kSafetensors);
  EXPECT_EQ(kind_of(std::string("\x02\x00\x00\x00\x00\x00\x00\x00[]", 10)), FileKind::kUnknown);
  EXPECT_EQ(kind_of(""), FileKind::kUnknown);
  EXPECT_EQ(kind_of("plain text"), FileKind::kUnknown);
}

TEST(FileKind, NotesNameTheKindUnlessItIsTheOneExpected) {
  EXPECT_EQ(tensor_input_note(FileKind::kNpy, FileKind::kNpy), "");
  EXPECT_EQ(tensor_input_note(FileKind::kUnknown, FileKind::kNpz), "");
  EXPECT_EQ(tensor_input_note(FileKind::kNpy, FileKind::kNpz), "; it is a .npy file: name it NAME.npy");
  EXPECT_EQ(tensor_input_note(FileKind::kGcz, FileKind::kUnknown),
            "; it is a .gcz file: gcz decode, info and verify read it");
  EXPECT_NE(tensor_input_note(FileKind::kTorch, FileKind::kSafetensors).find("which gcz does not read"),
            std::string::npos);
  EXPECT_EQ(gcz_input_note(FileKind::kGcz), "");
  EXPECT_EQ(gcz_input_note(FileKind::kSafetensors), "; it is a safetensors file: gcz encode and gcz eval read it");
  EXPECT_EQ(gcz_input_note(FileKind::kZip), "; it is a zip archive");
}

}  // namespace
}  // namespace gcz::detail

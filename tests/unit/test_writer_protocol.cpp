// What every multi-tensor writer (.safetensors, .npz, HDF5, a directory) shares through
// create_tensor_file and SequentialWriter: the tensor list is checked at creation, and finish() commits
// only a file whose every tensor was written.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gcz/tensor_io.h"
#include "scratch_dir.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

using WriterProtocolTest = gcz::testing::ScratchDirTest;

// The outputs that hold several tensors, one of each format.
const std::vector<std::string> kOutputs = {"out.safetensors", "out.npz", "out.h5", "out_dir/"};

// Two tensors of one name are refused at creation in every format, before anything is written (each
// format could otherwise hold both, or fail only at the second begin()).
TEST_F(WriterProtocolTest, TwoTensorsOfOneNameAreRefusedInEveryFormat) {
  for (const std::string& out : kOutputs) {
    const std::string p = dir_ + "/" + out;
    auto w = create_tensor_file(p, {{"w", DType::kFloat32, {2}}, {"w", DType::kFloat32, {3}}}, {});
    ASSERT_FALSE(w) << out << ": two tensors named 'w'";
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << out << ": " << w.status().message();
    EXPECT_EQ(w.status().message(), p + ": tensor 'w': duplicate name") << out;
    EXPECT_TRUE(fs::is_empty(dir_)) << out << ": nothing is left behind";
  }
}

// finish() after only the first of two tensors fails, saying how many were written, and commits
// nothing: no output, and once the writer is gone no temporary either.
TEST_F(WriterProtocolTest, FinishBeforeEveryTensorIsWrittenFailsAndLeavesNothing) {
  const std::vector<float> v = {1.5f, -2.0f};
  for (const std::string& out : kOutputs) {
    const std::string p = dir_ + "/" + out;
    {
      auto w = create_tensor_file(p, {{"a", DType::kFloat32, {2}}, {"b", DType::kFloat32, {2}}}, {});
      ASSERT_TRUE(w) << out << ": " << w.status().message();
      ASSERT_TRUE((*w)->begin(0).is_ok() && (*w)->write(v.data(), 2).is_ok() && (*w)->end().is_ok()) << out;
      const Status s = (*w)->finish();
      ASSERT_FALSE(s) << out << ": finish() with tensor 'b' not written";
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << out << ": " << s.message();
      EXPECT_EQ(s.message(), p + ": finish() after 1 of 2 tensors") << out;
      EXPECT_FALSE(fs::exists(p)) << out << ": no output after the failed finish()";
    }
    EXPECT_TRUE(fs::is_empty(dir_)) << out << ": no temporary left once the writer is gone";
  }
}

}  // namespace
}  // namespace gcz

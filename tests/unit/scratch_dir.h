// Scratch directories for tests: fresh and empty, under the test temp dir, named so that test
// processes running in parallel (ctest -j) never share one.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace gcz::testing {

// "<temp>/gcz_<name>", emptied and created.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::path(::testing::TempDir()) / ("gcz_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A fixture whose dir_ is a fresh directory for each test (named after the test and the process),
// removed afterwards.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = scratch_dir(std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(::getpid()))
               .string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

}  // namespace gcz::testing

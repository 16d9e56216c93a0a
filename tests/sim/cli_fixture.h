// A test that drives the tpusim binary, as a user would, in a scratch directory of
// its own (named after the test, removed afterwards). TPUSIM_BIN is the binary's
// path, a compile definition of each test target.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/sim/spawn.h"

namespace tpusim::testing {

class TpusimCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "tpusim_" + info->test_suite_name() + "_" + std::to_string(::getpid()) + "_" +
           info->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // `tpusim ARGS...` run in the scratch directory; killed after `timeout_s`.
  Completed tpusim(std::vector<std::string> args, unsigned timeout_s = 120) {
    args.insert(args.begin(), TPUSIM_BIN);
    return spawn(args, dir_, timeout_s);
  }
  std::string dir_;
};

}  // namespace tpusim::testing

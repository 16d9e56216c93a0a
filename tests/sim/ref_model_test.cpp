// `tpusim ref MODEL`: the graph reference through the command line, checked
// against closed forms (values a person can compute by hand) and the CLI's error
// contract.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "isa/io/npy.h"
#include "tests/sim/spawn.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  std::string path;
  Scratch() {
    path = (fs::temp_directory_path() /
            ("tpusim_ref_model_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path + "/" + name) << text;
    return path + "/" + name;
  }
};

// y = relu(x + x): every element is max(2x, 0), exact in fp32 for these inputs.
constexpr const char* kGraph = R"(graph twice {
  input %x : f32[3,5]
  %s = add(%x, %x) : f32[3,5] #0
  %y = relu(%s) : f32[3,5] #1
  output %y
}
)";

io::NpyArray f32_array(std::vector<int64_t> shape, const std::vector<float>& v) {
  io::NpyArray a;
  a.dtype = io::NpyDtype::kF32;
  a.shape.assign(shape.begin(), shape.end());
  a.data.resize(v.size() * 4);
  std::memcpy(a.data.data(), v.data(), a.data.size());
  return a;
}

TEST(RefModel, GraphTextGivesTheClosedForm) {
  Scratch s;
  const std::string model = s.write("twice.graph", kGraph);
  std::vector<float> x(15);
  for (int i = 0; i < 15; ++i) x[i] = 0.25f * float(i - 7);
  io::write_npy(s.path + "/x.npy", f32_array({3, 5}, x));
  const auto r = testing::spawn({TPUSIM_BIN, "ref", model, "--input", "x=" + s.path + "/x.npy", "--out",
                                 s.path + "/out"},
                                s.path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const io::NpyArray y = io::read_npy(s.path + "/out/y.npy");
  ASSERT_EQ(y.shape, (std::vector<int64_t>{3, 5}));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(y.as<float>()[i], std::max(2.0f * x[i], 0.0f)) << i;
}

TEST(RefModel, RandomInputsAreDeterministic) {
  Scratch s;
  const std::string model = s.write("twice.graph", kGraph);
  for (const char* dir : {"a", "b"}) {
    const auto r = testing::spawn({TPUSIM_BIN, "ref", model, "--random-inputs", "7", "--out", s.path + "/" + dir},
                                  s.path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(testing::slurp(s.path + "/a/y.npy"), testing::slurp(s.path + "/b/y.npy"));
}

TEST(RefModel, BadInputsExitTwoWithOneLine) {
  Scratch s;
  const std::string model = s.write("twice.graph", kGraph);
  io::write_npy(s.path + "/wrong.npy", f32_array({5, 3}, std::vector<float>(15, 1.0f)));
  const std::string truncated = s.write("cut.onnx", std::string("\x08\x07\x12\x04", 4));
  const std::string broken = s.write("broken.graph", "graph g {\n  input %x : f32[2\n}\n");
  struct Case {
    std::vector<std::string> argv;
    std::string needle;
  } cases[] = {
      {{TPUSIM_BIN, "ref", model}, "missing input 'x'"},
      {{TPUSIM_BIN, "ref", model, "--input", "x=" + s.path + "/wrong.npy"}, "shape"},
      {{TPUSIM_BIN, "ref", model, "--input", "z=" + s.path + "/wrong.npy"}, "no input of that name"},
      {{TPUSIM_BIN, "ref", model, "--random-inputs", "1", "--precision", "fp8"}, "--precision"},
      {{TPUSIM_BIN, "ref", truncated, "--random-inputs", "1"}, "cut.onnx"},
      {{TPUSIM_BIN, "ref", broken, "--random-inputs", "1"}, "broken.graph:"},
  };
  for (const auto& c : cases) {
    const auto r = testing::spawn(c.argv, s.path);
    EXPECT_EQ(r.exit_code, 2) << c.argv.back() << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(s.path + "/tpusim-out/y.npy"));
  }
}

}  // namespace
}  // namespace tpusim

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
  const std::string bundle = s.write("b.tpb", "TPUSIMB");  // read as a bundle (its magic)
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
      {{TPUSIM_BIN, "ref", model, "--random-inputs", "1", "--replicas", "3"}, "--replicas needs --preset"},
      {{TPUSIM_BIN, "ref", model, "--random-inputs", "1", "--set", "core.mxu.rows=64"}, "--set needs --preset"},
      {{TPUSIM_BIN, "ref", model, "--random-inputs", "1", "--preset", "v9"}, "unknown preset"},
      {{TPUSIM_BIN, "ref", model, "--random-inputs", "1", "--preset", "v3-8", "--replicas", "3"}, "whole chips"},
      {{TPUSIM_BIN, "ref", model, "--random-inputs", "1", "--preset", "v3-8", "--replicas", "2", "--collective",
        "star"},
       "--collective 'star'"},
      {{TPUSIM_BIN, "ref", bundle, "--random-inputs", "1", "--replicas", "2"}, "apply to a model"},
      {{TPUSIM_BIN, "ref", bundle, "--random-inputs", "1", "--collective", "ring"}, "apply to a model"},
  };
  for (const auto& c : cases) {
    const auto r = testing::spawn(c.argv, s.path);
    EXPECT_EQ(r.exit_code, 2) << c.argv.back() << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(s.path + "/tpusim-out/y.npy"));
  }
}

// Replicas split the batch: s is replica 0's column sums (rows 0-1), g their
// all_reduce over both replicas (every row), y = relu(x) the replicas' rows
// concatenated. Small integers: every order of addition gives the same sums.
TEST(RefModel, ReplicasSplitTheBatchAndAllReduce) {
  Scratch s;
  const std::string model = s.write("dp.graph", R"(graph dp {
  input %x : f32[4,3]
  %s = reduce_sum(%x) {axes=[0], keepdims=0} : f32[3] #0
  %g = all_reduce(%s) : f32[3] #1
  %y = relu(%x) : f32[4,3] #2
  output %s
  output %g
  output %y
}
)");
  std::vector<float> x(12);
  for (int i = 0; i < 12; ++i) x[i] = float((i * 7) % 11) - 4.0f;
  io::write_npy(s.path + "/x.npy", f32_array({4, 3}, x));
  const auto r = testing::spawn({TPUSIM_BIN, "ref", model, "--input", "x=" + s.path + "/x.npy", "--preset", "v3-8",
                                 "--replicas", "2", "--out", s.path + "/out"},
                                s.path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const io::NpyArray sum = io::read_npy(s.path + "/out/s.npy"), all = io::read_npy(s.path + "/out/g.npy"),
                     y = io::read_npy(s.path + "/out/y.npy");
  ASSERT_EQ(sum.shape, (std::vector<int64_t>{3}));
  ASSERT_EQ(all.shape, (std::vector<int64_t>{3}));
  ASSERT_EQ(y.shape, (std::vector<int64_t>{4, 3}));
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(sum.as<float>()[c], x[c] + x[3 + c]) << c;
    EXPECT_EQ(all.as<float>()[c], x[c] + x[3 + c] + x[6 + c] + x[9 + c]) << c;
  }
  for (int i = 0; i < 12; ++i) EXPECT_EQ(y.as<float>()[i], std::max(x[i], 0.0f)) << i;
}

// The graph reference with the preset of a compiled bundle equals that bundle on
// the functional reference, bit for bit, where the preset changes the add order:
// 64-row MXUs chunk a K of 200 differently from the default 128 rows, and 8
// replicas of a v3-8 add an all_reduce in the hierarchical schedule's order. Without
// the preset the same reference differs (so the options do reach it).
TEST(RefModel, PresetAndReplicasGiveTheBundlesValues) {
  Scratch s;
  struct Case {
    std::string graph;
    std::vector<std::string> options;
  } cases[] = {
      {R"(graph mm {
  input %x : f32[16,200]
  input %w : f32[200,24]
  %y = matmul(%x, %w) : f32[16,24] #0
  output %y
}
)",
       {"--preset", "v3", "--set", "core.mxu.rows=64", "--set", "core.mxu.cols=64"}},
      {R"(graph ar {
  input %x : f32[64,9,37]
  %s = reduce_sum(%x) {axes=[0], keepdims=0} : f32[9,37] #0
  %y = all_reduce(%s) : f32[9,37] #1
  output %y
}
)",
       {"--preset", "v3-8", "--replicas", "8"}},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string name = std::to_string(n++);  // case n: model n.graph, bundle n.tpb, outputs in n/
    const std::string dir = s.path + "/" + name;
    const std::string model = s.write(name + ".graph", c.graph);
    auto run = [&](std::vector<std::string> argv, const std::vector<std::string>& extra) {
      argv.insert(argv.end(), extra.begin(), extra.end());
      const auto r = testing::spawn(argv, s.path);
      EXPECT_EQ(r.exit_code, 0) << r.err;
    };
    run({TPUSIM_BIN, "compile", model, "-o", dir + ".tpb"}, c.options);
    run({TPUSIM_BIN, "ref", dir + ".tpb", "--random-inputs", "4", "--out", dir + "/bundle"}, {});
    run({TPUSIM_BIN, "ref", model, "--random-inputs", "4", "--out", dir + "/graph"}, c.options);
    run({TPUSIM_BIN, "ref", model, "--random-inputs", "4", "--out", dir + "/plain"}, {});
    const std::string bundle = testing::slurp(dir + "/bundle/y.npy");
    ASSERT_FALSE(bundle.empty()) << c.options[1];
    EXPECT_EQ(testing::slurp(dir + "/graph/y.npy"), bundle) << c.options[1];
    EXPECT_NE(testing::slurp(dir + "/plain/y.npy"), bundle) << c.options[1];
  }
}

}  // namespace
}  // namespace tpusim

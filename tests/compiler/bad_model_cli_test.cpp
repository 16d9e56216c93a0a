// Bad models through the command line, as a user meets them: `tpusim compile` and
// `tpusim ref MODEL` on a truncated or corrupt .onnx file, a graph with a cycle,
// mismatched shapes and an IR text that uses a tensor before defining it. Each is
// exit status 2 with exactly one line on stderr naming the file (and the node where
// there is one); none crashes. Randomly corrupted bytes of a good model either
// import or are such an error.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "isa/io/npy.h"
#include "tests/sim/spawn.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;

onnx::ModelProto model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(14);
  m.mutable_graph()->set_name("t");
  return m;
}

void add_input(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> shape) {
  auto* vi = m.mutable_graph()->add_input();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  for (int64_t d : shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

void add_node(onnx::ModelProto& m, const std::string& op, std::vector<std::string> in, const std::string& out,
              const std::string& name) {
  auto* n = m.mutable_graph()->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (auto& s : in) n->add_input(s);
  n->add_output(out);
}

// y = relu(a @ w + c): a small good model with initializers to cut and corrupt.
onnx::ModelProto good_model() {
  onnx::ModelProto m = model();
  add_input(m, "a", {4, 6});
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto_DataType_FLOAT);
  w->add_dims(6);
  w->add_dims(3);
  for (int k = 0; k < 18; ++k) w->add_float_data(0.25f * static_cast<float>(k - 9));
  add_node(m, "MatMul", {"a", "w"}, "h", "mm");
  add_node(m, "Relu", {"h"}, "y", "act");
  m.mutable_graph()->add_output()->set_name("y");
  return m;
}

struct Scratch {
  std::string path;
  Scratch() {
    path = (fs::temp_directory_path() / ("tpusim_bad_model_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path + "/" + name, std::ios::binary) << bytes;
    return path + "/" + name;
  }
};

// Both commands on `file`: exit 2, one stderr line containing every needle.
void expect_one_line_error(const Scratch& s, const std::string& file, const std::vector<std::string>& needles) {
  const std::vector<std::vector<std::string>> cmds = {
      {TPUSIM_BIN, "compile", file, "--preset", "v4", "-o", s.path + "/m.tpb"},
      {TPUSIM_BIN, "ref", file, "--random-inputs", "1", "--out", s.path + "/out"}};
  for (const auto& argv : cmds) {
    const auto r = testing::spawn(argv, s.path, 60);
    EXPECT_EQ(r.exit_code, 2) << argv[1] << " " << file << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "no '" << n << "' in: " << r.err;
    EXPECT_FALSE(fs::exists(s.path + "/m.tpb"));
  }
}

TEST(BadModelCli, TruncatedOnnx) {
  Scratch s;
  const std::string good = good_model().SerializeAsString();
  for (size_t cut : {size_t{0}, size_t{1}, size_t{9}, good.size() / 3, good.size() / 2, good.size() - 3}) {
    SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(good.size()));
    expect_one_line_error(s, s.write("cut.onnx", good.substr(0, cut)), {"cut.onnx"});
  }
}

TEST(BadModelCli, CorruptOnnx) {
  Scratch s;
  expect_one_line_error(s, s.write("junk.onnx", "this is not protobuf at all \xff\xff\xff"), {"junk.onnx"});
  // Random byte flips: either still a model (exit 0) or a one-line error (exit 2).
  const std::string good = good_model().SerializeAsString();
  std::mt19937 rng(5);
  int errors = 0;
  for (int trial = 0; trial < 40; ++trial) {
    std::string b = good;
    for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    const std::string f = s.write("flip.onnx", b);
    const auto r = testing::spawn({TPUSIM_BIN, "compile", f, "--preset", "v4", "-o", s.path + "/f.tpb"}, s.path, 60);
    ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 2) << "trial " << trial << ": exit " << r.exit_code << ": " << r.err;
    if (r.exit_code == 2) {
      ++errors;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_NE(r.err.find("flip.onnx"), std::string::npos) << r.err;
    }
  }
  EXPECT_GT(errors, 0) << "no corruption was detected in 40 trials";
}

TEST(BadModelCli, CycleInOnnx) {
  Scratch s;
  onnx::ModelProto m = model();
  add_input(m, "x", {4});
  add_node(m, "Add", {"x", "b"}, "a", "first");
  add_node(m, "Relu", {"a"}, "b", "second");
  m.mutable_graph()->add_output()->set_name("b");
  expect_one_line_error(s, s.write("cycle.onnx", m.SerializeAsString()), {"cycle.onnx", "cycle", "'first'"});
}

TEST(BadModelCli, MismatchedShapesInOnnx) {
  Scratch s;
  onnx::ModelProto m = model();
  add_input(m, "a", {3, 4});
  add_input(m, "b", {5, 6});
  add_node(m, "MatMul", {"a", "b"}, "y", "mm");
  m.mutable_graph()->add_output()->set_name("y");
  expect_one_line_error(s, s.write("shapes.onnx", m.SerializeAsString()), {"shapes.onnx", "'mm' (MatMul)", "f32[3,4]"});
  onnx::ModelProto e = model();
  add_input(e, "a", {2, 3});
  add_input(e, "b", {4, 3});
  add_node(e, "Add", {"a", "b"}, "y", "adder");
  e.mutable_graph()->add_output()->set_name("y");
  expect_one_line_error(s, s.write("bcast.onnx", e.SerializeAsString()), {"bcast.onnx", "'adder' (Add)"});
}

TEST(BadModelCli, CycleAndShapeErrorsInIrText) {
  Scratch s;
  expect_one_line_error(s,
                        s.write("cycle.ir", "graph g {\n  input %x : f32[4]\n  %a = add(%x, %b) {} : f32[4] #0\n"
                                            "  %b = relu(%a) {} : f32[4] #1\n  output %b\n}\n"),
                        {"cycle.ir", "%b"});
  expect_one_line_error(s,
                        s.write("shape.ir", "graph g {\n  input %x : f32[4,3]\n  %y = relu(%x) {} : f32[3,4] #0\n"
                                            "  output %y\n}\n"),
                        {"shape.ir", "relu"});
}

// A valid graph the lowering cannot place (a softmax row longer than VMEM): the
// one line names the file as well as the graph's node (it used to start with the
// graph's name only).
TEST(BadModelCli, LoweringErrorsNameTheFile) {
  Scratch s;
  const std::string file = s.write("long.ir", "graph g {\n  input %x : f32[2,300000]\n"
                                              "  %y = softmax(%x) {axis=1} : f32[2,300000] #0\n  output %y\n}\n");
  const auto r = testing::spawn({TPUSIM_BIN, "compile", file, "--preset", "v4", "-o", s.path + "/m.tpb"}, s.path, 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, file + ": g: node 'y' (#0, softmax): rows too long for VMEM\n");
  EXPECT_FALSE(fs::exists(s.path + "/m.tpb"));
}

// The graph reference's run-time errors (here a gather index past the axis) name
// the file too.
TEST(BadModelCli, GraphReferenceErrorsNameTheFile) {
  Scratch s;
  const std::string file = s.write("gather.ir", "graph g {\n  input %x : f32[3,4]\n  const %i : i64[1] = [7]\n"
                                                "  %y = gather(%x, %i) {axis=0} : f32[1,4] #0\n  output %y\n}\n");
  const auto r = testing::spawn({TPUSIM_BIN, "ref", file, "--random-inputs", "1", "--out", s.path + "/out"}, s.path, 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "tpusim ref: error: " + file + ": node #0 (gather): index 7 out of range [0,3)\n");
  EXPECT_FALSE(fs::exists(s.path + "/out/y.npy"));
}

// A graph whose tensors need more host memory than the machine has (a gather of
// 2^31 - 1 rows, found by fuzzing the IR text: ~292 GB) is refused at once by the
// graph reference, which holds every tensor; it used to allocate (overcommit) and be
// killed by the kernel after minutes of paging. The compiler refuses it too (its
// index input lies past the reachable HBM), and a result past the reachable HBM (a
// conv padded by 2^31 - 1 rows) before the lowering plans for it: the fuzzer's pad of
// 2^31, which the verifier now refuses, took 3 minutes and ended in a bare
// "std::bad_alloc".
TEST(BadModelCli, TensorsPastHostMemoryOrHbmAreRefusedAtOnce) {
  Scratch s;
  const std::string file = s.write("huge.ir", "graph g {\n  input %x : f32[6,16]\n  input %i : i64[2147483647]\n"
                                              "  %y = gather(%x, %i) {axis=0} : f32[2147483647,16] #0\n"
                                              "  %z = exp(%y) : f32[2147483647,16] #1\n  output %z\n}\n");
  expect_one_line_error(s, file, {file});
  const auto r = testing::spawn({TPUSIM_BIN, "ref", file, "--random-inputs", "1", "--out", s.path + "/out"}, s.path, 60);
  EXPECT_NE(r.err.find("needs 292.1 GB of host memory for its tensors, more than this machine's"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(s.path + "/out"));
  const std::string padded =
      s.write("padded.ir", "graph g {\n  input %x : f32[1,3,8,8]\n  input %w : f32[8,3,3,3]\n"
                           "  %c = conv2d(%x, %w) {dilations=[1,1], groups=1, pads=[2147483647,1,1,1], strides=[1,1]}"
                           " : f32[1,8,2147483654,8] #0\n  output %c\n}\n");
  const auto c = testing::spawn({TPUSIM_BIN, "compile", padded, "--preset", "v3", "-o", s.path + "/m.tpb"}, s.path, 60);
  EXPECT_EQ(c.exit_code, 2) << c.err;
  // 8 channels x 2,147,483,654 rows x 8 columns x 4 bytes.
  EXPECT_EQ(c.err, padded + ": g: node 'c' (#0, conv2d): its result of 549755815424 bytes is larger than the HBM "
                            "[sA + imm] reaches (6442446847)\n");
  EXPECT_FALSE(fs::exists(s.path + "/m.tpb"));
}

// An index input out of range at run time: the compiled gather checks its
// indices and traps, on the functional reference and on the chip model alike,
// with a message that says why (it used to be a deliberate "division by zero")
// and names the gather's op; no output is left behind.
TEST(BadModelCli, CompiledGatherTrapsAnIndexOutOfRange) {
  Scratch s;
  const std::string file = s.write("gather.ir", "graph g {\n  input %x : f32[3,4]\n  input %i : i64[2]\n"
                                                "  %y = gather(%x, %i) {axis=0} : f32[2,4] #0\n  output %y\n}\n");
  const auto c = testing::spawn({TPUSIM_BIN, "compile", file, "--preset", "v4", "-o", s.path + "/m.tpb"}, s.path, 60);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  io::NpyArray idx;
  idx.dtype = io::NpyDtype::kI64;
  idx.shape = {2};
  const int64_t values[2] = {1, 3};  // 3 is past the axis of 3 rows
  idx.data.resize(sizeof values);
  std::memcpy(idx.data.data(), values, sizeof values);
  io::write_npy(s.path + "/i.npy", idx);
  for (const std::vector<std::string>& how :
       {std::vector<std::string>{"ref"}, std::vector<std::string>{"run", "--preset", "v4", "-q"}}) {
    std::vector<std::string> args{TPUSIM_BIN, how[0], s.path + "/m.tpb"};
    args.insert(args.end(), how.begin() + 1, how.end());
    for (const std::string& a :
         std::vector<std::string>{"--input", "i=" + s.path + "/i.npy", "--random-inputs", "1", "--out", s.path + "/out"})
      args.push_back(a);
    const auto r = testing::spawn(args, s.path, 60);
    EXPECT_EQ(r.exit_code, 1) << how[0] << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("trap 1: an index read at run time is out of range"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("op 0"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(s.path + "/out/y.npy")) << how[0];
  }
}

// Data-parallel options out of range: --replicas 0 or -3 and --batch -1 compiled
// a bundle of one replica without a word, and --block-bytes 4 on a 1 MiB
// all-reduce over 32 replicas (262,144 blocks) planned for minutes until memory
// ran out. Each is now exit 2 naming the option (the all-reduce in one line that
// names its node), and no bundle.
TEST(BadModelCli, DataParallelOptionsOutOfRange) {
  Scratch s;
  const std::string file =
      s.write("ar.ir", "graph ar {\n  input %x : f32[32,262144]\n  %g = all_reduce(%x) : f32[32,262144] #0\n"
                       "  output %g\n}\n");
  const std::string bundle = s.path + "/m.tpb";
  auto compile = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv{TPUSIM_BIN, "compile", file, "--preset", "v2-4x4", "-o", bundle};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return testing::spawn(argv, s.path, 60);
  };
  for (const auto& [opt, value] : std::vector<std::pair<std::string, std::string>>{
           {"--replicas", "0"}, {"--replicas", "-3"}, {"--batch", "-1"}}) {
    const auto r = compile({opt, value});
    EXPECT_EQ(r.exit_code, 2) << opt << " " << value << ": " << r.err;
    EXPECT_NE(r.err.find(opt + ": Value " + value + " not in range 1 to"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(bundle));
  }
  const auto r = compile({"--replicas", "32", "--block-bytes", "4"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, file + ": ar: node 'g' (#0, all_reduce): all_reduce of 262144 fp32 values a replica in blocks of "
                          "1 (--block-bytes 4) is 262144 blocks, more than 256; give --block-bytes 4096 or more\n");
  EXPECT_FALSE(fs::exists(bundle));
}

}  // namespace
}  // namespace tpusim

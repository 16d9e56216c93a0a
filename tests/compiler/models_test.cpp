// The four whole models exported by scripts/export_models.py (ctest fixture
// compiler_export_models, directory in TPUSIM_MODEL_DIR): they import with no
// edits, decomposed layernorm/gelu come back fused, batchnorm is gone, and the
// graph reference agrees with torch's fp32 output on the same input within the
// bf16 error budget (docs/compiler.md, "Tolerances").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "compiler/compiler.h"
#include "isa/io/npy.h"

namespace tpusim::compiler {
namespace {

std::string dir() {
  const char* d = std::getenv("TPUSIM_MODEL_DIR");
  return d ? d : "";
}

std::map<OpKind, int> op_counts(const Graph& g) {
  std::map<OpKind, int> c;
  for (const Node& n : g.nodes) ++c[n.op];
  return c;
}

HostTensor load(const std::string& path) {
  const io::NpyArray a = io::read_npy(path);
  HostTensor t;
  t.shape.assign(a.shape.begin(), a.shape.end());
  t.f.assign(a.as<float>(), a.as<float>() + a.elements());
  return t;
}

void check_against_torch(const std::string& name, const Graph& g, double rel) {
  const HostTensor x = load(dir() + "/" + name + ".input.npy");
  const HostTensor want = load(dir() + "/" + name + ".torch.npy");
  const auto out = evaluate(g, {{g.inputs.at(0).name, x}}, num::PrecisionPolicy::kDefault);
  const HostTensor& got = out.at(g.outputs.at(0));
  ASSERT_EQ(got.shape, want.shape);
  double max_ref = 0, max_err = 0;
  for (size_t k = 0; k < want.f.size(); ++k) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want.f[k])));
    max_err = std::max(max_err, std::fabs(static_cast<double>(got.f[k]) - want.f[k]));
  }
  EXPECT_LE(max_err, rel * max_ref) << name << ": max |err| " << max_err << " vs max |torch| " << max_ref;
  std::printf("%s: max |ref - torch| = %.3g, max |torch| = %.3g\n", name.c_str(), max_err, max_ref);
}

class WholeModel : public ::testing::TestWithParam<const char*> {};

TEST_P(WholeModel, ImportsFusesAndMatchesTorch) {
  ASSERT_FALSE(dir().empty()) << "TPUSIM_MODEL_DIR not set (run through ctest)";
  const std::string name = GetParam();
  const Graph g = load_model(dir() + "/" + name + ".onnx");
  verify(g);
  auto c = op_counts(g);
  EXPECT_EQ(c[OpKind::kBatchNorm], 0);
  EXPECT_EQ(c[OpKind::kIdentity], 0);
  if (name == "resnet18") {
    EXPECT_EQ(c[OpKind::kConv2d], 20);
    EXPECT_EQ(c[OpKind::kMatmul], 1);
  } else if (name == "resnet50") {
    EXPECT_EQ(c[OpKind::kConv2d], 53);
  } else if (name == "mobilenet_v2") {
    EXPECT_EQ(c[OpKind::kConv2d], 52);
    EXPECT_EQ(c[OpKind::kClip], 35);  // ReLU6
  } else {
    EXPECT_EQ(c[OpKind::kLayerNorm], 2);
    EXPECT_EQ(c[OpKind::kGelu], 1);
    EXPECT_EQ(c[OpKind::kSoftmax], 1);
    EXPECT_EQ(c[OpKind::kMatmul], 8);
    EXPECT_EQ(c[OpKind::kErf] + c[OpKind::kPow] + c[OpKind::kReduceMean], 0);
  }
  // Text form round-trips even for a 25M-parameter graph.
  if (name != "resnet50") {
    EXPECT_EQ(print_graph(parse_graph(print_graph(g))), print_graph(g));
  }
  check_against_torch(name, g, 0.02);
}

INSTANTIATE_TEST_SUITE_P(Models, WholeModel, ::testing::Values("resnet18", "resnet50", "mobilenet_v2", "bert_layer"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
}  // namespace tpusim::compiler

// ONNX import on models built here with the protobuf classes: attribute and
// initializer handling, and every kind of bad input giving a one-line error.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>

#include "compiler/compiler.h"

namespace tpusim::compiler {
namespace {

onnx::ModelProto model(int opset = 14) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  m.mutable_graph()->set_name("t");
  return m;
}

void add_input(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> shape, int et = onnx::TensorProto_DataType_FLOAT) {
  auto* vi = m.mutable_graph()->add_input();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(et);
  for (int64_t d : shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

void add_output(onnx::ModelProto& m, const std::string& name) { m.mutable_graph()->add_output()->set_name(name); }

onnx::NodeProto* add_node(onnx::ModelProto& m, const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
                          const std::string& name = "") {
  auto* n = m.mutable_graph()->add_node();
  n->set_op_type(op);
  n->set_name(name.empty() ? op + "_0" : name);
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

void add_init(onnx::ModelProto& m, const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v, bool raw) {
  auto* t = m.mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto_DataType_FLOAT);
  for (int64_t d : shape) t->add_dims(d);
  if (raw) t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  else for (float f : v) t->add_float_data(f);
}

void add_attr_i(onnx::NodeProto* n, const std::string& k, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(onnx::AttributeProto_AttributeType_INT);
  a->set_i(v);
}
void add_attr_f(onnx::NodeProto* n, const std::string& k, float v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(onnx::AttributeProto_AttributeType_FLOAT);
  a->set_f(v);
}

std::string bytes(const onnx::ModelProto& m) { return m.SerializeAsString(); }

std::string import_error(const std::string& b) {
  try {
    import_onnx_bytes(b, "m.onnx");
  } catch (const CompileError& e) {
    const std::string s = e.what();
    EXPECT_EQ(s.find('\n'), std::string::npos) << s;
    EXPECT_EQ(s.rfind("m.onnx: ", 0), 0u) << s;
    return s;
  }
  ADD_FAILURE() << "imported without error";
  return "";
}

onnx::ModelProto gemm_model(bool raw) {
  onnx::ModelProto m = model();
  add_input(m, "a", {2, 3});
  add_init(m, "b", {4, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, raw);
  add_init(m, "c", {4}, {0.5f, -1, 2, 0}, raw);
  auto* n = add_node(m, "Gemm", {"a", "b", "c"}, {"y"});
  add_attr_i(n, "transB", 1);
  add_attr_f(n, "alpha", 2.0f);
  add_attr_f(n, "beta", 0.5f);
  add_output(m, "y");
  return m;
}

TEST(OnnxImport, GemmAttributesAndInitializerEncodings) {
  for (bool raw : {false, true}) {
    const Graph g = import_onnx_bytes(bytes(gemm_model(raw)), "gemm.onnx");
    ASSERT_EQ(g.nodes.size(), 1u);
    EXPECT_EQ(print_graph(g).substr(print_graph(g).find("  %y")),
              "  %y = matmul(%a, %b, %c) {alpha=2.0, beta=0.5, trans_b=1} : f32[2,4] #0\n  output %y\n}\n");
    HostTensor a;
    a.shape = {2, 3};
    a.f = {1, 0, -1, 2, 1, 0};
    const auto y = evaluate(g, {{"a", a}}, num::PrecisionPolicy::kDefault).at("y").f;
    // Row 0: a.b_j = b_j0 - b_j2 = -2 for all j; row 1: 2 b_j0 + b_j1 = {4,13,22,31}; y = 2 acc + 0.5 c.
    EXPECT_EQ(y, (std::vector<float>{-3.75f, -4.5f, -3.0f, -4.0f, 8.25f, 25.5f, 45.0f, 62.0f}));
  }
}

TEST(OnnxImport, CorruptAndTruncatedFilesAreErrors) {
  const std::string good = bytes(gemm_model(true));
  EXPECT_NE(import_error("").find("empty file"), std::string::npos);
  EXPECT_NE(import_error("this is not protobuf at all \xff\xff\xff").find("not a valid ONNX model"), std::string::npos);
  for (size_t cut : {size_t{1}, size_t{7}, good.size() / 3, good.size() / 2, good.size() - 5, good.size() - 1}) {
    const std::string msg = import_error(good.substr(0, cut));
    EXPECT_FALSE(msg.empty()) << "cut at " << cut;
  }
}

TEST(OnnxImport, UnsupportedOpNamesNodeAndOp) {
  onnx::ModelProto m = model();
  add_input(m, "x", {4});
  add_node(m, "Relu", {"x"}, {"r"});
  add_node(m, "Hardmax", {"r"}, {"y"}, "head/hard");
  add_output(m, "y");
  EXPECT_EQ(import_error(bytes(m)), "m.onnx: node 'head/hard' (Hardmax): op 'Hardmax' is not supported");
}

TEST(OnnxImport, UnsupportedAttributeAndModes) {
  onnx::ModelProto m = model();
  add_input(m, "x", {1, 1, 4, 4});
  auto* n = add_node(m, "MaxPool", {"x"}, {"y"}, "pool");
  auto* a = n->add_attribute();
  a->set_name("kernel_shape");
  a->set_type(onnx::AttributeProto_AttributeType_INTS);
  a->add_ints(2);
  a->add_ints(2);
  add_attr_i(n, "ceil_mode", 1);
  add_output(m, "y");
  EXPECT_EQ(import_error(bytes(m)), "m.onnx: node 'pool' (MaxPool): ceil_mode=1 is not supported");
  n->mutable_attribute()->RemoveLast();
  add_attr_i(n, "frobnicate", 1);
  EXPECT_EQ(import_error(bytes(m)), "m.onnx: node 'pool' (MaxPool): attribute 'frobnicate' is not supported");
}

TEST(OnnxImport, CycleAndUndefinedInputs) {
  onnx::ModelProto m = model();
  add_input(m, "x", {4});
  add_node(m, "Add", {"x", "b"}, {"a"}, "first");
  add_node(m, "Relu", {"a"}, {"b"}, "second");
  add_output(m, "b");
  EXPECT_NE(import_error(bytes(m)).find("the graph has a cycle through node 'first' (Add)"), std::string::npos);
  onnx::ModelProto u = model();
  add_input(u, "x", {4});
  add_node(u, "Add", {"x", "nowhere"}, {"y"}, "adder");
  add_output(u, "y");
  EXPECT_NE(import_error(bytes(u)).find("node 'adder' (Add): input 'nowhere' is not defined"), std::string::npos);
}

TEST(OnnxImport, MismatchedShapes) {
  onnx::ModelProto m = model();
  add_input(m, "a", {3, 4});
  add_input(m, "b", {5, 6});
  add_node(m, "MatMul", {"a", "b"}, {"y"}, "mm");
  add_output(m, "y");
  const std::string e = import_error(bytes(m));
  EXPECT_NE(e.find("node 'mm' (MatMul)"), std::string::npos) << e;
  EXPECT_NE(e.find("reduction lengths differ: f32[3,4] x f32[5,6]"), std::string::npos) << e;
}

TEST(OnnxImport, OpsetAndDynamicShapes) {
  onnx::ModelProto m = model(9);
  add_input(m, "x", {4});
  add_node(m, "Relu", {"x"}, {"y"});
  add_output(m, "y");
  EXPECT_EQ(import_error(bytes(m)), "m.onnx: opset 9 is not supported (11-17)");
  onnx::ModelProto d = model();
  auto* vi = d.mutable_graph()->add_input();
  vi->set_name("x");
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto_DataType_FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  add_node(d, "Relu", {"x"}, {"y"});
  add_output(d, "y");
  EXPECT_NE(import_error(bytes(d)).find("dynamic dimension 'batch'"), std::string::npos);
}

TEST(OnnxImport, InitializerSizeMismatch) {
  onnx::ModelProto m = model();
  add_input(m, "a", {2, 3});
  add_init(m, "b", {3, 4}, {1, 2, 3}, true);
  add_node(m, "MatMul", {"a", "b"}, {"y"});
  add_output(m, "y");
  EXPECT_NE(import_error(bytes(m)).find("tensor 'b' f32[3,4] holds 3 values, needs 12"), std::string::npos);
}

TEST(OnnxImport, MissingFile) {
  try {
    load_model("/nonexistent/model.onnx");
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/model.onnx: cannot open: No such file or directory");
  }
}

}  // namespace
}  // namespace tpusim::compiler

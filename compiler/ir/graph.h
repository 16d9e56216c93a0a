// The tensor-graph IR: a static, single-assignment list of op nodes over named
// tensors, in the spirit of XLA HLO. Every node has a stable integer id that later
// stages copy into the instructions lowered from it, so a profile can be read back
// in terms of the model. The text form (print_graph / parse_graph) round-trips
// exactly; verify() runs after every pass (compiler/passes/passes.h).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpusim::compiler {

// One-line, user-facing error (bad model, bad IR text, failed verification). The
// CLI prints what() and exits 2.
struct CompileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class DType { kF32, kBf16, kI64 };
const char* dtype_name(DType t);  // "f32", "bf16", "i64"

using Shape = std::vector<int64_t>;
int64_t num_elements(const Shape& s);
std::string shape_str(const Shape& s);  // "[1,3,224,224]"

struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};
std::string type_str(const TensorType& t);  // "f32[2,3]"

enum class OpKind {
  kMatmul,     // (a, b [, c]) {trans_a, trans_b, alpha, beta}: batched, numpy batch broadcast; c is the Gemm bias
  kConv2d,     // (x NCHW, w OIHW [, b]) {strides, pads [t,l,b,r], dilations, groups}
  // Data parallelism (docs/codegen.md "Boards and replicas"): every replica's result is the
  // fp32 sum over the replicas of that replica's x, in the add order of the
  // collective schedule the lowering uses (docs/ici.md "Add order"); 1 replica: identity.
  kAllReduce,  // (x)
  // The direct collectives (docs/codegen.md "Collectives"); {replicas=R} is set on
  // the per-replica graph, absent (1) they are the identity like all_reduce.
  kAllGather,      // (x): the replicas' x concatenated along axis 0 in replica order: shape[0] * R
  kReduceScatter,  // (x): block r of the sum over the replicas (axis 0 cut in R), replica r's: shape[0] / R
  kAllToAll,       // (x): block q of axis 0 goes to replica q, where it is block r (from replica r)
  kAdd, kSub, kMul, kDiv,  // numpy broadcasting
  kPow,        // (x) {exponent}: 0.5, 1, 2 or 3
  kRelu, kGelu, kTanh, kSigmoid, kExp, kLog, kSqrt, kRsqrt, kErf, kNeg,
  kClip,       // (x) {min, max}
  kSoftmax,    // {axis}
  kLayerNorm,  // (x, scale, bias) {axis (last), epsilon}
  kBatchNorm,  // (x, scale, bias, mean, var) {epsilon}: inference form, channel axis 1
  kReduceSum, kReduceMean, kReduceMax,  // {axes (one contiguous block), keepdims}
  kMaxPool, kAvgPool,  // {kernel, strides, pads [t,l,b,r], count_include_pad (avg)}
  kGlobalAvgPool,
  kTranspose,  // {perm}
  kReshape,    // {shape} (static, fully specified)
  kFlatten,    // {axis}
  kConcat,     // (x...) {axis}
  kSlice,      // {starts, ends, axes, steps} (normalised: one entry per axis, in range)
  kPad,        // {pads [begin..., end...], value}: constant mode
  kGather,     // (data, indices i64) {axis}
  kCast,       // {to = "f32" | "bf16"}
  kIdentity,
  // Training (compiler/train, docs/training.md): gradients the backward pass needs.
  kReluGrad,     // (dy, x): x > +0.0 ? dy : +0.0 (same shapes)
  kMaxPoolGrad,  // (dy, x, y) {kernel, strides, pads}: dy to the first tap of each window equal to y; type of x
  kReverse,      // (x) {axes}: element order reversed along each listed axis
  kIm2col,       // (x NCHW) {kernel, strides, pads, dilations}: [N*OH*OW, KH*KW*C], column (kh*KW + kw)*C + c
};
const char* op_name(OpKind k);
bool parse_op_name(const std::string& s, OpKind* out);
// Ops computed one element at a time from same-index operands (after broadcast).
bool is_elementwise(OpKind k);

struct Attr {
  enum class Kind { kInt, kInts, kFloat, kString };
  Kind kind = Kind::kInt;
  int64_t i = 0;
  std::vector<int64_t> ints;
  float f = 0.0f;
  std::string s;
  static Attr Int(int64_t v) { Attr a; a.kind = Kind::kInt; a.i = v; return a; }
  static Attr Ints(std::vector<int64_t> v) { Attr a; a.kind = Kind::kInts; a.ints = std::move(v); return a; }
  static Attr Float(float v) { Attr a; a.kind = Kind::kFloat; a.f = v; return a; }
  static Attr String(std::string v) { Attr a; a.kind = Kind::kString; a.s = std::move(v); return a; }
};
using Attrs = std::map<std::string, Attr>;

struct Node {
  int id = -1;                      // stable across passes; a fused op takes a fresh id
  OpKind op = OpKind::kIdentity;
  std::vector<std::string> inputs;  // tensor names, defined earlier in the graph
  std::string output;               // every op has exactly one result
  TensorType type;                  // of the output
  Attrs attrs;
  int fusion_group = -1;            // id of the node whose kernel this one is fused into

  bool has_attr(const std::string& k) const { return attrs.count(k) != 0; }
  int64_t attr_int(const std::string& k) const;
  const std::vector<int64_t>& attr_ints(const std::string& k) const;
  float attr_float(const std::string& k) const;
  const std::string& attr_string(const std::string& k) const;
};

// A constant tensor (ONNX initializer or Constant node). f32/bf16 values live in
// `f` (bf16 already rounded), i64 values in `i`.
struct Constant {
  std::string name;
  TensorType type;
  std::vector<float> f;
  std::vector<int64_t> i;
};

struct GraphInput {
  std::string name;
  TensorType type;
};

struct Graph {
  std::string name = "main";
  std::vector<GraphInput> inputs;
  std::vector<Constant> constants;
  std::vector<Node> nodes;  // in a topological order
  std::vector<std::string> outputs;

  int next_id() const;  // 1 + the largest node id
  const Node* find_node(int id) const;
  const Node* producer(const std::string& tensor) const;  // null for inputs/constants
  const Constant* find_constant(const std::string& name) const;
  std::map<std::string, TensorType> types() const;  // every defined tensor
};

// Output type of `n` given its operand types; throws CompileError naming the node.
TensorType infer_type(const Node& n, const std::vector<TensorType>& operands);

// Checks SSA form (each name defined once, before use), op arity, attributes,
// that every node's declared type equals the inferred one, constant sizes, unique
// ids and that the outputs exist. Throws CompileError "<where>: verifier: ...".
void verify(const Graph& g, const std::string& where = "graph");

// Text form. print_graph(parse_graph(print_graph(g))) == print_graph(g).
std::string print_graph(const Graph& g);
// `source` labels error messages: "<source>:<line>:<col>: <problem>".
Graph parse_graph(const std::string& text, const std::string& source = "<ir>");

// numpy broadcast of two shapes; throws CompileError on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where);

}  // namespace tpusim::compiler

#include "compiler/ir/graph.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "isa/io/printable.h"

namespace tpusim::compiler {

namespace {

struct OpInfo {
  OpKind kind;
  const char* name;
  int min_inputs, max_inputs;
  bool elementwise;
};

const OpInfo kOps[] = {
    {OpKind::kMatmul, "matmul", 2, 3, false},
    {OpKind::kConv2d, "conv2d", 2, 3, false},
    {OpKind::kAllReduce, "all_reduce", 1, 1, false},
    {OpKind::kAllGather, "all_gather", 1, 1, false},
    {OpKind::kReduceScatter, "reduce_scatter", 1, 1, false},
    {OpKind::kAllToAll, "all_to_all", 1, 1, false},
    {OpKind::kAdd, "add", 2, 2, true},
    {OpKind::kSub, "sub", 2, 2, true},
    {OpKind::kMul, "mul", 2, 2, true},
    {OpKind::kDiv, "div", 2, 2, true},
    {OpKind::kPow, "pow", 1, 1, true},
    {OpKind::kRelu, "relu", 1, 1, true},
    {OpKind::kGelu, "gelu", 1, 1, true},
    {OpKind::kTanh, "tanh", 1, 1, true},
    {OpKind::kSigmoid, "sigmoid", 1, 1, true},
    {OpKind::kExp, "exp", 1, 1, true},
    {OpKind::kLog, "log", 1, 1, true},
    {OpKind::kSqrt, "sqrt", 1, 1, true},
    {OpKind::kRsqrt, "rsqrt", 1, 1, true},
    {OpKind::kErf, "erf", 1, 1, true},
    {OpKind::kNeg, "neg", 1, 1, true},
    {OpKind::kClip, "clip", 1, 1, true},
    {OpKind::kSoftmax, "softmax", 1, 1, false},
    {OpKind::kLayerNorm, "layernorm", 3, 3, false},
    {OpKind::kBatchNorm, "batchnorm", 5, 5, false},
    {OpKind::kReduceSum, "reduce_sum", 1, 1, false},
    {OpKind::kReduceMean, "reduce_mean", 1, 1, false},
    {OpKind::kReduceMax, "reduce_max", 1, 1, false},
    {OpKind::kMaxPool, "maxpool", 1, 1, false},
    {OpKind::kAvgPool, "avgpool", 1, 1, false},
    {OpKind::kGlobalAvgPool, "global_avgpool", 1, 1, false},
    {OpKind::kTranspose, "transpose", 1, 1, false},
    {OpKind::kReshape, "reshape", 1, 1, false},
    {OpKind::kFlatten, "flatten", 1, 1, false},
    {OpKind::kConcat, "concat", 1, 1 << 20, false},
    {OpKind::kSlice, "slice", 1, 1, false},
    {OpKind::kPad, "pad", 1, 1, false},
    {OpKind::kGather, "gather", 2, 2, false},
    {OpKind::kCast, "cast", 1, 1, true},
    {OpKind::kIdentity, "identity", 1, 1, true},
    {OpKind::kReluGrad, "relu_grad", 2, 2, true},
    {OpKind::kMaxPoolGrad, "maxpool_grad", 3, 3, false},
    {OpKind::kReverse, "reverse", 1, 1, false},
    {OpKind::kIm2col, "im2col", 1, 1, false},
};

const OpInfo& info(OpKind k) {
  for (const OpInfo& i : kOps)
    if (i.kind == k) return i;
  throw CompileError("unknown op kind");
}

std::string node_where(const Node& n) {
  return std::string("node #") + std::to_string(n.id) + " (" + op_name(n.op) + " -> %" + n.output + ")";
}

[[noreturn]] void fail(const Node& n, const std::string& what) { throw CompileError(node_where(n) + ": " + what); }

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBf16; }

int64_t get_int(const Node& n, const std::string& k, int64_t def) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end()) return def;
  if (it->second.kind != Attr::Kind::kInt) fail(n, "attribute '" + k + "' must be an integer");
  return it->second.i;
}

float get_float(const Node& n, const std::string& k, float def) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end()) return def;
  if (it->second.kind == Attr::Kind::kInt) return static_cast<float>(it->second.i);
  if (it->second.kind != Attr::Kind::kFloat) fail(n, "attribute '" + k + "' must be a float");
  return it->second.f;
}

std::vector<int64_t> get_ints(const Node& n, const std::string& k, size_t len) {
  auto it = n.attrs.find(k);
  if (it == n.attrs.end()) fail(n, "missing attribute '" + k + "'");
  if (it->second.kind != Attr::Kind::kInts) fail(n, "attribute '" + k + "' must be an integer list");
  if (len != 0 && it->second.ints.size() != len)
    fail(n, "attribute '" + k + "' needs " + std::to_string(len) + " values, has " +
                std::to_string(it->second.ints.size()));
  return it->second.ints;
}

void need_rank(const Node& n, const TensorType& t, size_t rank, const char* what) {
  if (t.shape.size() != rank)
    fail(n, std::string(what) + " must have rank " + std::to_string(rank) + ", has " + type_str(t));
}

void need_float(const Node& n, const TensorType& t, const char* what) {
  if (!is_float(t.dtype)) fail(n, std::string(what) + " must be f32 or bf16, is " + type_str(t));
}

int64_t pool_extent(const Node& n, int64_t in, int64_t pad_lo, int64_t pad_hi, int64_t k, int64_t dil, int64_t stride) {
  if (k < 1 || dil < 1 || stride < 1 || pad_lo < 0 || pad_hi < 0) fail(n, "kernel, stride, dilation must be >= 1 and pads >= 0");
  // Below 2^31 each, dil * (k - 1) and the padded extent cannot overflow (a dilation
  // of 2^63 - 1, found by fuzzing, wrapped to an output the lowering then addressed
  // outside VMEM).
  constexpr int64_t kMaxWindow = INT32_MAX;
  if (k > kMaxWindow || dil > kMaxWindow || stride > kMaxWindow || pad_lo > kMaxWindow || pad_hi > kMaxWindow)
    fail(n, "kernel, stride, dilation and pads must be below 2^31");
  const int64_t span = in + pad_lo + pad_hi - dil * (k - 1) - 1;
  if (span < 0) fail(n, "window (" + std::to_string(k) + ") larger than the padded input (" + std::to_string(in) + ")");
  return span / stride + 1;
}

// Beyond this a tensor cannot be held anyway, and the products would overflow int64.
constexpr int64_t kMaxElements = int64_t{1} << 40;

bool too_large(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 1) return false;  // reported by the dimension checks
    if (n > kMaxElements / d) return true;
    n *= d;
  }
  return false;
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBf16: return "bf16";
    case DType::kI64: return "i64";
  }
  return "?";
}

int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

std::string type_str(const TensorType& t) { return dtype_name(t.dtype) + shape_str(t.shape); }

const char* op_name(OpKind k) { return info(k).name; }

bool parse_op_name(const std::string& s, OpKind* out) {
  for (const OpInfo& i : kOps)
    if (s == i.name) {
      *out = i.kind;
      return true;
    }
  return false;
}

bool is_elementwise(OpKind k) { return info(k).elementwise; }

int64_t Node::attr_int(const std::string& k) const { return get_int(*this, k, 0); }
float Node::attr_float(const std::string& k) const { return get_float(*this, k, 0.0f); }
const std::vector<int64_t>& Node::attr_ints(const std::string& k) const {
  static const std::vector<int64_t> kEmpty;
  auto it = attrs.find(k);
  return it == attrs.end() ? kEmpty : it->second.ints;
}
const std::string& Node::attr_string(const std::string& k) const {
  static const std::string kEmpty;
  auto it = attrs.find(k);
  return it == attrs.end() ? kEmpty : it->second.s;
}

int Graph::next_id() const {
  int m = -1;
  for (const Node& n : nodes) m = std::max(m, n.id);
  return m + 1;
}

const Node* Graph::find_node(int id) const {
  for (const Node& n : nodes)
    if (n.id == id) return &n;
  return nullptr;
}

const Node* Graph::producer(const std::string& t) const {
  for (const Node& n : nodes)
    if (n.output == t) return &n;
  return nullptr;
}

const Constant* Graph::find_constant(const std::string& name) const {
  for (const Constant& c : constants)
    if (c.name == name) return &c;
  return nullptr;
}

std::map<std::string, TensorType> Graph::types() const {
  std::map<std::string, TensorType> m;
  for (const GraphInput& i : inputs) m[i.name] = i.type;
  for (const Constant& c : constants) m[c.name] = c.type;
  for (const Node& n : nodes) m[n.output] = n.type;
  return m;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      throw CompileError(where + ": shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

TensorType infer_type(const Node& n, const std::vector<TensorType>& in) {
  const OpInfo& oi = info(n.op);
  if (static_cast<int>(in.size()) < oi.min_inputs || static_cast<int>(in.size()) > oi.max_inputs)
    fail(n, "takes " + std::to_string(oi.min_inputs) +
                (oi.max_inputs != oi.min_inputs ? ".." + std::to_string(std::min(oi.max_inputs, 99)) : std::string()) +
                " operands, has " + std::to_string(in.size()));
  for (const TensorType& t : in) {
    for (int64_t d : t.shape)
      if (d < 1) fail(n, "operand " + type_str(t) + " has a non-positive dimension");
    if (too_large(t.shape)) fail(n, "operand " + type_str(t) + " has more than 2^40 elements");
  }
  // Float operands of one op share a dtype: the precision policy retypes them together.
  if (n.op != OpKind::kGather && n.op != OpKind::kCast)
    for (const TensorType& t : in) {
      need_float(n, t, "operand");
      if (t.dtype != in[0].dtype) fail(n, "operands mix " + type_str(in[0]) + " and " + type_str(t));
    }
  const TensorType& x = in[0];
  const std::string where = node_where(n);
  switch (n.op) {
    case OpKind::kMatmul: {
      TensorType a = in[0], b = in[1];
      if (a.shape.size() < 2 || b.shape.size() < 2) fail(n, "operands need rank >= 2, have " + type_str(a) + ", " + type_str(b));
      if (get_int(n, "trans_a", 0)) std::swap(a.shape[a.shape.size() - 1], a.shape[a.shape.size() - 2]);
      if (get_int(n, "trans_b", 0)) std::swap(b.shape[b.shape.size() - 1], b.shape[b.shape.size() - 2]);
      const int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back();
      const int64_t kb = b.shape[b.shape.size() - 2], nn = b.shape.back();
      if (k != kb) fail(n, "reduction lengths differ: " + type_str(a) + " x " + type_str(b));
      Shape batch = broadcast_shapes(Shape(a.shape.begin(), a.shape.end() - 2), Shape(b.shape.begin(), b.shape.end() - 2), where);
      batch.push_back(m);
      batch.push_back(nn);
      if (in.size() == 3 && broadcast_shapes(batch, in[2].shape, where) != batch)
        fail(n, "bias " + type_str(in[2]) + " does not broadcast to " + shape_str(batch));
      get_float(n, "alpha", 1.0f);
      get_float(n, "beta", 1.0f);
      return {x.dtype, batch};
    }
    case OpKind::kConv2d: {
      need_rank(n, x, 4, "input");
      need_rank(n, in[1], 4, "weights");
      const auto st = get_ints(n, "strides", 2), pads = get_ints(n, "pads", 4), dil = get_ints(n, "dilations", 2);
      const int64_t g = get_int(n, "groups", 1);
      const Shape& w = in[1].shape;
      if (g < 1 || x.shape[1] % g != 0 || w[0] % g != 0)
        fail(n, "groups=" + std::to_string(g) + " must divide input channels " + std::to_string(x.shape[1]) +
                    " and output channels " + std::to_string(w[0]));
      if (w[1] * g != x.shape[1])
        fail(n, "weights " + type_str(in[1]) + " expect " + std::to_string(w[1] * g) + " input channels, input has " +
                    std::to_string(x.shape[1]));
      if (in.size() == 3 && in[2].shape != Shape{w[0]}) fail(n, "bias must be [" + std::to_string(w[0]) + "], is " + type_str(in[2]));
      const int64_t oh = pool_extent(n, x.shape[2], pads[0], pads[2], w[2], dil[0], st[0]);
      const int64_t ow = pool_extent(n, x.shape[3], pads[1], pads[3], w[3], dil[1], st[1]);
      return {x.dtype, {x.shape[0], w[0], oh, ow}};
    }
    case OpKind::kAdd: case OpKind::kSub: case OpKind::kMul: case OpKind::kDiv:
      return {x.dtype, broadcast_shapes(x.shape, in[1].shape, where)};
    case OpKind::kPow: {
      const float e = get_float(n, "exponent", 0.0f);
      if (e != 0.5f && e != 1.0f && e != 2.0f && e != 3.0f) fail(n, "exponent must be 0.5, 1, 2 or 3, is " + std::to_string(e));
      return x;
    }
    case OpKind::kClip:
      get_float(n, "min", 0.0f);
      get_float(n, "max", 0.0f);
      return x;
    case OpKind::kRelu: case OpKind::kGelu: case OpKind::kTanh: case OpKind::kSigmoid: case OpKind::kExp:
    case OpKind::kLog: case OpKind::kSqrt: case OpKind::kRsqrt: case OpKind::kErf: case OpKind::kNeg:
    case OpKind::kIdentity: case OpKind::kAllReduce:
      return x;
    case OpKind::kAllGather: case OpKind::kReduceScatter: case OpKind::kAllToAll: {
      const int64_t r = get_int(n, "replicas", 1);
      if (r < 1) fail(n, "replicas must be at least 1");
      if (x.shape.empty()) fail(n, "needs an operand of rank >= 1 (replicas split or stack axis 0)");
      if (n.op != OpKind::kAllGather && x.shape[0] % r != 0)
        fail(n, "axis 0 of " + type_str(x) + " does not split into " + std::to_string(r) + " replicas' blocks");
      TensorType out = x;
      if (n.op == OpKind::kAllGather) out.shape[0] *= r;
      if (n.op == OpKind::kReduceScatter) out.shape[0] /= r;
      return out;
    }
    case OpKind::kSoftmax: {
      const int64_t axis = get_int(n, "axis", -1);
      if (axis < 0 || axis >= static_cast<int64_t>(x.shape.size())) fail(n, "axis " + std::to_string(axis) + " out of range for " + type_str(x));
      return x;
    }
    case OpKind::kLayerNorm: {
      const int64_t axis = get_int(n, "axis", -1);
      if (x.shape.empty() || axis != static_cast<int64_t>(x.shape.size()) - 1) fail(n, "normalises the last axis only (axis=" + std::to_string(axis) + ")");
      if (in[1].shape != Shape{x.shape.back()} || in[2].shape != Shape{x.shape.back()})
        fail(n, "scale and bias must be [" + std::to_string(x.shape.back()) + "], are " + type_str(in[1]) + ", " + type_str(in[2]));
      get_float(n, "epsilon", 0.0f);
      return x;
    }
    case OpKind::kBatchNorm: {
      if (x.shape.size() < 2) fail(n, "input needs rank >= 2, is " + type_str(x));
      for (size_t i = 1; i < 5; ++i)
        if (in[i].shape != Shape{x.shape[1]}) fail(n, "parameter " + std::to_string(i) + " must be [" + std::to_string(x.shape[1]) + "], is " + type_str(in[i]));
      get_float(n, "epsilon", 0.0f);
      return x;
    }
    case OpKind::kReduceSum: case OpKind::kReduceMean: case OpKind::kReduceMax: {
      const auto axes = get_ints(n, "axes", 0);
      if (axes.empty()) fail(n, "needs at least one axis");
      for (size_t i = 0; i < axes.size(); ++i) {
        if (axes[i] < 0 || axes[i] >= static_cast<int64_t>(x.shape.size())) fail(n, "axis " + std::to_string(axes[i]) + " out of range for " + type_str(x));
        if (i && axes[i] != axes[i - 1] + 1) fail(n, "axes must be one contiguous increasing block, are " + shape_str(axes));
      }
      const bool keep = get_int(n, "keepdims", 1) != 0;
      Shape out;
      for (int64_t d = 0; d < static_cast<int64_t>(x.shape.size()); ++d) {
        const bool reduced = d >= axes.front() && d <= axes.back();
        if (!reduced) out.push_back(x.shape[d]);
        else if (keep) out.push_back(1);
      }
      return {x.dtype, out};
    }
    case OpKind::kMaxPool: case OpKind::kAvgPool: {
      need_rank(n, x, 4, "input");
      const auto k = get_ints(n, "kernel", 2), st = get_ints(n, "strides", 2), pads = get_ints(n, "pads", 4);
      if (n.op == OpKind::kAvgPool) get_int(n, "count_include_pad", 0);
      const int64_t oh = pool_extent(n, x.shape[2], pads[0], pads[2], k[0], 1, st[0]);
      const int64_t ow = pool_extent(n, x.shape[3], pads[1], pads[3], k[1], 1, st[1]);
      if (pads[0] >= k[0] || pads[2] >= k[0] || pads[1] >= k[1] || pads[3] >= k[1]) fail(n, "pads must be smaller than the window");
      return {x.dtype, {x.shape[0], x.shape[1], oh, ow}};
    }
    case OpKind::kGlobalAvgPool:
      need_rank(n, x, 4, "input");
      return {x.dtype, {x.shape[0], x.shape[1], 1, 1}};
    case OpKind::kTranspose: {
      const auto perm = get_ints(n, "perm", x.shape.size());
      Shape out(perm.size());
      std::vector<bool> seen(perm.size(), false);
      for (size_t i = 0; i < perm.size(); ++i) {
        if (perm[i] < 0 || perm[i] >= static_cast<int64_t>(perm.size()) || seen[perm[i]]) fail(n, "perm " + shape_str(perm) + " is not a permutation");
        seen[perm[i]] = true;
        out[i] = x.shape[perm[i]];
      }
      return {x.dtype, out};
    }
    case OpKind::kReshape: {
      const auto s = get_ints(n, "shape", 0);
      for (int64_t d : s)
        if (d < 1) fail(n, "shape " + shape_str(s) + " must be fully specified");
      if (too_large(s) || num_elements(s) != num_elements(x.shape)) fail(n, "cannot reshape " + type_str(x) + " to " + shape_str(s));
      return {x.dtype, s};
    }
    case OpKind::kFlatten: {
      const int64_t axis = get_int(n, "axis", 1);
      if (axis < 0 || axis > static_cast<int64_t>(x.shape.size())) fail(n, "axis out of range");
      return {x.dtype, {num_elements(Shape(x.shape.begin(), x.shape.begin() + axis)), num_elements(Shape(x.shape.begin() + axis, x.shape.end()))}};
    }
    case OpKind::kConcat: {
      const int64_t axis = get_int(n, "axis", 0);
      if (axis < 0 || axis >= static_cast<int64_t>(x.shape.size())) fail(n, "axis out of range for " + type_str(x));
      Shape out = x.shape;
      for (size_t i = 1; i < in.size(); ++i) {
        if (in[i].shape.size() != x.shape.size()) fail(n, "operands differ in rank");
        for (size_t d = 0; d < x.shape.size(); ++d)
          if (static_cast<int64_t>(d) != axis && in[i].shape[d] != x.shape[d]) fail(n, "operands " + type_str(x) + " and " + type_str(in[i]) + " differ off the concat axis");
        out[axis] += in[i].shape[axis];
      }
      return {x.dtype, out};
    }
    case OpKind::kSlice: {
      const size_t r = x.shape.size();
      const auto st = get_ints(n, "starts", r), en = get_ints(n, "ends", r), sp = get_ints(n, "steps", r);
      Shape out(r);
      for (size_t d = 0; d < r; ++d) {
        if (sp[d] < 1 || st[d] < 0 || en[d] > x.shape[d] || st[d] >= en[d])
          fail(n, "axis " + std::to_string(d) + ": range [" + std::to_string(st[d]) + "," + std::to_string(en[d]) + ") step " + std::to_string(sp[d]) + " invalid for extent " + std::to_string(x.shape[d]));
        out[d] = (en[d] - st[d] - 1) / sp[d] + 1;  // as ceil((en - st) / sp), without overflow for a huge step
      }
      return {x.dtype, out};
    }
    case OpKind::kPad: {
      const size_t r = x.shape.size();
      const auto p = get_ints(n, "pads", 2 * r);
      get_float(n, "value", 0.0f);
      Shape out(r);
      for (size_t d = 0; d < r; ++d) {
        if (p[d] < 0 || p[d + r] < 0) fail(n, "negative pads are not supported");
        if (p[d] > kMaxElements || p[d + r] > kMaxElements) fail(n, "pads must be below 2^40");
        out[d] = x.shape[d] + p[d] + p[d + r];
      }
      return {x.dtype, out};
    }
    case OpKind::kGather: {
      need_float(n, x, "data");
      if (in[1].dtype != DType::kI64) fail(n, "indices must be i64, are " + type_str(in[1]));
      const int64_t axis = get_int(n, "axis", 0);
      if (axis < 0 || axis >= static_cast<int64_t>(x.shape.size())) fail(n, "axis out of range for " + type_str(x));
      Shape out(x.shape.begin(), x.shape.begin() + axis);
      out.insert(out.end(), in[1].shape.begin(), in[1].shape.end());
      out.insert(out.end(), x.shape.begin() + axis + 1, x.shape.end());
      return {x.dtype, out};
    }
    case OpKind::kReluGrad:
      if (in[1].shape != x.shape) fail(n, "dy " + type_str(x) + " and x " + type_str(in[1]) + " must have one shape");
      return x;
    case OpKind::kMaxPoolGrad: {
      const TensorType& px = in[1];
      need_rank(n, px, 4, "x");
      const auto k = get_ints(n, "kernel", 2), st = get_ints(n, "strides", 2), pads = get_ints(n, "pads", 4);
      const int64_t oh = pool_extent(n, px.shape[2], pads[0], pads[2], k[0], 1, st[0]);
      const int64_t ow = pool_extent(n, px.shape[3], pads[1], pads[3], k[1], 1, st[1]);
      if (pads[0] >= k[0] || pads[2] >= k[0] || pads[1] >= k[1] || pads[3] >= k[1]) fail(n, "pads must be smaller than the window");
      const Shape pooled{px.shape[0], px.shape[1], oh, ow};
      if (x.shape != pooled || in[2].shape != pooled)
        fail(n, "dy " + type_str(x) + " and y " + type_str(in[2]) + " must have the pooled shape " + shape_str(pooled));
      return px;
    }
    case OpKind::kReverse: {
      const auto axes = get_ints(n, "axes", 0);
      for (size_t i = 0; i < axes.size(); ++i)
        if (axes[i] < 0 || axes[i] >= static_cast<int64_t>(x.shape.size()) || (i && axes[i] <= axes[i - 1]))
          fail(n, "axes " + shape_str(axes) + " must be increasing and within the rank of " + type_str(x));
      return x;
    }
    case OpKind::kIm2col: {
      need_rank(n, x, 4, "input");
      const auto k = get_ints(n, "kernel", 2), st = get_ints(n, "strides", 2), pads = get_ints(n, "pads", 4),
                 dil = get_ints(n, "dilations", 2);
      const int64_t oh = pool_extent(n, x.shape[2], pads[0], pads[2], k[0], dil[0], st[0]);
      const int64_t ow = pool_extent(n, x.shape[3], pads[1], pads[3], k[1], dil[1], st[1]);
      if (too_large({x.shape[0], oh, ow}) || too_large({k[0], k[1], x.shape[1]}))
        fail(n, "patches of more than 2^40 elements");
      return {x.dtype, {x.shape[0] * oh * ow, k[0] * k[1] * x.shape[1]}};
    }
    case OpKind::kCast: {
      need_float(n, x, "operand");
      const std::string& to = n.attr_string("to");
      if (to == "f32") return {DType::kF32, x.shape};
      if (to == "bf16") return {DType::kBf16, x.shape};
      fail(n, "cast target must be \"f32\" or \"bf16\", is \"" + to + "\"");
    }
  }
  fail(n, "unhandled op");
}

void verify(const Graph& g, const std::string& where) {
  const std::string pre = where + ": verifier: ";
  std::map<std::string, TensorType> defined;
  auto define = [&](const std::string& name, const TensorType& t, const std::string& what) {
    if (name.empty()) throw CompileError(pre + what + " has an empty name");
    if (!defined.emplace(name, t).second) throw CompileError(pre + "tensor %" + name + " is defined twice (again by " + what + ")");
  };
  for (const GraphInput& i : g.inputs) {
    for (int64_t d : i.type.shape)
      if (d < 1) throw CompileError(pre + "input %" + i.name + " has a non-positive dimension " + type_str(i.type));
    if (too_large(i.type.shape)) throw CompileError(pre + "input %" + i.name + " " + type_str(i.type) + " has more than 2^40 elements");
    define(i.name, i.type, "input");
  }
  for (const Constant& c : g.constants) {
    const size_t want = static_cast<size_t>(num_elements(c.type.shape));
    const size_t have = c.type.dtype == DType::kI64 ? c.i.size() : c.f.size();
    if (want != have) throw CompileError(pre + "constant %" + c.name + " " + type_str(c.type) + " holds " + std::to_string(have) + " values");
    define(c.name, c.type, "constant");
  }
  std::set<int> ids;
  for (const Node& n : g.nodes) {
    if (n.id < 0 || !ids.insert(n.id).second) throw CompileError(pre + node_where(n) + ": id is negative or not unique");
    std::vector<TensorType> in;
    for (const std::string& s : n.inputs) {
      auto it = defined.find(s);
      if (it == defined.end()) throw CompileError(pre + node_where(n) + ": operand %" + s + " is not defined before use");
      in.push_back(it->second);
    }
    TensorType t;
    try {
      t = infer_type(n, in);
    } catch (const CompileError& e) {
      throw CompileError(pre + e.what());
    }
    if (t != n.type) throw CompileError(pre + node_where(n) + ": declared type " + type_str(n.type) + " but operands give " + type_str(t));
    if (too_large(t.shape)) throw CompileError(pre + node_where(n) + ": result " + type_str(t) + " has more than 2^40 elements");
    define(n.output, n.type, node_where(n));
  }
  for (const Node& n : g.nodes)
    if (n.fusion_group >= 0 && !ids.count(n.fusion_group))
      throw CompileError(pre + node_where(n) + ": fused into #" + std::to_string(n.fusion_group) + ", which does not exist");
  if (g.outputs.empty()) throw CompileError(pre + "graph has no outputs");
  for (const std::string& o : g.outputs)
    if (!defined.count(o)) throw CompileError(pre + "output %" + o + " is not defined");
}

// ---------------------------------------------------------------- text form

namespace {

bool bare_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

std::string quote(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    if (c == '\n') { r += "\\n"; continue; }
    r += c;
  }
  return r + "\"";
}

std::string name_str(const std::string& s) {
  bool bare = !s.empty();
  for (char c : s) bare = bare && bare_name_char(c);
  return "%" + (bare ? s : quote(s));
}

// Shortest decimal that reads back as the same float, always with '.', 'e', "inf" or "nan".
std::string float_str(float f) {
  if (f != f) return "nan";
  if (f == INFINITY) return "inf";
  if (f == -INFINITY) return "-inf";
  char buf[64];
  for (int prec = 1; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string attr_str(const Attr& a) {
  switch (a.kind) {
    case Attr::Kind::kInt: return std::to_string(a.i);
    case Attr::Kind::kInts: return shape_str(a.ints);
    case Attr::Kind::kFloat: return float_str(a.f);
    case Attr::Kind::kString: return quote(a.s);
  }
  return "";
}

}  // namespace

std::string print_graph(const Graph& g) {
  std::ostringstream o;
  o << "graph " << name_str(g.name).substr(1) << " {\n";
  for (const GraphInput& i : g.inputs) o << "  input " << name_str(i.name) << " : " << type_str(i.type) << "\n";
  for (const Constant& c : g.constants) {
    o << "  const " << name_str(c.name) << " : " << type_str(c.type) << " = [";
    char buf[16];
    if (c.type.dtype == DType::kI64) {
      for (size_t k = 0; k < c.i.size(); ++k) o << (k ? ", " : "") << c.i[k];
    } else {
      for (size_t k = 0; k < c.f.size(); ++k) {
        uint32_t u;
        std::memcpy(&u, &c.f[k], 4);
        std::snprintf(buf, sizeof buf, "0x%08x", u);
        o << (k ? ", " : "") << buf;
      }
    }
    o << "]\n";
  }
  for (const Node& n : g.nodes) {
    o << "  " << name_str(n.output) << " = " << op_name(n.op) << "(";
    for (size_t k = 0; k < n.inputs.size(); ++k) o << (k ? ", " : "") << name_str(n.inputs[k]);
    o << ")";
    if (!n.attrs.empty()) {
      o << " {";
      bool first = true;
      for (const auto& [k, v] : n.attrs) {
        o << (first ? "" : ", ") << k << "=" << attr_str(v);
        first = false;
      }
      o << "}";
    }
    o << " : " << type_str(n.type) << " #" << n.id;
    if (n.fusion_group >= 0) o << " fusion=#" << n.fusion_group;
    o << "\n";
  }
  for (const std::string& s : g.outputs) o << "  output " << name_str(s) << "\n";
  o << "}\n";
  return o.str();
}

namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& source) : t_(text), src_(source) {}

  Graph parse() {
    Graph g;
    expect_word("graph");
    g.name = name_body();
    expect('{');
    for (;;) {
      skip();
      if (peek() == '}') {
        ++p_;
        break;
      }
      if (at_end()) error("missing '}' at the end of the graph");
      if (peek() == '%') {
        g.nodes.push_back(node());
        continue;
      }
      const std::string w = word();
      if (w == "input") {
        GraphInput i;
        i.name = tensor_name();
        expect(':');
        i.type = type();
        g.inputs.push_back(i);
      } else if (w == "const") {
        g.constants.push_back(constant());
      } else if (w == "output") {
        g.outputs.push_back(tensor_name());
      } else {
        error("expected 'input', 'const', 'output', a node or '}', found '" + w + "'");
      }
    }
    skip();
    if (!at_end()) error("text after the end of the graph");
    return g;
  }

 private:
  const std::string& t_;
  std::string src_;
  size_t p_ = 0;

  bool at_end() const { return p_ >= t_.size(); }
  char peek() const { return at_end() ? '\0' : t_[p_]; }

  [[noreturn]] void error(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw CompileError(src_ + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + what);
  }

  void skip() {
    for (;;) {
      while (!at_end() && std::isspace(static_cast<unsigned char>(peek()))) ++p_;
      if (p_ + 1 < t_.size() && t_[p_] == '/' && t_[p_ + 1] == '/') {
        while (!at_end() && peek() != '\n') ++p_;
        continue;
      }
      return;
    }
  }

  void expect(char c) {
    skip();
    if (peek() != c) error(std::string("expected '") + c + "'" + (at_end() ? " before the end of the text" : ", found '" + io::printable(peek()) + "'"));
    ++p_;
  }

  bool accept(char c) {
    skip();
    if (peek() != c) return false;
    ++p_;
    return true;
  }

  std::string word() {
    skip();
    const size_t s = p_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_')) ++p_;
    if (s == p_) error(at_end() ? "unexpected end of text" : "unexpected '" + io::printable(peek()) + "'");
    return t_.substr(s, p_ - s);
  }

  void expect_word(const std::string& w) {
    const size_t s = p_;
    if (word() != w) {
      p_ = s;
      skip();
      error("expected '" + w + "'");
    }
  }

  std::string quoted() {
    ++p_;  // opening quote
    std::string r;
    for (;;) {
      if (at_end()) error("unterminated string");
      char c = t_[p_++];
      if (c == '"') return r;
      if (c == '\\') {
        if (at_end()) error("unterminated string");
        c = t_[p_++];
        if (c == 'n') c = '\n';
      }
      r += c;
    }
  }

  std::string name_body() {
    skip();
    if (peek() == '"') return quoted();
    const size_t s = p_;
    while (!at_end() && bare_name_char(peek())) ++p_;
    if (s == p_) error("expected a name");
    return t_.substr(s, p_ - s);
  }

  std::string tensor_name() {
    expect('%');
    if (std::isspace(static_cast<unsigned char>(peek()))) error("expected a name right after '%'");
    return name_body();
  }

  int64_t integer() {
    skip();
    const size_t s = p_;
    if (peek() == '-' || peek() == '+') ++p_;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(peek()))) ++p_;
    if (p_ == s || (p_ == s + 1 && !std::isdigit(static_cast<unsigned char>(t_[s])))) {
      p_ = s;
      error("expected an integer");
    }
    try {
      return std::stoll(t_.substr(s, p_ - s));
    } catch (const std::exception&) {
      p_ = s;
      error("integer out of range");
    }
  }

  std::vector<int64_t> int_list() {
    expect('[');
    std::vector<int64_t> v;
    if (accept(']')) return v;
    do v.push_back(integer());
    while (accept(','));
    expect(']');
    return v;
  }

  TensorType type() {
    skip();
    const std::string w = word();
    TensorType t;
    if (w == "f32") t.dtype = DType::kF32;
    else if (w == "bf16") t.dtype = DType::kBf16;
    else if (w == "i64") t.dtype = DType::kI64;
    else error("unknown element type '" + w + "' (f32, bf16, i64)");
    t.shape = int_list();
    for (int64_t d : t.shape)
      if (d < 1) error("dimensions must be >= 1 in " + type_str(t));
    if (too_large(t.shape)) error(type_str(t) + " has more than 2^40 elements");
    return t;
  }

  Constant constant() {
    Constant c;
    c.name = tensor_name();
    expect(':');
    c.type = type();
    expect('=');
    expect('[');
    if (!accept(']')) {
      do {
        skip();
        const size_t s = p_;
        if (c.type.dtype == DType::kI64) {
          c.i.push_back(integer());
        } else {
          while (!at_end() && std::isxdigit(static_cast<unsigned char>(peek())) ) ++p_;
          if (!at_end() && (peek() == 'x' || peek() == 'X')) ++p_;
          while (!at_end() && std::isxdigit(static_cast<unsigned char>(peek()))) ++p_;
          const std::string tok = t_.substr(s, p_ - s);
          if (tok.size() != 10 || tok[0] != '0' || (tok[1] != 'x' && tok[1] != 'X')) {
            p_ = s;
            error("float constants are written as 0x followed by 8 hex digits of the fp32 bits");
          }
          const uint32_t u = static_cast<uint32_t>(std::stoul(tok.substr(2), nullptr, 16));
          float f;
          std::memcpy(&f, &u, 4);
          c.f.push_back(f);
        }
      } while (accept(','));
      expect(']');
    }
    const size_t have = c.type.dtype == DType::kI64 ? c.i.size() : c.f.size();
    if (static_cast<int64_t>(have) != num_elements(c.type.shape))
      error("constant %" + c.name + " " + type_str(c.type) + " needs " + std::to_string(num_elements(c.type.shape)) + " values, has " + std::to_string(have));
    return c;
  }

  Attr attr_value() {
    skip();
    if (peek() == '[') return Attr::Ints(int_list());
    if (peek() == '"') return Attr::String(quoted());
    const size_t s = p_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '-' || peek() == '+' || peek() == '.')) ++p_;
    const std::string tok = t_.substr(s, p_ - s);
    if (tok.empty()) error("expected an attribute value");
    const bool is_float = tok.find_first_of(".eEn") != std::string::npos;  // "inf"/"nan" contain 'n'
    try {
      size_t used = 0;
      if (is_float) {
        const float f = std::stof(tok, &used);
        if (used == tok.size()) return Attr::Float(f);
      } else {
        const long long v = std::stoll(tok, &used);
        if (used == tok.size()) return Attr::Int(v);
      }
    } catch (const std::exception&) {
    }
    p_ = s;
    error("bad attribute value '" + tok + "'");
  }

  Node node() {
    Node n;
    n.output = tensor_name();
    expect('=');
    const std::string op = word();
    if (!parse_op_name(op, &n.op)) {
      p_ -= op.size();
      error("unknown op '" + op + "'");
    }
    expect('(');
    if (!accept(')')) {
      do n.inputs.push_back(tensor_name());
      while (accept(','));
      expect(')');
    }
    if (accept('{')) {
      if (!accept('}')) {
        do {
          const std::string k = word();
          expect('=');
          if (!n.attrs.emplace(k, attr_value()).second) error("attribute '" + k + "' given twice");
        } while (accept(','));
        expect('}');
      }
    }
    expect(':');
    n.type = type();
    expect('#');
    const int64_t id = integer();
    if (id < 0 || id > (1 << 30)) error("node id out of range");
    n.id = static_cast<int>(id);
    skip();
    if (t_.compare(p_, 7, "fusion=") == 0) {
      p_ += 7;
      expect('#');
      n.fusion_group = static_cast<int>(integer());
    }
    return n;
  }
};

}  // namespace

Graph parse_graph(const std::string& text, const std::string& source) { return Parser(text, source).parse(); }

}  // namespace tpusim::compiler

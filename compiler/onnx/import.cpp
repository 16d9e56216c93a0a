#include "compiler/onnx/import.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "compiler/passes/passes.h"

namespace tpusim::compiler {

namespace {

constexpr int kMinOpset = 11, kMaxOpset = 17;

class Importer {
 public:
  explicit Importer(std::string label) : label_(std::move(label)) {}

  Graph run(const onnx::ModelProto& model) {
    int opset = -1;
    for (const auto& o : model.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") opset = static_cast<int>(o.version());
    if (opset < 0) fail("the model imports no ai.onnx opset");
    if (opset < kMinOpset || opset > kMaxOpset)
      fail("opset " + std::to_string(opset) + " is not supported (" + std::to_string(kMinOpset) + "-" + std::to_string(kMaxOpset) + ")");
    opset_ = opset;
    if (!model.has_graph()) fail("the model has no graph");
    const onnx::GraphProto& gp = model.graph();
    g_.name = gp.name().empty() ? "main" : gp.name();
    for (const auto& t : gp.initializer()) add_constant(t.name(), t);
    for (const auto& vi : gp.input()) {
      if (types_.count(vi.name())) continue;  // an initializer listed as an input
      GraphInput in;
      in.name = vi.name();
      in.type = value_type(vi);
      types_[in.name] = in.type;
      g_.inputs.push_back(in);
    }
    if (gp.output_size() == 0) fail("the graph has no outputs");
    for (const int idx : topological_order(gp)) convert(gp.node(idx), idx);
    for (const auto& vi : gp.output()) {
      if (!types_.count(vi.name())) fail("graph output '" + vi.name() + "' is not computed by any node");
      g_.outputs.push_back(vi.name());
    }
    try {
      verify(g_, label_);
      run_passes(g_, import_pipeline());
    } catch (const CompileError& e) {
      throw CompileError(label_ + ": " + e.what());
    }
    return std::move(g_);
  }

 private:
  std::string label_;
  int opset_ = 0;
  Graph g_;
  std::map<std::string, TensorType> types_;
  std::map<std::string, size_t> const_index_;  // name -> g_.constants index
  int next_id_ = 0;
  std::string where_;  // "node 'name' (Op)" while converting one

  [[noreturn]] void fail(const std::string& what) const {
    std::string msg = label_ + ": " + (where_.empty() ? "" : where_ + ": ") + what;
    // Names come from the file: keep the message on one printable line.
    for (char& c : msg)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    throw CompileError(msg);
  }

  TensorType value_type(const onnx::ValueInfoProto& vi) {
    if (!vi.type().has_tensor_type()) fail("input '" + vi.name() + "' is not a tensor");
    const auto& tt = vi.type().tensor_type();
    TensorType t;
    t.dtype = elem_type(tt.elem_type(), "input '" + vi.name() + "'");
    if (!tt.has_shape()) fail("input '" + vi.name() + "' has no static shape");
    for (const auto& d : tt.shape().dim()) {
      if (!d.has_dim_value() || d.dim_value() < 1)
        fail("input '" + vi.name() + "' has a dynamic dimension" + (d.has_dim_param() ? " '" + d.dim_param() + "'" : std::string()) +
             "; export it with static shapes");
      if (d.dim_value() > (int64_t{1} << 40) || num_elements(t.shape) > (int64_t{1} << 40) / d.dim_value())
        fail("input '" + vi.name() + "' is too large");
      t.shape.push_back(d.dim_value());
    }
    return t;
  }

  DType elem_type(int et, const std::string& what) {
    switch (et) {
      case onnx::TensorProto_DataType_FLOAT: case onnx::TensorProto_DataType_DOUBLE: return DType::kF32;
      case onnx::TensorProto_DataType_BFLOAT16: return DType::kBf16;
      case onnx::TensorProto_DataType_INT64: case onnx::TensorProto_DataType_INT32: return DType::kI64;
      default: fail(what + " has element type " + std::to_string(et) + "; only float32, bfloat16 and int32/int64 are supported");
    }
  }

  Constant tensor_constant(const std::string& name, const onnx::TensorProto& t) {
    if (t.data_location() == onnx::TensorProto_DataLocation_EXTERNAL) fail("tensor '" + name + "' uses external data, which is not supported");
    Constant c;
    c.name = name;
    c.type.dtype = elem_type(t.data_type(), "tensor '" + name + "'");
    for (int64_t d : t.dims()) {
      if (d < 1) fail("tensor '" + name + "' has a zero or negative dimension");
      if (d > (int64_t{1} << 40) || num_elements(c.type.shape) > (int64_t{1} << 40) / d) fail("tensor '" + name + "' is too large");
      c.type.shape.push_back(d);
    }
    const size_t n = static_cast<size_t>(num_elements(c.type.shape));
    const std::string& raw = t.raw_data();
    auto need = [&](size_t have) {
      if (have != n) fail("tensor '" + name + "' " + type_str(c.type) + " holds " + std::to_string(have) + " values, needs " + std::to_string(n));
    };
    switch (t.data_type()) {
      case onnx::TensorProto_DataType_FLOAT:
        if (!raw.empty()) {
          need(raw.size() / 4 * (raw.size() % 4 == 0));
          c.f.resize(n);
          std::memcpy(c.f.data(), raw.data(), n * 4);
        } else {
          need(static_cast<size_t>(t.float_data_size()));
          c.f.assign(t.float_data().begin(), t.float_data().end());
        }
        break;
      case onnx::TensorProto_DataType_DOUBLE:
        if (!raw.empty()) {
          need(raw.size() / 8 * (raw.size() % 8 == 0));
          for (size_t k = 0; k < n; ++k) {
            double d;
            std::memcpy(&d, raw.data() + 8 * k, 8);
            c.f.push_back(static_cast<float>(d));
          }
        } else {
          need(static_cast<size_t>(t.double_data_size()));
          for (double d : t.double_data()) c.f.push_back(static_cast<float>(d));
        }
        break;
      case onnx::TensorProto_DataType_BFLOAT16:
        if (!raw.empty()) {
          need(raw.size() / 2 * (raw.size() % 2 == 0));
          for (size_t k = 0; k < n; ++k) {
            uint16_t h;
            std::memcpy(&h, raw.data() + 2 * k, 2);
            const uint32_t u = static_cast<uint32_t>(h) << 16;
            float f;
            std::memcpy(&f, &u, 4);
            c.f.push_back(f);
          }
        } else {
          need(static_cast<size_t>(t.int32_data_size()));
          for (int32_t v : t.int32_data()) {
            const uint32_t u = static_cast<uint32_t>(v & 0xFFFF) << 16;
            float f;
            std::memcpy(&f, &u, 4);
            c.f.push_back(f);
          }
        }
        break;
      case onnx::TensorProto_DataType_INT64:
        if (!raw.empty()) {
          need(raw.size() / 8 * (raw.size() % 8 == 0));
          c.i.resize(n);
          std::memcpy(c.i.data(), raw.data(), n * 8);
        } else {
          need(static_cast<size_t>(t.int64_data_size()));
          c.i.assign(t.int64_data().begin(), t.int64_data().end());
        }
        break;
      default:  // INT32
        if (!raw.empty()) {
          need(raw.size() / 4 * (raw.size() % 4 == 0));
          for (size_t k = 0; k < n; ++k) {
            int32_t v;
            std::memcpy(&v, raw.data() + 4 * k, 4);
            c.i.push_back(v);
          }
        } else {
          need(static_cast<size_t>(t.int32_data_size()));
          c.i.assign(t.int32_data().begin(), t.int32_data().end());
        }
        break;
    }
    return c;
  }

  void add_constant(const std::string& name, const onnx::TensorProto& t) { add_constant(tensor_constant(name, t)); }

  void add_constant(Constant c) {
    if (types_.count(c.name)) fail("tensor '" + c.name + "' is defined twice");
    types_[c.name] = c.type;
    const_index_[c.name] = g_.constants.size();
    g_.constants.push_back(std::move(c));
  }

  std::vector<int> topological_order(const onnx::GraphProto& gp) {
    std::map<std::string, int> producer;
    for (int i = 0; i < gp.node_size(); ++i)
      for (const auto& o : gp.node(i).output())
        if (!o.empty()) {
          if (types_.count(o) || !producer.emplace(o, i).second) fail("tensor '" + o + "' is produced twice");
        }
    std::vector<int> pending(gp.node_size(), 0);
    std::vector<std::vector<int>> users(gp.node_size());
    for (int i = 0; i < gp.node_size(); ++i) {
      for (const auto& in : gp.node(i).input()) {
        if (in.empty() || types_.count(in)) continue;
        auto it = producer.find(in);
        if (it == producer.end()) fail(node_label(gp.node(i), i) + ": input '" + in + "' is not defined by any node, input or initializer");
        ++pending[i];
        users[it->second].push_back(i);
      }
    }
    std::vector<int> ready, order;
    for (int i = gp.node_size(); i-- > 0;)
      if (pending[i] == 0) ready.push_back(i);
    // Keep the file's order where possible: always take the lowest ready index.
    while (!ready.empty()) {
      std::sort(ready.begin(), ready.end(), std::greater<int>());
      const int i = ready.back();
      ready.pop_back();
      order.push_back(i);
      for (int u : users[i])
        if (--pending[u] == 0) ready.push_back(u);
    }
    if (static_cast<int>(order.size()) != gp.node_size())
      for (int i = 0; i < gp.node_size(); ++i)
        if (pending[i] > 0) fail("the graph has a cycle through " + node_label(gp.node(i), i));
    return order;
  }

  static std::string node_label(const onnx::NodeProto& n, int idx) {
    return "node '" + (n.name().empty() ? "#" + std::to_string(idx) : n.name()) + "' (" + n.op_type() + ")";
  }

  // ---- attribute access
  const onnx::NodeProto* cur_ = nullptr;

  const onnx::AttributeProto* attr(const std::string& name) const {
    for (const auto& a : cur_->attribute())
      if (a.name() == name) return &a;
    return nullptr;
  }
  int64_t attr_i(const std::string& name, int64_t def) const {
    const auto* a = attr(name);
    return a ? a->i() : def;
  }
  float attr_f(const std::string& name, float def) const {
    const auto* a = attr(name);
    return a ? a->f() : def;
  }
  std::string attr_s(const std::string& name, const std::string& def) const {
    const auto* a = attr(name);
    return a ? a->s() : def;
  }
  std::vector<int64_t> attr_ints(const std::string& name, std::vector<int64_t> def) const {
    const auto* a = attr(name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : def;
  }
  void allow_attrs(std::initializer_list<const char*> names) const {
    for (const auto& a : cur_->attribute()) {
      bool ok = false;
      for (const char* n : names) ok = ok || a.name() == n;
      if (!ok) fail("attribute '" + a.name() + "' is not supported");
    }
  }

  // ---- operand access
  size_t num_inputs() const {
    size_t n = static_cast<size_t>(cur_->input_size());
    while (n > 0 && cur_->input(static_cast<int>(n) - 1).empty()) --n;
    return n;
  }
  bool has_input(size_t k) const { return k < num_inputs() && !cur_->input(static_cast<int>(k)).empty(); }
  const std::string& input(size_t k) const {
    if (!has_input(k)) fail("operand " + std::to_string(k) + " is missing");
    return cur_->input(static_cast<int>(k));
  }
  const TensorType& type_of(const std::string& name) const { return types_.at(name); }
  const Constant& const_input(size_t k, const char* what) const {
    auto it = const_index_.find(input(k));
    if (it == const_index_.end()) fail(std::string(what) + " (operand " + std::to_string(k) + ") must be a constant");
    return g_.constants[it->second];
  }
  std::vector<int64_t> const_ints(size_t k, const char* what) const {
    const Constant& c = const_input(k, what);
    if (c.type.dtype != DType::kI64) fail(std::string(what) + " must be integers");
    return c.i;
  }
  float const_scalar(size_t k, const char* what) const {
    const Constant& c = const_input(k, what);
    if (c.type.dtype == DType::kI64) {
      if (c.i.size() != 1) fail(std::string(what) + " must be a scalar");
      return static_cast<float>(c.i[0]);
    }
    if (c.f.size() != 1) fail(std::string(what) + " must be a scalar");
    return c.f[0];
  }

  int64_t norm_axis(int64_t axis, size_t rank) const {
    const int64_t r = static_cast<int64_t>(rank);
    if (axis < -r || axis >= r) fail("axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
    return axis < 0 ? axis + r : axis;
  }

  // ---- emitting IR nodes
  std::string emit(OpKind op, std::vector<std::string> inputs, Attrs attrs, const std::string& out_name) {
    Node n;
    n.id = next_id_++;
    n.op = op;
    n.inputs = std::move(inputs);
    n.output = out_name;
    n.attrs = std::move(attrs);
    std::vector<TensorType> in;
    for (const std::string& s : n.inputs) in.push_back(types_.at(s));
    try {
      n.type = infer_type(n, in);
    } catch (const CompileError& e) {
      fail(e.what());
    }
    if (types_.count(out_name)) fail("tensor '" + out_name + "' is defined twice");
    types_[out_name] = n.type;
    g_.nodes.push_back(std::move(n));
    return out_name;
  }

  std::string temp_name(const std::string& base) {
    std::string s = base;
    for (int k = 1; types_.count(s); ++k) s = base + ".t" + std::to_string(k);
    return s;
  }

  std::string out0() const {
    if (cur_->output_size() < 1 || cur_->output(0).empty()) fail("has no output");
    for (int k = 1; k < cur_->output_size(); ++k)
      if (!cur_->output(k).empty()) fail("optional output " + std::to_string(k) + " ('" + cur_->output(k) + "') is not supported");
    return cur_->output(0);
  }

  std::vector<int64_t> spatial(const std::string& name, size_t n, int64_t def) const {
    auto v = attr_ints(name, std::vector<int64_t>(n, def));
    if (v.size() != n) fail("attribute '" + name + "' needs " + std::to_string(n) + " values");
    return v;
  }

  // ONNX pads [x1_begin, x2_begin, x1_end, x2_end] -> ours [top, left, bottom, right] (same order).
  std::vector<int64_t> window_pads(const Shape& x, const std::vector<int64_t>& k, const std::vector<int64_t>& st,
                                   const std::vector<int64_t>& dil) const {
    const std::string ap = attr_s("auto_pad", "NOTSET");
    if (ap == "NOTSET") return spatial("pads", 4, 0);
    if (ap == "VALID") return {0, 0, 0, 0};
    if (ap != "SAME_UPPER" && ap != "SAME_LOWER") fail("auto_pad '" + ap + "' is not supported");
    std::vector<int64_t> p(4);
    for (int d = 0; d < 2; ++d) {
      const int64_t in = x[2 + d], out = (in + st[d] - 1) / st[d];
      const int64_t total = std::max<int64_t>(0, (out - 1) * st[d] + dil[d] * (k[d] - 1) + 1 - in);
      const int64_t small = total / 2, big = total - small;
      p[d] = ap == "SAME_UPPER" ? small : big;
      p[d + 2] = ap == "SAME_UPPER" ? big : small;
    }
    return p;
  }

  void convert(const onnx::NodeProto& node, int idx) {
    cur_ = &node;
    where_ = node_label(node, idx);
    if (!node.domain().empty() && node.domain() != "ai.onnx") fail("op domain '" + node.domain() + "' is not supported");
    const std::string& op = node.op_type();
    static const std::map<std::string, OpKind> kUnary = {
        {"Relu", OpKind::kRelu}, {"Tanh", OpKind::kTanh}, {"Sigmoid", OpKind::kSigmoid}, {"Exp", OpKind::kExp},
        {"Log", OpKind::kLog},   {"Sqrt", OpKind::kSqrt}, {"Erf", OpKind::kErf},         {"Neg", OpKind::kNeg},
        {"Identity", OpKind::kIdentity}};
    static const std::map<std::string, OpKind> kBinary = {
        {"Add", OpKind::kAdd}, {"Sub", OpKind::kSub}, {"Mul", OpKind::kMul}, {"Div", OpKind::kDiv}};
    if (op == "Constant") {
      allow_attrs({"value", "value_float", "value_floats", "value_int", "value_ints"});
      const std::string out = out0();
      Constant c;
      c.name = out;
      if (const auto* a = attr("value")) {
        c = tensor_constant(out, a->t());
      } else if (const auto* a = attr("value_float")) {
        c.type = {DType::kF32, {}};
        c.f = {a->f()};
      } else if (const auto* a = attr("value_floats")) {
        c.type = {DType::kF32, {static_cast<int64_t>(a->floats_size())}};
        c.f.assign(a->floats().begin(), a->floats().end());
      } else if (const auto* a = attr("value_int")) {
        c.type = {DType::kI64, {}};
        c.i = {a->i()};
      } else if (const auto* a = attr("value_ints")) {
        c.type = {DType::kI64, {static_cast<int64_t>(a->ints_size())}};
        c.i.assign(a->ints().begin(), a->ints().end());
      } else {
        fail("has no value");
      }
      add_constant(std::move(c));
    } else if (kUnary.count(op)) {
      allow_attrs({});
      emit(kUnary.at(op), {input(0)}, {}, out0());
    } else if (op == "Dropout") {
      allow_attrs({"seed"});
      if (has_input(2)) fail("training_mode input is not supported (inference only)");
      emit(OpKind::kIdentity, {input(0)}, {}, out0());
    } else if (kBinary.count(op)) {
      allow_attrs({});
      emit(kBinary.at(op), {input(0), input(1)}, {}, out0());
    } else if (op == "Pow") {
      allow_attrs({});
      emit(OpKind::kPow, {input(0)}, {{"exponent", Attr::Float(const_scalar(1, "the exponent"))}}, out0());
    } else if (op == "Clip") {
      allow_attrs({});
      const float lo = has_input(1) ? const_scalar(1, "min") : std::numeric_limits<float>::lowest();
      const float hi = has_input(2) ? const_scalar(2, "max") : std::numeric_limits<float>::max();
      emit(OpKind::kClip, {input(0)}, {{"min", Attr::Float(lo)}, {"max", Attr::Float(hi)}}, out0());
    } else if (op == "Gemm") {
      allow_attrs({"alpha", "beta", "transA", "transB"});
      if (type_of(input(0)).shape.size() != 2 || type_of(input(1)).shape.size() != 2) fail("operands must be matrices");
      std::vector<std::string> in = {input(0), input(1)};
      if (has_input(2)) in.push_back(input(2));
      Attrs a;
      if (attr_i("transA", 0)) a["trans_a"] = Attr::Int(1);
      if (attr_i("transB", 0)) a["trans_b"] = Attr::Int(1);
      if (attr_f("alpha", 1.0f) != 1.0f) a["alpha"] = Attr::Float(attr_f("alpha", 1.0f));
      if (has_input(2) && attr_f("beta", 1.0f) != 1.0f) a["beta"] = Attr::Float(attr_f("beta", 1.0f));
      emit(OpKind::kMatmul, in, a, out0());
    } else if (op == "MatMul") {
      allow_attrs({});
      if (type_of(input(0)).shape.size() < 2 || type_of(input(1)).shape.size() < 2) fail("1-D operands are not supported");
      emit(OpKind::kMatmul, {input(0), input(1)}, {}, out0());
    } else if (op == "Conv") {
      allow_attrs({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"});
      const Shape& x = type_of(input(0)).shape;
      const Shape& w = type_of(input(1)).shape;
      if (x.size() != 4 || w.size() != 4) fail("only 2-D convolution (4-D tensors) is supported");
      const auto k = attr_ints("kernel_shape", {w[2], w[3]});
      if (k != std::vector<int64_t>{w[2], w[3]}) fail("kernel_shape " + shape_str(k) + " disagrees with the weights " + shape_str(w));
      const auto st = spatial("strides", 2, 1), dil = spatial("dilations", 2, 1);
      std::vector<std::string> in = {input(0), input(1)};
      if (has_input(2)) in.push_back(input(2));
      emit(OpKind::kConv2d, in,
           {{"strides", Attr::Ints(st)}, {"dilations", Attr::Ints(dil)}, {"pads", Attr::Ints(window_pads(x, k, st, dil))},
            {"groups", Attr::Int(attr_i("group", 1))}},
           out0());
    } else if (op == "BatchNormalization") {
      allow_attrs({"epsilon", "momentum", "training_mode", "spatial"});
      if (attr_i("training_mode", 0) != 0) fail("training_mode=1 is not supported (inference only)");
      emit(OpKind::kBatchNorm, {input(0), input(1), input(2), input(3), input(4)}, {{"epsilon", Attr::Float(attr_f("epsilon", 1e-5f))}}, out0());
    } else if (op == "LayerNormalization") {
      allow_attrs({"axis", "epsilon", "stash_type"});
      const TensorType& x = type_of(input(0));
      const int64_t axis = norm_axis(attr_i("axis", -1), x.shape.size());
      if (axis != static_cast<int64_t>(x.shape.size()) - 1) fail("normalising over more than the last axis is not supported");
      if (cur_->output_size() > 1)
        for (int k = 1; k < cur_->output_size(); ++k)
          if (!cur_->output(k).empty()) fail("Mean/InvStdDev outputs are not supported");
      std::string bias;
      if (has_input(2)) {
        bias = input(2);
      } else {
        Constant z{temp_name(cur_->output(0) + ".zero_bias"), {x.dtype, {x.shape.back()}}, std::vector<float>(x.shape.back(), 0.0f), {}};
        bias = z.name;
        add_constant(std::move(z));
      }
      emit(OpKind::kLayerNorm, {input(0), input(1), bias}, {{"axis", Attr::Int(axis)}, {"epsilon", Attr::Float(attr_f("epsilon", 1e-5f))}},
           cur_->output(0));
    } else if (op == "Softmax") {
      allow_attrs({"axis"});
      const TensorType& x = type_of(input(0));
      const size_t r = x.shape.size();
      const int64_t axis = norm_axis(attr_i("axis", opset_ >= 13 ? -1 : 1), r);
      if (opset_ >= 13 || axis == static_cast<int64_t>(r) - 1) {
        emit(OpKind::kSoftmax, {input(0)}, {{"axis", Attr::Int(axis)}}, out0());
      } else {  // before opset 13: softmax over the input coerced to 2-D at `axis`
        const Shape flat = {num_elements(Shape(x.shape.begin(), x.shape.begin() + axis)), num_elements(Shape(x.shape.begin() + axis, x.shape.end()))};
        const std::string a = emit(OpKind::kReshape, {input(0)}, {{"shape", Attr::Ints(flat)}}, temp_name(out0() + ".2d"));
        const std::string b = emit(OpKind::kSoftmax, {a}, {{"axis", Attr::Int(1)}}, temp_name(out0() + ".softmax"));
        emit(OpKind::kReshape, {b}, {{"shape", Attr::Ints(x.shape)}}, out0());
      }
    } else if (op == "ReduceSum" || op == "ReduceMean" || op == "ReduceMax") {
      allow_attrs({"axes", "keepdims", "noop_with_empty_axes"});
      const TensorType& x = type_of(input(0));
      std::vector<int64_t> axes = attr_ints("axes", {});
      if (has_input(1)) axes = const_ints(1, "axes");
      if (axes.empty()) {
        if (attr_i("noop_with_empty_axes", 0)) {
          emit(OpKind::kIdentity, {input(0)}, {}, out0());
          return;
        }
        for (size_t d = 0; d < x.shape.size(); ++d) axes.push_back(static_cast<int64_t>(d));
      }
      for (int64_t& a : axes) a = norm_axis(a, x.shape.size());
      std::sort(axes.begin(), axes.end());
      axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
      const OpKind k = op == "ReduceSum" ? OpKind::kReduceSum : op == "ReduceMean" ? OpKind::kReduceMean : OpKind::kReduceMax;
      emit(k, {input(0)}, {{"axes", Attr::Ints(axes)}, {"keepdims", Attr::Int(attr_i("keepdims", 1) ? 1 : 0)}}, out0());
    } else if (op == "MaxPool" || op == "AveragePool") {
      allow_attrs({"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "storage_order", "strides"});
      const Shape& x = type_of(input(0)).shape;
      if (x.size() != 4) fail("only 2-D pooling (4-D tensors) is supported");
      if (attr_i("ceil_mode", 0) != 0) fail("ceil_mode=1 is not supported");
      if (spatial("dilations", 2, 1) != std::vector<int64_t>{1, 1}) fail("dilated pooling is not supported");
      const auto k = spatial("kernel_shape", 2, 1);
      if (!attr("kernel_shape")) fail("kernel_shape is required");
      const auto st = spatial("strides", 2, 1);
      Attrs a = {{"kernel", Attr::Ints(k)}, {"strides", Attr::Ints(st)}, {"pads", Attr::Ints(window_pads(x, k, st, {1, 1}))}};
      if (op == "AveragePool") a["count_include_pad"] = Attr::Int(attr_i("count_include_pad", 0) ? 1 : 0);
      emit(op == "MaxPool" ? OpKind::kMaxPool : OpKind::kAvgPool, {input(0)}, a, out0());
    } else if (op == "GlobalAveragePool") {
      allow_attrs({});
      emit(OpKind::kGlobalAvgPool, {input(0)}, {}, out0());
    } else if (op == "Transpose") {
      allow_attrs({"perm"});
      const size_t r = type_of(input(0)).shape.size();
      std::vector<int64_t> rev;
      for (size_t d = r; d-- > 0;) rev.push_back(static_cast<int64_t>(d));
      emit(OpKind::kTranspose, {input(0)}, {{"perm", Attr::Ints(attr_ints("perm", rev))}}, out0());
    } else if (op == "Reshape") {
      allow_attrs({"allowzero"});
      const Shape& x = type_of(input(0)).shape;
      std::vector<int64_t> s = const_ints(1, "the shape");
      int infer = -1;
      int64_t known = 1;
      for (size_t d = 0; d < s.size(); ++d) {
        if (s[d] == 0 && !attr_i("allowzero", 0)) {
          if (d >= x.size()) fail("shape " + shape_str(s) + ": 0 copies a dimension the input does not have");
          s[d] = x[d];
        }
        if (s[d] == -1) {
          if (infer >= 0) fail("shape " + shape_str(s) + " has two -1 entries");
          infer = static_cast<int>(d);
        } else {
          known *= s[d];
        }
      }
      if (infer >= 0) {
        if (known <= 0 || num_elements(x) % known != 0) fail("cannot reshape " + shape_str(x) + " to " + shape_str(s));
        s[infer] = num_elements(x) / known;
      }
      emit(OpKind::kReshape, {input(0)}, {{"shape", Attr::Ints(s)}}, out0());
    } else if (op == "Flatten") {
      allow_attrs({"axis"});
      const size_t r = type_of(input(0)).shape.size();
      int64_t axis = attr_i("axis", 1);
      if (axis < 0) axis += static_cast<int64_t>(r);
      emit(OpKind::kFlatten, {input(0)}, {{"axis", Attr::Int(axis)}}, out0());
    } else if (op == "Squeeze" || op == "Unsqueeze") {
      allow_attrs({"axes"});
      const Shape& x = type_of(input(0)).shape;
      std::vector<int64_t> axes = attr_ints("axes", {});
      if (has_input(1)) axes = const_ints(1, "axes");
      Shape s;
      if (op == "Squeeze") {
        for (int64_t& a : axes) a = norm_axis(a, x.size());
        for (size_t d = 0; d < x.size(); ++d) {
          const bool listed = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
          if (listed && x[d] != 1) fail("cannot squeeze axis " + std::to_string(d) + " of extent " + std::to_string(x[d]));
          if (!(listed || (axes.empty() && x[d] == 1))) s.push_back(x[d]);
        }
      } else {
        const size_t r = x.size() + axes.size();
        for (int64_t& a : axes) a = norm_axis(a, r);
        size_t src = 0;
        for (size_t d = 0; d < r; ++d)
          s.push_back(std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end() ? 1 : x[src++]);
      }
      emit(OpKind::kReshape, {input(0)}, {{"shape", Attr::Ints(s)}}, out0());
    } else if (op == "Concat") {
      allow_attrs({"axis"});
      std::vector<std::string> in;
      for (size_t k = 0; k < num_inputs(); ++k) in.push_back(input(k));
      emit(OpKind::kConcat, in, {{"axis", Attr::Int(norm_axis(attr_i("axis", 0), type_of(input(0)).shape.size()))}}, out0());
    } else if (op == "Slice") {
      allow_attrs({});
      const Shape& x = type_of(input(0)).shape;
      const auto st = const_ints(1, "starts"), en = const_ints(2, "ends");
      std::vector<int64_t> axes, steps;
      if (has_input(3)) axes = const_ints(3, "axes");
      else for (size_t d = 0; d < st.size(); ++d) axes.push_back(static_cast<int64_t>(d));
      if (has_input(4)) steps = const_ints(4, "steps");
      else steps.assign(st.size(), 1);
      if (en.size() != st.size() || axes.size() != st.size() || steps.size() != st.size()) fail("starts, ends, axes and steps differ in length");
      std::vector<int64_t> s0(x.size(), 0), e0(x.begin(), x.end()), p0(x.size(), 1);
      for (size_t k = 0; k < st.size(); ++k) {
        const int64_t a = norm_axis(axes[k], x.size()), dim = x[a];
        if (steps[k] < 1) fail("steps must be positive");
        auto clampi = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
        s0[a] = clampi(st[k]);
        e0[a] = clampi(en[k]);
        p0[a] = steps[k];
        if (s0[a] >= e0[a]) fail("axis " + std::to_string(a) + " slices to nothing");
      }
      emit(OpKind::kSlice, {input(0)}, {{"starts", Attr::Ints(s0)}, {"ends", Attr::Ints(e0)}, {"steps", Attr::Ints(p0)}}, out0());
    } else if (op == "Pad") {
      allow_attrs({"mode"});
      if (attr_s("mode", "constant") != "constant") fail("mode '" + attr_s("mode", "") + "' is not supported (constant only)");
      const auto p = const_ints(1, "the pads");
      if (has_input(3)) fail("the axes operand is not supported");
      const float v = has_input(2) ? const_scalar(2, "the constant value") : 0.0f;
      emit(OpKind::kPad, {input(0)}, {{"pads", Attr::Ints(p)}, {"value", Attr::Float(v)}}, out0());
    } else if (op == "Gather") {
      allow_attrs({"axis"});
      emit(OpKind::kGather, {input(0), input(1)}, {{"axis", Attr::Int(norm_axis(attr_i("axis", 0), type_of(input(0)).shape.size()))}}, out0());
    } else if (op == "Cast") {
      allow_attrs({"to", "saturate"});
      const int64_t to = attr_i("to", 0);
      if (to != onnx::TensorProto_DataType_FLOAT && to != onnx::TensorProto_DataType_BFLOAT16)
        fail("cast to element type " + std::to_string(to) + " is not supported (float32 or bfloat16)");
      emit(OpKind::kCast, {input(0)}, {{"to", Attr::String(to == onnx::TensorProto_DataType_FLOAT ? "f32" : "bf16")}}, out0());
    } else {
      fail("op '" + op + "' is not supported");
    }
    where_.clear();
  }
};

}  // namespace

Graph import_onnx_bytes(const std::string& bytes, const std::string& label) {
  onnx::ModelProto model;
  if (bytes.empty()) throw CompileError(label + ": empty file, not an ONNX model");
  if (!model.ParseFromString(bytes)) throw CompileError(label + ": not a valid ONNX model (protobuf parse failed; truncated or corrupt?)");
  return Importer(label).run(model);
}

}  // namespace tpusim::compiler

// The lowerings of compiler/lower/shape.cpp against the graph reference, bit for
// bit: concat, slice, pad, gather (constant and input indices), unfolded
// batchnorm, softmax and reductions over non-innermost axes, avgpool excluding
// padded taps. Each one-op graph is evaluated by compiler/ref and compiled to a
// bundle run on the functional reference with the race checker, under both
// precision policies, on one and several cores.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>

#include "compiler/compiler.h"
#include "compiler/lower/lower.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/tensors.h"
#include "isa/numerics/bf16.h"

namespace tpusim::compiler {
namespace {

using num::PrecisionPolicy;
const PrecisionPolicy kPolicies[] = {PrecisionPolicy::kDefault, PrecisionPolicy::kBf16};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

isa::Target target(uint32_t rows = 128) {
  isa::Target t;
  t.mxu_rows = rows;
  t.mxu_cols = rows;
  t.fifo_rows = 64;
  t.hbm_bytes = 256ull << 20;
  return t;
}

struct Outcome {
  exec::RunResult run;
  size_t differing = 0;
};

// Compiles and runs `ir`; i64 inputs draw indices in [lo, hi). Expects every
// output equal to evaluate()'s bits unless the run faults (returned to the caller).
Outcome run_both(const std::string& ir, PrecisionPolicy policy, int cores = 1, int64_t lo = 0, int64_t hi = 0,
                 uint32_t seed = 1) {
  const Graph g = parse_graph(ir, "test.ir");
  verify(g);
  std::map<std::string, HostTensor> inputs;
  std::mt19937 rng(seed + 100);
  for (const auto& in : g.inputs) {
    HostTensor h;
    h.shape = in.type.shape;
    const size_t n = static_cast<size_t>(num_elements(in.type.shape));
    if (in.type.dtype == DType::kI64) {
      h.dtype = DType::kI64;
      std::uniform_int_distribution<int64_t> d(lo, hi - 1);
      for (size_t k = 0; k < n; ++k) h.i.push_back(d(rng));
    } else {
      h.dtype = DType::kF32;
      h.f = random_values(n, seed++);
    }
    inputs[in.name] = h;
  }
  LowerOptions lo_opt;
  lo_opt.target = target();
  lo_opt.policy = policy;
  lo_opt.cores = cores;
  const LowerResult lr = lower_graph(g, lo_opt);
  for (const auto& core : lr.bundle.cores)
    for (const auto& ins : core.code) EXPECT_GE(ins.op_id, 0) << "an instruction without an op id";
  exec::Interpreter interp(lr.bundle);
  for (const auto& e : lr.bundle.io) {
    if (e.kind != isa::IoKind::kInput) continue;
    const HostTensor& h = inputs.at(e.name);
    std::vector<uint8_t> dense;
    auto put = [&](uint32_t u, size_t size) {
      for (size_t k = 0; k < size; ++k) dense.push_back(static_cast<uint8_t>(u >> (8 * k)));
    };
    if (e.dtype == isa::Dtype::kI32) {
      for (int64_t v : h.i) put(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      for (float x : h.f) put(e.dtype == isa::Dtype::kBf16 ? num::fp32_to_bf16(x) : bits(x), isa::dtype_size(e.dtype));
    }
    exec::write_tensor(interp.machine(), e, dense);
  }
  exec::RunOptions ro;
  ro.check_races = true;
  Outcome out;
  out.run = interp.run(ro);
  if (!out.run.ok()) return out;
  const auto expected = evaluate(g, inputs, policy);
  for (const auto& e : lr.bundle.io) {
    if (e.kind != isa::IoKind::kOutput) continue;
    const std::vector<uint8_t> dense = exec::read_tensor(interp.machine(), e);
    const HostTensor& want = expected.at(e.name);
    EXPECT_EQ(dense.size(), want.f.size() * isa::dtype_size(e.dtype));
    for (size_t i = 0; i < want.f.size() && (i + 1) * isa::dtype_size(e.dtype) <= dense.size(); ++i) {
      uint32_t got = 0;
      if (e.dtype == isa::Dtype::kBf16) got = bits(num::bf16_to_fp32(static_cast<uint16_t>(dense[2 * i] | dense[2 * i + 1] << 8)));
      else std::memcpy(&got, &dense[4 * i], 4);
      if (got != bits(want.f[i])) {
        if (out.differing == 0) ADD_FAILURE() << e.name << ": first difference at element " << i;
        ++out.differing;
      }
    }
  }
  return out;
}

void expect_bit_exact(const std::string& ir, int cores = 1, int64_t lo = 0, int64_t hi = 0) {
  for (auto p : kPolicies) {
    SCOPED_TRACE(std::string("policy ") + num::precision_policy_name(p) + ", " + std::to_string(cores) + " core(s)\n" + ir);
    const Outcome o = run_both(ir, p, cores, lo, hi);
    ASSERT_TRUE(o.run.ok()) << o.run.message;
    EXPECT_EQ(o.differing, 0u);
  }
}

// A one-op graph over float inputs; the output type is the one the IR infers.
std::string op_ir(const std::string& op, const std::vector<std::string>& input_types, const std::string& attrs,
                  const std::string& extra_decls = "", const std::vector<std::string>& extra_operands = {}) {
  std::ostringstream s;
  s << "graph t {\n";
  std::vector<std::string> names;
  for (size_t k = 0; k < input_types.size(); ++k) {
    s << "  input %x" << k << " : " << input_types[k] << "\n";
    names.push_back("%x" + std::to_string(k));
  }
  s << extra_decls;
  for (const auto& o : extra_operands) names.push_back(o);
  std::string args;
  for (size_t k = 0; k < names.size(); ++k) args += (k ? ", " : "") + names[k];
  // Infer the result type by parsing once with a placeholder.
  const std::string head = s.str();
  const std::string body = "  %y = " + op + "(" + args + ") {" + attrs + "} : ";
  const Graph g = parse_graph(head + body + "f32[1] #0\n  output %y\n}\n", "probe.ir");
  std::vector<TensorType> ops;
  const auto types = g.types();
  for (const auto& in : g.nodes[0].inputs) ops.push_back(types.at(in));
  const TensorType t = infer_type(g.nodes[0], ops);
  return head + body + type_str(t) + " #0\n  output %y\n}\n";
}

std::string const_list(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::ostringstream s;
  s << "[";
  for (size_t k = 0; k < n; ++k) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", bits(d(rng)));
    s << (k ? ", " : "") << buf;
  }
  s << "]";
  return s.str();
}

TEST(LowerShape, Concat) {
  expect_bit_exact(op_ir("concat", {"f32[2,3,5]", "f32[2,4,5]"}, "axis=1"));
  expect_bit_exact(op_ir("concat", {"f32[7,130]", "f32[1,130]", "f32[5,130]"}, "axis=0"));
  expect_bit_exact(op_ir("concat", {"f32[3,2,129]", "f32[3,2,1]", "f32[3,2,7]"}, "axis=2"));
  // A constant operand (a bundle .const entry).
  expect_bit_exact(op_ir("concat", {"f32[4,6]"}, "axis=0", "  const %c : f32[3,6] = " + const_list(18, 3) + "\n", {"%c"}));
}

TEST(LowerShape, SliceWithSteps) {
  expect_bit_exact(op_ir("slice", {"f32[129,200]"}, "axes=[0,1], ends=[126,150], starts=[1,5], steps=[2,3]"));
  expect_bit_exact(op_ir("slice", {"f32[4,9]"}, "axes=[0,1], ends=[3,9], starts=[1,0], steps=[1,1]"));
  // Rank 5: more dims than a DMA has, so some become separate DMAs.
  expect_bit_exact(op_ir("slice", {"f32[3,4,5,6,7]"},
                         "axes=[0,1,2,3,4], ends=[3,4,5,5,7], starts=[1,0,1,0,2], steps=[1,3,2,2,1]"));
}

TEST(LowerShape, PadConstant) {
  expect_bit_exact(op_ir("pad", {"f32[3,5,7]"}, "pads=[1,2,0,0,3,1], value=0.5"));
  expect_bit_exact(op_ir("pad", {"f32[2,3,30,31]"}, "pads=[0,0,2,1,0,0,1,2], value=0"));
  expect_bit_exact(op_ir("pad", {"f32[1000]"}, "pads=[1,1100], value=-3.25"));  // > one 8x128 tile of fill
}

TEST(LowerShape, GatherConstantIndices) {
  const std::string idx = "  const %i : i64[2,3] = [4, -1, 2, 3, 4, 0]\n";
  expect_bit_exact(op_ir("gather", {"f32[6,16]"}, "axis=0", idx, {"%i"}));
  expect_bit_exact(op_ir("gather", {"f32[3,6,5]"}, "axis=1", idx, {"%i"}));
  expect_bit_exact(op_ir("gather", {"f32[3,4,6]"}, "axis=2", idx, {"%i"}));
}

TEST(LowerShape, GatherInputIndices) {
  const std::string idx = "  input %i : i64[3,7]\n";
  // Embedding lookup: indices from -50 to 49 into a 50-row table (negative ones count from the end).
  expect_bit_exact(op_ir("gather", {"f32[50,16]"}, "axis=0", idx, {"%i"}), 1, -50, 50);
  expect_bit_exact(op_ir("gather", {"f32[2,9,3]"}, "axis=1", idx, {"%i"}), 2, -9, 9);
}

TEST(LowerShape, GatherOutOfRange) {
  LowerOptions lo;
  lo.target = target();
  try {
    lower_graph(parse_graph(op_ir("gather", {"f32[6,16]"}, "axis=0", "  const %i : i64[2] = [1, 6]\n", {"%i"}), "t.ir"), lo);
    FAIL() << "a constant index out of range compiled";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("index 6 out of range [0,6)"), std::string::npos) << e.what();
  }
  // An input index out of range faults the run in the gather's op; -7 wraps to -1, still out.
  for (auto range : {std::pair<int64_t, int64_t>{6, 7}, {-7, -6}}) {
    const Outcome o = run_both(op_ir("gather", {"f32[6,16]"}, "axis=0", "  input %i : i64[4]\n", {"%i"}),
                               PrecisionPolicy::kDefault, 1, range.first, range.second);
    EXPECT_EQ(o.run.status, exec::RunResult::Status::kFault);
    EXPECT_NE(o.run.message.find("op 0"), std::string::npos) << o.run.message;
    // It says why: it used to be "division by zero" from a deliberate div by 0.
    EXPECT_NE(o.run.message.find("trap 1: an index read at run time is out of range"), std::string::npos)
        << o.run.message;
  }
}

TEST(LowerShape, BatchNormUnfolded) {
  auto bn = [](const std::string& x, int64_t c) {
    std::string d;
    const char* names[] = {"s", "b", "m", "v"};
    for (int k = 0; k < 4; ++k)
      d += std::string("  const %") + names[k] + " : f32[" + std::to_string(c) + "] = " +
           const_list(static_cast<size_t>(c), static_cast<uint32_t>(k + 10), k == 3 ? 0.1f : -2.0f, 2.0f) + "\n";
    return op_ir("batchnorm", {x}, "epsilon=1e-05", d, {"%s", "%b", "%m", "%v"});
  };
  expect_bit_exact(bn("f32[2,6,5,7]", 6));
  expect_bit_exact(bn("f32[5,3]", 3));
  expect_bit_exact(bn("f32[1,1030,3]", 1030), 2);  // s over two tiles, on two cores
}

TEST(LowerAxes, SoftmaxOverNonLastAxes) {
  expect_bit_exact(op_ir("softmax", {"f32[4,8]"}, "axis=0"));
  expect_bit_exact(op_ir("softmax", {"f32[2,11,7]"}, "axis=1"));
  expect_bit_exact(op_ir("softmax", {"f32[20,300]"}, "axis=0"));       // ragged tiles down and across
  expect_bit_exact(op_ir("softmax", {"f32[3,17,2,130]"}, "axis=1"));
  expect_bit_exact(op_ir("softmax", {"f32[3,9,1,1]"}, "axis=1"));     // innermost once 1s are dropped
  expect_bit_exact(op_ir("softmax", {"f32[5,40,9]"}, "axis=1"), 3);
  // Lane blocks of the same rows on different cores.
  expect_bit_exact(op_ir("softmax", {"f32[20,300]"}, "axis=0"), 2);
  expect_bit_exact(op_ir("softmax", {"f32[2,9,260]"}, "axis=1"), 3);
}

TEST(LowerAxes, ReductionsOverNonLastAxes) {
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max"}) {
    expect_bit_exact(op_ir(op, {"f32[6,300]"}, "axes=[0], keepdims=1"));
    expect_bit_exact(op_ir(op, {"f32[2,3,4,5]"}, "axes=[1,2], keepdims=0"));
    expect_bit_exact(op_ir(op, {"f32[33,2,129]"}, "axes=[0,1], keepdims=1"));
    expect_bit_exact(op_ir(op, {"f32[4,6,1]"}, "axes=[1], keepdims=0"));
  }
  expect_bit_exact(op_ir("reduce_sum", {"f32[3,25,260]"}, "axes=[1], keepdims=1"), 2);
  // Streamed units of up to 64 lane blocks, double-buffered both ways: 71 blocks per
  // outer index (a unit of 64 and one of 7, the last block ragged), 10 units over 2
  // cores, so each core reuses both buffers; an axis of 17 (3 tiles, 1 sublane last).
  expect_bit_exact(op_ir("reduce_sum", {"f32[5,3,9000]"}, "axes=[1], keepdims=0"), 2);
  expect_bit_exact(op_ir("reduce_mean", {"f32[6,17,700]"}, "axes=[1], keepdims=1"));
}

// Why the column order and not transpose + row op + transpose back: reduce_row
// (128 lane accumulators, a 128-wide tree) and reduce_column (8 sublane
// accumulators, an 8-wide tree) round differently, so the detour would not be the
// recipe. Found by search over random inputs, asserted on the first that differs.
TEST(LowerAxes, RowDetourWouldNotMatchTheRecipe) {
  const std::string direct = op_ir("reduce_sum", {"f32[40,3]"}, "axes=[0], keepdims=0");
  const std::string detour =
      "graph t {\n  input %x0 : f32[40,3]\n  %t = transpose(%x0) {perm=[1,0]} : f32[3,40] #0\n"
      "  %y = reduce_sum(%t) {axes=[1], keepdims=0} : f32[3] #1\n  output %y\n}\n";
  bool differs = false;
  for (uint32_t seed = 1; seed < 50 && !differs; ++seed) {
    HostTensor x;
    x.shape = {40, 3};
    x.f = random_values(120, seed);
    const auto a = evaluate(parse_graph(direct), {{"x0", x}}, PrecisionPolicy::kDefault);
    const auto b = evaluate(parse_graph(detour), {{"x0", x}}, PrecisionPolicy::kDefault);
    for (size_t k = 0; k < 3; ++k) differs |= bits(a.at("y").f[k]) != bits(b.at("y").f[k]);
  }
  EXPECT_TRUE(differs) << "the two orders never differed: the column lowering would not be needed";
}

TEST(LowerPool, AvgPoolExcludingPaddedTaps) {
  expect_bit_exact(op_ir("avgpool", {"f32[1,3,9,7]"}, "count_include_pad=0, kernel=[3,3], pads=[1,1,1,1], strides=[1,1]"));
  expect_bit_exact(op_ir("avgpool", {"f32[2,2,10,11]"}, "count_include_pad=0, kernel=[3,2], pads=[2,1,0,1], strides=[2,3]"));
  expect_bit_exact(op_ir("avgpool", {"f32[1,4,8,8]"}, "count_include_pad=0, kernel=[5,5], pads=[2,2,2,2], strides=[2,2]"), 2);
  // 12x12 windows: 144 taps span two tiles, a border pixel's fit one: refused.
  LowerOptions lo;
  lo.target = target();
  EXPECT_THROW(lower_graph(parse_graph(op_ir("avgpool", {"f32[1,1,13,13]"},
                                             "count_include_pad=0, kernel=[12,12], pads=[5,5,5,5], strides=[1,1]")),
                           lo),
               CompileError);
}

TEST(LowerShape, ChainThroughShapeOps) {
  // An embedding lookup feeding pad, slice, concat and a column softmax.
  const std::string ir =
      "graph chain {\n  input %ids : i64[2,5]\n  const %table : f32[30,12] = " + const_list(360, 4) +
      "\n  %e = gather(%table, %ids) {axis=0} : f32[2,5,12] #0\n"
      "  %p = pad(%e) {pads=[0,1,0,0,0,3], value=0.25} : f32[2,6,15] #1\n"
      "  %s = slice(%p) {axes=[0,1,2], ends=[2,6,15], starts=[0,0,1], steps=[1,2,1]} : f32[2,3,14] #2\n"
      "  %c = concat(%s, %s) {axis=1} : f32[2,6,14] #3\n"
      "  %y = softmax(%c) {axis=1} : f32[2,6,14] #4\n  output %y\n}\n";
  expect_bit_exact(ir, 1, 0, 30);
  expect_bit_exact(ir, 2, -30, 30);
}

}  // namespace
}  // namespace tpusim::compiler

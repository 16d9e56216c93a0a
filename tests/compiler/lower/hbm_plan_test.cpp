// The HBM plan of the lowering (docs/codegen.md "HBM plan"):
// - addresses past 2 GiB: graphs of every lowering family placed from an HBM base
//   of 2 GiB and of 4 GiB (the two window registers), compiled and run on the
//   functional reference with the race checker, equal bit for bit to the graph
//   reference; one such bundle also through `tpusim run` (the SystemC model) and
//   `tpusim ref MODEL`, compared by `tpusim diff`;
// - reuse: a tensor's HBM goes back after its last reader, the peak is the live
//   set's (checked against a live-set bound computed here from the graph), the
//   memory handed back is really rewritten (zero-filled scratch read back +0.0
//   where the gathers leave holes), with 1 and 2 cores, race checker on.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "compiler/compiler.h"
#include "compiler/lower/lower.h"
#include "isa/bundle/bundle_file.h"
#include "isa/exec/interpreter.h"
#include "hw/ici/topology.h"
#include "isa/exec/tensors.h"
#include "isa/numerics/bf16.h"
#include "tests/sim/cli_fixture.h"

namespace tpusim::compiler {
namespace {

using num::PrecisionPolicy;
constexpr int64_t kGiB = int64_t{1} << 30;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

isa::Target small_target() {
  isa::Target t;
  t.mxus_per_core = 2;
  t.mxu_rows = 32;
  t.mxu_cols = 32;
  t.fifo_rows = 64;
  t.hbm_bytes = 8 * static_cast<uint64_t>(kGiB);
  return t;
}

// Graph reference vs the lowered bundle on the functional reference (race checker
// on), every output bit for bit. Returns the lowering's result for further checks.
LowerResult expect_bit_exact(const std::string& ir, PrecisionPolicy policy, int64_t hbm_base, int cores,
                             bool reuse = true, bool fuse = true) {
  SCOPED_TRACE(std::string("policy ") + num::precision_policy_name(policy) + ", HBM base " + std::to_string(hbm_base) +
               ", cores " + std::to_string(cores) + "\n" + ir);
  const isa::Target t = small_target();
  const Graph g = parse_graph(ir, "test.ir");
  verify(g);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::map<std::string, HostTensor> inputs;
  for (const auto& in : g.inputs) {
    HostTensor h;
    h.dtype = in.type.dtype;
    h.shape = in.type.shape;
    const int64_t n = num_elements(in.type.shape);
    for (int64_t k = 0; k < n; ++k) {
      if (in.type.dtype == DType::kI64) {
        h.i.push_back((k * 7 + 3) % 11 - 5);  // in range of an axis of 11 or more, negatives too
      } else {
        const float x = d(rng);
        h.f.push_back(policy == PrecisionPolicy::kBf16 ? num::round_to_bf16(x) : x);
      }
    }
    inputs[in.name] = h;
  }
  EvalOptions eo;
  eo.mxu_rows = static_cast<int>(t.mxu_rows);
  const auto expected = evaluate(g, inputs, policy, eo);

  LowerOptions lo;
  lo.target = t;
  lo.policy = policy;
  lo.cores = cores;
  lo.hbm_base = hbm_base;
  lo.reuse_hbm = reuse;
  lo.fuse = fuse;
  const LowerResult lr = lower_graph(g, lo);
  exec::Interpreter interp(lr.bundle);
  for (const auto& e : lr.bundle.io) {
    if (e.kind != isa::IoKind::kInput) continue;
    EXPECT_GE(e.addr, static_cast<uint64_t>(hbm_base));
    const HostTensor& h = inputs.at(e.name);
    std::vector<uint8_t> dense;
    const size_t n = h.dtype == DType::kI64 ? h.i.size() : h.f.size();
    for (size_t k = 0; k < n; ++k) {
      const uint32_t u = h.dtype == DType::kI64 ? static_cast<uint32_t>(h.i[k])
                         : e.dtype == isa::Dtype::kBf16 ? num::fp32_to_bf16(h.f[k])
                                                        : bits(h.f[k]);
      for (size_t b = 0; b < isa::dtype_size(e.dtype); ++b) dense.push_back(static_cast<uint8_t>(u >> (8 * b)));
    }
    exec::write_tensor(interp.machine(), e, dense);
  }
  exec::RunOptions ro;
  ro.check_races = true;
  const exec::RunResult rr = interp.run(ro);
  EXPECT_TRUE(rr.ok()) << rr.message;
  if (!rr.ok()) return lr;
  for (const auto& e : lr.bundle.io) {
    if (e.kind != isa::IoKind::kOutput) continue;
    const std::vector<uint8_t> dense = exec::read_tensor(interp.machine(), e);
    const HostTensor& want = expected.at(e.name);
    EXPECT_EQ(dense.size(), want.f.size() * isa::dtype_size(e.dtype));
    if (dense.size() != want.f.size() * isa::dtype_size(e.dtype)) continue;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.f.size(); ++i) {
      uint32_t got = 0;
      if (e.dtype == isa::Dtype::kBf16) got = bits(num::bf16_to_fp32(static_cast<uint16_t>(dense[2 * i] | dense[2 * i + 1] << 8)));
      else std::memcpy(&got, &dense[4 * i], 4);
      if (got != bits(want.f[i]) && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << e.name << ": " << bad << " of " << want.f.size() << " elements differ; first at " << first;
  }
  return lr;
}

std::string consts(int64_t n, int seed) {
  std::ostringstream s;
  s << "[";
  for (int64_t k = 0; k < n; ++k) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", bits(static_cast<float>((k * 37 + seed) % 17 - 8) / 16.0f));
    s << (k ? ", " : "") << buf;
  }
  s << "]";
  return s.str();
}

// One graph per family of lowerings, each starting with a node whose result dies
// early, so later results and scratch land on reused memory (holes must be zeroed).
std::vector<std::string> family_graphs() {
  return {
      // matmul (transposed B copied to scratch, bias), elementwise with broadcast, fused epilogue
      "graph mm {\n  input %a : f32[37,70]\n  input %b : f32[45,70]\n  input %c : f32[45]\n"
      "  %a2 = mul(%a, %a) : f32[37,70] #0\n"
      "  %y = matmul(%a2, %b, %c) {trans_b=1} : f32[37,45] #1\n"
      "  %z = relu(%y) : f32[37,45] #2\n  %o = add(%z, %c) : f32[37,45] #3\n  output %o\n}\n",
      // conv: staged with padding and constant weights, then depthwise (direct gathers: holes)
      "graph cv {\n  input %x : f32[2,6,9,8]\n  const %w : f32[5,6,3,3] = " + consts(270, 1) +
          "\n  input %wd : f32[5,1,3,3]\n"
          "  %x2 = add(%x, %x) : f32[2,6,9,8] #0\n"
          "  %c = conv2d(%x2, %w) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[2,5,9,8] #1\n"
          "  %r = relu(%c) : f32[2,5,9,8] #2\n"
          "  %d = conv2d(%r, %wd) {dilations=[1,1], groups=5, pads=[1,1,1,1], strides=[2,2]} : f32[2,5,5,4] #3\n"
          "  output %d\n}\n",
      // pooling (padded avgpool's compacted taps: holes), global average, transpose
      "graph pl {\n  input %x : f32[2,5,9,8]\n"
      "  %x2 = mul(%x, %x) : f32[2,5,9,8] #0\n"
      "  %m = maxpool(%x2) {kernel=[3,3], pads=[1,1,1,1], strides=[2,2]} : f32[2,5,5,4] #1\n"
      "  %a = avgpool(%m) {count_include_pad=0, kernel=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[2,5,5,4] #2\n"
      "  %g = global_avgpool(%a) {} : f32[2,5,1,1] #3\n"
      "  %f = reshape(%g) {shape=[2,5]} : f32[2,5] #4\n"
      "  %t = transpose(%f) {perm=[1,0]} : f32[5,2] #5\n  output %t\n  output %a\n}\n",
      // movement and shape: gather (run-time indices), pad, slice, concat, softmax, reductions, layernorm
      "graph sh {\n  input %ids : i64[2,5]\n  input %table : f32[30,12]\n  input %lg : f32[12]\n  input %lb : f32[12]\n"
      "  %t2 = add(%table, %table) : f32[30,12] #0\n"
      "  %e = gather(%t2, %ids) {axis=0} : f32[2,5,12] #1\n"
      "  %p = pad(%e) {pads=[0,1,0,0,0,3], value=0.25} : f32[2,6,15] #2\n"
      "  %s = slice(%p) {axes=[0,1,2], ends=[2,6,15], starts=[0,0,1], steps=[1,2,1]} : f32[2,3,14] #3\n"
      "  %c = concat(%s, %s) {axis=1} : f32[2,6,14] #4\n"
      "  %n = softmax(%c) {axis=1} : f32[2,6,14] #5\n"
      "  %r = reduce_sum(%n) {axes=[1], keepdims=0} : f32[2,14] #6\n"
      "  %l = layernorm(%e, %lg, %lb) {axis=2, epsilon=1e-05} : f32[2,5,12] #7\n"
      "  output %r\n  output %l\n}\n",
      // the training graphs' ops: im2col with padding, maxpool_grad with uncovered
      // positions (holes), relu_grad, reverse
      "graph gr {\n  input %x : f32[2,3,7,7]\n  input %dy : f32[2,3,3,3]\n"
      "  %x2 = mul(%x, %x) : f32[2,3,7,7] #0\n"
      "  %y = maxpool(%x2) {kernel=[2,2], pads=[0,0,0,0], strides=[2,2]} : f32[2,3,3,3] #1\n"
      "  %dx = maxpool_grad(%dy, %x2, %y) {kernel=[2,2], pads=[0,0,0,0], strides=[2,2]} : f32[2,3,7,7] #2\n"
      "  %rg = relu_grad(%dx, %x) : f32[2,3,7,7] #3\n"
      "  %rv = reverse(%rg) {axes=[2,3]} : f32[2,3,7,7] #4\n"
      "  %p = im2col(%rv) {dilations=[1,1], kernel=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[98,27] #5\n"
      "  output %p\n}\n",
  };
}

// Above 2 GiB (window s31) and above 4 GiB (s30), 1 and 2 cores, both policies.
TEST(HbmPlan, AddressesPast2GiBBitExact) {
  for (const std::string& ir : family_graphs())
    for (int64_t base : {2 * kGiB + 12288, 4 * kGiB + 4096})
      for (int cores : {1, 2}) {
        const LowerResult r = expect_bit_exact(ir, PrecisionPolicy::kDefault, base, cores);
        EXPECT_NE(r.assembly.find(base < 4 * kGiB ? "[s31 + " : "[s30 + "), std::string::npos);
        EXPECT_NE(r.assembly.find("li s31, 2147483648"), std::string::npos);
      }
  for (const std::string& ir : family_graphs()) expect_bit_exact(ir, PrecisionPolicy::kBf16, 3 * kGiB, 2);
}

// The reach of [sA + imm] ends near 6 GiB: beyond it, a one-line error naming the node.
TEST(HbmPlan, BeyondTheAddressReachIsAClearError) {
  const Graph g = parse_graph(
      "graph big {\n  input %x : f32[1024,1024]\n  %y = transpose(%x) {perm=[1,0]} : f32[1024,1024] #0\n  output %y\n}\n",
      "big.ir");
  LowerOptions lo;
  lo.target = small_target();
  lo.target.hbm_bytes = 16 * static_cast<uint64_t>(kGiB);
  lo.hbm_base = 6 * kGiB - 4 * 4096;
  try {
    lower_graph(g, lo);
    FAIL() << "no error";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("beyond what [sA + imm] reaches"), std::string::npos) << e.what();
  }
}

// Peak = the live set: a chain of n same-sized elementwise results needs about two
// of them at a time (a bump allocator: n); the answer is still bit-exact, with the
// memory of dead results rewritten by later ones (race checker on, 1 and 2 cores).
TEST(HbmPlan, ReuseKeepsThePeakAtTheLiveSet) {
  const int n = 12;
  const int64_t bytes = 64 * 256 * 4;  // one result, a multiple of the 4 KiB alignment
  std::ostringstream s;
  s << "graph chain {\n  input %x : f32[64,256]\n";
  std::string prev = "%x";
  for (int k = 0; k < n; ++k) {
    const std::string y = "%t" + std::to_string(k);
    s << "  " << y << " = " << (k % 2 ? "mul(" : "add(") << prev << ", %x) : f32[64,256] #" << k << "\n";
    prev = y;
  }
  s << "  output " << prev << "\n}\n";
  for (int cores : {1, 2}) {
    // Unfused, every result goes through HBM.
    const LowerResult with = expect_bit_exact(s.str(), PrecisionPolicy::kDefault, 0, cores, true, false);
    const LowerResult without = expect_bit_exact(s.str(), PrecisionPolicy::kDefault, 0, cores, false, false);
    // Inputs (1) + every result (n), nothing reused.
    EXPECT_EQ(without.hbm_end, (1 + n) * bytes);
    EXPECT_EQ(with.hbm_unplanned, without.hbm_end);
    // Live at once: x, the result being read and the one being written (the output
    // is one of them at the end).
    EXPECT_EQ(with.hbm_end, 3 * bytes);
    // Fused into one kernel, only x and the chain's end are stored.
    EXPECT_EQ(expect_bit_exact(s.str(), PrecisionPolicy::kDefault, 0, cores).hbm_end, 2 * bytes);
  }
}

// Every replica of a data-parallel bundle gets the same plan (the collectives
// address other replicas' tensors at this replica's offsets): an MLP step's
// layers reuse memory and the 8-replica bundle is still what the tests of dp run.
TEST(HbmPlan, ReplicatedRegionsShrink) {
  const std::string ir =
      "graph mlp {\n  input %x : f32[64,96]\n  input %w1 : f32[96,80]\n  input %w2 : f32[80,96]\n"
      "  %h = matmul(%x, %w1) : f32[64,80] #0\n  %r = relu(%h) : f32[64,80] #1\n"
      "  %y = matmul(%r, %w2) : f32[64,96] #2\n  %z = add(%y, %x) : f32[64,96] #3\n"
      "  %s = all_reduce(%z) : f32[64,96] #4\n  output %s\n}\n";
  Graph g = parse_graph(ir, "mlp.ir");
  LowerOptions lo;
  lo.target = small_target();
  lo.target.chips = 4;
  lo.replicas.replicas = 8;
  lo.replicas.cores_per_chip = 2;
  lo.replicas.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
  lo.replicas.batched = {"x"};
  const LowerResult with = lower_graph(g, lo);
  lo.reuse_hbm = false;
  const LowerResult without = lower_graph(g, lo);
  EXPECT_LT(with.hbm_end, without.hbm_end);
}

// The same bundle placed past 2 GiB on the SystemC model: `tpusim run` == `tpusim
// ref MODEL` (graph reference) for the v3 preset, via the command line.
class HbmPlanCli : public testing::TpusimCli {};

TEST_F(HbmPlanCli, RunPast2GiBEqualsGraphReference) {
  const std::string ir = family_graphs()[1];  // convs: staged and direct gathers, fused relu
  {
    std::ofstream(dir_ + "/g.ir") << ir;
  }
  // The v3 preset's target, as `tpusim compile` derives it.
  const std::string d = dir_ + "/";
  testing::Completed c = tpusim({"compile", d + "g.ir", "--preset", "v3", "-o", d + "low.tpb"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  LowerOptions lo;
  lo.target = isa::read_bundle(dir_ + "/low.tpb").target;
  lo.hbm_base = 3 * kGiB + 8192;
  lo.cores = 2;
  const LowerResult r = lower_graph(parse_graph(ir, "g.ir"), lo);
  ASSERT_NE(r.assembly.find("[s31 + "), std::string::npos);
  isa::write_bundle(dir_ + "/high.tpb", r.bundle);
  c = tpusim({"run", d + "high.tpb", "--preset", "v3", "--random-inputs", "3", "--out", d + "run"}, 300);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"ref", d + "g.ir", "--random-inputs", "3", "--out", d + "graph"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"diff", d + "graph", d + "run"});
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
  EXPECT_NE(c.out.find("identical"), std::string::npos) << c.out;
}

}  // namespace
}  // namespace tpusim::compiler

namespace tpusim::compiler {
namespace {

// Not a check: the peak-HBM figures of docs/codegen.md "HBM plan". HBM_PLAN_REPORT
// lists MODEL|TARGET_BUNDLE|REPLICAS entries separated by ';' (the target is read
// from a bundle `tpusim compile` wrote for the preset; REPLICAS > 1 uses a v3-8-shaped
// board). Run with --gtest_also_run_disabled_tests --gtest_filter='*PeakReport*'.
TEST(HbmPlan, DISABLED_PeakReport) {
  const char* spec = std::getenv("HBM_PLAN_REPORT");
  ASSERT_NE(spec, nullptr);
  std::stringstream all(spec);
  std::string item;
  while (std::getline(all, item, ';')) {
    std::stringstream f(item);
    std::string model, tb, reps;
    std::getline(f, model, '|');
    std::getline(f, tb, '|');
    std::getline(f, reps, '|');
    const Graph g = load_model(model);
    LowerOptions lo;
    lo.target = isa::read_bundle(tb).target;
    const int R = std::stoi(reps);
    if (R > 1) {
      lo.target.chips = 4;
      lo.replicas.replicas = R;
      lo.replicas.cores_per_chip = 2;
      lo.replicas.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
    }
    const LowerResult with = lower_graph(g, lo);
    lo.reuse_hbm = false;
    int64_t without = -1;
    try {
      without = lower_graph(g, lo).hbm_end;
    } catch (const CompileError&) {
    }
    std::printf("%s replicas %d: peak %lld bytes with reuse (bump total %lld per replica), %lld without%s\n",
                model.c_str(), R, static_cast<long long>(with.hbm_end), static_cast<long long>(with.hbm_unplanned),
                static_cast<long long>(without), without < 0 ? " (does not compile)" : "");
  }
}

}  // namespace
}  // namespace tpusim::compiler

namespace tpusim::compiler {
namespace {

// The collectives' bandwidth sweep ends at 256 MiB per replica on v3-8
// (tests/compiler/dp/allreduce_bw.py's graph): it compiles, inside the 32 GiB of
// a v3 chip and the ~6 GiB the addresses reach (~7 s, a 40 MB bundle).
class HbmPlanBoard : public testing::TpusimCli {};

TEST_F(HbmPlanBoard, AllReduceOf256MiBPerReplicaOnV3_8Compiles) {
  const int64_t E = int64_t{64} << 20;  // fp32 elements per replica: 256 MiB
  const std::string d = dir_ + "/";
  std::ofstream(d + "ar.graph") << "graph ar {\n  input %x : f32[8,1]\n  %a = pad(%x) {pads=[0,0,0," << E - 1
                                << "], value=1.0} : f32[8," << E << "] #0\n  %g = all_reduce(%a) : f32[8," << E
                                << "] #1\n  %o = slice(%g) {starts=[0,0], ends=[1,8], axes=[0,1], steps=[1,1]} : f32[1,8] #2\n"
                                   "  output %o\n}\n";
  const testing::Completed c =
      tpusim({"compile", d + "ar.graph", "--preset", "v3-8", "--replicas", "8", "-o", d + "ar.tpb"}, 240);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out.find("instructions"), std::string::npos) << c.out;
}

}  // namespace
}  // namespace tpusim::compiler

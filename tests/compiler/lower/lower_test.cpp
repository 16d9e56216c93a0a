// The lowering against the graph reference: each one-op graph is evaluated by the
// graph reference (compiler/ref) and compiled to a bundle that runs on the ISA's
// functional reference (isa/exec, with the race checker on); every output must be
// equal bit for bit, under both precision policies and on several targets
// (ragged M/K/N, K > R, several MXUs, small R x C arrays).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "compiler/compiler.h"
#include "compiler/lower/lower.h"
#include "tests/compiler/lower/lowered.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/tensors.h"
#include "isa/numerics/bf16.h"

namespace tpusim::compiler {
namespace {

using num::PrecisionPolicy;

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

std::string hex_list(const std::vector<float>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t k = 0; k < v.size(); ++k) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", bits(v[k]));
    s << (k ? ", " : "") << buf;
  }
  s << "]";
  return s.str();
}

isa::Target target(uint32_t mxus, uint32_t rows, uint32_t cols) {
  isa::Target t;
  t.mxus_per_core = mxus;
  t.mxu_rows = rows;
  t.mxu_cols = cols;
  t.fifo_rows = 64;
  t.hbm_bytes = 256ull << 20;
  return t;
}

// The assembly `ir` lowers to.
std::string assembly_of(const std::string& ir, PrecisionPolicy policy, const isa::Target& t, int cores = 1) {
  LowerOptions lo;
  lo.target = t;
  lo.policy = policy;
  lo.cores = cores;
  return lower_graph(parse_graph(ir, "t.ir"), lo).assembly;
}

// Runs `ir` both ways and compares every output element's bits.
void expect_bit_exact(const std::string& ir, PrecisionPolicy policy, const isa::Target& t, uint32_t seed = 1,
                      int cores = 1) {
  SCOPED_TRACE(std::string("policy ") + num::precision_policy_name(policy) + ", MXUs " +
               std::to_string(t.mxus_per_core) + " of " + std::to_string(t.mxu_rows) + "x" +
               std::to_string(t.mxu_cols) + "\n" + ir);
  const Graph g = parse_graph(ir, "test.ir");
  verify(g);
  std::map<std::string, HostTensor> inputs;
  for (const auto& in : g.inputs) {
    HostTensor h;
    h.dtype = DType::kF32;
    h.shape = in.type.shape;
    h.f = random_values(static_cast<size_t>(num_elements(in.type.shape)), seed++);
    if (policy == PrecisionPolicy::kBf16)
      for (float& x : h.f) x = num::round_to_bf16(x);
    inputs[in.name] = h;
  }
  EvalOptions eo;
  eo.mxu_rows = static_cast<int>(t.mxu_rows);
  const auto expected = evaluate(g, inputs, policy, eo);

  LowerOptions lo;
  lo.target = t;
  lo.policy = policy;
  lo.cores = cores;
  const LowerResult lr = lower_graph(g, lo);
  ASSERT_EQ(lr.bundle.cores.size(), static_cast<size_t>(cores));
  for (const auto& core : lr.bundle.cores)
    for (const auto& ins : core.code) ASSERT_GE(ins.op_id, 0) << "an instruction without an op id";

  exec::Interpreter interp(lr.bundle);
  for (const auto& e : lr.bundle.io) {
    if (e.kind != isa::IoKind::kInput) continue;
    std::vector<uint8_t> dense;
    for (float x : inputs.at(e.name).f) {
      const uint32_t u = e.dtype == isa::Dtype::kBf16 ? num::fp32_to_bf16(x) : bits(x);
      for (size_t k = 0; k < isa::dtype_size(e.dtype); ++k) dense.push_back(static_cast<uint8_t>(u >> (8 * k)));
    }
    exec::write_tensor(interp.machine(), e, dense);
  }
  exec::RunOptions ro;
  ro.check_races = true;
  const exec::RunResult rr = interp.run(ro);
  ASSERT_TRUE(rr.ok()) << rr.message;
  for (const auto& e : lr.bundle.io) {
    if (e.kind != isa::IoKind::kOutput) continue;
    const std::vector<uint8_t> dense = exec::read_tensor(interp.machine(), e);
    const HostTensor& want = expected.at(e.name);
    ASSERT_EQ(dense.size(), want.f.size() * isa::dtype_size(e.dtype));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.f.size(); ++i) {
      uint32_t got = 0;
      if (e.dtype == isa::Dtype::kBf16) {
        got = bits(num::bf16_to_fp32(static_cast<uint16_t>(dense[2 * i] | dense[2 * i + 1] << 8)));
      } else {
        std::memcpy(&got, &dense[4 * i], 4);
      }
      if (got != bits(want.f[i]) && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << e.name << ": " << bad << " of " << want.f.size() << " elements differ; first at " << first;
  }
}

const PrecisionPolicy kPolicies[] = {PrecisionPolicy::kDefault, PrecisionPolicy::kBf16};

std::string matmul_ir(int64_t M, int64_t K, int64_t N, const std::string& attrs = "", bool ta = false,
                      bool tb = false, const std::string& bias_shape = "") {
  std::ostringstream s;
  s << "graph mm {\n";
  s << "  input %a : f32[" << (ta ? K : M) << "," << (ta ? M : K) << "]\n";
  s << "  input %b : f32[" << (tb ? N : K) << "," << (tb ? K : N) << "]\n";
  if (!bias_shape.empty()) s << "  input %c : f32" << bias_shape << "\n";
  s << "  %y = matmul(%a, %b" << (bias_shape.empty() ? "" : ", %c") << ") {" << attrs << "} : f32[" << M << "," << N
    << "] #0\n  output %y\n}\n";
  return s.str();
}

TEST(LowerMatmul, SmallSingleTile) {
  for (auto p : kPolicies) expect_bit_exact(matmul_ir(8, 16, 8), p, target(1, 128, 128));
}

TEST(LowerMatmul, RaggedWithSeveralChunksAndMxus) {
  for (auto p : kPolicies) {
    expect_bit_exact(matmul_ir(13, 200, 70), p, target(1, 128, 128));
    expect_bit_exact(matmul_ir(21, 300, 260), p, target(2, 128, 128));
    // R = C = 32: K = 100 is four chunks, N = 75 three column tiles over four MXUs.
    expect_bit_exact(matmul_ir(17, 100, 75), p, target(4, 32, 32));
  }
}

TEST(LowerMatmul, ManyRowGroups) {
  expect_bit_exact(matmul_ir(530, 40, 20), PrecisionPolicy::kDefault, target(1, 32, 32));
}

TEST(LowerMatmul, TransposesAlphaBetaBias) {
  for (auto p : kPolicies) {
    const isa::Target t = target(2, 32, 32);
    expect_bit_exact(matmul_ir(9, 45, 37, "trans_a=1", true, false), p, t);
    expect_bit_exact(matmul_ir(9, 45, 37, "trans_b=1", false, true), p, t);
    expect_bit_exact(matmul_ir(9, 45, 37, "alpha=0.75, beta=-1.5", false, false, "[37]"), p, t);
    expect_bit_exact(matmul_ir(9, 45, 37, "beta=2, trans_b=1", false, true, "[9,37]"), p, t);
    expect_bit_exact(matmul_ir(9, 45, 37, "", false, false, "[9,1]"), p, t);
    // A batch of B^T (attention's K^T), broadcast over A's leading axis: transposed
    // once through VMEM, all batches in one gather.
    for (int cores : {1, 2})
      expect_bit_exact("graph mm {\n  input %a : f32[3,1,6,9]\n  input %b : f32[2,5,9]\n"
                       "  %y = matmul(%a, %b) {trans_b=1} : f32[3,2,6,5] #0\n  output %y\n}\n",
                       p, t, 1, cores);
  }
}

TEST(LowerMatmul, ConstantWeightsAndBatchBroadcast) {
  const std::string ir = "graph mm {\n  input %a : f32[2,3,5,7]\n  const %w : f32[7,4] = " +
                         hex_list(random_values(28, 99)) +
                         "\n  %y = matmul(%a, %w) {} : f32[2,3,5,4] #3\n  output %y\n}\n";
  for (auto p : kPolicies) expect_bit_exact(ir, p, target(1, 8, 8));
  const std::string ir2 =
      "graph mm {\n  input %a : f32[3,1,6,9]\n  input %b : f32[2,9,5]\n"
      "  %y = matmul(%a, %b) {} : f32[3,2,6,5] #0\n  output %y\n}\n";
  for (auto p : kPolicies) expect_bit_exact(ir2, p, target(2, 8, 8));
}

// A constant B^T (a Gemm's weights with transB = 1) is laid out as B at compile
// time: bit-exact, and the bundle carries B [K, N] as a .const entry of its own.
TEST(LowerMatmul, ConstantTransposedWeightsLaidOutAtCompileTime) {
  const std::vector<float> w = random_values(7 * 45, 11);
  const std::string ir = "graph mm {\n  input %a : f32[9,45]\n  const %w : f32[7,45] = " + hex_list(w) +
                         "\n  const %c : f32[7] = " + hex_list(random_values(7, 12)) +
                         "\n  %y = matmul(%a, %w, %c) {trans_b=1} : f32[9,7] #0\n  output %y\n}\n";
  for (auto p : kPolicies) expect_bit_exact(ir, p, target(2, 16, 16));
  LowerOptions lo;
  lo.target = target(2, 16, 16);
  const auto bundle = lower_graph(parse_graph(ir, "test.ir"), lo).bundle;
  int laid_out = 0;
  for (const auto& e : bundle.io) {
    if (e.kind != isa::IoKind::kConst || e.shape != std::vector<int64_t>{45, 7}) continue;
    ++laid_out;
    ASSERT_EQ(e.data.size(), w.size() * 4);
    for (int64_t k = 0; k < 45; ++k)
      for (int64_t j = 0; j < 7; ++j) {
        uint32_t u;
        std::memcpy(&u, &e.data[static_cast<size_t>((k * 7 + j) * 4)], 4);
        EXPECT_EQ(u, bits(w[static_cast<size_t>(j * 45 + k)])) << k << "," << j;
      }
  }
  EXPECT_EQ(laid_out, 1);
}

std::string unary_ir(const std::string& op, const std::string& shape, const std::string& attrs = "") {
  return "graph u {\n  input %x : f32" + shape + "\n  %y = " + op + "(%x) {" + attrs + "} : f32" + shape +
         " #5\n  output %y\n}\n";
}

TEST(LowerElementwise, UnaryOps) {
  for (auto p : kPolicies)
    for (const char* op : {"relu", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt", "gelu", "erf", "neg", "identity"})
      expect_bit_exact(unary_ir(op, "[3,700]"), p, target(1, 128, 128));
  for (auto p : kPolicies) {
    expect_bit_exact(unary_ir("pow", "[5]", "exponent=2"), p, target(1, 128, 128));
    expect_bit_exact(unary_ir("pow", "[1030]", "exponent=0.5"), p, target(1, 128, 128));
    expect_bit_exact(unary_ir("pow", "[7,9]", "exponent=3"), p, target(1, 128, 128));
    expect_bit_exact(unary_ir("clip", "[2,2000]", "max=0.5, min=-0.25"), p, target(1, 128, 128));
  }
}

TEST(LowerElementwise, CastToBf16) {
  const std::string ir = "graph c {\n  input %x : f32[3,333]\n  %y = cast(%x) {to=\"bf16\"} : bf16[3,333] #0\n"
                         "  output %y\n}\n";
  expect_bit_exact(ir, PrecisionPolicy::kDefault, target(1, 128, 128));
}

TEST(LowerElementwise, BinaryOpsWithBroadcasting) {
  struct Case { const char* a; const char* b; const char* out; };
  const Case cases[] = {{"[4,300]", "[4,300]", "[4,300]"},
                        {"[2,3,130]", "[3,1]", "[2,3,130]"},
                        {"[130]", "[5,1,130]", "[5,1,130]"},
                        {"[1,7]", "[6,1]", "[6,7]"}};
  for (auto p : kPolicies)
    for (const auto& c : cases)
      for (const char* op : {"add", "sub", "mul", "div"})
        expect_bit_exact(std::string("graph b {\n  input %a : f32") + c.a + "\n  input %b : f32" + c.b + "\n  %y = " +
                             op + "(%a, %b) {} : f32" + c.out + " #2\n  output %y\n}\n",
                         p, target(1, 128, 128));
}

// An operand broadcast over leading axes only is read periodically from VMEM (its
// row repeated past a block's length; each block from its start mod the row): no HBM
// copy of it is laid out. Rows of 1152 and 300 elements (neither a multiple of a
// tile's 1024, several blocks of 64 tiles, a ragged last one), leading axes of 1 kept
// or dropped, the operand first or second, as a chain member's operand too (the
// optimizer's lr row: sub(w, mul(v, lr))), on 1 and 2 cores. A row shorter than a
// DMA beat (100 elements, 400 or 200 bytes) is still laid out.
TEST(LowerElementwise, LeadingBroadcastOperandsReadPeriodically) {
  struct Case {
    const char *a, *b, *out;
    int64_t period;  // elements; 0: laid out in HBM
    bool from_hbm;   // repeated by a stride-0 HBM read, else one row read and a VMEM copy
  };
  // Rows of any length are periodic, repeated past one tile (1,024 elements) from any
  // start: [27] over [16,27] 39 times, [100] over [700,100] 12 times (laid out in HBM
  // until session 79), [1152] twice, each repetition a memory request of a stride-0
  // read. A scalar needs 1,024: read once and repeated by a VMEM copy. Until session
  // 80 the repetitions covered a whole block (64 tiles: a scalar's 65,536). A
  // broadcast over a middle axis is laid out in HBM.
  const Case cases[] = {{"[300,1152]", "[1152]", "[300,1152]", 1152, true},
                        {"[16,27]", "[27]", "[16,27]", 27, true},
                        {"[1,300]", "[4,70,300]", "[4,70,300]", 300, true},
                        {"[3,80,300]", "[1,80,300]", "[3,80,300]", 24000, true},
                        {"[700,100]", "[100]", "[700,100]", 100, true},
                        {"[300,300]", "[1]", "[300,300]", 1, false},
                        {"[3,1,300]", "[3,80,300]", "[3,80,300]", 0, false}};
  for (auto p : kPolicies)
    for (int cores : {1, 2})
      for (const auto& c : cases) {
        const std::string ir = std::string("graph b {\n  input %a : f32") + c.a + "\n  input %b : f32" + c.b +
                               "\n  input %w : f32" + c.out + "\n  %y = mul(%a, %b) {} : f32" + c.out +
                               " #3\n  %z = sub(%w, %y) {} : f32" + c.out + " #4 fusion=#3\n  output %z\n}\n";
        expect_bit_exact(ir, p, target(1, 128, 128), 1, cores);
        const LowerResult r = lower_with(ir, p, target(1, 128, 128), cores);
        int hbm_to_hbm = 0, repeats_from_hbm = 0, repeats_in_vmem = 0, loads = 0;
        for (const auto& core : r.bundle.cores)
          for (const auto& in : core.code) {
            loads += in.op == isa::Op::kVld || in.op == isa::Op::kVldBf16;
            if (in.op != isa::Op::kDma) continue;
            hbm_to_hbm += in.src.space == isa::Space::kHbm && in.dst.space == isa::Space::kHbm;
            if (in.ndims == 0 || in.dims[0].src_stride != 0 || in.dst.space != isa::Space::kVmem) continue;
            (in.src.space == isa::Space::kHbm ? repeats_from_hbm : repeats_in_vmem) += 1;
            // One tile's worth from any start: P - 1 + 1,024 elements, in whole periods.
            const int64_t bytes = static_cast<int64_t>(in.imm) * (in.dims[0].count + (in.src.space == isa::Space::kVmem));
            EXPECT_LE(bytes, (2 * c.period + 1024) * 4) << c.a << " " << c.b;
          }
        EXPECT_EQ(hbm_to_hbm == 0, c.period > 0) << c.a << " " << c.b;
        EXPECT_EQ(repeats_from_hbm > 0, c.period > 0 && c.from_hbm) << c.a << " " << c.b;
        EXPECT_EQ(repeats_in_vmem > 0, c.period > 0 && !c.from_hbm) << c.a << " " << c.b;
        // Three loads a tile; a period that divides a tile (the scalar) is the same
        // tile throughout, loaded once a block of 64 tiles instead.
        int64_t count = 1;  // elements of c.out, "[d0,d1,...]"
        std::istringstream dims(c.out + 1);
        for (int64_t d; dims >> d; dims.ignore()) count *= d;
        const int64_t tiles = (count + 1023) / 1024, blocks = (tiles + 63) / 64;
        EXPECT_EQ(loads, c.period > 0 && 1024 % c.period == 0 ? 2 * tiles + blocks : 3 * tiles) << c.a << " " << c.b;
      }
}

// An elementwise chain goes on past a result other nodes read (the training step's
// new velocity: the update's step reads it and it is an output): the kernel stores
// it on the way, its readers after the chain read it from HBM. The root's own result
// likewise. A matmul's epilogue stops at such a result instead.
TEST(LowerElementwise, ChainsGoOnPastResultsOthersRead) {
  const std::string head =
      "graph u {\n  input %v : f32[37,300]\n  input %g : f32[37,300]\n  input %w : f32[37,300]\n"
      "  input %m : f32[300]\n  input %lr : f32[300]\n  %d = mul(%v, %m) : f32[37,300] #0\n"
      "  %vn = add(%d, %g) : f32[37,300] #1\n  %s = mul(%vn, %lr) : f32[37,300] #2\n"
      "  %wn = sub(%w, %s) : f32[37,300] #3\n  %t = tanh(%vn) : f32[37,300] #4\n  output %wn\n  output %t\n";
  for (bool root_read : {false, true}) {
    const std::string ir = head + (root_read ? "  output %d\n" : "") + "  output %vn\n}\n";
    for (auto p : kPolicies)
      for (int cores : {1, 2}) expect_bit_exact(ir, p, target(1, 128, 128), 1, cores);
    const LowerResult r = lower_with(ir, PrecisionPolicy::kDefault, target(1, 128, 128), 1);
    EXPECT_EQ(r.bundle.op_names,
              (std::map<int32_t, std::string>{{0, "mul %d +add +mul +sub"}, {4, "tanh %t"}}));
    // Stores to HBM: %wn, %vn, %t, and %d when it is read.
    int to_hbm = 0;
    for (const auto& in : r.bundle.cores[0].code)
      to_hbm += in.op == isa::Op::kDma && in.dst.space == isa::Space::kHbm && in.src.space == isa::Space::kVmem;
    EXPECT_EQ(to_hbm, root_read ? 4 : 3);
  }
  const std::string mm =
      "graph e {\n  input %x : f32[16,64]\n  input %w : f32[64,32]\n  %h = matmul(%x, %w) : f32[16,32] #0\n"
      "  %r = relu(%h) : f32[16,32] #1\n  %a = neg(%r) : f32[16,32] #2\n  output %a\n  output %r\n}\n";
  for (auto p : kPolicies) expect_bit_exact(mm, p, target(1, 128, 128));
  EXPECT_EQ(lower_with(mm, PrecisionPolicy::kDefault, target(1, 128, 128), 1).bundle.op_names,
            (std::map<int32_t, std::string>{{0, "matmul %h +relu"}, {2, "neg %a"}}));
}

// An operand whose shape differs from the result's only by axes of one element is
// read where it is (a [1] divisor of a [1,1] value; the training step's loss mean and
// xent total had such operands copied through VMEM first, three DMAs in a row, ~1.3 K
// cycles). The kernel's two loads and one store are the op's only DMAs; real
// broadcasts beside it stay bit-exact.
TEST(LowerElementwise, OperandsOfTheResultsElementCountAreNotCopied) {
  const std::string ir =
      "graph s {\n  input %x : f32[1,1]\n  input %r : f32[1]\n  input %u : f32[4,1,6]\n  input %v : f32[4,6]\n"
      "  %y = div(%x, %r) : f32[1,1] #0\n  %z = sub(%u, %v) : f32[4,4,6] #1\n  %w = mul(%v, %u) : f32[4,4,6] #2\n"
      "  output %y\n  output %z\n  output %w\n}\n";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) expect_bit_exact(ir, p, target(1, 128, 128), 1, cores);
  const LowerResult r = lower_with(ir, PrecisionPolicy::kDefault, target(1, 128, 128), 1);
  int dmas = 0;
  for (const auto& in : r.bundle.cores[0].code) dmas += in.op == isa::Op::kDma && in.op_id == 0;
  EXPECT_EQ(dmas, 3);
}

// A broadcast operand of a one-block op is spread straight into the kernel's block
// buffer, not laid out in HBM first: a row value over a row ([8,1] over [8,10], the
// xent's max and sum; runs of one element, so its bytes come into VMEM and the runs
// are copied there) and a middle-axis broadcast (runs of 1,200 B, from HBM). Each op
// stores only its result to HBM, and nothing goes HBM -> HBM. A two-block op
// ([3,80,300] over 71 tiles) still lays its operand out in HBM.
TEST(LowerElementwise, BroadcastOperandsOfOneBlockAreSpreadInVmem) {
  const std::string ir =
      "graph s {\n  input %x : f32[8,10]\n  input %m : f32[8,1]\n  input %u : f32[4,7,300]\n  input %v : f32[4,1,300]\n"
      "  input %p : f32[3,80,300]\n  input %q : f32[3,1,300]\n"
      "  %y = sub(%x, %m) : f32[8,10] #0\n  %e = exp(%y) : f32[8,10] #1 fusion=#0\n  %z = mul(%v, %u) : f32[4,7,300] #2\n"
      "  %w = add(%p, %q) : f32[3,80,300] #3\n  output %e\n  output %z\n  output %w\n}\n";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      expect_bit_exact(ir, p, target(1, 128, 128), 1, cores);
      const LowerResult r = lower_with(ir, p, target(1, 128, 128), cores);
      std::map<int32_t, int> to_hbm, hbm_to_hbm, vmem_gathers;
      for (const auto& core : r.bundle.cores)
        for (const auto& in : core.code) {
          if (in.op != isa::Op::kDma) continue;
          to_hbm[in.op_id] += in.dst.space == isa::Space::kHbm;
          hbm_to_hbm[in.op_id] += in.dst.space == isa::Space::kHbm && in.src.space == isa::Space::kHbm;
          vmem_gathers[in.op_id] += in.dst.space == isa::Space::kVmem && in.src.space == isa::Space::kVmem;
        }
      EXPECT_EQ(to_hbm[0], 1) << cores;
      EXPECT_EQ(to_hbm[2], 1) << cores;
      EXPECT_EQ(hbm_to_hbm[0] + hbm_to_hbm[2], 0) << cores;
      EXPECT_GT(vmem_gathers[0], 0) << "the [8,1] runs copied within VMEM";
      EXPECT_EQ(vmem_gathers[2], 0) << "the [4,1,300] runs straight from HBM";
      EXPECT_GT(to_hbm[3], 1) << "a two-block op's operand laid out in HBM";
    }
}

// Feeders: an elementwise op read by one member of an elementwise chain alone, whose
// operands exist before the chain's root, is computed in the chain's kernel (the
// data-parallel step's gradient mean into its velocity's add). %f stands before the
// root %q, so %p must live until the root's kernel reads it: %z, placed after %f, must
// not take its bytes. %e (unary) stands after the root. %b is read twice: stored, and
// read by its member. Bit-exact under both policies on 1 and 2 cores, with the
// feeders' ops in the chain's name and no code of their own.
TEST(LowerElementwise, FeedersAreComputedInTheChainsKernel) {
  const std::string ir =
      "graph f {\n  input %x : f32[300,300]\n  input %k : f32[300]\n  input %y : f32[8,300]\n"
      "  input %w : f32[300,300]\n  input %m : f32[300]\n  input %n : f32[300,8]\n"
      "  %p = softmax(%x) {axis=1} : f32[300,300] #0\n  %f = div(%p, %k) : f32[300,300] #1\n"
      "  %z = neg(%y) : f32[8,300] #2\n  %b = add(%x, %w) : f32[300,300] #8\n"
      "  %q = tanh(%w) : f32[300,300] #3\n  %d = mul(%q, %m) : f32[300,300] #4\n  %o = add(%d, %f) : f32[300,300] #5\n"
      "  %e = sqrt(%x) : f32[300,300] #6\n  %s = sub(%o, %e) : f32[300,300] #7\n  %t = mul(%s, %b) : f32[300,300] #9\n"
      "  %zz = matmul(%z, %n) : f32[8,8] #10\n  %u = add(%b, %w) : f32[300,300] #11\n"
      "  output %t\n  output %zz\n  output %u\n}\n";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) expect_bit_exact(ir, p, target(1, 128, 128), 1, cores);
  const LowerResult r = lower_with(ir, PrecisionPolicy::kDefault, target(1, 128, 128), 1);
  EXPECT_EQ(r.bundle.op_names, (std::map<int32_t, std::string>{{0, "softmax %p"},
                                                                 {2, "neg %z"},
                                                                 {3, "tanh %q +div +mul +add +sqrt +sub +mul"},
                                                                 {8, "add %b +add"},
                                                                 {10, "matmul %zz"}}));
  auto has_code = [](const LowerResult& lr, int id) {
    for (const auto& in : lr.bundle.cores[0].code)
      if (in.op_id == id && in.op != isa::Op::kOpMark) return true;
    return false;
  };
  for (int id : {1, 4, 5, 6, 7, 9}) EXPECT_FALSE(has_code(r, id)) << id;
  // Unfused, every node has code of its own.
  LowerOptions lo;
  lo.target = target(1, 128, 128);
  lo.fuse = false;
  EXPECT_EQ(lower_graph(parse_graph(ir, "test.ir"), lo).bundle.op_names.size(), 12u);
  // With 4 MiB of VMEM the chain's buffers with either feeder's operands would take
  // more than half of it (3 MiB: six 256 KiB buffers, twice): %f runs on its own and
  // is read as an operand; %e too, and as it comes after the root, the chain ends
  // before %s.
  isa::Target small = target(1, 128, 128);
  small.vmem_bytes = 4 << 20;
  for (auto p : kPolicies) expect_bit_exact(ir, p, small);
  const LowerResult rs = lower_with(ir, PrecisionPolicy::kDefault, small, 1);
  for (int id : {1, 6, 7}) EXPECT_TRUE(has_code(rs, id)) << id;
  for (int id : {4, 5}) EXPECT_FALSE(has_code(rs, id)) << id;
  // The names follow what the lowering did, not the graph's marks.
  EXPECT_EQ(rs.bundle.op_names, (std::map<int32_t, std::string>{{0, "softmax %p"},
                                                                  {1, "div %f"},
                                                                  {2, "neg %z"},
                                                                  {3, "tanh %q +mul +add"},
                                                                  {6, "sqrt %e"},
                                                                  {7, "sub %s"},
                                                                  {8, "add %b +add"},
                                                                  {9, "mul %t"},
                                                                  {10, "matmul %zz"}}));
}

TEST(LowerGraph, ChainOfOpsWithReshape) {
  const std::string ir =
      "graph mlp {\n  input %x : f32[6,40]\n  const %w : f32[40,24] = " + hex_list(random_values(960, 7)) +
      "\n  const %bias : f32[24] = " + hex_list(random_values(24, 8)) +
      "\n  %h = matmul(%x, %w, %bias) {} : f32[6,24] #0\n  %r = relu(%h) {} : f32[6,24] #1 fusion=#0\n"
      "  %f = reshape(%r) {shape=[3,48]} : f32[3,48] #2\n  %t = tanh(%f) {} : f32[3,48] #3\n  output %t\n}\n";
  for (auto p : kPolicies) expect_bit_exact(ir, p, target(2, 16, 16));
}

// A reshape or flatten that is not a graph output is its operand's bytes: no copy, and
// the tensor owning them (through a chain of reshapes) lives until the last read of
// any of them, so results placed after the operand's last direct read (%b, %c) do
// not reuse its bytes while %f still reads them. A reshape that is a graph output
// still copies (its home is its own).
// The graph bit-exact under both policies on 1 and 2 cores; its lowering (1 core).
LowerResult lowered_bit_exact(const std::string& ir) {
  for (auto p : kPolicies)
    for (int cores : {1, 2}) expect_bit_exact(ir, p, target(1, 128, 128), 1, cores);
  LowerOptions lo;
  lo.target = target(1, 128, 128);
  return lower_graph(parse_graph(ir, "test.ir"), lo);
}

// HBM -> HBM DMAs (copies) of each op id of the bundle.
std::map<int, int> hbm_to_hbm_dmas(const LowerResult& lr) {
  std::map<int, int> copies;
  for (const auto& core : lr.bundle.cores)
    for (const auto& in : core.code)
      if (in.op == isa::Op::kDma && in.src.space == isa::Space::kHbm && in.dst.space == isa::Space::kHbm)
        ++copies[in.op_id];
  return copies;
}

TEST(LowerGraph, ReshapeIsItsOperandsBytes) {
  const std::string ir =
      "graph rs {\n  input %x : f32[6,40]\n"
      "  %a = relu(%x) : f32[6,40] #0\n  %r = reshape(%a) {shape=[3,80]} : f32[3,80] #1\n"
      "  %f = reshape(%r) {shape=[240]} : f32[240] #2\n  %b = exp(%x) : f32[6,40] #3\n"
      "  %c = neg(%x) : f32[6,40] #4\n  %d = mul(%b, %c) : f32[6,40] #5\n"
      "  %g = flatten(%d) {axis=0} : f32[1,240] #6\n  %h = reshape(%g) {shape=[240]} : f32[240] #7\n"
      "  %o = add(%f, %h) : f32[240] #8\n  %q = reshape(%x) {shape=[240]} : f32[240] #9\n"
      "  output %o\n  output %q\n}\n";
  const LowerResult lr = lowered_bit_exact(ir);
  std::map<int, int> copies = hbm_to_hbm_dmas(lr);
  EXPECT_EQ(copies[1] + copies[2] + copies[6] + copies[7], 0);
  EXPECT_EQ(copies[9], 1);
}

// A slice whose elements are one run of its operand's (axes before one a single
// index, those after it whole) is those bytes at an offset, as is a reshape of it: no
// code. One that is not a run, or is a graph output, is copied.
TEST(LowerGraph, SliceOfOneRunIsItsOperandsBytes) {
  const std::string sl = "{axes=[0,1], steps=[1,1]";
  const std::string ir =
      "graph sl {\n  input %x : f32[4,300]\n  input %z : f32[2,3,5]\n  %a = exp(%x) : f32[4,300] #0\n"
      "  %s = slice(%a) " + sl + ", starts=[1,0], ends=[2,300]} : f32[1,300] #1\n"
      "  %t = slice(%a) " + sl + ", starts=[2,0], ends=[4,300]} : f32[2,300] #2\n"
      "  %u = slice(%a) " + sl + ", starts=[0,10], ends=[4,20]} : f32[4,10] #3\n"
      "  %b = neg(%z) : f32[2,3,5] #4\n"
      "  %v = slice(%b) {axes=[0,1,2], steps=[1,1,1], starts=[1,1,0], ends=[2,3,5]} : f32[1,2,5] #5\n"
      "  %w = reshape(%t) {shape=[600]} : f32[600] #6\n  %o1 = tanh(%s) : f32[1,300] #7\n"
      "  %o2 = tanh(%w) : f32[600] #8\n  %o3 = tanh(%u) : f32[4,10] #9\n  %o4 = exp(%v) : f32[1,2,5] #10\n"
      "  %q = slice(%a) " + sl + ", starts=[3,0], ends=[4,300]} : f32[1,300] #11\n"
      "  output %o1\n  output %o2\n  output %o3\n  output %o4\n  output %q\n}\n";
  const LowerResult lr = lowered_bit_exact(ir);
  std::map<int, int> code;  // instructions but the op markers, per op id
  for (const auto& core : lr.bundle.cores)
    for (const auto& in : core.code) code[in.op_id] += in.op != isa::Op::kOpMark;
  EXPECT_EQ(code[1] + code[2] + code[5] + code[6], 0);
  EXPECT_GT(code[3], 0);
  EXPECT_GT(code[11], 0);
}

// A concat whose operands are runs of its result, each read by it alone (through
// views at most), is assembled in place: its operands' producers write their runs of
// it, and it has no code. One with an operand read elsewhere too, a graph input, or
// operands interleaved (outer axes) is copied.
TEST(LowerGraph, ConcatOfRunsIsAssembledInPlace) {
  const std::string ir =
      "graph cc {\n  input %x : f32[2,150]\n  input %z : f32[5,10]\n  input %k : f32[1,20]\n  input %j : f32[1,10]\n"
      "  %a = exp(%x) : f32[2,150] #0\n  %af = reshape(%a) {shape=[1,300]} : f32[1,300] #1\n"
      "  %b = neg(%z) : f32[5,10] #2\n  %bf = reshape(%b) {shape=[1,50]} : f32[1,50] #3\n"
      "  %c = concat(%af, %bf) {axis=1} : f32[1,350] #4\n  %y = tanh(%c) : f32[1,350] #5\n"
      "  %d = exp(%z) : f32[5,10] #6\n  %e = concat(%d, %j) {axis=0} : f32[6,10] #7\n"
      "  %g = neg(%k) : f32[1,20] #8\n  %h = concat(%g, %k) {axis=1} : f32[1,40] #9\n"
      "  %m = exp(%k) : f32[1,20] #10\n  %n = concat(%m, %g) {axis=1} : f32[1,40] #11\n"
      "  %q = exp(%x) : f32[2,150] #12\n  %r = concat(%q, %q) {axis=0} : f32[4,150] #13\n"
      "  %s = neg(%x) : f32[2,150] #14\n  %t = tanh(%x) : f32[2,150] #15\n"
      "  %u = concat(%s, %t) {axis=1} : f32[2,300] #16\n"
      "  output %y\n  output %e\n  output %h\n  output %n\n  output %r\n  output %u\n}\n";
  const LowerResult lr = lowered_bit_exact(ir);
  std::map<int, int> code;  // instructions but the op markers, per op id
  for (const auto& core : lr.bundle.cores)
    for (const auto& in : core.code) code[in.op_id] += in.op != isa::Op::kOpMark;
  EXPECT_EQ(code[4], 0);   // %a and %b written into %c's runs
  EXPECT_GT(code[7], 0);   // %j is a graph input
  EXPECT_GT(code[9], 0);   // %k is a graph input
  EXPECT_GT(code[11], 0);  // %g is read by %h too
  EXPECT_GT(code[13], 0);  // one operand twice
  EXPECT_GT(code[16], 0);  // rows of %s and %t interleave in %u
}

// A reshape that is a graph output is its operand's bytes when those are a stored
// node result no output names (a training step's new weights through their 2-D
// update); it is copied when they are an input's, another output's, or already
// another output's bytes.
TEST(LowerGraph, OutputReshapeIsItsOperandsBytes) {
  const std::string ir =
      "graph rs {\n  input %x : f32[6,40]\n"
      "  %a = exp(%x) : f32[6,40] #0\n  %r = reshape(%a) {shape=[3,80]} : f32[3,80] #1\n"
      "  %b = neg(%x) : f32[6,40] #2\n  %c = reshape(%b) {shape=[240]} : f32[240] #3\n"
      "  %d = reshape(%b) {shape=[2,120]} : f32[2,120] #4\n  %e = reshape(%x) {shape=[240]} : f32[240] #5\n"
      "  %m = add(%x, %x) : f32[6,40] #6\n  %n = reshape(%m) {shape=[240]} : f32[240] #7\n"
      "  output %r\n  output %c\n  output %d\n  output %e\n  output %m\n  output %n\n}\n";
  const LowerResult lr = lowered_bit_exact(ir);
  std::map<int, int> copies = hbm_to_hbm_dmas(lr);
  EXPECT_EQ(copies[1] + copies[3], 0);
  EXPECT_EQ(copies[4], 1);
  EXPECT_EQ(copies[5], 1);
  EXPECT_EQ(copies[7], 1);
  std::map<std::string, uint64_t> addr;
  for (const auto& e : lr.bundle.io) addr[e.name] = e.addr;
  EXPECT_NE(addr.at("c"), addr.at("d"));
}

// Attention's head transposes (perm [0, 2, 1, 3]) fold into the matmuls: one read only
// by a matmul is a strided view of its operand (Q as the LHS, V as the RHS), one of a
// matmul's result read by it alone has the matmul store its rows so (the head merge).
// Bit-exact against evaluate() on K-streamed tiles (6 heads' products over 2 cores)
// and resident units (2), full-width and narrow MXUs; the folded transposes move no
// data, K's (perm [0, 2, 3, 1]) and a merge that is a graph output still do. K's goes
// through VMEM in blocks of batch elements over the cores (one a core at least, with
// fewer batch elements than cores only as many cores as batch elements).
TEST(LowerGraph, HeadTransposesAreMatmulViews) {
  auto ir = [](int64_t B0, int64_t H, bool merge_out) {
    const std::string S = "5", D = "16", b = std::to_string(B0), h = std::to_string(H);
    const std::string x = "[" + b + "," + S + "," + h + "," + D + "]", t = "[" + b + "," + h + "," + S + "," + D + "]";
    return "graph at {\n  input %q : f32" + x + "\n  input %k : f32" + x + "\n  input %v : f32" + x + "\n" +
           "  %qt = transpose(%q) {perm=[0,2,1,3]} : f32" + t + " #1\n" +
           "  %kt = transpose(%k) {perm=[0,2,3,1]} : f32[" + b + "," + h + "," + D + "," + S + "] #2\n" +
           "  %s = matmul(%qt, %kt) : f32[" + b + "," + h + "," + S + "," + S + "] #3\n" +
           "  %vt = transpose(%v) {perm=[0,2,1,3]} : f32" + t + " #4\n" +
           "  %o = matmul(%s, %vt) : f32" + t + " #5\n" + "  %ot = transpose(%o) {perm=[0,2,1,3]} : f32" + x +
           " #6\n" + (merge_out ? "  output %ot\n}\n"
                                : "  %r = reshape(%ot) {shape=[" + b + "," + S + "," + std::to_string(H * 16) +
                                      "]} : f32[" + b + "," + S + "," + std::to_string(H * 16) + "] #7\n  output %r\n}\n");
  };
  for (auto p : kPolicies)
    for (const auto& t : {target(1, 128, 128), target(2, 16, 16)})
      for (int cores : {1, 2})
        for (const auto& [B0, H] : std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {1, 2}, {6, 2}})
          for (bool merge_out : {false, true}) {
            const std::string g = ir(B0, H, merge_out);
            expect_bit_exact(g, p, t, 1, cores);
            LowerOptions lo;
            lo.target = t;
            lo.policy = p;
            lo.cores = cores;
            const LowerResult lr = lower_graph(parse_graph(g, "test.ir"), lo);
            std::map<int, int> code;  // DMAs (every op ends at a barrier)
            int k_cores = 0;          // cores with DMAs of K's transpose
            for (const auto& core : lr.bundle.cores) {
              int k = 0;
              for (const auto& in : core.code) {
                code[in.op_id] += in.op == isa::Op::kDma;
                k += in.op == isa::Op::kDma && in.op_id == 2;
              }
              k_cores += k > 0;
            }
            EXPECT_EQ(code[1] + code[4], 0) << g;
            EXPECT_EQ(k_cores, std::min<int64_t>(cores, B0)) << g;
            EXPECT_EQ(code[6] > 0, merge_out) << g;
          }
}

TEST(LowerRows, SoftmaxLastAxis) {
  for (auto p : kPolicies) {
    expect_bit_exact(unary_ir("softmax", "[3,5]", "axis=1"), p, target(1, 128, 128));
    expect_bit_exact(unary_ir("softmax", "[11,300]", "axis=1"), p, target(1, 128, 128));
    expect_bit_exact(unary_ir("softmax", "[2,3,256]", "axis=2"), p, target(1, 128, 128));
    // Blocks of 8 row groups whose steps interleave, a ragged last group; 2 cores.
    for (int cores : {1, 2}) {
      expect_bit_exact(unary_ir("softmax", "[70,130]", "axis=1"), p, target(1, 128, 128), 1, cores);
      expect_bit_exact(unary_ir("softmax", "[150,128]", "axis=1"), p, target(1, 128, 128), 2, cores);
      // Short rows: blocks of more than 8 groups, each set of 8 through the steps together.
      expect_bit_exact(unary_ir("softmax", "[700,40]", "axis=1"), p, target(1, 128, 128), 2, cores);
    }
  }
}

TEST(LowerRows, LayerNorm) {
  for (auto p : kPolicies)
    for (int64_t n : {64, 200, 384}) {
      // 70: blocks of 8 row groups, a ragged one; 400 (one core: blocks of 25 groups):
      // sets of 6 groups three in flight, every accumulator bank and scratch bank reused.
      const std::string rows = n == 200 ? "70" : n == 64 ? "400" : "9";
      const std::string ir = "graph ln {\n  input %x : f32[" + rows + "," + std::to_string(n) + "]\n  const %g : f32[" +
                             std::to_string(n) + "] = " + hex_list(random_values(static_cast<size_t>(n), 5)) +
                             "\n  const %b : f32[" + std::to_string(n) + "] = " +
                             hex_list(random_values(static_cast<size_t>(n), 6)) +
                             "\n  %y = layernorm(%x, %g, %b) {axis=1, epsilon=1e-05} : f32[" + rows + "," +
                             std::to_string(n) + "] #4\n  output %y\n}\n";
      for (int cores : {1, 2}) expect_bit_exact(ir, p, target(1, 128, 128), 1, cores);
    }
}

TEST(LowerRows, ReductionsAndGlobalAvgPool) {
  for (auto p : kPolicies) {
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max"}) {
      expect_bit_exact(std::string("graph r {\n  input %x : f32[13,300]\n  %y = ") + op +
                           "(%x) {axes=[1], keepdims=1} : f32[13,1] #0\n  output %y\n}\n",
                       p, target(1, 128, 128));
      expect_bit_exact(std::string("graph r {\n  input %x : f32[2,3,50]\n  %y = ") + op +
                           "(%x) {axes=[1,2], keepdims=0} : f32[2] #0\n  output %y\n}\n",
                       p, target(1, 128, 128));
    }
    expect_bit_exact("graph r {\n  input %x : f32[2,5,7,7]\n  %y = global_avgpool(%x) {} : f32[2,5,1,1] #0\n"
                     "  output %y\n}\n",
                     p, target(1, 128, 128));
    // Blocks of 64 rows (8 groups a block, each in its own register, one DMA out a
    // block), a ragged last group, on two cores.
    for (int cores : {1, 2})
      expect_bit_exact("graph r {\n  input %x : f32[1,150,7,7]\n  %y = global_avgpool(%x) {} : f32[1,150,1,1] #0\n"
                       "  output %y\n}\n",
                       p, target(1, 128, 128), 2, cores);
    // Short rows in blocks of more than 8 groups (resnet50's pool, 2048 rows of 49):
    // sets of 8 groups alternate between two register banks, the last set and group
    // ragged; 1000 rows come in at most 8 DMAs (they were 16 blocks of 64 rows).
    const std::string pool =
        "graph r {\n  input %x : f32[1,1000,7,7]\n  %y = global_avgpool(%x) {} : f32[1,1000,1,1] #0\n  output %y\n}\n";
    for (int cores : {1, 2}) {
      expect_bit_exact(pool, p, target(1, 128, 128), 2, cores);
      const std::string as = assembly_of(pool, p, target(1, 128, 128), cores);
      int blocks = 0;  // the blocks' input DMAs, on f14 and f15 (double_buffered)
      for (const char* f : {", flag=f14\n", ", flag=f15\n"})
        for (size_t at = as.find(f); at != std::string::npos; at = as.find(f, at + 1)) ++blocks;
      EXPECT_LE(blocks, 8) << "cores " << cores;
      expect_bit_exact("graph r {\n  input %x : f32[700,40]\n"
                       "  %y = reduce_max(%x) {axes=[1], keepdims=1} : f32[700,1] #0\n  output %y\n}\n",
                       p, target(1, 128, 128), 2, cores);
    }
  }
}

// Reductions over axes of one element (lower_unit_axis): x (+) the identity over
// dense tiles, bit-exact with the reference's tree over one element and its padding,
// -0, subnormals, infinities and NaN included; no lane or sublane reduction is
// emitted. Axes of one element down the rows, in the middle, innermost, and two of
// them; ragged last tiles; one and two cores.
TEST(LowerRows, ReductionsOverAxesOfOneElement) {
  std::vector<float> special = random_values(2056, 7);
  const float subnormal = std::ldexp(1.0f, -130);
  const float odd[] = {-0.0f, 0.0f, subnormal, -subnormal, INFINITY, -INFINITY, NAN, -NAN, 1e-38f, -3.5f};
  for (size_t k = 0; k < special.size(); k += 3) special[k] = odd[(k / 3) % 10];
  for (auto p : kPolicies)
    for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max"})
      for (int cores : {1, 2}) {
        const std::string r = std::string(" = ") + op;
        const std::vector<std::string> irs = {
            "graph r {\n  input %x : f32[1,5000]\n  %y" + r + "(%x) {axes=[0], keepdims=0} : f32[5000] #0\n  output %y\n}\n",
            "graph r {\n  input %x : f32[3,1,700]\n  %y" + r + "(%x) {axes=[1], keepdims=1} : f32[3,1,700] #0\n  output %y\n}\n",
            "graph r {\n  input %x : f32[7,1]\n  %y" + r + "(%x) {axes=[1], keepdims=0} : f32[7] #0\n  output %y\n}\n",
            "graph r {\n  input %x : f32[1,1,300]\n  %y" + r + "(%x) {axes=[0,1], keepdims=0} : f32[300] #0\n  output %y\n}\n",
            "graph r {\n  const %c : f32[1,2056] = " + hex_list(special) + "\n  %y" + r +
                "(%c) {axes=[0], keepdims=1} : f32[1,2056] #0\n  output %y\n}\n"};
        for (const std::string& ir : irs) {
          expect_bit_exact(ir, p, target(1, 128, 128), 3, cores);
          EXPECT_EQ(assembly_of(ir, p, target(1, 128, 128), cores).find("vreduce"), std::string::npos) << ir;
        }
      }
}

// Row regions (row_region.cpp): reductions over the innermost axes or down the rows
// and the elementwise ops around them run as one kernel whose values stay in VMEM:
// the softmax cross-entropy of a training step, with ragged rows (13) and rows of
// three tiles (300, the last ragged), a total over both axes (one row of 31 tiles), a
// mean, a constant operand and values read outside the region (graph outputs, a row
// value among them); a bias's gradient and update (columns); and two updates without
// a reduction, merged into one kernel. Each output is bit-exact with the graph
// reference, only the region's first node (#0) has code (the marker has none), and
// only the outputs go to HBM. Not regions: a reduction whose only neighbour reads an operand made after it
// (the transpose, #1: it runs on its own), two updates the second of which reads
// such an operand, values over kRegionElems, a row value broadcast over other than
// the last axis.
TEST(LowerRows, RowRegionsKeepTheirValuesInVmem) {
  const std::string xent =
      "graph x {\n  input %z : f32[13,300]\n  input %t : f32[13,300]\n  const %n : f32[1] = [0x41500000]\n"
      "  %m = reduce_max(%z) {axes=[1], keepdims=1} : f32[13,1] #0\n"
      "  %s = sub(%z, %m) : f32[13,300] #2\n  %e = exp(%s) : f32[13,300] #3\n"
      "  %q = reduce_sum(%e) {axes=[1], keepdims=1} : f32[13,1] #4\n  %l = log(%q) : f32[13,1] #5\n"
      "  %lp = sub(%s, %l) : f32[13,300] #6\n  %tl = mul(%t, %lp) : f32[13,300] #7\n"
      "  %tot = reduce_sum(%tl) {axes=[0,1], keepdims=1} : f32[1,1] #8\n  %loss = neg(%tot) : f32[1,1] #9\n"
      "  %sm = div(%e, %q) : f32[13,300] #10\n  %r = sub(%sm, %t) : f32[13,300] #11\n"
      "  %g = div(%r, %n) : f32[13,300] #12\n  %gm = reduce_mean(%g) {axes=[1], keepdims=0} : f32[13] #13\n"
      "  %gt = tanh(%gm) : f32[13] #14\n"
      "  output %loss\n  output %g\n  output %gt\n  output %l\n}\n";
  // A bias's gradient and its momentum update (the column sum down 13 rows, the last
  // group ragged, over 300 lanes, three blocks), a column max and mean, an operand of
  // the result's elements with a leading axis of one.
  const std::string columns =
      "graph c {\n  input %g : f32[13,300]\n  input %v : f32[300]\n  input %mom : f32[300]\n"
      "  %gb = reduce_sum(%g) {axes=[0], keepdims=0} : f32[300] #0\n"
      "  %vd = mul(%v, %mom) : f32[300] #2\n  %vn = add(%vd, %gb) : f32[300] #3\n"
      "  %cm = reduce_max(%g) {axes=[0], keepdims=1} : f32[1,300] #4\n  %cs = add(%cm, %gb) : f32[1,300] #5\n"
      "  %cmean = reduce_mean(%g) {axes=[0], keepdims=0} : f32[300] #6\n  %w = sub(%vn, %cmean) : f32[300] #7\n"
      "  output %vn\n  output %cs\n  output %w\n}\n";
  // Two chains of no reduction, each an optimizer-like update: one kernel between
  // them (horizontal merging); not when the second reads a value made after the
  // first chain's first node (the transpose).
  const std::string updates =
      "graph u {\n  input %g1 : f32[16,40]\n  input %g2 : f32[300]\n  input %w1 : f32[16,40]\n"
      "  input %w2 : f32[300]\n  const %m : f32[1] = [0x3f666666]\n"
      "  %a = mul(%g1, %m) : f32[16,40] #0\n  %b = sub(%w1, %a) : f32[16,40] #2\n"
      "  %c = mul(%g2, %m) : f32[300] #3\n  %d = sub(%w2, %c) : f32[300] #4\n  output %b\n  output %d\n}\n";
  const std::string updates_late =
      "graph u {\n  input %g1 : f32[16,40]\n  input %g2 : f32[20,15]\n  input %w1 : f32[16,40]\n"
      "  input %w2 : f32[15,20]\n  const %m : f32[1] = [0x3f666666]\n"
      "  %a = mul(%g1, %m) : f32[16,40] #0\n  %gt = transpose(%g2) {perm=[1,0]} : f32[15,20] #1\n"
      "  %b = sub(%w1, %a) : f32[16,40] #2\n"
      "  %c = mul(%gt, %m) : f32[15,20] #3\n  %d = sub(%w2, %c) : f32[15,20] #4\n  output %b\n  output %d\n}\n";
  const std::string late =
      "graph l {\n  input %a : f32[8,20]\n  input %b : f32[20,8]\n"
      "  %m = reduce_sum(%a) {axes=[1], keepdims=1} : f32[8,1] #0\n  %c = transpose(%b) {perm=[1,0]} : f32[8,20] #1\n"
      "  %d = sub(%c, %m) : f32[8,20] #2\n  output %d\n}\n";
  const std::string big =
      "graph b {\n  input %a : f32[128,600]\n  %m = reduce_max(%a) {axes=[1], keepdims=1} : f32[128,1] #0\n"
      "  %d = sub(%a, %m) : f32[128,600] #2\n  output %d\n}\n";
  const std::string middle =
      "graph c {\n  input %a : f32[2,5,40]\n  %m = reduce_max(%a) {axes=[1,2], keepdims=1} : f32[2,1,1] #0\n"
      "  %d = sub(%a, %m) : f32[2,5,40] #2\n  output %d\n}\n";
  struct Case {
    const std::string* ir;
    bool region;
    int marker;  // a node that has code exactly when there is no region
  };
  for (const Case& c : {Case{&xent, true, 2}, Case{&columns, true, 2}, Case{&updates, true, 3},
                        Case{&updates_late, false, 3}, Case{&late, false, 2}, Case{&big, false, 2},
                        Case{&middle, false, 2}})
    for (auto p : kPolicies)
      for (int cores : {1, 2}) {
        expect_bit_exact(*c.ir, p, target(1, 128, 128), 3, cores);
        LowerOptions lo;
        lo.target = target(1, 128, 128);
        lo.policy = p;
        lo.cores = cores;
        const LowerResult lr = lower_graph(parse_graph(*c.ir, "t.ir"), lo);
        const std::string& as = lr.assembly;
        EXPECT_NE(as.find("  op 0\n"), std::string::npos);
        EXPECT_EQ(as.find("  op " + std::to_string(c.marker) + "\n") == std::string::npos, c.region) << *c.ir;
        if (c.region) {
          for (int id = 3; id <= 14; ++id) EXPECT_EQ(as.find("  op " + std::to_string(id) + "\n"), std::string::npos) << id;
          // Its outputs (and nothing else) go to HBM.
          int64_t out = 0, want = 0;
          for (const auto& e : lr.bundle.io)
            if (e.kind == isa::IoKind::kOutput) want += static_cast<int64_t>(e.elements() * isa::dtype_size(e.dtype));
          std::istringstream in(as);
          for (std::string line; std::getline(in, line);)
            if (line.rfind("  dma hbm:", 0) == 0) {
              const auto b = line.find("bytes=");
              int64_t bytes = std::stoll(line.substr(b + 6));
              const auto d = line.find("dim=");
              if (d != std::string::npos) bytes *= std::stoll(line.substr(d + 4));
              out += bytes;
            }
          EXPECT_EQ(out, want);
        }
      }
}

// Random row regions: chains of row, column and total reductions, unary ops and
// binary ops of rows with rows, row values, columns or a constant, over shapes with
// one row or lane, ragged groups and tiles; every output bit-exact with the graph
// reference (both policies, one and two cores), and most graphs are one region.
TEST(LowerRows, RandomRowRegionsBitExact) {
  std::mt19937 rng(82);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  int regions = 0, graphs = 0;
  for (int round = 0; round < 24; ++round) {
    const int64_t R = std::vector<int64_t>{1, 5, 8, 13, 17}[pick(5)];
    const int64_t L = std::vector<int64_t>{1, 3, 10, 128, 130}[pick(5)];
    const std::string rows = "[" + std::to_string(R) + "," + std::to_string(L) + "]";
    const std::string row = "[" + std::to_string(R) + ",1]", col = "[" + std::to_string(L) + "]", one = "[1,1]";
    std::ostringstream ir;
    ir << "graph r {\n  input %x0 : f32" << rows << "\n  input %x1 : f32" << rows << "\n  input %c : f32" << col
       << "\n  const %k : f32[1] = [0x3fc00000]\n";
    std::vector<std::pair<std::string, std::string>> vals = {{"%x0", rows}, {"%x1", rows}, {"%c", col}};
    auto of = [&](const std::string& shape) {
      std::vector<std::string> v;
      for (const auto& [name, s] : vals)
        if (s == shape) v.push_back(name);
      return v.empty() ? std::string() : v[static_cast<size_t>(pick(static_cast<int>(v.size())))];
    };
    int id = 0;
    bool reduced = false;
    for (int step = 0; step < 9; ++step) {
      const std::string out = "%v" + std::to_string(id);
      const char* red[] = {"reduce_sum", "reduce_max", "reduce_mean"};
      const char* un[] = {"neg", "tanh", "exp", "sigmoid", "sqrt"};
      const char* bin[] = {"add", "sub", "mul", "div"};
      const int kind = !reduced ? pick(3) : pick(7);
      std::string line, shape;
      if (kind == 0) {
        line = out + " = " + red[pick(3)] + "(" + of(rows) + ") {axes=[1], keepdims=1}";
        shape = row;
      } else if (kind == 1) {
        line = out + " = " + red[pick(3)] + "(" + of(rows) + ") {axes=[0], keepdims=0}";
        shape = col;
      } else if (kind == 2) {
        line = out + " = reduce_sum(" + of(rows) + ") {axes=[0,1], keepdims=1}";
        shape = one;
      } else if (kind == 3) {
        const auto& v = vals[static_cast<size_t>(pick(static_cast<int>(vals.size())))];
        line = out + " = " + un[pick(5)] + "(" + v.first + ")";
        shape = v.second;
      } else {
        // rows with rows, a row value or the constant; or a value with one of its shape.
        const auto& a = vals[static_cast<size_t>(pick(static_cast<int>(vals.size())))];
        std::string b = a.second == rows && pick(2) ? of(row) : of(a.second);
        if (b.empty() || pick(4) == 0) b = "%k";
        line = out + " = " + bin[pick(4)] + (pick(2) ? "(" + a.first + ", " + b + ")" : "(" + b + ", " + a.first + ")");
        shape = a.second;
      }
      reduced = reduced || kind <= 2;
      ir << "  " << line << " : f32" << shape << " #" << id++ << "\n";
      vals.emplace_back(out, shape);
    }
    ir << "  output %v" << id - 1 << "\n  output %v" << pick(id - 1) << "\n}\n";
    const std::string text = ir.str();
    for (auto p : kPolicies)
      for (int cores : {1, 2}) expect_bit_exact(text, p, target(1, 128, 128), 7 + static_cast<uint32_t>(round), cores);
    LowerOptions lo;
    lo.target = target(1, 128, 128);
    const std::string as = lower_graph(parse_graph(text, "t.ir"), lo).assembly;
    int ops = 0;
    for (size_t at = as.find("  op "); at != std::string::npos; at = as.find("  op ", at + 1)) ++ops;
    ++graphs;
    regions += ops < id;
  }
  EXPECT_GE(regions, graphs / 2);
}

std::string conv_ir(const std::string& x, const std::string& w, const std::string& y, const std::string& attrs,
                    const std::string& bias = "") {
  return "graph c {\n  input %x : f32" + x + "\n  input %w : f32" + w + "\n" +
         (bias.empty() ? "" : "  input %b : f32" + bias + "\n") + "  %y = conv2d(%x, %w" + (bias.empty() ? "" : ", %b") +
         ") {" + attrs + "} : f32" + y + " #1\n  output %y\n}\n";
}

// `ir` lowered for target t (policy p, `cores` cores): each op's bytes DMAed into HBM,
// and its instructions by op id.
struct Lowered {
  std::map<int, int64_t> stored;
  LowerResult lr;
};
Lowered lower_for(const std::string& ir, PrecisionPolicy p, const isa::Target& t, int cores) {
  LowerOptions lo;
  lo.target = t;
  lo.policy = p;
  lo.cores = cores;
  Lowered l{{}, lower_graph(parse_graph(ir, "test.ir"), lo)};
  for (const auto& core : l.lr.bundle.cores)
    for (const auto& in : core.code) {
      if (in.op != isa::Op::kDma || in.dst.space != isa::Space::kHbm) continue;
      int64_t bytes = in.imm;
      for (int d = 0; d < in.ndims; ++d) bytes *= in.dims[d].count;
      l.stored[in.op_id] += bytes;
    }
  return l;
}

// On two cores the im2col bands and the NHWC -> NCHW channel bands go round robin;
// 9 taps or more gather into planes interleaved by one copy.
TEST(LowerConv, Im2colOrderPaddingStridesBias) {
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      SCOPED_TRACE(cores);
      expect_bit_exact(conv_ir("[1,3,6,6]", "[4,3,3,3]", "[1,4,6,6]",
                               "dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]", "[4]"),
                       p, target(1, 32, 32), 1, cores);
      // K = 5*5*6 = 150 > R: several chunks; stride 2, asymmetric padding, dilation.
      expect_bit_exact(conv_ir("[2,6,9,8]", "[5,6,5,5]", "[2,5,4,4]",
                               "dilations=[1,1], groups=1, pads=[2,1,1,2], strides=[2,2]"),
                       p, target(2, 32, 32), 2, cores);
      expect_bit_exact(conv_ir("[1,2,7,7]", "[3,2,3,3]", "[1,3,3,3]",
                               "dilations=[2,2], groups=1, pads=[0,0,0,0], strides=[1,1]", "[3]"),
                       p, target(1, 128, 128), 3, cores);
      // Grouped and depthwise.
      expect_bit_exact(conv_ir("[2,6,5,5]", "[4,3,3,3]", "[2,4,5,5]",
                               "dilations=[1,1], groups=2, pads=[1,1,1,1], strides=[1,1]", "[4]"),
                       p, target(1, 16, 16), 4, cores);
      expect_bit_exact(conv_ir("[1,5,7,7]", "[5,1,3,3]", "[1,5,4,4]",
                               "dilations=[1,1], groups=5, pads=[1,1,1,1], strides=[2,2]", "[5]"),
                       p, target(1, 8, 8), 5, cores);
    }
}

// Depthwise convs (a channel per group) with K = KH*KW <= R run on the VPU (strides 1
// and 2 as shifted loads over padded planes or their phases, others through tap
// gathers): the
// contract's single chunk (+0.0, then each bf16 x bf16 product added in increasing
// k), the bias one more add, fused members after it. Bit-exact against evaluate()
// with padding, strides, dilation, bias, several images and cores, blocks of
// whole channels and of part of one channel (a small VMEM), and a fused chain
// with a scalar operand; K > R keeps the MXU's chunked order.
// A depthwise conv whose blocks each hold all of an image's channels (small planes,
// a batch of them) expands its weight tiles (128 copies of each weight, a VMEM ->
// VMEM DMA) once per buffer, on each core's first two blocks, not on every block;
// the later blocks read them where they are. Bit-exact with the race checker, stride 1
// (7 x 7 planes) and 2 (46 x 44 planes split into phases), 1 and 2 cores.
TEST(LowerConv, DepthwiseWeightTilesOnceABuffer) {
  const std::string s1 = conv_ir("[6,20,7,7]", "[20,1,3,3]", "[6,20,7,7]",
                                 "dilations=[1,1], groups=20, pads=[1,1,1,1], strides=[1,1]", "[20]");
  const std::string s2 = conv_ir("[6,9,46,44]", "[9,1,3,3]", "[6,9,23,22]",
                                 "dilations=[1,1], groups=9, pads=[1,1,1,1], strides=[2,2]", "[9]");
  for (auto p : kPolicies)
    for (int cores : {1, 2})
      for (const std::string& ir : {s1, s2}) {
        expect_bit_exact(ir, p, target(1, 16, 16), 1, cores);
        const LowerResult lr = lower_with(ir, p, target(1, 16, 16), cores);
        for (const auto& core : lr.bundle.cores) {
          int expansions = 0, loads = 0;  // weight tile expansions, input loads from HBM
          for (const auto& in : core.code) {
            if (in.op != isa::Op::kDma || in.op_id != 1) continue;
            loads += in.src.space == isa::Space::kHbm && in.dst.space == isa::Space::kVmem;
            expansions += in.src.space == isa::Space::kVmem && in.dst.space == isa::Space::kVmem &&
                          in.ndims == 3 && in.dims[0] == (isa::DmaDim{128, 0, in.dims[0].dst_stride});
          }
          EXPECT_GE(loads, 3) << "cores " << cores << ": blocks too few to tell\n" << ir;
          EXPECT_EQ(expansions, 2) << "cores " << cores << "\n" << ir;
        }
      }
}

TEST(LowerConv, DepthwiseOnTheVpu) {
  auto big_vmem = target(1, 16, 16);
  auto small_vmem = target(1, 16, 16);
  small_vmem.vmem_bytes = 256 << 10;  // two buffers of 1024-output blocks, not of 2048
  const std::string chain =
      "graph d {\n  input %x : f32[2,6,9,8]\n  input %w : f32[6,1,3,3]\n  input %b : f32[6]\n"
      "  const %s : f32[1] = [0xbf000000]\n"
      "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=6, pads=[1,1,1,1], strides=[1,1]} : f32[2,6,9,8] #1\n"
      "  %r = relu(%c) : f32[2,6,9,8] #2\n  %a = sub(%s, %r) : f32[2,6,9,8] #3\n  output %a\n}\n";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      SCOPED_TRACE(cores);
      for (const auto& t : {big_vmem, small_vmem}) {
        expect_bit_exact(conv_ir("[2,6,9,8]", "[6,1,3,3]", "[2,6,9,8]",
                                 "dilations=[1,1], groups=6, pads=[1,1,1,1], strides=[1,1]", "[6]"),
                         p, t, 1, cores);
        expect_bit_exact(conv_ir("[1,5,11,10]", "[5,1,3,3]", "[1,5,5,5]",
                                 "dilations=[2,2], groups=5, pads=[2,1,1,2], strides=[2,2]"),
                         p, t, 2, cores);
        // 50 channels of 7 x 7: 20 channels a block in the small VMEM (20, 20, 10).
        expect_bit_exact(conv_ir("[1,50,7,7]", "[50,1,3,3]", "[1,50,7,7]",
                                 "dilations=[1,1], groups=50, pads=[1,1,1,1], strides=[1,1]", "[50]"),
                         p, t, 3, cores);
        // 40 x 40 = 1600 outputs a channel: blocks of 25 rows of one channel in the
        // small VMEM (25, 15 a channel).
        expect_bit_exact(conv_ir("[1,2,40,40]", "[2,1,3,3]", "[1,2,40,40]",
                                 "dilations=[1,1], groups=2, pads=[1,1,1,1], strides=[1,1]", "[2]"),
                         p, t, 4, cores);
        expect_bit_exact(chain, p, t, 5, cores);
        // Stride 1 with dilation and asymmetric padding (shifted loads over padded
        // planes), and 16 taps over two channel groups, the second partial.
        expect_bit_exact(conv_ir("[1,3,12,11]", "[3,1,3,3]", "[1,3,11,10]",
                                 "dilations=[2,2], groups=3, pads=[2,1,1,2], strides=[1,1]", "[3]"),
                         p, t, 7, cores);
        expect_bit_exact(conv_ir("[2,9,8,8]", "[9,1,4,4]", "[2,9,8,8]",
                                 "dilations=[1,1], groups=9, pads=[1,2,2,1], strides=[1,1]"),
                         p, t, 8, cores);
      }
      // Stride 2 on planes of at least 512 outputs (each padded plane split into its
      // four phases): 9 channels over two groups, row blocks, several a core.
      expect_bit_exact(conv_ir("[1,9,46,44]", "[9,1,3,3]", "[1,9,23,22]",
                               "dilations=[1,1], groups=9, pads=[1,1,1,1], strides=[2,2]", "[9]"),
                       p, big_vmem, 10, cores);
      // Row blocks of 40 (40, 40, 20) over two images: image 1's top block reuses the
      // buffer image 0's middle block filled, whose rows are its padding now.
      expect_bit_exact(conv_ir("[2,1,100,100]", "[1,1,3,3]", "[2,1,100,100]",
                               "dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]", "[1]"),
                       p, big_vmem, 9, cores);
      // K = 25 > R = 16: the MXU's two chunks.
      expect_bit_exact(conv_ir("[1,3,6,6]", "[3,1,5,5]", "[1,3,6,6]",
                               "dilations=[1,1], groups=3, pads=[2,2,2,2], strides=[1,1]", "[3]"),
                       p, big_vmem, 6, cores);
    }
  // The VPU's path: no MXU instruction for the conv, and the fused members left no
  // node of their own.
  LowerOptions lo;
  lo.target = big_vmem;
  const auto code = lower_graph(parse_graph(chain, "test.ir"), lo).bundle.cores.at(0).code;
  int mxu = 0, vmul = 0;
  for (const auto& in : code) {
    EXPECT_NE(in.op_id, 2);
    EXPECT_NE(in.op_id, 3);
    if (in.op_id != 1) continue;
    mxu += in.op == isa::Op::kMmul || in.op == isa::Op::kMpush;
    vmul += in.op == isa::Op::kVmul;
  }
  EXPECT_EQ(mxu, 0);
  EXPECT_GT(vmul, 0);
  // A single relu6 (clip) member keeps its bounds in two registers for a block, and the
  // first tap's add starts from a +0.0 register: no broadcast is repeated a tile
  // (mobilenet_v2's depthwise convs: 3 of ~35 vector instructions a tile). Bit-exact,
  // and the same vmax then vmin.
  const std::string relu6 =
      "graph r {\n  input %x : f32[1,8,40,40]\n  input %w : f32[8,1,3,3]\n  input %b : f32[8]\n"
      "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=8, pads=[1,1,1,1], strides=[1,1]} : f32[1,8,40,40] #1\n"
      "  %y = clip(%c) {max=6, min=0} : f32[1,8,40,40] #2\n  output %y\n}\n";
  for (auto p : kPolicies) expect_bit_exact(relu6, p, big_vmem, 11, 1);
  int bound_bcasts = 0, zero_bcasts = 0, vmins = 0;
  for (const auto& in : lower_graph(parse_graph(relu6, "test.ir"), lo).bundle.cores.at(0).code) {
    if (in.op_id != 1) continue;
    bound_bcasts += in.op == isa::Op::kVbcast && static_cast<uint32_t>(in.imm) == 0x40c00000u;  // 6.0
    // +0.0 into the third and fourth chunks' accumulators (v24, v26; v0 and v2 are also
    // the padding rows' registers)
    zero_bcasts += in.op == isa::Op::kVbcast && in.imm == 0 && (in.a == 24 || in.a == 26);
    vmins += in.op == isa::Op::kVmin;
  }
  EXPECT_GE(vmins, 13);  // a tile of 128 outputs each
  EXPECT_LE(4 * bound_bcasts, vmins) << "the clip's bounds broadcast for each tile";
  EXPECT_EQ(zero_bcasts, 0) << "+0.0 broadcast into the accumulators for each chunk";
  // The taps are software-pipelined: after a tap's load (and the conversion of the one
  // before) comes the multiply of an earlier tap, so a load and two ALU ops fill one
  // bundle's vector slots; loading a chunk's four tiles of a tap before their
  // multiplies left the ALUs idle for three loads in four. The planes lie an odd
  // number of 512 B apart, so a tap's 8 rows of 128 elements fall on 8 different pairs
  // of 256 B banks: one pass at any offset.
  for (auto p : kPolicies) {  // f32 planes (each tap converted to bf16) and bf16 planes
    LowerOptions plo = lo;
    plo.policy = p;
    const auto dw_code = lower_graph(parse_graph(relu6, "test.ir"), plo).bundle.cores.at(0).code;
    int tap_loads = 0, pipelined = 0;
    for (size_t i = 0; i + 1 < dw_code.size(); ++i) {
      const auto& in = dw_code[i];
      if (in.op_id != 1 || (in.op != isa::Op::kVld && in.op != isa::Op::kVldBf16) || in.imm2 <= 512) continue;
      if (in.imm2 % 512 != 0 || (in.imm2 / 512) % 2 != 1) ADD_FAILURE() << "plane stride " << in.imm2;
      ++tap_loads;
      size_t j = i + 1;
      while (j < dw_code.size() && dw_code[j].op == isa::Op::kVcvtBf16 && dw_code[j].a != in.a) ++j;
      pipelined += j < dw_code.size() && dw_code[j].op == isa::Op::kVmul && dw_code[j].a != in.a;
    }
    EXPECT_GE(tap_loads, 13 * 9);
    EXPECT_GE(10 * pipelined, 9 * tap_loads) << pipelined << " of " << tap_loads;
  }
  // In the small VMEM the 40 x 40 conv is still the VPU's, in four blocks: four
  // stores to HBM, double-buffered over one core.
  lo.target = small_vmem;
  int stores = 0;
  mxu = 0;
  // (The result is kept: a range-for over a temporary's member read freed memory.)
  const LowerResult small = lower_graph(
      parse_graph(conv_ir("[1,2,40,40]", "[2,1,3,3]", "[1,2,40,40]",
                          "dilations=[1,1], groups=2, pads=[1,1,1,1], strides=[1,1]", "[2]"),
                  "test.ir"),
      lo);
  for (const auto& in : small.bundle.cores.at(0).code) {
    mxu += in.op == isa::Op::kMmul || in.op == isa::Op::kMpush;
    stores += in.op == isa::Op::kDma && in.src.space == isa::Space::kVmem && in.dst.space == isa::Space::kHbm;
  }
  EXPECT_EQ(mxu, 0);
  EXPECT_EQ(stores, 4);
}

// A 1x1 conv (stride 1, no padding, one group) is the matmul W x X per image in
// NCHW: bit-exact against evaluate() with ragged rows (CO = 13) and columns (H*W = 72
// over 16-column tiles), two chunks of K, several images and cores, a bias per output
// row, a fused chain, and the K-streamed plan (1040 output rows); no im2col rows and
// no NHWC -> NCHW move (no DMA HBM -> HBM or VMEM -> VMEM but a scalar's replication).
TEST(LowerConv, PointwiseAsWeightsTimesImages) {
  const std::string chain =
      "graph d {\n  input %x : f32[2,20,9,8]\n  input %w : f32[13,20,1,1]\n  input %b : f32[13]\n"
      "  const %s : f32[1] = [0xbf000000]\n"
      "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]} : f32[2,13,9,8] #1\n"
      "  %r = relu(%c) : f32[2,13,9,8] #2\n  %a = sub(%s, %r) : f32[2,13,9,8] #3\n  output %a\n}\n";
  const std::string attrs = "dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      SCOPED_TRACE(cores);
      expect_bit_exact(conv_ir("[2,20,9,8]", "[13,20,1,1]", "[2,13,9,8]", attrs, "[13]"), p, target(2, 16, 16), 1,
                       cores);
      expect_bit_exact(conv_ir("[3,7,5,5]", "[24,7,1,1]", "[3,24,5,5]", attrs), p, target(1, 8, 8), 2, cores);
      expect_bit_exact(chain, p, target(2, 16, 16), 3, cores);
      expect_bit_exact(conv_ir("[1,40,5,5]", "[1040,40,1,1]", "[1,1040,5,5]", attrs, "[1040]"), p,
                       target(1, 16, 16), 4, cores);
    }
  LowerOptions lo;
  lo.target = target(2, 16, 16);
  lo.cores = 2;
  const auto bundle = lower_graph(parse_graph(chain, "test.ir"), lo).bundle;
  for (const auto& core : bundle.cores) {
    int mmul = 0, moves = 0;
    for (const auto& in : core.code) {
      EXPECT_NE(in.op_id, 2);
      EXPECT_NE(in.op_id, 3);
      mmul += in.op == isa::Op::kMmul;
      // (The scalar operand's replication over a tile reads one element: stride 0.)
      const bool replicates = in.ndims > 0 && in.dims[0].src_stride == 0;
      moves += in.op == isa::Op::kDma && in.src.space == in.dst.space && !replicates;
    }
    EXPECT_GT(mmul, 0);
    EXPECT_EQ(moves, 0);
  }
}

// A strided 1x1 conv with a column tile of outputs an image (resnet's downsamples) is
// pointwise on its input's every s-th pixel, gathered first into NCHW scratch through
// VMEM: bit-exact against evaluate() with strides 2 and (3, 2), a bias, and a residual
// add + relu in its epilogue (its tiles are NCHW, so the add fuses: no code of its
// own); the result needs no NHWC -> NCHW move (the only HBM stores are the scratch's and
// the output's). Only the input rows that hold taps are read, and a core's next image
// is loaded before this one's gather. With fewer outputs an image it stays an im2col
// (shifted) conv.
TEST(LowerConv, StridedPointwiseOnEverySthPixel) {
  const std::string residual =
      "graph d {\n  input %x : f32[2,20,24,22]\n  input %w : f32[13,20,1,1]\n  input %b : f32[13]\n"
      "  input %z : f32[2,13,12,11]\n"
      "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[2,2]} : f32[2,13,12,11] #1\n"
      "  %a = add(%z, %c) : f32[2,13,12,11] #2\n  %r = relu(%a) : f32[2,13,12,11] #3\n  output %r\n}\n";
  const std::string attrs3 = "dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[3,2]";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      SCOPED_TRACE(cores);
      expect_bit_exact(residual, p, target(2, 16, 16), 1, cores);
      expect_bit_exact(conv_ir("[1,9,40,26]", "[24,9,1,1]", "[1,24,14,13]", attrs3), p, target(1, 8, 8), 2, cores);
    }
  for (int cores : {1, 2}) {
    LowerOptions lo;
    lo.target = target(2, 16, 16);
    lo.cores = cores;
    const Graph g = parse_graph(residual, "test.ir");
    const auto bundle = lower_graph(g, lo).bundle;
    int64_t x_at = -1;
    for (const auto& e : bundle.io)
      if (e.name == "x") x_at = static_cast<int64_t>(e.addr);
    ASSERT_GE(x_at, 0);
    int64_t stored = 0, x_read = 0;
    for (const auto& core : bundle.cores) {
      std::vector<size_t> x_loads, gathers;  // instruction indices
      for (size_t k = 0; k < core.code.size(); ++k) {
        const auto& in = core.code[k];
        EXPECT_NE(in.op_id, 2);  // the add and the relu run in the conv's epilogue
        EXPECT_NE(in.op_id, 3);
        if (in.op != isa::Op::kDma) continue;
        int64_t bytes = in.imm;
        for (int d = 0; d < in.ndims; ++d) bytes *= in.dims[d].count;
        if (in.dst.space == isa::Space::kHbm) stored += bytes;
        if (in.src.space == isa::Space::kHbm && in.src.reg == 0 && in.src.offset >= x_at &&
            in.src.offset < x_at + 2 * 20 * 24 * 22 * 4) {
          x_read += bytes;
          x_loads.push_back(k);
        }
        if (in.src.space == isa::Space::kVmem && in.dst.space == isa::Space::kVmem) gathers.push_back(k);
      }
      // A core's next image comes in while this one is gathered.
      if (x_loads.size() >= 2) {
        EXPECT_LT(x_loads[1], gathers.at(0)) << "the second image loaded after the first's gather";
      }
    }
    EXPECT_EQ(stored, (2 * 20 * 12 * 11 + 2 * 13 * 12 * 11) * 4);  // the scratch, then the output
    EXPECT_EQ(x_read, 2 * 20 * 12 * 22 * 4) << "more of x read than its every other row";
  }
}

// An ungrouped conv whose taps are at least 128 bytes of channels reads its im2col
// rows straight from padded NHWC planes, one per stride phase (docs/codegen.md,
// "Shifted convolutions"): bit-exact against evaluate() with padding (asymmetric too),
// strides 1 and 2 (four phases), dilation, a 1x1 stride-2 conv (one phase), a bias,
// a fused member, ragged column tiles, several chunks of K, images and cores (bands of
// plane rows and of output rows when images are fewer than cores). The rows are never
// built: no DMA writes as many bytes as they hold, and a stride-1 conv's LHS rows
// come as runs of KW taps' channels.
TEST(LowerConv, ShiftedOverPaddedPlanes) {
  const std::string chain =
      "graph d {\n  input %x : f32[2,64,9,8]\n  input %w : f32[5,64,3,3]\n  input %b : f32[5]\n"
      "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[2,5,9,8] #1\n"
      "  %r = relu(%c) : f32[2,5,9,8] #2\n  output %r\n}\n";
  for (auto p : kPolicies)
    for (int cores : {1, 2, 3}) {
      SCOPED_TRACE(cores);
      expect_bit_exact(chain, p, target(2, 32, 32), 1, cores);
      expect_bit_exact(conv_ir("[1,64,11,10]", "[37,64,3,3]", "[1,37,6,5]",
                               "dilations=[1,1], groups=1, pads=[2,1,1,0], strides=[2,2]", "[37]"),
                       p, target(2, 32, 32), 2, cores);
      expect_bit_exact(conv_ir("[1,64,10,9]", "[6,64,3,3]", "[1,6,6,5]",
                               "dilations=[2,2], groups=1, pads=[0,0,0,0], strides=[1,1]"),
                       p, target(1, 16, 16), 3, cores);
      expect_bit_exact(conv_ir("[2,64,8,7]", "[9,64,1,1]", "[2,9,4,4]",
                               "dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[2,2]", "[9]"),
                       p, target(1, 16, 16), 4, cores);
    }
  // The LHS rows read in place: 64 channels on 128 rows are chunks of two taps, one of
  // them not adjacent ((0, 2) and (1, 0): two masked loads and a vsel); 48 channels
  // make runs of 16 and 32 lanes (five masks).
  for (auto p : kPolicies) {
    expect_bit_exact(chain, p, target(2, 128, 128), 1, 2);
    expect_bit_exact(conv_ir("[2,48,7,9]", "[20,48,3,3]", "[2,20,7,9]",
                             "dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]", "[20]"),
                     p, target(2, 128, 128), 5, 2);
  }
  // Each image's planes are read from HBM about once, not once a tap: the conv's
  // HBM -> VMEM bytes are its input, weights and bias and at most twice the planes
  // (2 images of 12 rows of 10 pixels), where the 9 taps' rows were 6.75 times them.
  for (auto p : kPolicies)
    for (uint32_t rows : {32u, 128u}) {
      LowerOptions lo;
      lo.target = target(2, rows, rows);
      lo.policy = p;
      lo.cores = 2;
      const LowerResult lr = lower_graph(parse_graph(chain, "test.ir"), lo);
      const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
      int64_t loaded = 0, in_place = 0;
      for (const auto& core : lr.bundle.cores)
        for (const auto& in : core.code) {
          if (in.op_id != 1) continue;
          in_place += (in.op == isa::Op::kVld || in.op == isa::Op::kVldBf16) && in.imm2 == 64 * e;
          if (in.op != isa::Op::kDma || in.src.space != isa::Space::kHbm || in.dst.space != isa::Space::kVmem) continue;
          int64_t bytes = in.imm;
          for (int d = 0; d < in.ndims; ++d) bytes *= in.dims[d].count;
          loaded += bytes;
        }
      SCOPED_TRACE(rows);
      EXPECT_GT(in_place, 0);
      EXPECT_LE(loaded, (2 * 64 * 9 * 8 + 5 * 64 * 9 + 5 + 2 * 2 * 12 * 10 * 64) * e);
    }
}

// A shifted conv whose result is not a next conv's planes stores it as NCHW straight
// from its tiles (docs/codegen.md, "Shifted convolutions"): each output band is
// transposed in VMEM, the Wq - OW dropped pixels of a row left out, and goes out a run
// a channel. Bit-exact against evaluate() with K-streamed tiles that start and end
// inside output rows (40 x 37 outputs, rows of 39), a tall matmul over small images
// whose tiles cross images and the rows between them (resident and K-streamed), ragged
// column tiles and several column bands, four stride phases and asymmetric padding.
// The conv's HBM stores are its planes, its rearranged weights and its output: no
// NHWC rows, which the move to NCHW wrote and read back.
TEST(LowerConv, ShiftedConvStoresNchwStraight) {
  const std::string pad1 = "dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]";
  struct Case {
    std::string x, w, y, bias;
    int64_t planes, weights, out;  // elements the conv stores
  };
  // Planes of Hr rows of Wq pixels: Hr the padded rows or what the last output row's
  // dropped pixels read at the largest shift (2 Wq + 2), in whole rows.
  const std::vector<Case> cases = {
      {"[1,64,80,70]", "[40,64,3,3]", "[1,40,80,70]", "", 83 * 72 * 64, 576 * 40, 40 * 80 * 70},
      {"[6,64,5,5]", "[300,64,3,3]", "[6,300,5,5]", "[300]", 6 * 8 * 7 * 64, 576 * 300, 6 * 300 * 25},
      {"[48,64,5,5]", "[300,64,3,3]", "[48,300,5,5]", "", 48 * 8 * 7 * 64, 576 * 300, 48 * 300 * 25},
  };
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      SCOPED_TRACE(cores);
      for (const Case& c : cases) expect_bit_exact(conv_ir(c.x, c.w, c.y, pad1, c.bias), p, target(2, 128, 128), 1, cores);
      expect_bit_exact(conv_ir("[2,64,11,10]", "[200,64,3,3]", "[2,200,6,5]",
                               "dilations=[1,1], groups=1, pads=[2,1,1,0], strides=[2,2]", "[200]"),
                       p, target(2, 128, 128), 2, cores);
    }
  for (auto p : kPolicies)
    for (int cores : {1, 2})
      for (const Case& c : cases) {
        SCOPED_TRACE(c.x + " on " + std::to_string(cores) + " cores");
        const Lowered l = lower_for(conv_ir(c.x, c.w, c.y, pad1, c.bias), p, target(2, 128, 128), cores);
        int64_t transposes = 0;
        for (const auto& core : l.lr.bundle.cores)
          for (const auto& in : core.code)
            transposes += in.op == isa::Op::kDma && in.src.space == isa::Space::kVmem &&
                          in.dst.space == isa::Space::kVmem && in.ndims == 3 && in.dims[0].src_stride == in.imm;
        const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
        EXPECT_GT(transposes, 0);
        EXPECT_EQ(l.stored.size(), 1u);
        EXPECT_EQ(l.stored.at(1), (c.planes + c.weights + c.out) * e);
      }
}

// A shifted conv's residual add (a basic block's: conv, + identity, relu) joins its
// group and runs on the NCHW bands after the transpose, the identity's band fetched
// beside each (docs/codegen.md, "Shifted convolutions"): bit-exact against evaluate()
// with K-streamed tiles (two on a core, their registers free: six blocks at a time),
// resident units (one register block), the operand first or second (sub), a ragged
// channel count (cols % 8 != 0: a mask a block), ragged pixel counts, and columns
// split over the cores (bands from channel 256 on, the operand's too); the add and
// the relu have no code of their own, and the conv's HBM stores are its planes, its
// rearranged weights and the chain's end once.
TEST(LowerConv, ResidualAddOnTheNchwBands) {
  auto ir = [](const std::string& x, const std::string& w, const std::string& y, const std::string& op,
               bool conv_first) {
    const std::string a = conv_first ? "%c, %z" : "%z, %c";
    return "graph d {\n  input %x : f32" + x + "\n  input %w : f32" + w + "\n  input %z : f32" + y +
           "\n  %c = conv2d(%x, %w) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32" + y +
           " #1\n  %a = " + op + "(" + a + ") : f32" + y + " #2\n  %r = relu(%a) : f32" + y +
           " #3\n  output %r\n}\n";
  };
  struct Case {
    std::string x, w, y, op;
    bool conv_first;
    int64_t planes, weights, out;
  };
  const std::vector<Case> cases = {
      {"[1,64,80,70]", "[40,64,3,3]", "[1,40,80,70]", "add", true, 83 * 72 * 64, 576 * 40, 40 * 80 * 70},
      {"[2,64,9,8]", "[21,64,3,3]", "[2,21,9,8]", "sub", false, 2 * 12 * 10 * 64, 576 * 21, 2 * 21 * 72},
      {"[6,64,5,5]", "[300,64,3,3]", "[6,300,5,5]", "add", false, 6 * 8 * 7 * 64, 576 * 300, 6 * 300 * 25},
      {"[1,64,6,7]", "[300,64,3,3]", "[1,300,6,7]", "add", true, 9 * 9 * 64, 576 * 300, 300 * 42},
  };
  for (auto p : kPolicies)
    for (int cores : {1, 2})
      for (const Case& c : cases) {
        SCOPED_TRACE(c.x + " " + c.op + " on " + std::to_string(cores) + " cores");
        const std::string g = ir(c.x, c.w, c.y, c.op, c.conv_first);
        expect_bit_exact(g, p, target(2, 128, 128), 1, cores);
        const Lowered l = lower_for(g, p, target(2, 128, 128), cores);
        for (const auto& core : l.lr.bundle.cores)
          for (const auto& in : core.code) {
            EXPECT_NE(in.op_id, 2);
            EXPECT_NE(in.op_id, 3);
          }
        const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
        EXPECT_EQ(l.stored.size(), 1u);
        EXPECT_EQ(l.stored.at(1), (c.planes + c.weights + c.out) * e);
      }
}

// A pointwise conv read only by a stride-1 shifted conv stores its W x X tiles into
// that conv's planes (docs/codegen.md, "Shifted convolutions"): each output band is
// transposed in VMEM, a pixel's channels together, and written at its plane rows; the
// padding is zeroed after. Bit-exact against evaluate() with K-streamed tiles over a
// batch (4 images) and resident units that hold part of the channels (one image on
// two cores: bands of 40 and 32 of 72), output sub-bands that end inside a row (35 x 33
// pixels), a bias and a fused relu. The pointwise conv's
// HBM stores are the planes, each byte once (no NCHW result), and the 3x3 conv builds
// none (its only stores are its rearranged weights and its output).
TEST(LowerConv, PointwiseResultsTransposedIntoTheNextConvsPlanes) {
  auto ir = [](int64_t B, int64_t CIN, int64_t CO, int64_t H, int64_t W, int64_t C2) {
    auto sh = [](std::vector<int64_t> d) {
      std::string r = "[";
      for (size_t i = 0; i < d.size(); ++i) r += (i ? "," : "") + std::to_string(d[i]);
      return r + "]";
    };
    return "graph d {\n  input %x : f32" + sh({B, CIN, H, W}) + "\n  input %w1 : f32" + sh({CO, CIN, 1, 1}) +
           "\n  input %b1 : f32" + sh({CO}) + "\n  input %w2 : f32" + sh({C2, CO, 3, 3}) +
           "\n  %c = conv2d(%x, %w1, %b1) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]} : f32" +
           sh({B, CO, H, W}) + " #1\n  %r = relu(%c) : f32" + sh({B, CO, H, W}) +
           " #2\n  %d = conv2d(%r, %w2) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32" +
           sh({B, C2, H, W}) + " #3\n  output %d\n}\n";
  };
  struct Case {
    int64_t B, CIN, CO, H, W, C2;
  };
  const std::vector<Case> cases = {{4, 24, 64, 9, 11, 20}, {1, 40, 72, 6, 7, 9}, {1, 24, 72, 35, 33, 9}};
  for (auto p : kPolicies)
    for (int cores : {1, 2})
      for (const Case& c : cases) {
        SCOPED_TRACE(std::to_string(c.B) + " images on " + std::to_string(cores) + " cores");
        const std::string g = ir(c.B, c.CIN, c.CO, c.H, c.W, c.C2);
        expect_bit_exact(g, p, target(2, 128, 128), 1, cores);
        std::map<int, int64_t> stored = lower_for(g, p, target(2, 128, 128), cores).stored;
        const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
        // Planes of H + 3 rows (the padding and what the last row's dropped pixels read)
        // of W + 2 pixels.
        EXPECT_EQ(stored[1], c.B * (c.H + 3) * (c.W + 2) * c.CO * e);
        EXPECT_EQ(stored[3], (9 * c.CO * c.C2 + c.B * c.C2 * c.H * c.W) * e);
      }
}

// A conv whose patches fit a chunk per MXU (the stems: 3 channels, K = KH*KW*3) pushes
// its patches as the MXUs' columns and computes NCHW tiles (docs/codegen.md, "Stems:
// patches pushed as columns"): bit-exact against evaluate() with a 7x7 stride-2 conv
// of two chunks, asymmetric padding and strides, ragged tiles of narrow MXUs (masked
// stores), a chunk boundary inside a tap's channels, one chunk over two MXUs (tiles
// take turns), constant and run-time weights, a bias, a fused chain with a scalar
// operand, and bands over several images and cores.
// HBM sees the input, the weights, the bias and the output once each: no im2col rows
// and no NHWC result, which the im2col matmul wrote and read back.
TEST(LowerConv, StemPatchesPushedAsColumns) {
  const std::string chain = "graph s {\n  input %x : f32[2,3,23,21]\n  const %w : f32[16,3,7,7] = " +
                            hex_list(random_values(16 * 3 * 49, 9)) +
                            "\n  input %b : f32[16]\n  const %s : f32[1] = [0xbf000000]\n"
                            "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[3,3,3,3], strides=[2,2]} : "
                            "f32[2,16,12,11] #1\n  %r = relu(%c) : f32[2,16,12,11] #2\n"
                            "  %a = sub(%s, %r) : f32[2,16,12,11] #3\n  output %a\n}\n";
  const std::string narrow = conv_ir("[1,3,9,13]", "[5,3,3,3]", "[1,5,9,7]",
                                     "dilations=[1,1], groups=1, pads=[2,1,0,1], strides=[1,2]", "[5]");
  const std::string split = conv_ir("[3,3,6,5]", "[8,3,3,3]", "[3,8,6,5]",
                                    "dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]");
  for (auto p : kPolicies)
    for (int cores : {1, 2, 3}) {
      SCOPED_TRACE(cores);
      expect_bit_exact(chain, p, target(2, 128, 128), 1, cores);
      expect_bit_exact(narrow, p, target(1, 32, 32), 2, cores);
      expect_bit_exact(split, p, target(2, 16, 16), 3, cores);  // tap 5's channels: k 15 | 16, 17
      expect_bit_exact(narrow, p, target(2, 32, 32), 4, cores);  // one chunk: tiles take turns on the MXUs
    }
  {
    // With a chunk and two MXUs the tiles alternate between them.
    LowerOptions lo;
    lo.target = target(2, 32, 32);
    int64_t per_mxu[2] = {0, 0};
    for (const auto& in : lower_graph(parse_graph(narrow, "test.ir"), lo).bundle.cores.at(0).code)
      if (in.op == isa::Op::kMpushT) ++per_mxu[in.a];
    EXPECT_GT(per_mxu[0], 0);
    EXPECT_GT(per_mxu[1], 0);
  }
  for (auto p : kPolicies) {
    LowerOptions lo;
    lo.target = target(2, 128, 128);
    lo.policy = p;
    lo.cores = 2;
    const LowerResult lr = lower_graph(parse_graph(chain, "test.ir"), lo);
    const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
    int64_t loaded = 0, stored = 0, pushed = 0;
    for (const auto& core : lr.bundle.cores)
      for (const auto& in : core.code) {
        if (in.op_id != 1) continue;
        pushed += in.op == isa::Op::kMpushT;
        EXPECT_NE(in.op, isa::Op::kMpush);
        if (in.op != isa::Op::kDma) continue;
        EXPECT_FALSE(in.src.space == isa::Space::kHbm && in.dst.space == isa::Space::kHbm);
        int64_t bytes = in.imm;
        for (int d = 0; d < in.ndims; ++d) bytes *= in.dims[d].count;
        if (in.src.space == isa::Space::kHbm) loaded += bytes;
        if (in.dst.space == isa::Space::kHbm) stored += bytes;
      }
    // 2 images x 12 x 11 pixels in tiles of 128 (bands of whole rows), 2 chunks a group of 8.
    EXPECT_GE(pushed, 2 * 2 * 12 * 11 / 8);
    EXPECT_EQ(stored, 2 * 16 * 12 * 11 * e);
    // The input once (a band's rows, overlapping by the kernel's 7 - 2), the weights
    // and bias on each core.
    EXPECT_LE(loaded, 2 * 3 * 23 * 21 * e * 2 + 2 * (2 * 16 * 128 * e + 16 * 4));
  }
}

TEST(LowerMovement, Transpose) {
  for (auto p : kPolicies) {
    expect_bit_exact("graph t {\n  input %x : f32[5,7]\n  %y = transpose(%x) {perm=[1,0]} : f32[7,5] #0\n"
                     "  output %y\n}\n", p, target(1, 128, 128));
    expect_bit_exact("graph t {\n  input %x : f32[2,3,4,5,6]\n  %y = transpose(%x) {perm=[3,0,4,2,1]} : "
                     "f32[5,2,6,4,3] #0\n  output %y\n}\n", p, target(1, 128, 128));
    // Axes that stay adjacent and in order move as one, size-1 axes drop out, and a
    // trailing axis contiguous at both ends is the DMA's run.
    const char* cases[][3] = {
        {"[1,6,3,5]", "[0,2,1,3]", "[1,3,6,5]"},          // BERT's head split: run of 5
        {"[2,3,4,5]", "[1,0,2,3]", "[3,2,4,5]"},          // a run of 4 x 5
        {"[2,3,4]", "[0,1,2]", "[2,3,4]"},                // identity: one run
        {"[4,1,6]", "[2,1,0]", "[6,1,4]"},                // a size-1 axis
        {"[1,1,7]", "[1,0,2]", "[1,1,7]"},                // nothing moves
        {"[2,3,4,5,6,7]", "[4,5,0,1,2,3]", "[6,7,2,3,4,5]"},  // two merged groups swap
        {"[3,2,2,2,3]", "[4,1,0,3,2]", "[3,2,3,2,2]"},    // four axes and more left
    };
    for (const auto& c : cases)
      expect_bit_exact(std::string("graph t {\n  input %x : f32") + c[0] + "\n  %y = transpose(%x) {perm=" + c[1] +
                           "} : f32" + c[2] + " #0\n  output %y\n}\n",
                       p, target(1, 128, 128));
  }
}

// The transfers a transpose becomes. BERT-base's head split [1,128,12,64] perm
// [0,2,1,3] moves rows of 64 elements (256 B) between the two layouts, as one DMA
// of 12 x 128 runs; it was 128 x 12 x 64 runs of one element each. Its K^T
// [1,12,128,64] perm [0,1,3,2] has one-element runs: it goes through VMEM, one
// contiguous load and one store in HBM and the element runs VMEM -> VMEM.
TEST(LowerMovement, TransposeMovesContiguousRowsAsOneRun) {
  auto dmas_of = [](const std::string& ir) {
    LowerOptions lo;
    lo.target = target(1, 128, 128);
    std::vector<isa::Instr> out;
    const LowerResult r = lower_graph(parse_graph(ir, "test.ir"), lo);
    for (const auto& in : r.bundle.cores.at(0).code)
      if (in.op == isa::Op::kDma && in.op_id == 0) out.push_back(in);
    return out;
  };
  const auto split = dmas_of("graph t {\n  input %x : f32[1,128,12,64]\n  %y = transpose(%x) {perm=[0,2,1,3]} : "
                             "f32[1,12,128,64] #0\n  output %y\n}\n");
  ASSERT_EQ(split.size(), 1u);
  EXPECT_EQ(split[0].imm, 64 * 4);
  ASSERT_EQ(split[0].ndims, 2);
  // Innermost first: 128 sequence positions (12 x 64 elements apart in x, 64 in y),
  // then 12 heads (64 apart in x, 128 x 64 in y).
  EXPECT_EQ(split[0].dims[0], (isa::DmaDim{128, 12 * 64 * 4, 64 * 4}));
  EXPECT_EQ(split[0].dims[1], (isa::DmaDim{12, 64 * 4, 128 * 64 * 4}));
  const auto kt = dmas_of("graph t {\n  input %x : f32[1,12,128,64]\n  %y = transpose(%x) {perm=[0,1,3,2]} : "
                          "f32[1,12,64,128] #0\n  output %y\n}\n");
  // Through VMEM in two blocks of 6 heads (the heads axis is outermost at both ends),
  // double-buffered: each a load, the element runs VMEM -> VMEM and a store.
  ASSERT_EQ(kt.size(), 6u);
  const int32_t bytes = 6 * 128 * 64 * 4;
  int loads = 0, runs = 0, stores = 0;
  for (const isa::Instr& d : kt) {
    if (d.src.space == isa::Space::kHbm && d.dst.space == isa::Space::kVmem) {
      ++loads;
      EXPECT_EQ(d.imm, bytes);
    } else if (d.src.space == isa::Space::kVmem && d.dst.space == isa::Space::kVmem) {
      ++runs;
      EXPECT_EQ(d.imm, 4);
      EXPECT_EQ(d.ndims, 3);
    } else {
      ++stores;
      EXPECT_EQ(d.dst.space, isa::Space::kHbm);
      EXPECT_EQ(d.imm, bytes);
    }
  }
  EXPECT_EQ(loads, 2);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(stores, 2);
}

// A transpose staged through VMEM in blocks of its outermost axis when the whole
// does not fit, and straight HBM -> HBM when not even one block does or the input
// does not share that axis: the same values every way.
TEST(LowerMovement, TransposeBlocksToFitVmem) {
  const std::string shared = "graph t {\n  input %x : f32[6,40,50]\n  %y = transpose(%x) {perm=[0,2,1]} : "
                             "f32[6,50,40] #0\n  output %y\n}\n";
  const std::string moved = "graph t {\n  input %x : f32[6,40,50]\n  %y = transpose(%x) {perm=[2,0,1]} : "
                            "f32[50,6,40] #0\n  output %y\n}\n";
  for (uint64_t vmem : {uint64_t{16} << 20, uint64_t{49152}, uint64_t{40960}, uint64_t{8192}}) {
    isa::Target t = target(1, 128, 128);
    t.vmem_bytes = vmem;
    SCOPED_TRACE("VMEM " + std::to_string(vmem));
    expect_bit_exact(shared, PrecisionPolicy::kDefault, t);
    expect_bit_exact(moved, PrecisionPolicy::kDefault, t);
  }
  // 48 KiB holds six 8000-byte slices: three buffers each way of one slice, six blocks
  // in a ring of three (gathered_stream), each a load, one VMEM gather and a store.
  LowerOptions lo;
  lo.target = target(1, 128, 128);
  lo.target.vmem_bytes = 49152;
  int loads = 0;
  const LowerResult r = lower_graph(parse_graph(shared, "test.ir"), lo);
  for (const auto& in : r.bundle.cores.at(0).code)
    if (in.op == isa::Op::kDma && in.op_id == 0 && in.src.space == isa::Space::kHbm) {
      ++loads;
      EXPECT_EQ(in.imm, 40 * 50 * 4);
    }
  EXPECT_EQ(loads, 6);
}

// A maxpool's bands of planes hold several whole images where each core keeps four
// bands or more (its tap gathers hold a DMA engine for the on-chip latency whatever
// their size): 2 images a band for 9 on 1 core (the last band one image), 18 on 2
// cores; a 3x3 stride-2 window with padding and a 2x2 one. Bit-exact, and the input
// comes in as that many loads.
TEST(LowerRows, MaxpoolBandsOfSeveralImages) {
  struct Case {
    int64_t nb, ch, h, w;
    const char* attrs;
    int cores;
    int64_t loads;  // input loads a band (all cores)
  };
  const Case cases[] = {{9, 5, 6, 7, "kernel=[3,3], pads=[1,1,1,1], strides=[2,2]", 1, 5},
                        {18, 4, 8, 8, "kernel=[2,2], pads=[0,0,0,0], strides=[2,2]", 2, 9},
                        {3, 4, 8, 8, "kernel=[2,2], pads=[0,0,0,0], strides=[2,2]", 1, 3}};
  for (const Case& c : cases) {
    std::ostringstream ir;
    ir << "graph p {\n  input %x : f32[" << c.nb << "," << c.ch << "," << c.h << "," << c.w << "]\n  %y = maxpool(%x) {"
       << c.attrs << "} : f32[1] #0\n  output %y\n}\n";
    Graph g = parse_graph(ir.str(), "p.ir");
    std::vector<TensorType> ops = {g.inputs[0].type};
    g.nodes[0].type = infer_type(g.nodes[0], ops);
    const std::string text = print_graph(g);
    for (auto p : kPolicies) expect_bit_exact(text, p, target(1, 128, 128), 1, c.cores);
    const LowerResult r = lower_with(text, PrecisionPolicy::kDefault, target(1, 128, 128), c.cores);
    int64_t loads = 0;
    for (const auto& core : r.bundle.cores)
      for (const auto& in : core.code)
        loads += in.op == isa::Op::kDma && in.src.space == isa::Space::kHbm && in.dst.space == isa::Space::kVmem;
    EXPECT_EQ(loads, c.loads) << text;
  }
}

TEST(LowerRows, Pooling) {
  const char* cases[][3] = {
      {"maxpool", "[1,3,8,8]", "kernel=[3,3], pads=[1,1,1,1], strides=[2,2]"},
      {"maxpool", "[1,21,20,19]", "kernel=[3,3], pads=[1,1,1,1], strides=[2,2]"},
      {"maxpool", "[2,2,7,6]", "kernel=[2,3], pads=[0,0,0,0], strides=[1,2]"},
      {"avgpool", "[1,3,8,8]", "count_include_pad=1, kernel=[3,3], pads=[1,1,1,1], strides=[2,2]"},
      {"avgpool", "[2,2,7,6]", "count_include_pad=0, kernel=[2,2], pads=[0,0,0,0], strides=[2,2]"}};
  for (auto p : kPolicies)
    for (const auto& c : cases) {
      const Graph g = parse_graph(std::string("graph p {\n  input %x : f32") + c[1] + "\n  %y = " + c[0] + "(%x) {" +
                                  c[2] + "} : f32[1] #0\n  output %y\n}\n", "p.ir");
      // The output shape is whatever the IR infers; print it back with it.
      Node n = g.nodes[0];
      std::vector<TensorType> ops = {g.inputs[0].type};
      const std::string shape = shape_str(infer_type(n, ops).shape);
      // On two cores the channel bands go round robin (race checker on).
      for (int cores : {1, 2})
        expect_bit_exact(std::string("graph p {\n  input %x : f32") + c[1] + "\n  %y = " + c[0] + "(%x) {" + c[2] +
                             "} : f32" + shape + " #0\n  output %y\n}\n",
                         p, target(1, 128, 128), 1, cores);
    }
  // A maxpool's taps are reduced in VMEM: the only stores to HBM are its output's
  // (21 channels of 10 x 10, several tiles a band with a ragged last one).
  for (int cores : {1, 2}) {
    LowerOptions lo;
    lo.target = target(1, 128, 128);
    lo.cores = cores;
    const LowerResult r = lower_graph(
        parse_graph("graph p {\n  input %x : f32[1,21,20,19]\n  %y = maxpool(%x) {kernel=[3,3], pads=[1,1,1,1], "
                    "strides=[2,2]} : f32[1,21,10,10] #0\n  output %y\n}\n",
                    "p.ir"),
        lo);
    int64_t stored = 0;
    for (const auto& core : r.bundle.cores)
      for (const auto& in : core.code)
        if (in.op == isa::Op::kDma && in.dst.space == isa::Space::kHbm) stored += in.imm;
    EXPECT_EQ(stored, 21 * 10 * 10 * 4);
  }
}

// A maxpool of stride 1 or 2 on planes large enough runs as a depthwise conv does
// (docs/codegen.md "Depthwise conv2d"): each tap a shifted load of a padded plane
// (-inf in the padding) or of one of its stride phases, max for multiply-add.
// Bit-exact against evaluate() with padding, strides 1 and 2, a 2x2 window, several
// images, channel groups and cores; at stride 1 no tap is gathered (no VMEM -> VMEM
// DMA), and HBM sees the input (with bands' edge rows) and the output once.
TEST(LowerRows, MaxpoolAsShiftedWindows) {
  const char* cases[][3] = {{"[1,10,50,46]", "kernel=[3,3], pads=[1,1,1,1], strides=[2,2]", "[1,10,25,23]"},
                            {"[2,11,9,13]", "kernel=[3,3], pads=[1,1,1,1], strides=[1,1]", "[2,11,9,13]"},
                            {"[1,9,48,48]", "kernel=[2,2], pads=[0,0,0,0], strides=[2,2]", "[1,9,24,24]"}};
  auto ir = [](const char* const* c) {
    return std::string("graph p {\n  input %x : f32") + c[0] + "\n  %y = maxpool(%x) {" + c[1] + "} : f32" + c[2] +
           " #0\n  output %y\n}\n";
  };
  for (auto p : kPolicies)
    for (const auto& c : cases)
      for (int cores : {1, 2}) expect_bit_exact(ir(c), p, target(1, 128, 128), 1, cores);
  for (int cores : {1, 2}) {
    LowerOptions lo;
    lo.target = target(1, 128, 128);
    lo.cores = cores;
    int64_t loaded = 0, stored = 0, gathers = 0;
    for (const auto& core : lower_graph(parse_graph(ir(cases[1]), "p.ir"), lo).bundle.cores)
      for (const auto& in : core.code) {
        if (in.op != isa::Op::kDma) continue;
        int64_t bytes = in.imm;
        for (int d = 0; d < in.ndims; ++d) bytes *= in.dims[d].count;
        gathers += in.src.space == isa::Space::kVmem && in.dst.space == isa::Space::kVmem;
        if (in.src.space == isa::Space::kHbm) loaded += bytes;
        if (in.dst.space == isa::Space::kHbm) stored += bytes;
      }
    EXPECT_EQ(gathers, 0);
    // (Bands of rows read their neighbours' edge rows too.)
    EXPECT_GE(loaded, 2 * 11 * 9 * 13 * 4);
    EXPECT_LE(loaded, 2 * 2 * 11 * 9 * 13 * 4);
    EXPECT_EQ(stored, 2 * 11 * 9 * 13 * 4);
  }
}

TEST(LowerGraph, WorkSplitAcrossCores) {
  const std::string ir =
      "graph mlp {\n  input %x : f32[40,70]\n  const %w : f32[70,24] = " + hex_list(random_values(70 * 24, 7)) +
      "\n  const %g : f32[24] = " + hex_list(random_values(24, 8)) + "\n  const %b : f32[24] = " +
      hex_list(random_values(24, 9)) +
      "\n  %h = matmul(%x, %w) {} : f32[40,24] #0\n  %r = gelu(%h) {} : f32[40,24] #1\n"
      "  %n = layernorm(%r, %g, %b) {axis=1, epsilon=1e-05} : f32[40,24] #2\n"
      "  %s = softmax(%n) {axis=1} : f32[40,24] #3\n  %a = add(%s, %n) {} : f32[40,24] #4\n  output %a\n}\n";
  for (auto p : kPolicies)
    for (int cores : {2, 3}) expect_bit_exact(ir, p, target(2, 16, 16), 1, cores);
  for (int cores : {2, 4})
    expect_bit_exact(conv_ir("[2,6,9,8]", "[5,6,5,5]", "[2,5,4,4]",
                             "dilations=[1,1], groups=1, pads=[2,1,1,2], strides=[2,2]", "[5]"),
                     PrecisionPolicy::kDefault, target(1, 32, 32), 1, cores);
}

// The bundle's op FLOPs are the model's, 2 per multiply-accumulate of the unpadded
// operands (the closed forms below), not the MXU's padded tiles: the same on any
// array size and however many cores share the work; ops off the MXU have none.
TEST(LowerGraph, OpFlopsAreTheModelsNotThePaddedTiles) {
  auto flops_of = [](const std::string& ir, const isa::Target& t, int cores = 1) {
    LowerOptions lo;
    lo.target = t;
    lo.cores = cores;
    return lower_graph(parse_graph(ir, "test.ir"), lo).bundle.op_flops;
  };
  using Flops = std::map<int32_t, uint64_t>;
  for (const isa::Target& t : {target(1, 128, 128), target(4, 32, 32), target(2, 8, 8)}) {
    EXPECT_EQ(flops_of(matmul_ir(13, 200, 70), t), (Flops{{0, 2ull * 13 * 200 * 70}}));
    EXPECT_EQ(flops_of(matmul_ir(9, 45, 37, "trans_a=1", true, false), t), (Flops{{0, 2ull * 9 * 45 * 37}}));
    EXPECT_EQ(flops_of(matmul_ir(9, 45, 37, "beta=2, trans_b=1", false, true, "[9,37]"), t),
              (Flops{{0, 2ull * 9 * 45 * 37}}));
  }
  // Batch broadcast: [3,1,6,9] x [2,9,5] is 3 x 2 products of 6 x 9 by 9 x 5.
  EXPECT_EQ(flops_of("graph mm {\n  input %a : f32[3,1,6,9]\n  input %b : f32[2,9,5]\n"
                     "  %y = matmul(%a, %b) {} : f32[3,2,6,5] #4\n  output %y\n}\n",
                     target(2, 8, 8)),
            (Flops{{4, 2ull * 3 * 2 * 6 * 9 * 5}}));
  // Convolutions: output elements x taps x input channels of the group.
  EXPECT_EQ(flops_of(conv_ir("[2,6,9,8]", "[5,6,5,5]", "[2,5,4,4]",
                             "dilations=[1,1], groups=1, pads=[2,1,1,2], strides=[2,2]"),
                     target(2, 32, 32)),
            (Flops{{1, 2ull * (2 * 5 * 4 * 4) * (6 * 5 * 5)}}));
  EXPECT_EQ(flops_of(conv_ir("[2,6,5,5]", "[4,3,3,3]", "[2,4,5,5]",
                             "dilations=[1,1], groups=2, pads=[1,1,1,1], strides=[1,1]", "[4]"),
                     target(1, 16, 16)),
            (Flops{{1, 2ull * (2 * 4 * 5 * 5) * (3 * 3 * 3)}}));
  EXPECT_EQ(flops_of(conv_ir("[1,5,7,7]", "[5,1,3,3]", "[1,5,4,4]",
                             "dilations=[1,1], groups=5, pads=[1,1,1,1], strides=[2,2]", "[5]"),
                     target(1, 8, 8)),
            (Flops{{1, 2ull * (1 * 5 * 4 * 4) * (1 * 3 * 3)}}));
  // Several ops, the work split over cores: only the matmul has FLOPs, counted once.
  const std::string mlp = "graph mlp {\n  input %x : f32[40,70]\n  input %w : f32[70,24]\n"
                          "  %h = matmul(%x, %w) {} : f32[40,24] #0\n  %r = gelu(%h) {} : f32[40,24] #1\n"
                          "  %s = softmax(%r) {axis=1} : f32[40,24] #3\n  output %s\n}\n";
  for (int cores : {1, 3}) EXPECT_EQ(flops_of(mlp, target(2, 16, 16), cores), (Flops{{0, 2ull * 40 * 70 * 24}}));
}

TEST(LowerGraph, UnsupportedOpIsAClearError) {
  LowerOptions lo;
  // A graph larger than the target's HBM.
  try {
    LowerOptions small = lo;
    small.target.hbm_bytes = 1 << 20;
    lower_graph(parse_graph(unary_ir("relu", "[1024,1024]"), "t.ir"), small);
    FAIL() << "an 8 MiB graph lowered for a 1 MiB HBM";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of HBM, the target has 1048576"), std::string::npos) << e.what();
  }
  // A softmax axis too long for VMEM's tiles.
  try {
    lower_graph(parse_graph(unary_ir("softmax", "[2,300000]", "axis=1"), "t.ir"), lo);
    FAIL() << "a 300000-element softmax row lowered without an error";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("too long for VMEM"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpusim::compiler

// The performance schedule of the lowering against the graph reference, bit for bit
// on the functional reference with the race checker: the matmul pipeline's shapes
// (K chunks split over MXUs, several column tiles per pass, ragged passes, several
// row units per core, column bands and the streamed-weight fallback forced by small
// VMEM, batches, the next unit's LHS prefetch), fused epilogues and elementwise
// chains (and that the fused members really left no code of their own), VMEM-staged
// im2col/pooling gathers.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <tuple>

#include "compiler/compiler.h"
#include "compiler/lower/lower.h"
#include "tests/compiler/lower/lowered.h"
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

isa::Target target(uint32_t mxus, uint32_t rows, uint32_t cols, uint64_t vmem = 16ull << 20) {
  isa::Target t;
  t.mxus_per_core = mxus;
  t.mxu_rows = rows;
  t.mxu_cols = cols;
  t.fifo_rows = 128;
  t.vmem_bytes = vmem;
  t.hbm_bytes = 256ull << 20;
  return t;
}

// Lowers `ir`, runs it on the functional reference (race checker on) and compares
// every output with evaluate(); returns the assembly.
std::string expect_bit_exact(const std::string& ir, PrecisionPolicy policy, const isa::Target& t, int cores = 1,
                             bool fuse = true) {
  SCOPED_TRACE(std::string("policy ") + num::precision_policy_name(policy) + ", " + std::to_string(t.mxus_per_core) +
               " MXUs of " + std::to_string(t.mxu_rows) + "x" + std::to_string(t.mxu_cols) + ", VMEM " +
               std::to_string(t.vmem_bytes) + ", cores " + std::to_string(cores) + (fuse ? "" : ", no fusion") +
               "\n" + ir.substr(0, 600));
  const Graph g = parse_graph(ir, "test.ir");
  std::map<std::string, HostTensor> inputs;
  uint32_t seed = 11;
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
  lo.fuse = fuse;
  const LowerResult lr = lower_graph(g, lo);
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
  EXPECT_TRUE(rr.ok()) << rr.message;
  if (!rr.ok()) return lr.assembly;
  for (const auto& e : lr.bundle.io) {
    if (e.kind != isa::IoKind::kOutput) continue;
    const std::vector<uint8_t> dense = exec::read_tensor(interp.machine(), e);
    const HostTensor& want = expected.at(e.name);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.f.size(); ++i) {
      uint32_t got = 0;
      if (e.dtype == isa::Dtype::kBf16) got = bits(num::bf16_to_fp32(static_cast<uint16_t>(dense[2 * i] | dense[2 * i + 1] << 8)));
      else std::memcpy(&got, &dense[4 * i], 4);
      if (got != bits(want.f[i]) && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << e.name << ": " << bad << " of " << want.f.size() << " elements differ; first at " << first;
  }
  return lr.assembly;
}

std::string matmul_ir(int64_t M, int64_t K, int64_t N, const std::string& attrs = "", const std::string& bias = "",
                      const std::string& batch = "") {
  std::ostringstream s;
  s << "graph mm {\n  input %a : f32[" << batch << M << "," << K << "]\n  input %b : f32[" << K << "," << N << "]\n";
  if (!bias.empty()) s << "  input %c : f32" << bias << "\n";
  s << "  %y = matmul(%a, %b" << (bias.empty() ? "" : ", %c") << ") {" << attrs << "} : f32[" << batch << M << ","
    << N << "] #0\n  output %y\n}\n";
  return s.str();
}

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// The K-streamed tiles' comment on each core that runs them: its tiles and how many
// LHS row bands of them it fetches (tiles with the tile before's rows of one A reuse them).
constexpr const char* kTilesMark = "# k-streamed tiles: ";
std::vector<std::pair<int, int>> tiled_cores(const std::string& as) {
  std::vector<std::pair<int, int>> r;
  for (size_t at = as.find(kTilesMark); at != std::string::npos; at = as.find(kTilesMark, at + 1)) {
    int tiles = 0, rows = 0;
    std::sscanf(as.c_str() + at + std::strlen(kTilesMark), "%d tiles, %d lhs rows", &tiles, &rows);
    r.push_back({tiles, rows});
  }
  return r;
}

// K split over 1..4 MXUs, 1..4 column tiles per pass, ragged last pass and tile.
TEST(LowerSchedule, MatmulPassShapes) {
  for (auto p : kPolicies) {
    expect_bit_exact(matmul_ir(40, 100, 70), p, target(4, 16, 16));     // 7 chunks: passes of 4 + 3
    expect_bit_exact(matmul_ir(17, 48, 130), p, target(4, 16, 16));     // 3 chunks, 9 column tiles
    expect_bit_exact(matmul_ir(24, 200, 24), p, target(2, 32, 32));     // 7 chunks on 2 MXUs
    expect_bit_exact(matmul_ir(9, 30, 20), p, target(3, 8, 8));         // 3 MXUs
    expect_bit_exact(matmul_ir(300, 260, 140), p, target(2, 128, 128)); // full-width tiles, ragged everything
  }
}

// Small VMEM: several row units per core, narrow column bands (LHS read once per
// band), and at the smallest the streamed-weight ring.
TEST(LowerSchedule, MatmulBandsUnitsAndStreamedWeights) {
  for (auto p : kPolicies) {
    for (uint64_t vmem : {1ull << 20, 448ull << 10})
      expect_bit_exact(matmul_ir(200, 384, 384), p, target(2, 128, 128, vmem));
    for (uint64_t vmem : {256ull << 10, 96ull << 10})
      expect_bit_exact(matmul_ir(72, 96, 100), p, target(4, 16, 16, vmem));
    // 128 chunks of 16 rows: one column group's weights do not fit, they stream.
    expect_bit_exact(matmul_ir(16, 2048, 40), p, target(4, 16, 16, 256ull << 10));
  }
}

TEST(LowerSchedule, MatmulEpilogueOperandsBatchesAndCores) {
  for (auto p : kPolicies) {
    const isa::Target t = target(2, 16, 16);
    expect_bit_exact(matmul_ir(20, 40, 36, "", "[36]"), p, t);                         // row-vector bias
    expect_bit_exact(matmul_ir(20, 40, 36, "alpha=0.5, beta=2", "[20,36]"), p, t);      // full C
    expect_bit_exact(matmul_ir(20, 40, 36, "", "[1]"), p, t);                          // scalar bias
    expect_bit_exact("graph t {\n  input %a : f32[40,20]\n  input %b : f32[36,40]\n"
                     "  %y = matmul(%a, %b) {trans_a=1, trans_b=1} : f32[20,36] #0\n  output %y\n}\n",
                     p, t);
    expect_bit_exact(matmul_ir(20, 40, 36, "", "", "3,"), p, t, 2);                     // batches on 2 cores
    expect_bit_exact(matmul_ir(300, 64, 200), p, target(2, 128, 128), 2);
  }
}

// The next unit's first LHS band fetched (f13) during the previous unit of its core,
// once that unit's last column group is past band 0: it needs more than one LHS band
// (K > 1024 columns in f32, > 2048 in bf16, 4 KiB runs) and several row units per
// core (VMEM small enough to cut the rows).
// Both A layouts, ragged M, K and N. A run-time B^T too large to transpose through
// this VMEM first (its weight loads read B^T's columns) keeps the matmul on this
// resident schedule: without it these shapes take the K-streamed tiles (below),
// which use f13 for something else (so did a full C operand until the tiles took
// those too).
TEST(LowerSchedule, MatmulNextUnitLhsPrefetch) {
  for (auto p : kPolicies) {
    const int64_t M = 61, K = p == PrecisionPolicy::kBf16 ? 2060 : 1030, N = 41;  // B: 169 KB, twice > VMEM
    auto graph = [&](bool trans_a) {
      std::ostringstream g;
      g << "graph t {\n  input %a : f32[" << (trans_a ? K : M) << "," << (trans_a ? M : K) << "]\n  input %b : f32["
        << N << "," << K << "]\n  input %c : f32[" << M << "," << N << "]\n  %y = matmul(%a, %b, %c) {trans_b=1"
        << (trans_a ? ", trans_a=1" : "") << "} : f32[" << M << "," << N << "] #0\n  output %y\n}\n";
      return g.str();
    };
    for (const std::string& ir : {graph(false), graph(true)})
      for (int cores : {1, 2}) {
        const std::string as = expect_bit_exact(ir, p, target(2, 16, 16, 320ull << 10), cores);
        EXPECT_TRUE(tiled_cores(as).empty()) << "took the K-streamed tiles";
        const int fetches = count_of(as, ", flag=f13\n"), waits = count_of(as, "  wait f13, ");
        EXPECT_GT(fetches, 0) << "no next-unit LHS prefetch: policy " << num::precision_policy_name(p) << ", cores "
                              << cores << "\n" << ir;
        EXPECT_EQ(waits, fetches) << "every prefetch is waited on by the unit it was fetched for";
      }
  }
}

// K-streamed tiles (docs/codegen.md): VMEM too small for a unit's LHS rows and a
// band of weights together, so the output is cut into tiles whose partial sums stay
// in VMEM while K streams through LHS band slots (f13/f14) and weight panels. Ragged
// M, K and N, A and A^T, 1 and 2 cores, narrow (16x16) and full-width (128x128)
// MXUs, a row-vector bias with a fused relu, batches; bit-exact with the race checker.
// The marker: the tiles' comment; each band slot fetched (f13, f14) is waited on.
TEST(LowerSchedule, MatmulKStreamedTiles) {
  auto check = [](const std::string& ir, PrecisionPolicy p, const isa::Target& t, int cores) {
    const std::string as = expect_bit_exact(ir, p, t, cores);
    EXPECT_FALSE(tiled_cores(as).empty()) << "not the K-streamed schedule: cores " << cores << "\n" << ir;
    EXPECT_GT(count_of(as, ", flag=f13\n"), 0) << "no LHS band fetched";
    for (const char* f : {"f13", "f14"})
      EXPECT_EQ(count_of(as, std::string(", flag=") + f + "\n") > 0, count_of(as, std::string("  wait ") + f + ", ") > 0)
          << "a band fetched on " << f << " is never waited on";
  };
  for (auto p : kPolicies) {
    const int64_t M = 61, K = p == PrecisionPolicy::kBf16 ? 2060 : 1030, N = 37;
    std::ostringstream ta;
    ta << "graph t {\n  input %a : f32[" << K << "," << M << "]\n  input %b : f32[" << K << "," << N
       << "]\n  %y = matmul(%a, %b) {trans_a=1} : f32[" << M << "," << N << "] #0\n  output %y\n}\n";
    for (const std::string& ir : {matmul_ir(M, K, N), ta.str()})
      for (int cores : {1, 2}) check(ir, p, target(2, 16, 16, 192ull << 10), cores);
    // Full-width tiles: several tiles across N and M per core, ragged in all three.
    for (int cores : {1, 2}) check(matmul_ir(300, 600, 400), p, target(2, 128, 128, 1ull << 20), cores);
    // A bias row with a fused relu in the epilogue, and batches over 2 cores.
    std::ostringstream fused;
    fused << "graph f {\n  input %a : f32[45," << K << "]\n  input %b : f32[" << K << ",50]\n  input %c : f32[50]\n"
          << "  %h = matmul(%a, %b) : f32[45,50] #0\n  %hb = add(%h, %c) : f32[45,50] #1\n"
          << "  %r = relu(%hb) : f32[45,50] #2\n  output %r\n}\n";
    check(fused.str(), p, target(2, 16, 16, 192ull << 10), 1);
    check(matmul_ir(30, K, 50, "", "", "3,"), p, target(2, 16, 16, 192ull << 10), 2);
  }
}

// Fewer rows than columns (a batch-1 classifier, a 7 x 7 conv): the cores take bands of
// columns instead of rows, so each pushes (and reads) only its band's weights: over the
// cores every weight row is pushed as often as on one core. Bit-exact with the race
// checker (cores store interleaved column bands of the same rows), 2 and 3 cores, a
// GEMV with a bias among them. Weight-bound column bands take the K-streamed tiles
// (their panels arrive while the MXUs push the ones before), each core's tiles one band
// of rows fetched once.
TEST(LowerSchedule, MatmulFewRowsSplitsColumnsOverCores) {
  auto pushes = [](const std::string& ir, PrecisionPolicy p, const isa::Target& t, int cores) {
    const LowerResult lr = lower_with(ir, p, t, cores);
    std::vector<int> per_core;
    for (const auto& core : lr.bundle.cores) {
      per_core.push_back(0);
      for (const auto& in : core.code) per_core.back() += in.op == isa::Op::kMpush;
    }
    return per_core;
  };
  for (auto p : kPolicies) {
    const int64_t K = p == PrecisionPolicy::kBf16 ? 2060 : 1030;
    const std::tuple<std::string, isa::Target, bool> cases[] = {
        {matmul_ir(1, 100, 200, "", "[200]"), target(2, 16, 16), false},
        {matmul_ir(13, 70, 90), target(1, 16, 16), false},
        {matmul_ir(12, K, 300), target(2, 16, 16, 192ull << 10), true},
    };
    for (const auto& [ir, t, streamed] : cases) {
      const int one = pushes(ir, p, t, 1).at(0);
      for (int cores : {2, 3}) {
        const std::string as = expect_bit_exact(ir, p, t, cores);
        const auto tc = tiled_cores(as);
        EXPECT_FALSE(tc.empty()) << "not the K-streamed tiles";
        for (const auto& [tiles, rows] : tc)
          if (!streamed) {
            EXPECT_EQ(rows, 1) << "a core's rows fetched again for its next column tile";
          }
        const std::vector<int> each = pushes(ir, p, t, cores);
        int sum = 0;
        for (int c : each) {
          EXPECT_GT(c, 0) << "a core without a band: cores " << cores << "\n" << ir;
          sum += c;
        }
        EXPECT_EQ(sum, one) << "weights pushed by more than one core: cores " << cores << "\n" << ir;
      }
    }
  }
}

// Columns over the cores with more weight bytes a core than LHS bytes (a batch-1
// classifier, resnet's layer4 convs) take the K-streamed tiles, whose panels arrive
// while the MXUs push the ones before (their LHS band on f13); with the LHS the larger
// (rows close to the columns) the resident plan stays (one unit a core: no f13). Panels on a long
// K take 5 slots (f8..f12), 3 on a short one (no f11, f12). A bias row over every
// whole column tile is one DMA (stride 0 over the 8 rows), the ragged tile another.
// Bit-exact with the race checker on 2 cores, every weight row pushed once over them.
TEST(LowerSchedule, MatmulWeightBoundColumnBandsStreamPanels) {
  auto pushes = [](const LowerResult& lr) {
    int n = 0;
    for (const auto& core : lr.bundle.cores)
      for (const auto& in : core.code) n += in.op == isa::Op::kMpush;
    return n;
  };
  for (auto p : kPolicies) {
    const int64_t K = p == PrecisionPolicy::kBf16 ? 2060 : 1030;
    struct Case {
      std::string ir;
      bool tiles, five_panels;
    };
    const Case cases[] = {
        {matmul_ir(6, K, 300, "", "[300]"), true, true},
        {matmul_ir(6, 100, 300, "", "[300]"), true, false},
        {matmul_ir(200, K, 240), false, true},
    };
    for (const Case& c : cases) {
      const std::string as = expect_bit_exact(c.ir, p, target(2, 16, 16), 2);
      EXPECT_EQ(count_of(as, ", flag=f13\n") > 0, c.tiles) << "the K-streamed tiles' LHS band is f13's\n" << c.ir;
      if (c.tiles) {
        EXPECT_EQ(count_of(as, ", flag=f12\n") > 0, c.five_panels) << "panel slots\n" << c.ir;
      }
      LowerOptions lo;
      lo.target = target(2, 16, 16);
      lo.policy = p;
      lo.cores = 1;
      const Graph g = parse_graph(c.ir, "test.ir");
      const int one = pushes(lower_graph(g, lo));
      lo.cores = 2;
      EXPECT_EQ(pushes(lower_graph(g, lo)), one) << "weights pushed by more than one core\n" << c.ir;
      // The bias tiles: 300 = 18 whole 16-column tiles + 12 columns, on each core's band.
      if (c.ir.find("%c") != std::string::npos) {
        EXPECT_LE(count_of(as, ", dim=8:0:"), 4) << c.ir;
      }
    }
  }
}

// The resident plan's replicated operands (a bias row as a tile a column tile) come in
// behind pass 0's weights and rows, ahead of the later passes' fetches: behind all of
// them the bias, which the first epilogue needs, waited for a DMA engine while the
// MXUs had their first pass (v3 bf16 batch 1: resnet50 344,380 -> 336,019 cycles).
// 1 and 2 cores, bit-exact with the race checker.
TEST(LowerSchedule, ResidentPlanFetchesItsBiasBehindPassZero) {
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      const std::string as = expect_bit_exact(matmul_ir(256, 1024, 128, "", "[128]"), p, target(2, 128, 128), cores);
      ASSERT_TRUE(tiled_cores(as).empty()) << "not the resident plan";
      // Core 0's program: its first fetches on the pass ring's slots f8 and f9, and the
      // bias's DMA (every tile's columns read 8 times: a stride-0 dim).
      const size_t f8 = as.find(", flag=f8\n"), f9 = as.find(", flag=f9\n"), bias = as.find(", dim=8:0:");
      ASSERT_NE(f9, std::string::npos) << "one pass";
      ASSERT_NE(bias, std::string::npos);
      EXPECT_LT(f8, bias) << "the bias ahead of pass 0's fetch";
      EXPECT_LT(bias, f9) << "the bias behind pass 1's fetch";
    }
}

// The resident plan's units (here of 2048 rows, two a core on 2 cores) store
// their output bands while the next unit's MXU work goes on: a core's next unit starts
// on the output buffer its last store does not read, so no wait on f4 sits between a
// store and the next mmul (each store is waited for before the next is issued, and
// at the end). Bit-exact with the race checker, one and two column groups a unit.
TEST(LowerSchedule, MatmulUnitsDoNotWaitForTheirStores) {
  for (auto p : kPolicies)
    for (int64_t N : {12, 40})
      for (int cores : {1, 2}) {
        // Units of at most 2048 rows: four of them (a batch against one B would be one).
        const std::string ir = matmul_ir(3 * 2048 + 60, 40, N);
        const std::string as = expect_bit_exact(ir, p, target(2, 16, 16), cores);
        int stores = 0;
        for (size_t c = as.find(".core "); c != std::string::npos;) {
          const size_t end = as.find(".core ", c + 1);
          const std::string core = as.substr(c, end == std::string::npos ? std::string::npos : end - c);
          std::vector<size_t> at;
          for (size_t d = core.find(", flag=f4\n"); d != std::string::npos; d = core.find(", flag=f4\n", d + 1))
            at.push_back(d);
          // A wait on f4 with no mmul since the last store is only ever one before
          // another store (a group's column tiles go out one after another).
          for (size_t k = 0; k + 1 < at.size(); ++k) {
            const size_t w = core.find("wait f4,", at[k]);
            ASSERT_NE(w, std::string::npos);
            if (core.substr(at[k], w - at[k]).find("mmul ") != std::string::npos) continue;
            const size_t next_mmul = core.find("mmul ", w);
            EXPECT_LT(at[k + 1], next_mmul)
                << "store " << k << " waited for before more MXU work: cores " << cores << "\n" << ir;
          }
          stores += static_cast<int>(at.size());
          c = end;
        }
        EXPECT_GE(stores, 4) << "every unit stores its band";
      }
}

// Batches of matmuls with a B each (attention's per-head products; a pointwise conv's
// images, 300 rows of W each) take the K-streamed tiles (fetched ahead across a core's
// tiles: f14 in use for attention's LHS of its own each); the images' tiles share one
// W, so each core fetches its rows once for all its images, not once an image. With
// one B for the whole batch they keep the resident plan. Bit-exact, 1 and 2 cores.
// One-pass tiles keep four bands in flight and alternate two output buffers.
TEST(LowerSchedule, MatmulBatchesWithTheirOwnWeightsTakeTheTiles) {
  const std::string own =
      "graph a {\n  input %q : f32[1,6,24,16]\n  input %k : f32[1,6,16,40]\n"
      "  %y = matmul(%q, %k) {} : f32[1,6,24,40] #0\n  output %y\n}\n";
  const std::string shared =
      "graph s {\n  input %q : f32[1,6,24,16]\n  input %k : f32[16,40]\n"
      "  %y = matmul(%q, %k) {} : f32[1,6,24,40] #0\n  output %y\n}\n";
  // A pointwise conv's shape: one W (300 output channels) against each image's X.
  const std::string images =
      "graph p {\n  input %w : f32[300,40]\n  input %x : f32[4,40,50]\n  input %c : f32[300,1]\n"
      "  %y = matmul(%w, %x, %c) {} : f32[4,300,50] #0\n  output %y\n}\n";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      EXPECT_GT(count_of(expect_bit_exact(own, p, target(2, 16, 16), cores), ", flag=f14\n"), 0)
          << "not the K-streamed tiles: cores " << cores;
      const auto tc = tiled_cores(expect_bit_exact(images, p, target(2, 128, 128), cores));
      ASSERT_EQ(tc.size(), static_cast<size_t>(cores)) << "the images' tiles of 300 rows not the K-streamed tiles";
      for (const auto& [tiles, rows] : tc) {
        EXPECT_EQ(tiles, 4 / cores) << "a tile an image";
        EXPECT_EQ(rows, 1) << "W's rows fetched again for another image: cores " << cores;
      }
      EXPECT_TRUE(tiled_cores(expect_bit_exact(shared, p, target(2, 16, 16), cores)).empty())
          << "a shared B left the resident plan: cores " << cores;
    }
  // Tiles of one pass (K = 16, one chunk) take four LHS band slots (f13..f16) and two
  // output buffers (stores on f4 and f5), so a tile neither waits for its own band
  // fetched a tile ahead nor for the store of the tile before it.
  const std::string one_core = expect_bit_exact(own, PrecisionPolicy::kDefault, target(2, 16, 16), 1);
  for (const char* f : {"f13", "f14", "f15", "f16", "f4", "f5"})
    EXPECT_GT(count_of(one_core, std::string(", flag=") + f + "\n"), 0) << f;
}

// Attention's per-head products (Q K^T and scores x V, one-pass tiles of 24 rows, Q
// and V strided views of [2, 24, 6, 16]) on the K-streamed tiles: a core's tiles go
// through one software pipeline (tile 1's first mmul is issued before tile 0's last
// mpop), and move in packs, one DMA an operand with a dimension over the pack's
// tiles. A pack is the largest (at most 8) run of a core's tiles whose operands are
// equally spaced: the views' heads are within a batch element, not across, so 6
// heads on one core and 3 (heads 0, 2, 4) on each of two. Bit-exact with the race
// checker (a pack's flag waited for before any of its slots is read).
TEST(LowerSchedule, OnePassTilesRunThroughOnePipelineInPacks) {
  const std::string x = "[2,24,6,16]", t = "[2,6,24,16]";
  const std::string ir = "graph at {\n  input %q : f32" + x + "\n  input %k : f32" + x + "\n  input %v : f32" + x +
                         "\n  %qt = transpose(%q) {perm=[0,2,1,3]} : f32" + t +
                         " #1\n  %kt = transpose(%k) {perm=[0,2,3,1]} : f32[2,6,16,24] #2\n"
                         "  %s = matmul(%qt, %kt) : f32[2,6,24,24] #3\n  %vt = transpose(%v) {perm=[0,2,1,3]} : f32" +
                         t + " #4\n  %o = matmul(%s, %vt) : f32" + t + " #5\n  output %o\n}\n";
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      const std::string as = expect_bit_exact(ir, p, target(2, 16, 16), cores);
      const int64_t pack = cores == 1 ? 6 : 3;
      // The LHS bands (f13..f15) and outputs (f4, f5) of both products (K's transpose
      // uses f14..f17 too): every DMA a pack's, its last dim the pack's tiles.
      int bands = 0, outs = 0;
      std::istringstream in(as);
      bool product = false;  // in the code of op 3 or 5 (each op's code starts at "  op N")
      for (std::string l; std::getline(in, l);) {
        if (l.rfind("  op ", 0) == 0) product = l == "  op 3" || l == "  op 5";
        if (!product || l.find("  dma ") != 0) continue;
        const bool band = l.find(", flag=f13") != std::string::npos || l.find(", flag=f14") != std::string::npos ||
                          l.find(", flag=f15") != std::string::npos;
        const bool out = l.find(", flag=f4") != std::string::npos || l.find(", flag=f5") != std::string::npos;
        if (!band && !out) continue;
        (band ? bands : outs) += 1;
        const size_t d = l.rfind(", dim=");
        ASSERT_NE(d, std::string::npos) << l;
        EXPECT_EQ(std::stoll(l.substr(d + 6)), pack) << "not a pack of " << pack << " tiles: " << l;
      }
      // 12 tiles a product; Q K^T's 24 columns go out as two runs of 16 (the MXUs'
      // columns), scores x V's 16 as one.
      EXPECT_EQ(bands, 2 * 12 / pack) << "cores " << cores;
      EXPECT_EQ(outs, 3 * 12 / pack) << "cores " << cores;
      // Q K^T's tiles: 3 blocks of 8 rows on 2 MXUs (24 columns), 6 mmuls and 6 mpops a tile.
      const size_t c0 = as.find(".core chip0.core0"), c1 = as.find(".core chip0.core1");
      ASSERT_NE(c0, std::string::npos);
      const std::string core0 = as.substr(c0, c1 == std::string::npos ? std::string::npos : c1 - c0);
      std::vector<size_t> mmuls, mpops;
      for (size_t at = core0.find("  mmul "); at != std::string::npos; at = core0.find("  mmul ", at + 1))
        mmuls.push_back(at);
      for (size_t at = core0.find("  mpop"); at != std::string::npos; at = core0.find("  mpop", at + 1))
        mpops.push_back(at);
      ASSERT_GE(mmuls.size(), 7u);
      ASSERT_GE(mpops.size(), 6u);
      EXPECT_LT(mmuls[6], mpops[5]) << "tile 0's pops drained before tile 1's mmuls: cores " << cores;
    }
}

// The K-streamed tiles' ramped ends: a core's first pass runs in row pieces (its first LHS
// fetch moves only the first piece's rows) and its last pass too (the last tile's output
// goes out per piece). Ragged M, K and N; A^T; 1 and 2 cores (core 1 has one tile, so
// both ends ramp in it); every output row stored exactly once per column tile. Also
// the short-K shapes with >= 512 rows per core that take the tiles since 17c6fa2.
TEST(LowerSchedule, MatmulKStreamedRampedEnds) {
  // Rows moved by the DMAs on flag `f` (the count of their outer dim), in program order.
  auto dma_rows = [](const std::string& as, const std::string& f) {
    std::vector<int64_t> rows;
    std::istringstream in(as);
    for (std::string l; std::getline(in, l);) {
      if (l.find("  dma ") != 0 || l.size() < f.size() || l.compare(l.size() - f.size(), f.size(), f) != 0) continue;
      const size_t d = l.rfind(", dim=");
      rows.push_back(d == std::string::npos ? 1 : std::stoll(l.substr(d + 6)));
    }
    return rows;
  };
  for (auto p : kPolicies) {
    const int64_t M = 520, K = p == PrecisionPolicy::kBf16 ? 2060 : 1030, N = 40;
    std::ostringstream ta;
    ta << "graph t {\n  input %a : f32[" << K << "," << M << "]\n  input %b : f32[" << K << "," << N
       << "]\n  %y = matmul(%a, %b) {trans_a=1} : f32[" << M << "," << N << "] #0\n  output %y\n}\n";
    for (const std::string& ir : {matmul_ir(M, K, N), ta.str()})
      for (int cores : {1, 2}) {
        const std::string as = expect_bit_exact(ir, p, target(2, 16, 16, 7ull << 19), cores);
        ASSERT_GT(count_of(as, ", flag=f14\n"), 0) << "not the K-streamed schedule: cores " << cores << "\n" << ir;
        const std::vector<int64_t> out = dma_rows(as, ", flag=f4");
        int64_t stored = 0;
        for (int64_t r : out) stored += r;
        EXPECT_EQ(stored, M * ((N + 15) / 16)) << "output rows stored per column tile";
        if (cores == 1 && ir == matmul_ir(M, K, N)) {
          const std::vector<int64_t> b13 = dma_rows(as, ", flag=f13"), b14 = dma_rows(as, ", flag=f14");
          ASSERT_FALSE(b13.empty());
          EXPECT_LT(b13.front(), b14.front()) << "the first LHS fetch is not the first piece's rows";
          EXPECT_LE(2 * out.back(), out.front()) << "the last tile's output does not go out per piece";
        }
      }
    // A short K (7 chunks, two passes or more) with >= 512 rows per core fits the
    // resident plan, but takes the tiles (their LHS comes on f13, which the resident
    // plan uses only for a K longer than one band).
    for (int cores : {1, 2}) {
      const std::string as = expect_bit_exact(matmul_ir(520 * cores, 100, 40), p, target(2, 16, 16), cores);
      EXPECT_GT(count_of(as, ", flag=f13\n"), 0) << "not the K-streamed schedule: cores " << cores;
    }
  }
}

// A batch of LHS matrices against one B (BERT's [8, 128, 768] x [768, 3072]) is one
// matmul of all the batch's rows: its weights are pushed as often as for an unbatched
// matmul of as many rows, not once a batch element, on the resident plan and the
// K-streamed tiles. Bit-exact with a bias row, a residual of the batch's shape and a
// value a row broadcast over the batch ([M, 1], which no longer matches the folded
// rows and is materialised at the output's shape), and an A^T batch, which is not
// folded (its rows are not contiguous).
TEST(LowerSchedule, BatchesAgainstOneWeightAreOneMatmul) {
  auto pushes = [](const std::string& as) { return count_of(as, "  mpush "); };
  auto fused = [](int64_t nb, int64_t M, int64_t K, int64_t N) {
    std::ostringstream o;
    o << "graph b {\n  input %a : f32[" << nb << "," << M << "," << K << "]\n  input %b : f32[" << K << "," << N
      << "]\n  input %c : f32[" << N << "]\n  input %r : f32[" << nb << "," << M << "," << N << "]\n  input %q : f32["
      << M << ",1]\n  %h = matmul(%a, %b, %c) : f32[" << nb << "," << M << "," << N << "] #0\n  %s = add(%h, %r) : f32["
      << nb << "," << M << "," << N << "] #1\n  %y = mul(%s, %q) : f32[" << nb << "," << M << "," << N
      << "] #2\n  output %y\n}\n";
    return o.str();
  };
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      SCOPED_TRACE(cores);
      // Resident: 4 x 40 rows, one unit of 160 (or 80 a core).
      const int batched = pushes(expect_bit_exact(matmul_ir(40, 200, 60, "", "", "4,"), p, target(2, 16, 16), cores));
      EXPECT_EQ(batched, pushes(expect_bit_exact(matmul_ir(160, 200, 60), p, target(2, 16, 16), cores)));
      EXPECT_LE(batched, 2 * pushes(lower_with(matmul_ir(40, 200, 60), p, target(2, 16, 16), cores).assembly))
          << "pushed once a batch element";
      expect_bit_exact(fused(4, 40, 200, 60), p, target(2, 16, 16), cores);
      // K-streamed tiles: 4 x 130 rows a core, K of 9 passes.
      const int64_t m = 130 * cores;
      const std::string ks = expect_bit_exact(matmul_ir(m, 260, 40, "", "", "4,"), p, target(2, 16, 16), cores);
      ASSERT_GT(count_of(ks, ", flag=f13\n"), 0) << "not the K-streamed schedule";
      EXPECT_EQ(pushes(ks), pushes(lower_with(matmul_ir(4 * m, 260, 40), p, target(2, 16, 16), cores).assembly));
      expect_bit_exact(fused(4, m, 260, 40), p, target(2, 16, 16), cores);
      std::ostringstream ta;
      ta << "graph t {\n  input %a : f32[3,50,40]\n  input %b : f32[50,30]\n"
         << "  %y = matmul(%a, %b) {trans_a=1} : f32[3,40,30] #0\n  output %y\n}\n";
      expect_bit_exact(ta.str(), p, target(2, 16, 16), cores);
    }
}

// Epilogues run in groups, op by op across the group's blocks and column tiles, so the
// in-order vector unit does not wait out each op's latency (gelu's div and erf) and
// its two ALUs have two chains to take from (a relu's too); a chain takes its operand register and temporary from the
// accumulators of blocks not yet popped, and the chains of one column tile share a
// replicated operand's register. Bit-exact under the race checker on the K-streamed
// tiles and the resident plan, one and two column tiles a pass (2 and 4 MXUs), with a
// bias row (replicated) and with a residual (a tile a chain).
TEST(LowerSchedule, EpiloguesRunInterleaved) {
  auto ir = [](int64_t M, int64_t K, int64_t N, bool residual, const std::string& act) {
    std::ostringstream o;
    o << "graph e {\n  input %a : f32[" << M << "," << K << "]\n  input %b : f32[" << K << "," << N << "]\n  input %c : f32["
      << (residual ? std::to_string(M) + "," : "") << N << "]\n  %h = matmul(%a, %b) : f32[" << M << "," << N
      << "] #0\n  %s = add(%h, %c) : f32[" << M << "," << N << "] #1\n  %y = " << act << "(%s) : f32[" << M << "," << N
      << "] #2\n  output %y\n}\n";
    return o.str();
  };
  // The longest run of consecutive `op` lines.
  auto longest_run = [](const std::string& as, const std::string& op) {
    int best = 0, run = 0;
    std::istringstream in(as);
    for (std::string l; std::getline(in, l);) best = std::max(best, run = l.rfind("  " + op + " ", 0) == 0 ? run + 1 : 0);
    return best;
  };
  for (auto p : kPolicies)
    for (uint32_t mxus : {2u, 4u})
      for (bool residual : {false, true}) {
        SCOPED_TRACE(std::to_string(mxus) + " MXUs, residual " + std::to_string(residual));
        const isa::Target t = target(mxus, 128, 128);
        const std::string ks = expect_bit_exact(ir(600, 520, 300, residual, "gelu"), p, t);
        ASSERT_GT(count_of(ks, ", flag=f13\n"), 0) << "not the K-streamed schedule";
        EXPECT_GE(longest_run(ks, "verf"), 3);
        const std::string res = expect_bit_exact(ir(64, 200, 300, residual, "gelu"), p, t);
        ASSERT_EQ(count_of(res, ", flag=f13\n"), 0) << "not the resident plan";
        EXPECT_GE(longest_run(res, "verf"), 2);
        EXPECT_GE(longest_run(expect_bit_exact(ir(600, 520, 300, residual, "relu"), p, t), "vmax"), 2);
      }
  // A pointwise conv's pipeline whose last steps hold more sigmoid chains than
  // accumulators are left unpopped: the chains beyond go out as the next group (the
  // lowering had indexed past its spare registers and stopped: "vector::_M_range_check"
  // on v4 and v5e for this conv).
  const std::string conv =
      "graph c {\n  input %x : f32[2,64,28,28]\n  input %w : f32[128,64,1,1]\n  input %b : f32[128]\n"
      "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]} : f32[2,128,28,28] #1\n"
      "  %s = sigmoid(%c) : f32[2,128,28,28] #2\n  output %s\n}\n";
  for (auto p : kPolicies)
    for (uint32_t mxus : {2u, 4u}) {
      SCOPED_TRACE(std::to_string(mxus) + " MXUs, conv");
      EXPECT_GE(count_of(expect_bit_exact(conv, p, target(mxus, 128, 128)), "vexp"), 2 * 128 * 784 / 1024);
    }
}

// matmul -> add bias row -> relu -> add residual -> mul scalar const -> clip -> sigmoid,
// all in the matmul's epilogue; the chain's intermediates never get code of their own.
TEST(LowerSchedule, FusedMatmulEpilogue) {
  const std::string ir =
      "graph f {\n  input %x : f32[20,40]\n  input %w : f32[40,36]\n  input %r : f32[20,36]\n"
      "  input %bias : f32[36]\n  const %s : f32[1] = [0x3fc00000]\n"
      "  %h = matmul(%x, %w) : f32[20,36] #0\n  %hb = add(%h, %bias) : f32[20,36] #1\n"
      "  %a = relu(%hb) : f32[20,36] #2\n  %b = add(%r, %a) : f32[20,36] #3\n  %c = mul(%b, %s) : f32[20,36] #4\n"
      "  %d = clip(%c) {max=3, min=-1} : f32[20,36] #5\n  %e = sigmoid(%d) : f32[20,36] #6\n  %f = sub(%r, %e) : f32[20,36] #7\n"
      "  output %f\n}\n";
  for (auto p : kPolicies) {
    const std::string fused = expect_bit_exact(ir, p, target(2, 16, 16));
    for (int id = 1; id <= 7; ++id)
      EXPECT_EQ(fused.find("  op " + std::to_string(id) + "\n"), std::string::npos) << "node #" << id << " not fused";
    const std::string unfused = expect_bit_exact(ir, p, target(2, 16, 16), 1, false);
    EXPECT_NE(unfused.find("  op 7\n"), std::string::npos);
  }
}

// Elementwise chains (broadcast operands, operand order of sub/div), a member whose
// other operand is computed after the root (a feeder, computed in the chain's kernel),
// a member that reads one value twice (runs on its own), and a graph output inside a
// chain.
TEST(LowerSchedule, ElementwiseChains) {
  const std::string ir =
      "graph e {\n  input %x : f32[5,300]\n  input %y : f32[5,300]\n  input %v : f32[300]\n"
      "  %a = add(%x, %y) : f32[5,300] #0\n  %b = relu(%a) : f32[5,300] #1\n  %c = div(%v, %b) : f32[5,300] #2\n"
      "  %t = tanh(%x) : f32[5,300] #3\n  %d = sub(%c, %t) : f32[5,300] #4\n  %e = exp(%d) : f32[5,300] #5\n"
      "  %g = mul(%e, %e) : f32[5,300] #6\n  %h = gelu(%g) : f32[5,300] #7\n  output %h\n  output %e\n}\n";
  for (auto p : kPolicies) {
    const std::string as = expect_bit_exact(ir, p, target(1, 128, 128), 2);
    for (int id : {1, 2, 3, 4, 5, 7}) EXPECT_EQ(as.find("  op " + std::to_string(id) + "\n"), std::string::npos) << id;
    // %d = sub(%c, %t) joins #0's chain with %t = tanh(%x), which comes after #0, as its
    // feeder; %e (a graph output) ends it, as mul(%e, %e) reads one value twice and
    // runs on its own, gelu in its chain.
    EXPECT_NE(as.find("  op 6\n"), std::string::npos);
  }
}

// Convs gathered through VMEM (channels >= 8), with a fused relu and scalar add, both
// staged and (tiny VMEM) direct; maxpool through tap planes.
TEST(LowerSchedule, StagedConvAndPool) {
  const std::string conv =
      "graph c {\n  input %x : f32[2,16,9,11]\n  const %w : f32[12,8,3,3] = " + hex_list(random_values(864, 3)) +
      "\n  const %b : f32[12] = " + hex_list(random_values(12, 4)) +
      "\n  const %s : f32[1] = [0xbf000000]\n"
      "  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=2, pads=[1,2,1,0], strides=[2,1]} : f32[2,12,5,11] #0\n"
      "  %r = relu(%c) : f32[2,12,5,11] #1\n  %a = add(%s, %r) : f32[2,12,5,11] #2\n"
      "  %m = maxpool(%a) {kernel=[3,3], pads=[1,1,1,1], strides=[2,2]} : f32[2,12,3,6] #3\n  output %m\n}\n";
  // Depthwise (one channel per group): the direct HBM gathers.
  const std::string dw =
      "graph d {\n  input %x : f32[1,16,7,7]\n  const %w : f32[16,1,3,3] = " + hex_list(random_values(144, 5)) +
      "\n  %c = conv2d(%x, %w) {dilations=[1,1], groups=16, pads=[1,1,1,1], strides=[1,1]} : f32[1,16,7,7] #0\n"
      "  %r = clip(%c) {max=6, min=0} : f32[1,16,7,7] #1\n  output %r\n}\n";
  for (auto p : kPolicies) {
    expect_bit_exact(dw, p, target(1, 16, 16));
    const std::string as = expect_bit_exact(conv, p, target(2, 16, 16));
    EXPECT_EQ(as.find("  op 2\n"), std::string::npos);
    expect_bit_exact(conv, p, target(2, 16, 16, 96ull << 10));
  }
}

// Undilated staged im2col convs: each band's input rows are laid out once as padded
// NHWC (one VMEM -> VMEM gather), then a kernel row's taps are one contiguous run in
// both, one gather a kernel row: KH + 1 copies a band instead of KH * KW. A 3-channel
// 7 x 7 stride-2 stem and a grouped 3 x 5 conv with asymmetric padding and strides, on
// 1 and 2 cores (bands round robin), bit-exact with the race checker; a dilated conv
// keeps a gather per tap.
TEST(LowerSchedule, Im2colRowsFromPaddedNhwcBands) {
  auto conv = [](const std::string& x, const std::string& w, int64_t wn, const std::string& y,
                 const std::string& attrs) {
    return "graph c {\n  input %x : f32" + x + "\n  const %w : f32" + w + " = " +
           hex_list(random_values(static_cast<size_t>(wn), 3)) + "\n  %c = conv2d(%x, %w) {" + attrs + "} : f32" + y +
           " #0\n  output %c\n}\n";
  };
  struct Case {
    std::string ir;
    int kh, groups;
  };
  const Case cases[] = {
      {conv("[1,3,23,21]", "[8,3,7,7]", 8 * 3 * 49, "[1,8,12,11]",
            "dilations=[1,1], groups=1, pads=[3,3,3,3], strides=[2,2]"),
       7, 1},
      {conv("[1,16,9,10]", "[12,8,3,5]", 12 * 8 * 15, "[1,12,8,5]",
            "dilations=[1,1], groups=2, pads=[1,2,0,1], strides=[1,2]"),
       3, 2},
  };
  auto copies = [](const std::string& as) {  // VMEM -> VMEM DMAs
    int n = 0;
    for (size_t at = as.find("dma vmem:"); at != std::string::npos; at = as.find("dma vmem:", at + 1))
      n += as.compare(as.find(", ", at) + 2, 5, "vmem:") == 0;
    return n;
  };
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      for (const Case& c : cases) {
        const std::string as = expect_bit_exact(c.ir, p, target(2, 16, 16), cores);
        // A band (at most one a core here) of each group: its KH + 1 gathers and the
        // NHWC -> NCHW move's one.
        EXPECT_LE(copies(as), c.groups * cores * (c.kh + 2)) << "cores " << cores << "\n" << c.ir;
      }
      expect_bit_exact(conv("[1,4,12,12]", "[6,4,3,3]", 6 * 4 * 9, "[1,6,12,12]",
                            "dilations=[2,2], groups=1, pads=[2,2,2,2], strides=[1,1]"),
                       p, target(2, 16, 16), cores);
    }
}

// A shifted conv whose result (after its fused relu) only a stride-1 shifted conv with
// rows as wide reads writes it straight into that conv's padded NHWC planes: neither
// its move to NCHW nor the consumer's planes are made, so a pair has 2 VMEM -> VMEM
// copies a band (the first conv's planes, the second's move) instead of 4. Images 1
// and 2, cores 1 and 2, three convs in a row (the middle one reads and writes
// planes), a stride-2 producer (its rows widened to the consumer's), and not when
// the result has another reader; bit-exact with the race checker.
TEST(LowerSchedule, ConvResultsStraightIntoTheNextConvsPlanes) {
  auto conv = [](const std::string& in, const std::string& out, const std::string& w, int64_t ci, int64_t h,
                 int64_t wd, int64_t s, int id) {
    const int64_t oh = (h + 2 - 3) / s + 1, ow = (wd + 2 - 3) / s + 1;
    std::ostringstream o;
    o << "  const %" << w << " : f32[64," << ci << ",3,3] = "
      << hex_list(random_values(static_cast<size_t>(64 * ci * 9), static_cast<uint32_t>(id)))
      << "\n  %" << out << " = conv2d(%" << in << ", %" << w << ") {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=["
      << s << "," << s << "]} : f32[NB,64," << oh << "," << ow << "] #" << id << "\n";
    return o.str();
  };
  auto graph = [](std::string body, int64_t nb, const std::string& x, const std::string& out) {
    for (size_t at = body.find("NB"); at != std::string::npos; at = body.find("NB"))
      body.replace(at, 2, std::to_string(nb));
    return "graph c {\n  input %x : f32[" + std::to_string(nb) + x + "]\n" + body + "  output %" + out + "\n}\n";
  };
  auto copies = [](const std::string& as) {
    int n = 0;
    for (size_t at = as.find("dma vmem:"); at != std::string::npos; at = as.find("dma vmem:", at + 1))
      n += as.compare(as.find(", ", at) + 2, 5, "vmem:") == 0;
    return n;
  };
  const std::string pair = conv("x", "c1", "w1", 64, 5, 6, 1, 1) + "  %r1 = relu(%c1) : f32[NB,64,5,6] #2\n" +
                           conv("r1", "c2", "w2", 64, 5, 6, 1, 3);
  const std::string three = pair + conv("c2", "c3", "w3", 64, 5, 6, 1, 4);
  const std::string shared = pair + "  %a = add(%c2, %r1) : f32[NB,64,5,6] #5\n";
  const std::string strided = conv("x", "c1", "w1", 64, 10, 12, 2, 1) + conv("c1", "c2", "w2", 64, 5, 6, 1, 3);
  for (auto p : kPolicies)
    for (int64_t nb : {1, 2})
      for (int cores : {1, 2}) {
        // A band of plane rows or of the move a core, or an image a band.
        const int bands = static_cast<int>(std::max<int64_t>(cores, nb));
        const std::string as = expect_bit_exact(graph(pair, nb, ",64,5,6", "c2"), p, target(2, 16, 16), cores);
        EXPECT_EQ(copies(as), 2 * bands) << "images " << nb << ", cores " << cores;
        EXPECT_EQ(copies(expect_bit_exact(graph(three, nb, ",64,5,6", "c3"), p, target(2, 16, 16), cores)), 2 * bands);
        EXPECT_EQ(copies(expect_bit_exact(graph(shared, nb, ",64,5,6", "a"), p, target(2, 16, 16), cores)), 4 * bands)
            << "a result with two readers went into the planes";
        // A stride-2 producer (4 phase planes a band) computes rows as wide as the
        // consumer's planes: its 4 gathers a band and the consumer's move, not 7.
        EXPECT_EQ(copies(expect_bit_exact(graph(strided, nb, ",64,10,12", "c2"), p, target(2, 16, 16), cores)),
                  5 * bands);
        // The planes on memory given back by an earlier node (nonzero): every padding
        // pixel must be written.
        std::string reused = graph("  input %y : f32[NB,64,12,12]\n  %t = relu(%y) : f32[NB,64,12,12] #10\n"
                                   "  %m = global_avgpool(%t) : f32[NB,64,1,1] #11\n" + pair + "  output %m\n",
                                   nb, ",64,5,6", "c2");
        expect_bit_exact(reused, p, target(2, 16, 16), cores);
      }
}

// Batch elements that share their weights fetch them once a core: the resident plan
// keyed a core's weight band by the batch index, so every element of a batched
// product with one B loaded all of B again. And a shifted conv on small images runs
// its batch as one tall matmul (image b's plane rows after image b - 1's): its weights
// are pushed for the batch's rows together, as often as for one image, where each
// image pushed them all for its few rows (resnet50's layer4: 63 rows an image).
// A pointwise conv's tiles are NCHW, so a residual of its shape (a bottleneck's
// add(conv3, x), then relu) runs in its epilogue: the add and relu leave no code,
// the conv's result is never stored and read back, and with 128-column MXUs the
// residual comes in sub-bands of the output's column groups, runs of 1 KiB or the
// row's end, not a tile's 256 B or 512 B. Either operand order (sub is not
// commutative), a ragged last column tile (480 pixels an image), 2 images on 1 and 2
// cores (the K-streamed tiles) and one on one core (the resident plan).
TEST(LowerSchedule, PointwiseConvTakesTheResidualInItsEpilogue) {
  auto graph = [](const std::string& member, int n) {
    const std::string x = "[" + std::to_string(n) + ",24,12,40]", y = "[" + std::to_string(n) + ",40,12,40]";
    std::ostringstream o;
    o << "graph r {\n  input %x : f32" << x << "\n  input %skip : f32" << y << "\n  const %w : f32[40,24,1,1] = "
      << hex_list(random_values(40 * 24, 5)) << "\n  const %b : f32[40] = " << hex_list(random_values(40, 6))
      << "\n  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[0,0,0,0], strides=[1,1]} : f32" << y << " #1"
      << "\n  %a = " << member << " : f32" << y << " #2\n  %r = relu(%a) : f32" << y << " #3\n  output %r\n}\n";
    return o.str();
  };
  for (auto p : kPolicies)
    for (const std::string member : {"add(%c, %skip)", "sub(%skip, %c)", "sub(%c, %skip)"})
      for (uint32_t rows : {16u, 128u})
        for (const auto& [n, cores] : {std::pair{1, 1}, {2, 1}, {2, 2}}) {
          const std::string as = expect_bit_exact(graph(member, n), p, target(2, rows, rows), cores);
          // 2 images (a B each) take the K-streamed tiles, whose tiles fetch the residual
          // a tile ahead; one image on one core the resident plan.
          EXPECT_EQ(!tiled_cores(as).empty(), n == 2) << member << " " << n << " " << cores;
          EXPECT_EQ(as.find("  op 2\n"), std::string::npos) << member;
          EXPECT_EQ(as.find("  op 3\n"), std::string::npos) << member;
          // The residual's loads (f6/f7): with 128-column MXUs runs of 1 KiB or the rest
          // of the row (fp32: 256 + 224 columns; bf16: all 480 at once), with 16 columns
          // a tile of 16 each.
          const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
          int loads = 0;
          for (size_t at = as.find("dma vmem:"); at != std::string::npos; at = as.find("dma vmem:", at + 1)) {
            const std::string l = as.substr(at, as.find('\n', at) - at);
            if (l.find("flag=f6") == std::string::npos && l.find("flag=f7") == std::string::npos) continue;
            const int64_t bytes = std::stoll(l.substr(l.find("bytes=") + 6));
            if (rows == 16) EXPECT_EQ(bytes, 16 * e) << l;
            else EXPECT_GE(bytes, 224 * 4) << l;
            ++loads;
          }
          EXPECT_GT(loads, 0) << member << " " << rows;
        }
}

// A pass that fills fewer MXUs than the core has runs on copies of its weights, its
// 8-row blocks alternating over them: a 3x3 conv of 32 (f32) or 64 (bf16) channels
// has K = 288 or 576, chunks (0, 1) and 2, or (0, 1), (2, 3) and 4 on two MXUs, and
// the last chunk's blocks used to run on MXU 0 alone (twice MXU 1's mmuls). A dense
// matmul of one chunk and one column tile likewise.
TEST(LowerSchedule, ShortPassesRunOnEveryMxu) {
  auto conv = [](int64_t ci, int64_t nb) {
    std::ostringstream o;
    o << "graph c {\n  input %x : f32[" << nb << "," << ci << ",6,7]\n  const %w : f32[16," << ci << ",3,3] = "
      << hex_list(random_values(static_cast<size_t>(16 * ci * 9), 5)) << "\n  %y = conv2d(%x, %w) {dilations=[1,1], "
      << "groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[" << nb << ",16,6,7] #0\n  output %y\n}\n";
    return o.str();
  };
  auto mmuls_on = [](const std::string& as, int mxu) { return count_of(as, "mmul mxu" + std::to_string(mxu) + ","); };
  for (auto p : kPolicies)
    for (int cores : {1, 2}) {
      const std::string as =
          expect_bit_exact(conv(p == PrecisionPolicy::kBf16 ? 64 : 32, 3), p, target(2, 128, 128), cores);
      // Within a block a unit (each unit's copies start on MXU 0).
      const int a = mmuls_on(as, 0), b = mmuls_on(as, 1);
      EXPECT_GT(b, 0);
      EXPECT_LE(std::abs(a - b), 3) << a << " against " << b;
      const std::string mm = expect_bit_exact(matmul_ir(96, 100, 40), p, target(2, 128, 128), cores);
      EXPECT_GT(mmuls_on(mm, 1), 0);
      EXPECT_LE(std::abs(mmuls_on(mm, 0) - mmuls_on(mm, 1)), 2 * cores);
    }
}

// A shifted conv's LHS chunks of two runs read in place share v31 for their second
// loads, each select before the next chunk's second load: resnet18's layer2.0 conv1
// (64 -> 128 channels, stride 2, bf16: four phases, three chunks of two runs a block on
// v5e's four MXUs) differed in 884 of 1000 outputs when a third chunk's second load
// took v31 from under the first's deferred select. Stride 1 and 2, with the bias,
// the residual add on the NCHW bands and the relu; two and four MXUs.
TEST(LowerSchedule, InPlaceChunksOfTwoRunsShareTheirScratch) {
  for (int64_t s : {1, 2}) {
    const int64_t hw = 14, o = (hw + 2 - 3) / s + 1;
    const std::string xs = "[1,64," + std::to_string(hw) + "," + std::to_string(hw) + "]";
    const std::string ys = "[1,128," + std::to_string(o) + "," + std::to_string(o) + "]";
    std::ostringstream g;
    g << "graph c {\n  input %x : f32" << xs << "\n  input %res : f32" << ys << "\n  const %w : f32[128,64,3,3] = "
      << hex_list(random_values(128 * 64 * 9, 6)) << "\n  const %b : f32[128] = " << hex_list(random_values(128, 7))
      << "\n  %y = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[" << s << "," << s
      << "]} : f32" << ys << " #0\n  %a = add(%y, %res) {} : f32" << ys << " #1 fusion=#0\n  %r = relu(%a) {} : f32"
      << ys << " #2 fusion=#0\n  output %r\n}\n";
    for (auto p : kPolicies)
      for (uint32_t mxus : {2u, 4u}) expect_bit_exact(g.str(), p, target(mxus, 128, 128), 1);
  }
}

// K-streamed tiles whose every tile reads the same weights (a conv's images, one
// column band) and whose K takes at most five passes keep a panel slot a pass: the
// weights come from HBM once, not once a tile. A 64 -> 128 3x3 conv (K = 576: three
// passes of two chunks) on 8 images of 8 x 8 (640 rows) against 4 images: the
// difference in bytes loaded is the 4 images' planes, not the 295 KB of weights again.
TEST(LowerSchedule, KStreamedTilesKeepOneSetOfWeights) {
  auto conv = [](int64_t nb) {
    std::ostringstream o;
    o << "graph c {\n  input %x : f32[" << nb << ",64,8,8]\n  input %w : f32[128,64,3,3]\n"
      << "  %y = conv2d(%x, %w) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[" << nb
      << ",128,8,8] #0\n  output %y\n}\n";
    return o.str();
  };
  auto loaded = [](const std::string& ir) {
    const LowerResult lr = lower_with(ir, PrecisionPolicy::kDefault, target(2, 128, 128), 1);
    int64_t bytes = 0;
    for (const auto& in : lr.bundle.cores.at(0).code) {
      if (in.op != isa::Op::kDma || in.src.space != isa::Space::kHbm || in.dst.space != isa::Space::kVmem) continue;
      int64_t b = in.imm;
      for (int d = 0; d < in.ndims; ++d) b *= in.dims[d].count;
      bytes += b;
    }
    return bytes;
  };
  expect_bit_exact(conv(8), PrecisionPolicy::kDefault, target(2, 128, 128), 1);
  const int64_t weights = 128 * 64 * 9 * 4, planes4 = 4 * 10 * 10 * 64 * 4;
  EXPECT_LT(loaded(conv(8)) - loaded(conv(4)), 2 * planes4 + weights / 4) << "weights " << weights;
}

TEST(LowerSchedule, BatchesThatShareWeightsFetchAndPushThemOnce) {
  auto summary = [](const std::string& ir, PrecisionPolicy p, const isa::Target& t, int cores) {
    const LowerResult lr = lower_with(ir, p, t, cores);
    int64_t loaded = 0, pushes = 0;
    for (const auto& core : lr.bundle.cores)
      for (const auto& in : core.code) {
        pushes += in.op == isa::Op::kMpush;
        if (in.op != isa::Op::kDma || in.src.space != isa::Space::kHbm || in.dst.space != isa::Space::kVmem) continue;
        int64_t bytes = in.imm;
        for (int d = 0; d < in.ndims; ++d) bytes *= in.dims[d].count;
        loaded += bytes;
      }
    return std::make_pair(loaded, pushes);
  };
  // s: the stride (2: four phases of planes, each phase's planes of the batch in turn).
  auto conv = [](int64_t nb, int s = 1) {
    const int64_t h = 3 * s;
    std::ostringstream o;
    o << "graph c {\n  input %x : f32[" << nb << ",64," << h << "," << h << "]\n  const %w : f32[40,64,3,3] = "
      << hex_list(random_values(40 * 64 * 9, 3)) << "\n  %y = conv2d(%x, %w) {dilations=[1,1], groups=1, "
      << "pads=[1,1,1,1], strides=[" << s << "," << s << "]} : f32[" << nb << ",40,3,3] #1\n  output %y\n}\n";
    return o.str();
  };
  for (auto p : kPolicies) {
    const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
    for (int cores : {1, 2}) {
      // 4 x (16 x 64) @ (64 x 24): A once, B once a core.
      const std::string mm = matmul_ir(16, 64, 24, "", "", "4,");
      expect_bit_exact(mm, p, target(2, 16, 16), cores);
      EXPECT_LE(summary(mm, p, target(2, 16, 16), cores).first, (4 * 16 * 64 + cores * 64 * 24) * e) << cores;
      // 4 images of 3 x 5 matmul rows against 40 x 576 weights; with stride 2, 3 x 4.
      // The stride-2 planes are built two images a core at least, in a ring of three
      // (gathered_stream: the second input slot's flag, f9).
      expect_bit_exact(conv(4), p, target(2, 128, 128), cores);
      EXPECT_GT(count_of(expect_bit_exact(conv(4, 2), p, target(2, 128, 128), cores), ", flag=f9\n"), 0) << cores;
    }
    for (int s : {1, 2})
      EXPECT_EQ(summary(conv(4, s), p, target(2, 128, 128), 1).second,
                summary(conv(1, s), p, target(2, 128, 128), 1).second)
          << "the weights pushed again for another image: stride " << s;
  }
}

// Runs of one element cost an HBM request each: im2col's NCHW -> NHWC move,
// maxpool_grad's tap gathers and scatters, a broadcast operand materialised over an
// inner axis, a matmul's A^T (a weight gradient's, of 16 K elements or more) and a
// reverse of the inner axes (flipped conv weights) go through VMEM (gathers cost per
// byte there), so no DMA to or from HBM moves one element a run; nor does im2col
// move its taps' short runs (5 channels: 20 or 10 bytes) in HBM. A [1,1,H,W]
// operand over N x C planes is periodic: one DMA, not one a plane. Bit-exact,
// both policies.
TEST(LowerSchedule, ElementRunsGoThroughVmem) {
  const std::string ir =
      "graph g {\n  input %x : f32[2,5,6,8]\n  input %dy : f32[2,5,3,4]\n  input %c : f32[2,5,1,1]\n"
      "  input %z : f32[1,1,6,8]\n"
      "  %r1 = im2col(%x) {dilations=[1,1], kernel=[1,1], pads=[0,0,0,0], strides=[1,1]} : f32[96,5] #1\n"
      "  %r3 = im2col(%x) {dilations=[1,1], kernel=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[96,45] #2\n"
      "  %y = maxpool(%x) {kernel=[2,2], pads=[0,0,0,0], strides=[2,2]} : f32[2,5,3,4] #3\n"
      "  %dx = maxpool_grad(%dy, %x, %y) {kernel=[2,2], pads=[0,0,0,0], strides=[2,2]} : f32[2,5,6,8] #4\n"
      "  %a = add(%dx, %c) : f32[2,5,6,8] #5\n  %b = mul(%a, %z) : f32[2,5,6,8] #6\n"
      "  input %p : f32[256,80]\n  input %q : f32[256,5]\n  %g = matmul(%p, %q) {trans_a=1} : f32[80,5] #7\n"
      "  input %w : f32[4,3,3,3]\n  %f = reverse(%w) {axes=[2,3]} : f32[4,3,3,3] #8\n"
      "  output %r1\n  output %r3\n  output %b\n  output %g\n  output %f\n}\n";
  for (auto p : kPolicies) {
    const std::string as = expect_bit_exact(ir, p, target(1, 16, 16), 1, false);
    const int64_t e = p == PrecisionPolicy::kBf16 ? 2 : 4;
    int element_runs = 0, mul_dmas = 0, mul_periodic = 0, mul_row = 0, short_taps = 0, op = -1;
    std::istringstream lines(as);
    for (std::string l; std::getline(lines, l);) {
      if (l.rfind("  op ", 0) == 0) op = std::stoi(l.substr(5));
      const bool vmem_to_vmem = l.rfind("  dma vmem:", 0) == 0 && l.find(", vmem:") != std::string::npos;
      const bool hbm_to_vmem = l.rfind("  dma vmem:", 0) == 0 && l.find(", hbm:") != std::string::npos;
      mul_dmas += op == 6 && vmem_to_vmem;
      mul_periodic += op == 6 && hbm_to_vmem && l.find(":0:" + std::to_string(48 * e)) != std::string::npos;
      mul_row += op == 6 && hbm_to_vmem && l.find("bytes=" + std::to_string(48 * e) + ",") != std::string::npos;
      if (l.rfind("  dma ", 0) != 0 || l.find("hbm:") == std::string::npos) continue;
      element_runs += l.find("bytes=" + std::to_string(e) + ",") != std::string::npos;
      short_taps += op == 2 && std::stoll(l.substr(l.find("bytes=") + 6)) < 128;
    }
    EXPECT_EQ(element_runs, 0) << as;
    EXPECT_EQ(short_taps, 0) << "the 3x3 im2col's taps";
    // The [1,1,6,8] operand over 10 planes: its 48-element period read into VMEM by
    // one stride-0 DMA, 23 repetitions covering a tile from any start (periodic since
    // session 78; in session 79 one row read and a block's worth repeated by a VMEM
    // copy; a VMEM gather of its planes before).
    EXPECT_EQ(mul_row, 1) << as;
    EXPECT_EQ(mul_periodic, 1) << as;
    EXPECT_EQ(mul_dmas, 0) << as;
  }
}

}  // namespace
}  // namespace tpusim::compiler

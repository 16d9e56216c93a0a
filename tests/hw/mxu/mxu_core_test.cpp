// The plain C++ MXU core: values against the numerics contract, timing against
// the published TPU v4 micro-benchmarks and the closed forms of docs/mxu.md,
// stall reasons, faults, and skip(n) == n ticks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "hw/config/params.h"
#include "hw/mxu/mxu_core.h"
#include "hw/mxu/mxu_queue.h"
#include "isa/exec/semantics.h"
#include "mxu_program.h"

namespace tpusim::hw::mxu {
namespace {

using testing::compile_matmul;
using testing::explicit_result;
using testing::random_problem;
using testing::reference_result;
using testing::ResultAssembler;

uint32_t bits(float f) { return num::f32_bits(f); }

MxuParams small_params(int rows, int cols, int pes_per_cycle = 1) {
  MxuParams p;
  p.rows = rows;
  p.cols = cols;
  p.pes_per_cycle = pes_per_cycle;
  p.fixed_latency_cycles = 3;
  p.weight_swap_cycles = 4;
  p.result_fifo_vregs = 8;
  return p;
}

// Runs a compiled matmul on a bare core and returns the assembled M x N result.
std::vector<float> run_matmul(const testing::MatmulProblem& prob, const MxuParams& hw, bool transposed,
                              bool use_skip, MxuCounters* counters = nullptr) {
  const auto prog = compile_matmul(prob, hw, transposed, std::min(12, hw.result_fifo_vregs - 1), 99);
  MxuCore core(hw);
  MxuOpQueue q;
  ResultAssembler out(prob, hw, prog);
  q.on_pop = [&](const PoppedVreg& v) { out.take(v); };
  for (const auto& op : prog.ops) q.submit(op);
  q.run(core, use_skip);
  EXPECT_EQ(q.fault(), "");
  EXPECT_EQ(out.mismatched_kinds(), 0);
  if (counters) *counters = core.counters();
  return out.result();
}

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (bits(got[i]) != bits(want[i])) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " (0x" << std::hex << bits(got[i])
                    << ") want " << want[i] << " (0x" << bits(want[i]) << std::dec << ")";
    }
}

// ---------------------------------------------------------------- values

struct Shape {
  int rows, cols, m, k, n;
  bool transposed;
};

class MxuCoreValues : public ::testing::TestWithParam<Shape> {};

TEST_P(MxuCoreValues, MatchReferenceAndExplicitLoop) {
  const Shape s = GetParam();
  const MxuParams hw = small_params(s.rows, s.cols);
  for (bool specials : {false, true}) {
    const auto prob = random_problem(s.m, s.k, s.n, 1234u + static_cast<uint32_t>(s.m * 7 + s.k * 3 + s.n), specials);
    const auto got = run_matmul(prob, hw, s.transposed, true);
    expect_bits_equal(got, reference_result(prob, s.rows), "vs mxu_matmul_reference");
    expect_bits_equal(got, explicit_result(prob, s.rows), "vs explicit loop");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MxuCoreValues,
                         ::testing::Values(Shape{8, 8, 1, 1, 1, false},      // one element, K < R
                                           Shape{8, 8, 13, 5, 7, false},     // K < R: invalid rows
                                           Shape{8, 8, 13, 5, 7, true},      // the same with mpush.t
                                           Shape{16, 8, 40, 37, 19, false},  // 3 K chunks, ragged everywhere
                                           Shape{16, 8, 40, 37, 19, true},
                                           Shape{128, 128, 24, 300, 130, false},  // v4's array
                                           Shape{128, 128, 9, 129, 5, true}));

TEST(MxuCore, SignedZerosStartFromPositiveZero) {
  // Every product is -0.0: the chunk sum is +0.0 + (-0.0) + ... = +0.0, never -0.0.
  MxuCore core(small_params(8, 8));
  Vreg w, a;
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 8; ++l) w.at(s, l) = -1.0f, a.at(s, l) = 0.0f;
  core.push(w, false);
  core.skip(8);
  core.swap();
  core.skip(4);
  core.matmul(a);
  core.skip(static_cast<uint64_t>(core.params().first_result_latency_cycles()));
  core.pop(false);
  core.skip(8);
  const auto p = core.take_popped();
  ASSERT_TRUE(p.has_value());
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 128; ++l) EXPECT_EQ(bits(p->data.at(s, l)), 0u) << s << "," << l;  // lanes >= C read +0.0 too
}

TEST(MxuCore, InvalidRowsIgnoreNanActivationsAndNaNsAreCanonical) {
  // Weights pushed for 3 rows only; LHS lanes 3..7 hold NaN and Inf, which meet
  // invalid rows and must contribute +0.0. Row 0 of the LHS also has Inf x 0 = NaN.
  MxuCore core(small_params(8, 8));
  Vreg w, a;
  for (int l = 0; l < 8; ++l) {
    w.at(0, l) = 1.0f;
    w.at(1, l) = 2.0f;
    w.at(2, l) = l == 5 ? 0.0f : -1.0f;
  }
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 8; ++l) a.at(s, l) = l < 3 ? float(s + 1) : std::numeric_limits<float>::quiet_NaN();
  a.at(0, 2) = std::numeric_limits<float>::infinity();
  core.push(w, false);
  core.skip(8);
  core.swap(3);
  core.skip(4);
  core.matmul(a);
  core.skip(static_cast<uint64_t>(core.params().first_result_latency_cycles()));
  core.pop(false);
  core.skip(8);
  const auto p = core.take_popped();
  ASSERT_TRUE(p.has_value());
  for (int s = 1; s < 8; ++s)
    for (int l = 0; l < 8; ++l) {
      const float x = float(s + 1);
      const float want = l == 5 ? x + 2 * x : x + 2 * x - x;
      EXPECT_EQ(p->data.at(s, l), want) << s << "," << l;
    }
  // Row 0: 1*1 + 1*2 + Inf*(-1) = -Inf, and Inf * 0 = NaN in column 5 (canonical).
  EXPECT_EQ(bits(p->data.at(0, 0)), 0xFF800000u);
  EXPECT_EQ(bits(p->data.at(0, 5)), 0x7FC00000u);
}

TEST(MxuCore, TransposedPushEqualsTransposedWeights) {
  // mpush.t of W^T gives the same array weights as mpush of W.
  const MxuParams hw = small_params(16, 16);
  const auto prob = random_problem(16, 16, 16, 7, false);
  expect_bits_equal(run_matmul(prob, hw, true, true), run_matmul(prob, hw, false, true), "mpush.t vs mpush");
}

// The functional ISA reference's own MXU semantics (isa/exec), run over the same
// op stream in program order: every popped vreg must be the same bits.
TEST(MxuCore, EqualsFunctionalReferenceBitForBit) {
  for (const Shape& s : {Shape{16, 8, 21, 37, 19, false}, Shape{16, 8, 21, 37, 19, true},
                         Shape{128, 128, 17, 200, 140, false}, Shape{128, 128, 17, 200, 140, true}}) {
    const MxuParams hw = small_params(s.rows, s.cols);
    const auto prob = random_problem(s.m, s.k, s.n, 77u + static_cast<uint32_t>(s.transposed), true);
    const auto prog = compile_matmul(prob, hw, s.transposed, 6, 5);
    exec::MxuState ref(hw.rows, hw.cols, hw.result_fifo_rows());
    std::vector<exec::MxuResult> want;
    for (const MxuOp& op : prog.ops) {
      exec::VReg v;
      for (size_t i = 0; i < v.bits.size(); ++i) v.bits[i] = bits(op.data.v[i]);
      switch (op.kind) {
        case MxuOpKind::kPush: exec::mxu_push(ref, v, false); break;
        case MxuOpKind::kPushTransposed: exec::mxu_push(ref, v, true); break;
        case MxuOpKind::kSwap: exec::mxu_swap(ref, std::max(0, op.valid_rows)); break;
        case MxuOpKind::kMatmul: exec::mxu_fifo_push(ref, exec::mxu_compute(ref, v)); break;
        case MxuOpKind::kPop:
        case MxuOpKind::kPopAdd: want.push_back(exec::mxu_fifo_pop(ref)); break;
      }
    }
    MxuCore core(hw);
    MxuOpQueue q;
    std::vector<PoppedVreg> got;
    q.on_pop = [&](const PoppedVreg& p) { got.push_back(p); };
    for (const auto& op : prog.ops) q.submit(op);
    q.run(core, true);
    ASSERT_EQ(q.fault(), "");
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      for (size_t e = 0; e < want[i].v.size(); ++e)
        ASSERT_EQ(bits(got[i].data.v[e]), bits(want[i].v[e]))
            << "pop " << i << " element " << e << (s.transposed ? " mpush.t" : " mpush") << " R=" << s.rows;
  }
}

// ---------------------------------------------------------------- timing

TEST(MxuCore, CalibrationAgainstPublishedV4MicroBenchmarks) {
  // TPU v4 (architecture.md): first result 83 cycles after issue (101 on MXU 2/3),
  // one 8-row LHS vreg accepted every 8 cycles, results pop one row per cycle.
  const auto preset = config::load_preset("v4");
  for (int index = 0; index < 4; ++index) {
    const MxuParams hw = MxuParams::from_config(preset, index);
    MxuCore core(hw);
    std::vector<std::pair<uint64_t, uint64_t>> arrivals;  // (seq*8+row, cycle)
    core.set_row_observer([&](uint64_t seq, int row, uint64_t cycle, const float*) {
      arrivals.emplace_back(seq * 8 + static_cast<uint64_t>(row), cycle);
    });
    MxuOpQueue q;
    std::vector<uint64_t> mmul_issue;
    std::vector<PoppedVreg> pops;
    q.on_pop = [&](const PoppedVreg& v) { pops.push_back(v); };
    for (int i = 0; i < 16; ++i) q.submit({MxuOpKind::kPush, Vreg{}, -1, 0});
    q.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});
    const int stream = 24;
    for (int i = 0; i < stream; ++i) q.submit({MxuOpKind::kMatmul, Vreg{}, -1, 0});
    for (int i = 0; i < stream; ++i) q.submit({MxuOpKind::kPop, Vreg{}, -1, static_cast<uint64_t>(i)});
    // Record issue cycles by watching the queue shrink.
    size_t before = q.size();
    while (!q.drained(core) || !q.empty()) {
      q.step(core);
      if (q.size() < before && q.last_op() == 1 + static_cast<int>(MxuOpKind::kMatmul)) mmul_issue.push_back(core.now());
      before = q.size();
      core.tick();
    }
    q.step(core);  // the last pop finished in this cycle
    ASSERT_EQ(mmul_issue.size(), static_cast<size_t>(stream));
    const uint64_t want_latency = index < 2 ? 83 : 101;
    for (int i = 0; i < stream; ++i) {
      if (i > 0) {
        EXPECT_EQ(mmul_issue[i] - mmul_issue[i - 1], 8u) << "LHS vreg interval, MXU " << index;
      }
      EXPECT_EQ(arrivals[static_cast<size_t>(i * 8)].second - mmul_issue[static_cast<size_t>(i)], want_latency)
          << "first result latency, MXU " << index << " mmul " << i;
    }
    ASSERT_EQ(arrivals.size(), static_cast<size_t>(stream * 8));
    for (size_t r = 1; r < arrivals.size(); ++r)
      EXPECT_EQ(arrivals[r].second - arrivals[r - 1].second, 1u) << "one result row per cycle";
    ASSERT_EQ(pops.size(), static_cast<size_t>(stream));
    for (size_t i = 0; i < pops.size(); ++i) {
      EXPECT_EQ(pops[i].done_cycle - pops[i].issue_cycle, 8u) << "8 rows at one row per cycle";
      if (i > 0) {
        EXPECT_EQ(pops[i].issue_cycle - pops[i - 1].issue_cycle, 8u) << "pops stream back to back";
      }
    }
  }
}

TEST(MxuCore, LatencySplitScalesWithArrayGeometry) {
  // fixed + ceil(R/P) + ceil(C/P) - 1: the v4 preset's split gives 83 at 128 x 128.
  auto preset = config::load_preset("v4");
  EXPECT_EQ(MxuParams::from_config(preset, 0).first_result_latency_cycles(), 83);
  EXPECT_EQ(MxuParams::from_config(preset, 3).first_result_latency_cycles(), 101);
  preset.set("core.mxu.rows=32");
  preset.set("core.mxu.cols=64");
  const MxuParams small = MxuParams::from_config(preset, 0);
  EXPECT_EQ(small.first_result_latency_cycles(), small.fixed_latency_cycles + 8 + 16 - 1);
}

// Closed forms of each stall from the parameters (docs/mxu.md, "Stalls").
TEST(MxuCore, StallReasonsAndTheirDurations) {
  MxuParams hw = small_params(16, 8);  // two pushes fill 16 rows
  hw.result_fifo_vregs = 1;
  const int F = hw.first_result_latency_cycles();
  MxuCore core(hw);
  MxuOpQueue q;
  q.submit({MxuOpKind::kPush, Vreg{}, -1, 0});
  q.submit({MxuOpKind::kPush, Vreg{}, -1, 0});  // staging port busy for push_cycles - 1
  q.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});  // again push_cycles - 1
  q.submit({MxuOpKind::kMatmul, Vreg{}, -1, 0});  // weights loading: swap_cycles - 1
  q.submit({MxuOpKind::kPop, Vreg{}, -1, 0});     // waiting for results: F - 1
  q.submit({MxuOpKind::kMatmul, Vreg{}, -1, 0});  // FIFO (1 vreg) full until the pop frees 8 rows: 7
  q.submit({MxuOpKind::kPop, Vreg{}, -1, 0});
  q.submit({MxuOpKind::kPop, Vreg{}, -1, 0});  // underflow: a fault
  q.run(core, false);
  const auto& c = core.counters();
  EXPECT_EQ(c.stall_cycles[size_t(MxuStall::kStagingPortBusy)], 2u * (hw.weight_push_cycles_per_vreg - 1));
  EXPECT_EQ(c.stall_cycles[size_t(MxuStall::kArrayBusy)], uint64_t(hw.weight_swap_cycles - 1));
  // First pop waits F - 1; the second pop waits for its mmul, which issued 8 cycles
  // after the first pop: F - 1 again.
  EXPECT_EQ(c.stall_cycles[size_t(MxuStall::kWaitingForResults)], uint64_t(2 * (F - 1)));
  EXPECT_EQ(c.stall_cycles[size_t(MxuStall::kFifoFull)], 7u);
  EXPECT_NE(q.fault().find("underflow"), std::string::npos) << q.fault();
  EXPECT_EQ(c.matmuls, 2u);
  EXPECT_EQ(c.pops, 2u);
  EXPECT_EQ(c.pushes, 2u);
  EXPECT_EQ(c.swaps, 1u);
  EXPECT_EQ(c.macs, 2u * 8 * 16 * 8);
}

TEST(MxuCore, TheIssueCycleIsNeverAStallOfTheNextOp) {
  // An owner that declares the next op pending right after issuing (no from_cycle)
  // counts the same stalls as MxuOpQueue: one op per cycle, so only the cycles
  // after the issue can be stalls.
  MxuParams hw = small_params(16, 8);
  MxuCore core(hw);
  core.push(Vreg{}, false);
  core.set_pending(MxuOpKind::kPush);
  while (!core.check(MxuOpKind::kPush).can_issue()) core.tick();
  EXPECT_EQ(core.now(), uint64_t(hw.weight_push_cycles_per_vreg));
  EXPECT_EQ(core.counters().stall_cycles[size_t(MxuStall::kStagingPortBusy)], uint64_t(hw.weight_push_cycles_per_vreg - 1));
}

TEST(MxuCore, FaultsAreReportedNotCrashes) {
  MxuParams hw = small_params(8, 8);
  hw.result_fifo_vregs = 2;
  {
    MxuCore core(hw);
    EXPECT_NE(core.check(MxuOpKind::kPop).fault.find("underflow"), std::string::npos);
    EXPECT_THROW(core.pop(false), MxuFault);
  }
  {
    MxuCore core(hw);
    MxuOpQueue q;
    for (int i = 0; i < 3; ++i) q.submit({MxuOpKind::kMatmul, Vreg{}, -1, uint64_t(40 + i)});
    q.run(core, true);
    EXPECT_NE(q.fault().find("overflow"), std::string::npos) << q.fault();
    EXPECT_NE(q.fault().find("op tag 42"), std::string::npos) << q.fault();
  }
  {
    MxuCore core(hw);
    MxuOpQueue q;
    q.submit({MxuOpKind::kPush, Vreg{}, -1, 0});
    q.submit({MxuOpKind::kPush, Vreg{}, -1, 7});  // an 8-row array takes one push
    q.run(core, true);
    EXPECT_NE(q.fault().find("mpush: the staging buffer already holds all 8"), std::string::npos) << q.fault();
  }
  {
    MxuCore core(hw);
    MxuOpQueue q;
    q.submit({MxuOpKind::kSwap, Vreg{}, 9, 5});
    q.run(core, true);
    EXPECT_NE(q.fault().find("mswap k=9 exceeds"), std::string::npos) << q.fault();
  }
}

TEST(MxuCore, BadConfigIsAOneLineError) {
  auto preset = config::load_preset("v4");
  preset.set("core.mxu.lhs_cycles_per_vreg=4");
  try {
    MxuParams::from_config(preset, 0);
    FAIL() << "no error";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lhs_cycles_per_vreg=4 must be at least 8"), std::string::npos) << e.what();
  }
  auto p2 = config::load_preset("v4");
  p2.set("core.mxu.fixed_latency_cycles=[20, 20]");
  EXPECT_THROW(MxuParams::from_config(p2, 0), config::ConfigError);
  EXPECT_THROW(MxuParams::from_config(config::load_preset("v4"), 4), config::ConfigError);
}

TEST(MxuCore, SwapDoesNotDisturbMmulsInFlight) {
  // mmul on W1, then W2 staged and swapped in while that mmul is still in the
  // array, then mmul on W2: each result belongs to its own weights.
  const MxuParams hw = small_params(8, 8);
  MxuCore core(hw);
  MxuOpQueue q;
  std::vector<PoppedVreg> pops;
  q.on_pop = [&](const PoppedVreg& v) { pops.push_back(v); };
  Vreg w1, w2, a;
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 8; ++l) w1.at(s, l) = 1.0f, w2.at(s, l) = 2.0f, a.at(s, l) = 1.0f;
  q.submit({MxuOpKind::kPush, w1, -1, 0});
  q.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});
  q.submit({MxuOpKind::kMatmul, a, -1, 0});
  q.submit({MxuOpKind::kPush, w2, -1, 0});
  q.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});
  q.submit({MxuOpKind::kMatmul, a, -1, 0});
  q.submit({MxuOpKind::kPop, Vreg{}, -1, 1});
  q.submit({MxuOpKind::kPop, Vreg{}, -1, 2});
  q.run(core, true);
  ASSERT_EQ(pops.size(), 2u);
  EXPECT_EQ(pops[0].data.at(3, 3), 8.0f);
  EXPECT_EQ(pops[1].data.at(3, 3), 16.0f);
  // Two swaps back to back: the second overwrites the bank the first mmul reads,
  // so it waits until that mmul has left the array.
  MxuCore c2(hw);
  MxuOpQueue q2;
  q2.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});
  q2.submit({MxuOpKind::kMatmul, a, -1, 0});
  q2.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});
  q2.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});
  q2.submit({MxuOpKind::kPop, Vreg{}, -1, 0});
  q2.run(c2, false);
  // mmul at swap_cycles; 2nd swap at swap_cycles + 1 (bank 0 idle); the 3rd waits for
  // the staging port (swap_cycles - 1) and then for bank 1's drain.
  const uint64_t mmul_at = uint64_t(hw.weight_swap_cycles);
  const uint64_t drain = mmul_at + uint64_t(hw.first_result_latency_cycles()) + 8;
  const uint64_t second = mmul_at + 1, third_port = second + uint64_t(hw.weight_swap_cycles);
  EXPECT_EQ(c2.counters().stall_cycles[size_t(MxuStall::kArrayBusy)], (hw.weight_swap_cycles - 1) + (drain - third_port));
}

// ---------------------------------------------------------------- skip == ticks

TEST(MxuCore, SkipEqualsTicks) {
  for (const Shape& s : {Shape{8, 8, 30, 20, 17, false}, Shape{16, 32, 64, 40, 70, true}}) {
    MxuParams hw = small_params(s.rows, s.cols, 2);
    hw.result_fifo_vregs = 3;  // FIFO-full stalls happen
    const auto prob = random_problem(s.m, s.k, s.n, 5, true);
    MxuCounters skipped, ticked;
    const auto a = run_matmul(prob, hw, s.transposed, true, &skipped);
    const auto b = run_matmul(prob, hw, s.transposed, false, &ticked);
    expect_bits_equal(a, b, "skip vs tick values");
    EXPECT_EQ(skipped, ticked);
    EXPECT_GT(skipped.busy_cycles, 0u);
    for (auto& [name, value] : skipped.named()) RecordProperty(name, std::to_string(value));
  }
}

}  // namespace
}  // namespace tpusim::hw::mxu

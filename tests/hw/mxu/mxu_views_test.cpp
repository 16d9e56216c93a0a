// The MXU's SystemC views held together on the op sequences a compiler emits for
// M x K x N matmuls (M, K, N from 1 to 3 tiles, ragged edges): the per-PE grid
// and the tile model deliver identical values at the same cycle for every result
// row; the event-driven and the clocked views agree on every cycle and counter;
// and the assembled results equal num::mxu_matmul_reference. One elaboration per
// test (ctest runs each in its own process).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <fstream>
#include <sstream>
#include <systemc>
#include <tuple>

#include "hw/mxu/mxu_sc.h"
#include "mxu_program.h"

namespace tpusim::hw::mxu {
namespace {

using testing::compile_matmul;
using testing::random_problem;
using testing::reference_result;
using testing::ResultAssembler;

struct RowEvent {
  uint64_t seq, cycle;
  int row;
  std::vector<uint32_t> bits;
  bool operator==(const RowEvent& o) const { return seq == o.seq && cycle == o.cycle && row == o.row && bits == o.bits; }
};

struct PopEvent {
  uint64_t tag, issue, done;
  std::vector<uint32_t> bits;
  bool operator==(const PopEvent& o) const {
    return tag == o.tag && issue == o.issue && done == o.done && bits == o.bits;
  }
};

// Everything one view reports, recorded for comparison.
struct Recorder {
  std::vector<RowEvent> rows;
  std::vector<PopEvent> pops;
  std::vector<PoppedVreg> popped;
  void attach(MxuUnit& unit) {
    const int C = unit.core().params().cols;
    unit.core().set_row_observer([this, C](uint64_t seq, int row, uint64_t cycle, const float* v) {
      RowEvent e{seq, cycle, row, {}};
      for (int c = 0; c < C; ++c) e.bits.push_back(num::f32_bits(v[c]));
      rows.push_back(std::move(e));
    });
    unit.queue().on_pop = [this](const PoppedVreg& p) {
      PopEvent e{p.tag, p.issue_cycle, p.done_cycle, {}};
      for (float x : p.data.v) e.bits.push_back(num::f32_bits(x));
      pops.push_back(std::move(e));
      popped.push_back(p);
    };
  }
  void clear() { rows.clear(), pops.clear(), popped.clear(); }
};

struct ArrayCase {
  int rows, cols, pes_per_cycle, fixed, fifo_vregs;
};

std::string case_name(const ::testing::TestParamInfo<ArrayCase>& i) {
  const ArrayCase& a = i.param;
  return std::to_string(a.rows) + "x" + std::to_string(a.cols) + "_P" + std::to_string(a.pes_per_cycle) + "_F" +
         std::to_string(a.fixed);
}

class MxuViews : public ::testing::TestWithParam<ArrayCase> {};

TEST_P(MxuViews, PerPeGridTileModelFastAndDetailedAgree) {
  const ArrayCase ac = GetParam();
  MxuParams hw;
  hw.rows = ac.rows;
  hw.cols = ac.cols;
  hw.pes_per_cycle = ac.pes_per_cycle;
  hw.fixed_latency_cycles = ac.fixed;
  hw.result_fifo_vregs = ac.fifo_vregs;
  hw.weight_swap_cycles = 5;
  const sc_core::sc_time cycle(1, sc_core::SC_NS);
  sc_core::sc_clock clk("clk", cycle);
  MxuFast fast("fast", hw, cycle);
  MxuDetailed ticked("ticked", hw, cycle, MxuDetailed::Datapath::kTile);
  MxuDetailed grid("grid", hw, cycle, MxuDetailed::Datapath::kPerPe);
  ticked.clk(clk);
  grid.clk(clk);
  Recorder rf, rt, rg;
  rf.attach(fast);
  rt.attach(ticked);
  rg.attach(grid);
  std::string faults;
  for (MxuUnit* u : {static_cast<MxuUnit*>(&fast), static_cast<MxuUnit*>(&ticked), static_cast<MxuUnit*>(&grid)})
    u->queue().on_fault = [&](const MxuOp&, const std::string& m) { faults += m + "\n"; };

  const int R = ac.rows, C = ac.cols;
  const int Ms[] = {std::max(1, R - 3), 2 * R, 3 * R - 1};
  const int Ks[] = {std::max(1, R - 5), 2 * R, 3 * R - 2};
  const int Ns[] = {std::max(1, C - 3), 2 * C, 3 * C - 1};
  int index = 0, shapes = 0;
  for (int m : Ms)
    for (int k : Ks)
      for (int n : Ns) {
        ++index;
        ++shapes;
        const bool transposed = index % 2 == 0;
        const auto prob = random_problem(m, k, n, static_cast<uint32_t>(index), index % 4 == 1);
        const auto prog = compile_matmul(prob, hw, transposed, std::min(hw.result_fifo_vregs - 1, 6), 17u + index);
        // Every third shape trickles in: random bursts of ops at random cycles (the
        // random input stalls of a MatchLib testbench), so the event-driven view
        // must wake for new work exactly when the clocked one sees it.
        const bool trickle = index % 3 == 0;
        std::mt19937 gaps(static_cast<uint32_t>(index));
        size_t sent = 0;
        while (sent < prog.ops.size()) {
          const size_t burst = trickle ? 1 + gaps() % 6 : prog.ops.size();
          for (size_t i = 0; i < burst && sent < prog.ops.size(); ++i, ++sent)
            for (MxuUnit* u : {static_cast<MxuUnit*>(&fast), static_cast<MxuUnit*>(&ticked), static_cast<MxuUnit*>(&grid)})
              u->submit(prog.ops[sent]);
          if (trickle) sc_core::sc_start(sc_core::sc_time(1 + gaps() % 40, sc_core::SC_NS));
        }
        for (int guard = 0;; ++guard) {
          sc_core::sc_start(sc_core::sc_time(256, sc_core::SC_NS));
          fast.sync();
          if (fast.idle() && ticked.idle() && grid.idle()) break;
          ASSERT_LT(guard, 10000) << "no progress";
        }
        const std::string what = "shape " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) +
                                 (transposed ? " mpush.t" : " mpush");
        ASSERT_EQ(faults, "") << what;
        ASSERT_EQ(rg.rows.size(), static_cast<size_t>(testing::ceil_div(m, 8) * testing::ceil_div(k, R) *
                                                      testing::ceil_div(n, C) * 8))
            << what;
        ASSERT_EQ(rg.rows.size(), rt.rows.size()) << what;
        for (size_t i = 0; i < rg.rows.size(); ++i) {
          ASSERT_EQ(rg.rows[i].cycle, rt.rows[i].cycle) << what << ": row " << i << " cycle, per-PE vs tile";
          ASSERT_TRUE(rg.rows[i] == rt.rows[i]) << what << ": row " << i << " values, per-PE vs tile";
        }
        EXPECT_TRUE(rf.rows == rt.rows) << what << ": fast vs detailed rows";
        EXPECT_TRUE(rg.pops == rt.pops) << what << ": per-PE vs tile pops";
        EXPECT_TRUE(rf.pops == rt.pops) << what << ": fast vs detailed pops";
        EXPECT_EQ(fast.core().counters(), ticked.core().counters()) << what;
        EXPECT_EQ(grid.core().counters(), ticked.core().counters()) << what;

        ResultAssembler out(prob, hw, prog);
        for (const auto& p : rg.popped) out.take(p);
        const auto want = reference_result(prob, R);
        const auto got = out.result();
        int bad = 0;
        for (size_t i = 0; i < got.size() && bad < 3; ++i)
          if (num::f32_bits(got[i]) != num::f32_bits(want[i]))
            ++bad, ADD_FAILURE() << what << ": element " << i << " " << got[i] << " want " << want[i];
        rf.clear(), rt.clear(), rg.clear();
      }
  EXPECT_GT(shapes, 8);
  const auto& c = ticked.core().counters();
  EXPECT_GT(c.busy_cycles, 0u);
  EXPECT_GT(c.matmuls, 0u);
}

INSTANTIATE_TEST_SUITE_P(Arrays, MxuViews,
                         ::testing::Values(ArrayCase{8, 8, 1, 1, 4}, ArrayCase{8, 16, 2, 3, 8},
                                           ArrayCase{16, 24, 3, 2, 3}, ArrayCase{32, 32, 4, 20, 32},
                                           ArrayCase{32, 32, 1, 1, 8}),
                         case_name);

TEST(MxuViewsTrace, WaveformHasUnitStateAndEveryPePartialSum) {
  MxuParams hw;
  hw.rows = 8;
  hw.cols = 8;
  hw.pes_per_cycle = 1;
  hw.fixed_latency_cycles = 2;
  const sc_core::sc_time cycle(1, sc_core::SC_NS);
  sc_core::sc_clock clk("clk", cycle);
  MxuDetailed mxu("mxu0", hw, cycle, MxuDetailed::Datapath::kPerPe);
  mxu.clk(clk);
  const std::string base = ::testing::TempDir() + "mxu_trace_test";
  sc_core::sc_trace_file* tf = sc_core::sc_create_vcd_trace_file(base.c_str());
  mxu.trace(tf);
  Vreg w, a;
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 8; ++l) w.at(s, l) = 1.0f, a.at(s, l) = float(s + 1);
  mxu.submit({MxuOpKind::kPush, w, -1, 0});
  mxu.submit({MxuOpKind::kSwap, Vreg{}, -1, 0});
  mxu.submit({MxuOpKind::kMatmul, a, -1, 0});
  mxu.submit({MxuOpKind::kPop, Vreg{}, -1, 0});
  sc_core::sc_start(sc_core::sc_time(60, sc_core::SC_NS));
  sc_core::sc_close_vcd_trace_file(tf);
  std::ifstream in(base + ".vcd");
  std::stringstream text;
  text << in.rdbuf();
  const std::string vcd = text.str();
  for (const char* sig : {"busy", "fifo_rows", "inflight_rows", "staging_rows", "queue_depth", "last_op", "stall_reason"})
    EXPECT_NE(vcd.find(sig), std::string::npos) << sig;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c)
      EXPECT_NE(vcd.find("pe_" + std::to_string(r) + "_" + std::to_string(c)), std::string::npos) << r << "," << c;
  // The last PE of column 0 ends with the full sum of LHS row 7: 8 x 8 = 64.
  EXPECT_EQ(mxu.grid()->pe(7, 0).psum, 64.0f);
  EXPECT_NE(vcd.find("act"), std::string::npos);
  if (std::getenv("TPUSIM_KEEP_VCD") == nullptr) std::remove((base + ".vcd").c_str());
}

}  // namespace
}  // namespace tpusim::hw::mxu

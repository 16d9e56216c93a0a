// Simulation speed of the MXU (docs/mxu.md, "Measured speed"): simulated cycles
// and MACs per second of wall time on a long MXU-bound stream (v4 MXU 0, 128 x 128:
// every weight tile's 16 pushes overlap the previous tile's 16 mmuls, pops trail
// by 12), for
//   * the plain C++ tile model jumping between events (what the fast view runs),
//     with values and timing only;
//   * the same core ticked every cycle (what the clocked view runs);
//   * the SystemC views: MxuFast, and MxuDetailed with a per-PE grid at 32 x 32
//     and 8 x 8 (mxu_sc_bench, a separate program: SystemC elaborates once per
//     process, and a running clock would tax every other benchmark).
#include <benchmark/benchmark.h>

#include "hw/config/params.h"
#include "hw/mxu/mxu_queue.h"
#include "tests/hw/mxu/mxu_program.h"

namespace {

using namespace tpusim::hw::mxu;

MxuParams v4_mxu0() { return MxuParams::from_config(tpusim::config::load_preset("v4"), 0); }

// M x 128 x (128 * tiles): each weight tile feeds M/8 mmuls.
const testing::Program& stream_program(const MxuParams& hw, int m, int tiles) {
  static testing::Program prog;
  static int made_m = -1, made_tiles = -1;
  if (made_m != m || made_tiles != tiles) {
    const auto prob = testing::random_problem(m, hw.rows, hw.cols * tiles, 3, false);
    prog = testing::compile_matmul(prob, hw, false, 12, 4);
    made_m = m, made_tiles = tiles;
  }
  return prog;
}

void BM_MxuTileCore(benchmark::State& state, bool use_skip, bool values) {
  const MxuParams hw = v4_mxu0();
  const auto& prog = stream_program(hw, 128, 32);
  uint64_t cycles = 0, macs = 0;
  for (auto _ : state) {
    state.PauseTiming();
    MxuCore core(hw);
    core.set_compute_values(values);
    MxuOpQueue q;
    for (const auto& op : prog.ops) q.submit(op);
    state.ResumeTiming();
    cycles += q.run(core, use_skip);
    macs += core.counters().macs;
    benchmark::DoNotOptimize(core.counters());
  }
  state.counters["sim_cycles/s"] = benchmark::Counter(double(cycles), benchmark::Counter::kIsRate);
  state.counters["MAC/s"] = benchmark::Counter(double(macs), benchmark::Counter::kIsRate);
  // Simulated MXU utilisation: MACs over R x C per simulated cycle.
  state.counters["utilization"] = double(macs) / (double(cycles) * hw.rows * hw.cols);
}

BENCHMARK_CAPTURE(BM_MxuTileCore, skip_values, true, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MxuTileCore, skip_timing_only, true, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MxuTileCore, tick_values, false, true)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

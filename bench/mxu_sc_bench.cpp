// Simulation speed of the MXU's SystemC views (docs/mxu.md, "Measured speed"), one
// view per process because SystemC elaborates once per process:
//   mxu_sc_bench --model=fast   MxuFast (event-driven tile model), v4 MXU 0, 128 x 128
//   mxu_sc_bench --model=pe32   MxuDetailed with the per-PE grid, 32 x 32 (P = 4)
//   mxu_sc_bench --model=pe8    MxuDetailed with the per-PE grid, 8 x 8 (P = 1)
//   mxu_sc_bench --model=tick   MxuDetailed with the tile model, 128 x 128
// Other arguments go to Google Benchmark. Reports simulated cycles and MACs per
// second of wall time on a long MXU-bound matmul stream.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <systemc>

#include "hw/config/params.h"
#include "hw/mxu/mxu_sc.h"
#include "tests/hw/mxu/mxu_program.h"

namespace {

using namespace tpusim::hw::mxu;

std::string g_model = "fast";
MxuUnit* g_unit = nullptr;
MxuParams g_hw;

void BM_MxuView(benchmark::State& state) {
  // Weight tiles of the array's size, each feeding 16 mmuls (pushes overlapped).
  const auto prob = testing::random_problem(128, g_hw.rows, g_hw.cols * 16, 3, false);
  const auto prog = testing::compile_matmul(prob, g_hw, false, std::min(12, g_hw.result_fifo_vregs - 1), 4);
  const sc_core::sc_time cycle(1, sc_core::SC_NS);
  uint64_t cycles = 0, macs = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const uint64_t start = sc_core::sc_time_stamp().value() / cycle.value();
    const uint64_t macs0 = g_unit->core().counters().macs;
    for (const auto& op : prog.ops) g_unit->submit(op);
    state.ResumeTiming();
    do {
      sc_core::sc_start(sc_core::sc_time(4096, sc_core::SC_NS));
      g_unit->sync();
    } while (!g_unit->idle());
    cycles += sc_core::sc_time_stamp().value() / cycle.value() - start;
    macs += g_unit->core().counters().macs - macs0;
  }
  state.SetLabel(g_model + " " + std::to_string(g_hw.rows) + "x" + std::to_string(g_hw.cols));
  state.counters["sim_cycles/s"] = benchmark::Counter(double(cycles), benchmark::Counter::kIsRate);
  state.counters["MAC/s"] = benchmark::Counter(double(macs), benchmark::Counter::kIsRate);
}

}  // namespace

int sc_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--model=", 8) == 0) {
      g_model = argv[i] + 8;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  g_hw = MxuParams::from_config(tpusim::config::load_preset("v4"), 0);
  const sc_core::sc_time cycle(1, sc_core::SC_NS);
  std::unique_ptr<sc_core::sc_clock> clk;
  std::unique_ptr<MxuUnit> unit;
  if (g_model == "fast") {
    unit = std::make_unique<MxuFast>("mxu0", g_hw, cycle);
  } else if (g_model == "pe32" || g_model == "pe8" || g_model == "tick") {
    if (g_model != "tick") {
      g_hw.rows = g_hw.cols = g_model == "pe32" ? 32 : 8;
      g_hw.pes_per_cycle = g_model == "pe32" ? 4 : 1;
    }
    clk = std::make_unique<sc_core::sc_clock>("clk", cycle);
    auto d = std::make_unique<MxuDetailed>(
        "mxu0", g_hw, cycle, g_model == "tick" ? MxuDetailed::Datapath::kTile : MxuDetailed::Datapath::kPerPe);
    d->clk(*clk);
    unit = std::move(d);
  } else {
    std::fprintf(stderr, "mxu_sc_bench: unknown --model=%s (fast, pe32, pe8, tick)\n", g_model.c_str());
    return 2;
  }
  g_unit = unit.get();
  benchmark::RegisterBenchmark("BM_MxuView", BM_MxuView)->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

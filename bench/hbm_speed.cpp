// Simulation speed of the HBM controller (docs/validation.md, "HBM"): DRAM cycles
// simulated per second of CPU time while a 4 KiB sequential stream keeps 8
// pseudo-channels busy (hbm2_v3 cut to one stack of 4 channels x 2 pseudo-channels),
// the pattern the acceptance target (2 M cycles/s) and the Ramulator 2 / DRAMsim3
// comparisons refer to. Also the full 64-channel v3 stream, and the idle cost.
#include "hw/hbm/hbm_memory.h"
#include "hw/hbm/traffic.h"

#include <benchmark/benchmark.h>

using namespace tpusim;

static void stream(benchmark::State& state, const std::vector<std::string>& overrides) {
  const hbm::HbmConfig cfg = hbm::load_hbm_preset("hbm2_v3", overrides);
  uint64_t cycles = 0;
  for (auto _ : state) {
    hbm::HbmMemory mem(cfg);
    const auto r = hbm::run_traffic(mem, hbm::TrafficSpec::defaults(hbm::Pattern::kSequential, uint64_t(state.range(0))),
                                    cfg.capacity_bytes());
    benchmark::DoNotOptimize(r.bytes);
    cycles += mem.cycle();
  }
  state.counters["dram_cycles_per_s"] = benchmark::Counter(double(cycles), benchmark::Counter::kIsRate);
  state.counters["channels"] = cfg.channels();
}

static void BM_StreamEightChannels(benchmark::State& state) {
  stream(state, {"hbm.stacks=1", "hbm.channels_per_stack=4"});
}
BENCHMARK(BM_StreamEightChannels)->Arg(20000)->Unit(benchmark::kMillisecond);

static void BM_StreamAllChannelsV3(benchmark::State& state) { stream(state, {}); }
BENCHMARK(BM_StreamAllChannelsV3)->Arg(20000)->Unit(benchmark::kMillisecond);

// No requests: only refresh happens, which the fast mode visits once per refresh.
static void BM_IdleV3(benchmark::State& state) {
  const hbm::HbmConfig cfg = hbm::load_hbm_preset("hbm2_v3");
  uint64_t cycles = 0;
  for (auto _ : state) {
    hbm::HbmMemory mem(cfg);
    mem.skip(uint64_t(state.range(0)));
    cycles += mem.cycle();
  }
  state.counters["dram_cycles_per_s"] = benchmark::Counter(double(cycles), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_IdleV3)->Arg(10000000)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();

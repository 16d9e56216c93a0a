// Writes a stats.json for the plot.py test through the same make_stats the CLI
// uses, and refuses to write one that check_stats rejects, so the test plots a
// file of exactly the schema `tpusim run` writes. The figures are a v4 chip's
// peaks and a made-up run; units carry stall counters in every spelling the
// hardware units use (hw/mxu, hw/core, hw/vpu, hw/dma, hw/ici).
//
//   stats_fixture OUT.json
#include <cstdio>
#include <exception>

#include "sim/run/stats.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: stats_fixture OUT.json\n");
    return 2;
  }
  using nlohmann::json;
  tpusim::run::RunFigures f;
  f.preset = "v4";
  f.mode = "fast";
  f.clock_hz = 1.05e9;
  f.cycles = 20000;
  f.flops = 1000000000;
  f.peak_flops_per_s = 2.0 * 128 * 128 * 4 * 2 * 1.05e9;  // 2 x R x C x MXUs x cores x clock
  f.hbm_bytes_read = 3000000;
  f.hbm_bytes_written = 1000000;
  f.hbm_peak_bytes_per_s = 1.2e12;
  f.wall_seconds = 0.25;
  f.units = json::object();
  f.units["chip0.core0.mxu0"] = {{"busy_cycles", 15000},
                                 {"macs", 500000000},
                                 {"stall_cycles.fifo_full", 1000},
                                 {"stall_cycles.array_busy", 3000}};
  f.units["chip0.core0.mxu1"] = {{"busy_cycles", 5000}, {"stall_cycles", {{"waiting_for_results", 2000}}}};
  f.units["chip0.core0.sequencer"] = {{"issued", 900}, {"stall_flag_cycles", 4000}, {"stall_queue_full_cycles", 500}};
  f.units["chip0.core0.vpu"] = {{"busy_cycles", 2500}, {"stall_dependency_cycles", 100}};
  f.units["chip0.core0.dma0"] = {{"busy_cycles", 8000}, {"bytes", 4000000}, {"cycles", 16000}};
  f.units["chip0.ici.link0"] = {{"busy_cycles", 1234.5}, {"credit_stall_cycles", 10}, {"bytes", 65536}};
  f.units["chip0.hbm"] = {{"reads", 12}, {"label", "hbm2_v4"}, {"latency_histogram", {{"100", 3}, {"200", 9}}}};
  try {
    const json stats = tpusim::run::make_stats(f);
    const auto problems = tpusim::run::check_stats(stats);
    if (!problems.empty()) {
      std::fprintf(stderr, "stats_fixture: invalid stats: %s\n", problems.front().c_str());
      return 1;
    }
    tpusim::run::write_stats(argv[1], stats);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stats_fixture: %s\n", e.what());
    return 1;
  }
  return 0;
}

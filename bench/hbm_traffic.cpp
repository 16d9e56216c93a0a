// hbm_traffic: the HBM acceptance table (docs/validation.md, "HBM"). Runs synthetic
// patterns against a preset and prints achieved bandwidth as a fraction of peak,
// request latency, and the simulation speed in DRAM cycles per wall-clock second.
//
//   hbm_traffic                                  # every preset x every pattern
//   hbm_traffic --preset hbm2_v3 --pattern sequential --set hbm.page_policy=closed
//   hbm_traffic --preset hbm2_v4 --pattern random_read --json   # full stats.json block
#include "hw/hbm/hbm_memory.h"
#include "hw/hbm/traffic.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <iostream>

using namespace tpusim;

int main(int argc, char** argv) {
  CLI::App app{"HBM traffic generator: bandwidth, latency and simulation speed per preset and pattern"};
  std::vector<std::string> presets, patterns, overrides;
  uint64_t requests = 0;
  uint32_t streams = 8;
  bool json = false;
  app.add_option("--preset", presets, "HBM preset name(s) in configs/hbm (default: all)");
  app.add_option("--pattern", patterns, "sequential, strided, random_read, random_write, mix, streams (default: all)");
  app.add_option("--streams", streams, "streams: DMA-like streams at once (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--requests", requests,
                 "requests per run (default: 64 MiB worth for sequential, mix and streams, 200000 otherwise)");
  app.add_option("--set", overrides, "hbm.KEY=VALUE override (repeatable)");
  app.add_flag("--json", json, "print the controller's stats as JSON after each run");
  CLI11_PARSE(app, argc, argv);
  try {
    if (presets.empty()) presets = hbm::hbm_preset_names();
    if (patterns.empty())
      for (hbm::Pattern p : hbm::kAllPatterns) patterns.push_back(hbm::pattern_name(p));
    // Every preset and pattern checked before any output, so an error is the only line.
    std::vector<hbm::HbmConfig> configs;
    for (const auto& preset : presets) configs.push_back(hbm::load_hbm_preset(preset, overrides));
    for (const auto& pname : patterns) hbm::parse_pattern(pname);
    fmt::print("{:<10} {:<13} {:>9} {:>7} {:>9} {:>9} {:>9} {:>11} {:>8} {:>10}\n", "preset", "pattern", "GB/s",
               "%peak", "lat_avg", "lat_p50", "lat_p99", "dram_cyc", "wall_s", "Mcyc/s");
    for (const auto& cfg : configs) {
      for (const auto& pname : patterns) {
        const hbm::Pattern p = hbm::parse_pattern(pname);
        hbm::HbmMemory mem(cfg);
        // Streaming patterns move 64 MiB whatever their request size; the small
        // random and strided requests run a fixed count.
        const bool streaming = p == hbm::Pattern::kSequential || p == hbm::Pattern::kMix || p == hbm::Pattern::kStreams;
        hbm::TrafficSpec spec = hbm::TrafficSpec::defaults(p, 0);
        spec.requests = requests ? requests : streaming ? (uint64_t(64) << 20) / spec.request_bytes : 200000;
        spec.streams = streams;
        const auto t0 = std::chrono::steady_clock::now();
        const hbm::TrafficResult r = hbm::run_traffic(mem, spec, cfg.capacity_bytes());
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        fmt::print("{:<10} {:<13} {:>9.1f} {:>6.1f}% {:>7.1f}ns {:>7}ns {:>7}ns {:>11} {:>8.3f} {:>10.2f}\n",
                   cfg.name, pname, r.bytes_per_s / 1e9, 100 * r.fraction_of_peak, r.latency_ns.mean(),
                   r.latency_ns.percentile(0.5), r.latency_ns.percentile(0.99), mem.cycle(), wall,
                   double(mem.cycle()) / wall / 1e6);
        if (json) std::cout << mem.stats_json().dump(1) << "\n";
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "hbm_traffic: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

// All-reduce on the ICI network model: achieved bandwidth against the alpha-beta
// closed form over a size sweep, and the 100 MB all-reduce on a 16x16 v2 slice
// timed in wall-clock seconds (docs/ici.md, "Measured").
//
//   ici_allreduce                          # sweep 1 KiB..256 MiB, v3-8, v2-4x4, v4-4x4x4
//   ici_allreduce --presets v3-8 --algorithms ring --max 1048576
//   ici_allreduce --big                    # 100e6 bytes on v2-16x16, torus, timed
//   ici_allreduce --calibrate              # v4 single transfers against the micro-benchmarks
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>

#include "hw/config/params.h"
#include "hw/ici/collective_sim.h"

using namespace tpusim;

namespace {

struct Row {
  uint64_t cycles;
  double closed, wall;
  uint64_t messages;
};

// bytes: per chip, or per core for the hierarchical algorithm (both cores of every
// chip take part; its closed form adds the on-chip steps at the preset's
// core_to_core fit).
Row run_one(const config::Params& p, ici::Algorithm algo, uint64_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  ici::Network net = ici::Network::from_params(p);
  const int64_t elements = int64_t(bytes / 4);  // fp32
  const bool hier = algo == ici::Algorithm::kHierarchical;
  const ici::Schedule s =
      ici::make_schedule(ici::CollectiveKind::kAllReduce, algo, net.topology(), elements, hier ? 2 : 1);
  const ici::CollectiveRun r = ici::simulate(net, s, 4);
  const auto ab = net.neighbour_alpha_beta();
  const double onchip_alpha = p.get_double("core.dma.core_to_core.latency_cycles");
  const double onchip_beta = p.get_double("core.dma.core_to_core.cycles_per_kib") / 1024;
  const double closed = ici::closed_form_cycles(ici::CollectiveKind::kAllReduce, algo, net.topology(), double(bytes),
                                                ab.alpha_cycles, ab.beta_cycles_per_byte, onchip_alpha, onchip_beta);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {r.cycles, closed, wall, r.messages};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ICI all-reduce bandwidth against the alpha-beta closed form"};
  std::vector<std::string> presets{"v3-8", "v2-4x4", "v4-4x4x4"};
  std::vector<std::string> algorithms{"ring", "bidir-ring", "torus", "hierarchical"};
  uint64_t min_bytes = 1024, max_bytes = uint64_t(256) << 20, factor = 4;
  bool big = false, calibrate = false;
  app.add_option("--presets", presets, "board presets");
  app.add_option("--algorithms", algorithms, "ring | bidir-ring | torus | hierarchical (both cores of each chip)");
  app.add_option("--min", min_bytes, "smallest buffer, bytes per chip");
  app.add_option("--max", max_bytes, "largest buffer, bytes per chip");
  app.add_option("--factor", factor, "size step factor")->check(CLI::Range(2, 1024));
  app.add_flag("--big", big, "only the 100 MB all-reduce on v2-16x16 (torus), timed");
  app.add_flag("--calibrate", calibrate, "only the v4 single-transfer table against the micro-benchmarks");
  CLI11_PARSE(app, argc, argv);
  try {
    if (calibrate) {
      const auto p = config::load_preset("v4-8");
      fmt::print("| path | KiB | model cycles | published fit | model/published |\n|---|---:|---:|---:|---:|\n");
      for (int same_chip = 0; same_chip < 2; ++same_chip)
        for (uint64_t kib : {1, 4, 16, 64, 256, 1024, 4096, 16384}) {
          ici::Network net = ici::Network::from_params(p);
          const ici::MessageId id = net.send({0, 0}, {same_chip ? 0 : 1, same_chip ? 1 : 0}, kib * 1024, 0);
          net.run();
          const double want = same_chip ? 414 + 2.0 * double(kib) : 1941 + 24.77 * double(kib);
          fmt::print("| {} | {} | {} | {:.0f} | {:.4f} |\n", same_chip ? "same chip core0->core1" : "neighbour chip",
                     kib, net.delivery_cycle(id), want, double(net.delivery_cycle(id)) / want);
        }
      return 0;
    }
    if (big) {
      const auto p = config::load_preset("v2-16x16");
      const Row r = run_one(p, ici::Algorithm::kTorus, 100000000);
      const double clock = p.get_double("clock_hz");
      fmt::print("v2-16x16 torus all-reduce of 100e6 bytes: {} cycles = {:.3f} ms simulated, {:.1f} GB/s algorithm "
                 "bandwidth, closed form {:.0f} cycles (sim/closed {:.4f}), {} messages, {:.2f} s wall\n",
                 r.cycles, 1e3 * double(r.cycles) / clock, 100e6 / (double(r.cycles) / clock) / 1e9, r.closed,
                 double(r.cycles) / r.closed, r.messages, r.wall);
      return 0;
    }
    fmt::print(
        "| preset | algorithm | bytes/chip (hierarchical: /core) | cycles | us | algbw GB/s | closed-form cycles "
        "| sim/closed | wall s |\n");
    fmt::print("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& name : presets) {
      const auto p = config::load_preset(name);
      const double clock = p.get_double("clock_hz");
      for (const auto& a : algorithms) {
        const ici::Algorithm algo = ici::parse_algorithm(a);
        for (uint64_t n = min_bytes; n <= max_bytes; n *= factor) {
          const Row r = run_one(p, algo, n);
          const double secs = double(r.cycles) / clock;
          fmt::print("| {} | {} | {} | {} | {:.1f} | {:.2f} | {:.0f} | {:.4f} | {:.2f} |\n", name, a, n, r.cycles,
                     secs * 1e6, double(n) / secs / 1e9, r.closed, double(r.cycles) / r.closed, r.wall);
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "ici_allreduce: {}\n", e.what());
    return 2;
  }
  return 0;
}

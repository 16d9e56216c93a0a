// The 100 MB all-reduce on a 16x16 v2 slice through the SystemC fast view
// (IciFast), timed, to show what the SystemC kernel adds over the plain core
// that ici_allreduce --big runs (docs/ici.md, "Speed").
//
//   ici_fast_view [preset] [bytes]        # defaults: v2-16x16 100000000
#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <systemc>

#include "hw/config/params.h"
#include "hw/ici/collective_sim.h"
#include "hw/ici/ici_views.h"

using namespace tpusim;

int sc_main(int argc, char** argv) {
  try {
    const std::string preset = argc > 1 ? argv[1] : "v2-16x16";
    const uint64_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 100000000;
    const auto t0 = std::chrono::steady_clock::now();
    const auto p = config::load_preset(preset);
    ici::Network net = ici::Network::from_params(p);
    const ici::Schedule s =
        ici::make_schedule(ici::CollectiveKind::kAllReduce, ici::Algorithm::kTorus, net.topology(), int64_t(bytes / 4));
    // 1 ns per cycle: sc_time needs a whole number of its resolution per cycle.
    ici::IciFast view("ici", net, sc_core::sc_time(1, sc_core::SC_NS));
    ici::CollectiveDriver driver(net, s, 4);
    driver.start();
    sc_core::sc_start();
    const ici::CollectiveRun r = driver.result();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("{} torus all-reduce of {} bytes through IciFast: {} cycles, {} messages, {:.2f} s wall\n", preset, bytes,
               r.cycles, r.messages, wall);
  } catch (const std::exception& e) {
    fmt::print(stderr, "ici_fast_view: {}\n", e.what());
    return 2;
  }
  return 0;
}

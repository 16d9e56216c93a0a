// The fast (event-driven) and the clocked SystemC views of the network give the
// plain core's delivery cycles and counters exactly. SystemC elaborates once per
// process, so each view has its own test (ctest runs each in its own process).
#include <gtest/gtest.h>

#include <random>
#include <systemc>

#include "hw/config/params.h"
#include "hw/ici/collective_sim.h"
#include "hw/ici/ici_views.h"

namespace tpusim::ici {
namespace {

struct Traffic {
  Endpoint src, dst;
  uint64_t bytes, cycle;  // issued between edges cycle and cycle+1
};

std::vector<Traffic> traffic(const Network& net) {
  std::mt19937 rng(11);
  std::vector<Traffic> out;
  uint64_t c = 0;
  for (int i = 0; i < 60; ++i) {
    c += rng() % 300;
    out.push_back({{int(rng() % 4), int(rng() % 2)}, {int(rng() % 4), int(rng() % 2)}, rng() % 30000, c});
  }
  (void)net;
  return out;
}

const char* kPreset = "v3-8";

// The plain core: a message issued between edges c and c+1 is issued at c+1.
std::pair<std::vector<uint64_t>, std::vector<uint64_t>> reference() {
  Network net = Network::from_params(config::load_preset(kPreset, {"ici.buffer_packets=3"}));
  std::vector<MessageId> ids;
  for (const auto& t : traffic(net)) {
    if (net.now() < t.cycle + 1) net.skip(t.cycle + 1 - net.now());
    ids.push_back(net.send(t.src, t.dst, t.bytes, t.cycle + 1));
  }
  net.run();
  std::vector<uint64_t> d, ctr;
  for (auto id : ids) d.push_back(net.delivery_cycle(id));
  for (const auto& c : net.link_counters()) {
    ctr.push_back(c.bytes);
    ctr.push_back(c.credit_stall_cycles);
  }
  return {d, ctr};
}

template <typename View>
struct Bench : sc_core::sc_module {
  SC_HAS_PROCESS(Bench);
  Bench(sc_core::sc_module_name n, View& v, sc_core::sc_time cycle) : sc_module(n), view(v), cycle(cycle) {
    SC_THREAD(drive);
  }
  void drive() {
    for (const auto& t : traffic(view.network())) {
      const sc_core::sc_time at = cycle * double(t.cycle) + cycle / 2;
      if (at > sc_core::sc_time_stamp()) wait(at - sc_core::sc_time_stamp());
      const MessageId id = view.send(t.src, t.dst, t.bytes, [this](MessageId m, uint64_t c) {
        // The callback runs in the simulated cycle it reports.
        EXPECT_EQ(uint64_t(sc_core::sc_time_stamp() / cycle), c) << "message " << m;
      });
      ids.push_back(id);
    }
  }
  View& view;
  sc_core::sc_time cycle;
  std::vector<MessageId> ids;
};

template <typename View>
void check(Network& net, const Bench<View>& bench) {
  const auto [want_d, want_ctr] = reference();
  std::vector<uint64_t> d, ctr;
  for (auto id : bench.ids) d.push_back(net.delivery_cycle(id));
  for (const auto& c : net.link_counters()) {
    ctr.push_back(c.bytes);
    ctr.push_back(c.credit_stall_cycles);
  }
  EXPECT_EQ(net.messages_in_flight(), 0u);
  EXPECT_EQ(d, want_d);
  EXPECT_EQ(ctr, want_ctr);
  uint64_t stalls = 0;
  for (size_t i = 1; i < ctr.size(); i += 2) stalls += ctr[i];
  EXPECT_GT(stalls, 0u) << "the traffic should exercise credit stalls";
}

TEST(IciViews, FastViewMatchesCore) {
  Network net = Network::from_params(config::load_preset(kPreset, {"ici.buffer_packets=3"}));
  const sc_core::sc_time cycle(1, sc_core::SC_NS);
  IciFast view("ici", net, cycle);
  Bench<IciFast> bench("bench", view, cycle);
  sc_core::sc_start();  // returns when nothing is left to do
  check(net, bench);
}

TEST(IciViews, ClockedViewMatchesCore) {
  Network net = Network::from_params(config::load_preset(kPreset, {"ici.buffer_packets=3"}));
  const sc_core::sc_time cycle(1, sc_core::SC_NS);
  sc_core::sc_clock clk("clk", cycle);
  IciClocked view("ici", net);
  view.clk(clk);
  Bench<IciClocked> bench("bench", view, cycle);
  const auto [want_d, want_ctr] = reference();
  uint64_t last = 0;
  for (auto d : want_d) last = std::max(last, d);
  sc_core::sc_start(cycle * double(last + 10));
  check(net, bench);
}

TEST(IciViews, FastViewRunsACollectiveLikeTheCore) {
  // A 4 MiB torus all-reduce on a 4x4 v2 slice, driven by delivery callbacks
  // inside the SystemC thread, against the same schedule on the plain core.
  const auto preset = config::load_preset("v2-4x4");
  Network ref = Network::from_params(preset);
  const Schedule s = make_schedule(CollectiveKind::kAllReduce, Algorithm::kTorus, ref.topology(), 1 << 20);
  const CollectiveRun want = simulate(ref, s, 4);

  Network net = Network::from_params(preset);
  IciFast view("ici", net, sc_core::sc_time(1, sc_core::SC_NS));
  CollectiveDriver driver(net, s, 4);
  driver.start();
  sc_core::sc_start();
  ASSERT_TRUE(driver.done());
  const CollectiveRun got = driver.result();
  EXPECT_EQ(got.cycles, want.cycles);
  EXPECT_EQ(got.bytes_moved, want.bytes_moved);
  EXPECT_EQ(uint64_t(sc_core::sc_time_stamp() / sc_core::sc_time(1, sc_core::SC_NS)), want.cycles);
  const auto a = ref.link_counters(), b = net.link_counters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].bytes, b[i].bytes) << a[i].name;
    EXPECT_EQ(a[i].credit_stall_cycles, b[i].credit_stall_cycles) << a[i].name;
  }
}

}  // namespace
}  // namespace tpusim::ici

// The ICI network core against independent expectations: shortest torus/mesh
// distances, the published v4 micro-benchmarks, the closed forms of a single
// transfer, of credit-limited streaming and of link sharing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <map>
#include <set>

#include "hw/config/params.h"
#include "hw/ici/network.h"
#include "hw/ici/topology.h"
#include "hw/timeline/timeline.h"

namespace tpusim::ici {
namespace {

int ring_distance(int a, int b, int k, bool wrap) {
  const int d = std::abs(a - b);
  return wrap ? std::min(d, k - d) : d;
}

class TopologyShapes : public ::testing::TestWithParam<Topology> {};
}  // namespace
void PrintTo(const Topology& t, std::ostream* os) { *os << t.name(); }
namespace {

TEST_P(TopologyShapes, RoutesAreShortestAndDimensionOrdered) {
  const Topology& t = GetParam();
  for (int a = 0; a < t.chips(); ++a)
    for (int b = 0; b < t.chips(); ++b) {
      int expect = 0;
      const auto ca = t.coords(a), cb = t.coords(b);
      for (int d = 0; d < t.num_dims(); ++d) expect += ring_distance(ca[d], cb[d], t.dims()[d], t.wraps());
      for (int tie : {+1, -1}) {
        const auto ports = t.route_ports(a, b, tie);
        ASSERT_EQ(int(ports.size()), expect) << a << "->" << b;
        int chip = a, last_dim = -1;
        for (int p : ports) {
          ASSERT_GE(p / 2, last_dim) << "dimension order broken";
          last_dim = p / 2;
          chip = t.neighbour(chip, p);
          ASSERT_GE(chip, 0);
        }
        EXPECT_EQ(chip, b);
      }
    }
}

TEST_P(TopologyShapes, RingOrderVisitsEveryChipOnce) {
  const Topology& t = GetParam();
  const auto order = t.ring_order();
  ASSERT_EQ(int(order.size()), t.chips());
  EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), order.size());
  EXPECT_EQ(order[0], 0);
  // Neighbour hops all the way round where a Hamiltonian cycle exists (every
  // torus here has an even dimension; a mesh needs one even dimension).
  if (t.chips() > 1 && (t.wraps() || t.dims()[0] % 2 == 0 || t.dims()[1] % 2 == 0)) {
    for (size_t i = 0; i < order.size(); ++i)
      EXPECT_EQ(t.hops(order[i], order[(i + 1) % order.size()]), 1) << "position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TopologyShapes,
                         ::testing::Values(Topology(TopologyKind::kRing, {6}), Topology(TopologyKind::kTorus2d, {2, 2}),
                                           Topology(TopologyKind::kTorus2d, {4, 4}),
                                           Topology(TopologyKind::kTorus2d, {3, 4}),
                                           Topology(TopologyKind::kMesh2d, {4, 4}),
                                           Topology(TopologyKind::kMesh2d, {3, 2}),
                                           Topology(TopologyKind::kMesh2d, {4, 3}),
                                           Topology(TopologyKind::kMesh2d, {3, 3}),
                                           Topology(TopologyKind::kTorus3d, {4, 4, 4}),
                                           Topology(TopologyKind::kTorus3d, {2, 2, 1})));

TEST(Topology, TieGoesTheAskedWayAndSizeTwoHasParallelLinks) {
  const Topology t(TopologyKind::kTorus2d, {4, 2});
  EXPECT_EQ(t.route_ports(0, 2, +1), (std::vector<int>{port_plus(0), port_plus(0)}));
  EXPECT_EQ(t.route_ports(0, 2, -1), (std::vector<int>{port_minus(0), port_minus(0)}));
  EXPECT_EQ(t.neighbour(0, port_plus(1)), 4);
  EXPECT_EQ(t.neighbour(0, port_minus(1)), 4);
  EXPECT_EQ(t.route_ports(0, 4, -1), (std::vector<int>{port_minus(1)}));
}

TEST(Topology, PresetMismatchesAreOneLineErrors) {
  auto p = config::load_preset("v3-8", {"system.chips=8"});
  try {
    Topology::from_params(p);
    FAIL();
  } catch (const IciError& e) {
    EXPECT_NE(std::string(e.what()).find("v3-8.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("system.chips"), std::string::npos) << e.what();
  }
  // A 3-D torus needs 6 links; v2 chips have 4.
  EXPECT_THROW(Topology::from_params(config::load_preset("v2-8", {"system.topology=torus3d", "system.dims=[2, 2, 2]",
                                                                  "system.chips=8"})),
               IciError);
  EXPECT_THROW(Topology::from_params(config::load_preset("v2-8", {"system.topology=hypercube"})), IciError);
  EXPECT_THROW(Topology(TopologyKind::kTorus2d, {4096, 4096}), IciError);  // 16 M chips: refused, not allocated
  EXPECT_THROW(Topology(TopologyKind::kTorus2d, {0, 4}), IciError);
  EXPECT_THROW(Topology(TopologyKind::kTorus2d, {2, 2, 2}), IciError);
  EXPECT_THROW(NetworkParams::from_params(config::load_preset("v4", {"ici.link_latency_cycles=0"})), IciError);
  EXPECT_THROW(NetworkParams::from_params(config::load_preset("v4", {"ici.packet_bytes=0"})), IciError);
}

uint64_t one_transfer(Network& net, Endpoint a, Endpoint b, uint64_t bytes) {
  const uint64_t t0 = net.now();
  const MessageId id = net.send(a, b, bytes, t0);
  net.run();
  return net.delivery_cycle(id) - t0;
}

// Published v4 micro-benchmarks (architecture.md), one transfer in flight.
TEST(Calibration, NeighbourChipVmemToVmemMatchesV4Measurement) {
  const auto p = config::load_preset("v4-8");
  const double lat = p.get_double("ici.neighbour_vmem_to_vmem.latency_cycles");
  const double per_kib = p.get_double("ici.neighbour_vmem_to_vmem.cycles_per_kib");
  ASSERT_DOUBLE_EQ(lat, 1941);
  ASSERT_DOUBLE_EQ(per_kib, 24.77);
  for (uint64_t kib : {1, 2, 8, 64, 512, 4096, 16384}) {
    Network net = Network::from_params(p);
    const double got = double(one_transfer(net, {0, 0}, {1, 0}, kib * 1024));
    const double want = 1941 + 24.77 * double(kib);
    EXPECT_NEAR(got, want, 0.10 * want) << kib << " KiB";
  }
}

TEST(Calibration, SameChipCoreToCoreMatchesV4Measurement) {
  const auto p = config::load_preset("v4-8");
  for (uint64_t kib : {1, 16, 256, 4096}) {
    Network net = Network::from_params(p);
    const double got = double(one_transfer(net, {2, 0}, {2, 1}, kib * 1024));
    const double want = 414 + 2.0 * double(kib);
    EXPECT_NEAR(got, want, 0.10 * want) << kib << " KiB";
  }
}

TEST(Calibration, SingleTransferEqualsAlphaBeta) {
  for (const char* preset : {"v2-8", "v3-8", "v4-8"}) {
    Network probe = Network::from_params(config::load_preset(preset));
    const auto ab = probe.neighbour_alpha_beta();
    for (uint64_t packets : {1, 3, 100, 2000}) {
      Network net = Network::from_params(config::load_preset(preset));
      const uint64_t n = packets * uint64_t(net.params().packet_bytes);
      const double got = double(one_transfer(net, {0, 1}, {1, 1}, n));
      // Whole-cycle rounding at each of the four store-and-forward stages.
      EXPECT_NEAR(got, ab.alpha_cycles + double(n) * ab.beta_cycles_per_byte, 4.0) << preset << " " << n;
    }
  }
}

TEST(Calibration, PacketSizeIsAParameter) {
  // Other packet sizes keep the single-transfer closed form; only the on-chip
  // store-and-forward share of alpha (2 P / onchip rate) moves.
  for (const char* packet : {"256", "8192"}) {
    const auto p = config::load_preset("v4-8", {std::string("ici.packet_bytes=") + packet});
    Network net = Network::from_params(p);
    const auto ab = net.neighbour_alpha_beta();
    const uint64_t n = 40 * uint64_t(net.params().packet_bytes);
    const double got = double(one_transfer(net, {0, 0}, {1, 0}, n));
    EXPECT_NEAR(got, ab.alpha_cycles + double(n) * ab.beta_cycles_per_byte, 4.0) << packet;
    uint64_t packets = 0;
    for (const auto& c : net.link_counters())
      if (c.name == "chip0.ici.x+") packets = c.packets;
    EXPECT_EQ(packets, 40u);
  }
}

TEST(Calibration, EachExtraHopCostsLinkAndRouterLatency) {
  const auto p = config::load_preset("v4-4x4x4");
  Network a = Network::from_params(p), b = Network::from_params(p);
  const auto& prm = a.params();
  const uint64_t n = uint64_t(prm.packet_bytes);
  const double one = double(one_transfer(a, {0, 0}, {1, 0}, n));
  const double three = double(one_transfer(b, {0, 0}, {1 + 4 + 16, 0}, n));  // +x, +y, +z
  const double per_hop = double(prm.link_latency_cycles + prm.router_latency_cycles) +
                         double(n) / prm.link_payload_bytes_per_cycle();
  EXPECT_NEAR(three - one, 2 * per_hop, 3.0);
}

TEST(FlowControl, OneCreditLimitsAStreamToOnePacketPerRoundTrip) {
  auto p = config::load_preset("v4-8", {"ici.buffer_packets=1"});
  Network net = Network::from_params(p);
  const auto& prm = net.params();
  const uint64_t packets = 50, n = packets * uint64_t(prm.packet_bytes);
  const double got = double(one_transfer(net, {0, 0}, {1, 0}, n));
  // A packet on the chip link waits for the credit of the previous one: its
  // serialisation, the trip over, the router, the credit's trip back.
  const double ser = double(prm.packet_bytes) / prm.link_payload_bytes_per_cycle();
  const double round_trip = ser + 2.0 * double(prm.link_latency_cycles) + double(prm.router_latency_cycles);
  const double want = net.neighbour_alpha_beta().alpha_cycles + ser + double(packets - 1) * round_trip;
  EXPECT_NEAR(got, want, 0.01 * want);
  uint64_t stalls = 0;
  for (const auto& c : net.link_counters())
    if (c.name == "chip0.ici.x+") stalls = c.credit_stall_cycles;
  // The link stalls from when the next packet is at its router (its own credit
  // for the inject buffer came back when this one left) until the credit returns.
  const double next_ready = 2.0 * double(prm.onchip_latency_cycles) +
                            double(prm.packet_bytes) / prm.onchip_bytes_per_cycle + double(prm.router_latency_cycles);
  EXPECT_NEAR(double(stalls), double(packets - 1) * (round_trip - next_ready), 0.02 * double(packets) * round_trip);
}

TEST(FlowControl, TwoStreamsShareALinkFairlyEnough) {
  // Chips 0 and 3 of a ring of 4 both send to chip 2... via chip 1 for 0, and
  // 3 directly: no shared link. Instead two cores of chip 0 send to chip 1.
  Network net = Network::from_params(config::load_preset("v4-8"));
  const uint64_t n = 4 << 20;
  const MessageId a = net.send({0, 0}, {1, 0}, n, 0);
  const MessageId b = net.send({0, 1}, {1, 1}, n, 0);
  net.run();
  const auto ab = net.neighbour_alpha_beta();
  const double both = ab.alpha_cycles + 2.0 * double(n) * ab.beta_cycles_per_byte;
  EXPECT_NEAR(double(std::max(net.delivery_cycle(a), net.delivery_cycle(b))), both, 0.01 * both);
  // Oldest-first arbitration interleaves packets: both finish near the end.
  EXPECT_NEAR(double(std::min(net.delivery_cycle(a), net.delivery_cycle(b))), both, 0.01 * both);
  for (const auto& c : net.link_counters())
    if (c.name == "chip0.ici.x+") {
      EXPECT_EQ(c.bytes, 2 * n);
      EXPECT_NEAR(c.busy_cycles, 2.0 * double(n) * ab.beta_cycles_per_byte, 2.0);
    }
}

// A core's inject link (docs/ici.md "Injection"): two transfers to one neighbour
// go one after the other, the older first at the link's rate, as a router's
// oldest-first output takes them; two to different neighbours share only the
// inject link (512 B a cycle against a chip link's ~41) and both land at the
// single-transfer figure. With ici.inject_order round_robin the two to one
// neighbour interleave packet by packet and both end near twice its time.
TEST(InjectOrder, OldestTransferToAnOutputGoesFirstAndOutputsTakeTurns) {
  const auto preset = config::load_preset("v4-8");
  const Topology topo = Topology::from_params(preset);
  const uint64_t n = 1 << 20;
  struct Pair {
    uint64_t first, second;
  };
  auto run = [&](NetworkParams::InjectOrder order, int to_a, int to_b) {
    NetworkParams prm = NetworkParams::from_params(preset);
    prm.inject_order = order;
    Network net(topo, prm);
    const MessageId a = net.send({0, 0}, {to_a, 0}, n, 0);
    const MessageId b = net.send({0, 0}, {to_b, 0}, n, 0);
    net.run();
    return Pair{net.delivery_cycle(a), net.delivery_cycle(b)};
  };
  const int x = topo.neighbour(0, 0), y = topo.neighbour(0, 2);
  ASSERT_GE(x, 0);
  ASSERT_GE(y, 0);
  ASSERT_NE(x, y);
  const auto ab = Network(topo, NetworkParams::from_params(preset)).neighbour_alpha_beta();
  const double one = ab.alpha_cycles + double(n) * ab.beta_cycles_per_byte;
  const double two = ab.alpha_cycles + 2.0 * double(n) * ab.beta_cycles_per_byte;
  using O = NetworkParams::InjectOrder;
  const struct {
    O order;
    int to_b;
    double first, second;  // the expected delivery cycles
  } cases[] = {{O::kOldestPerOutput, x, one, two},
               {O::kOldestPerOutput, y, one, one},
               {O::kRoundRobin, x, two, two},
               {O::kRoundRobin, y, one, one}};
  for (const auto& c : cases) {
    const Pair got = run(c.order, x, c.to_b);
    EXPECT_NEAR(double(got.first), c.first, 0.005 * c.first) << int(c.order) << " to chip " << c.to_b;
    EXPECT_NEAR(double(got.second), c.second, 0.005 * c.second) << int(c.order) << " to chip " << c.to_b;
  }
  // The key is read from the preset, and a value it does not know is an error.
  EXPECT_EQ(NetworkParams::from_params(config::load_preset("v4-8", {"ici.inject_order=round_robin"})).inject_order,
            O::kRoundRobin);
  try {
    NetworkParams::from_params(config::load_preset("v4-8", {"ici.inject_order=fifo"}));
    ADD_FAILURE() << "no error";
  } catch (const IciError& e) {
    EXPECT_NE(std::string(e.what()).find("ici.inject_order must be oldest_per_output or round_robin, not 'fifo'"),
              std::string::npos)
        << e.what();
  }
}

// Traffic classes (docs/ici.md "Traffic classes"): a short message sent while a
// long one from the same core to the same neighbour has filled its router buffer.
// As bulk it queues behind the long one; as urgent it waits at most for the
// bulk packet on each link as it arrives, and the link stays work-conserving:
// the bulk message ends later by the urgent one's serialisation, no more.
TEST(TrafficClass, UrgentMessageOvertakesQueuedBulkPackets) {
  const auto p = config::load_preset("v4-8");
  const uint64_t bulk = 4 << 20, at = 20000;
  struct Run {
    uint64_t urgent_latency, bulk_delivery;
  };
  auto run = [&](uint8_t tc, uint64_t short_bytes) {
    Network net = Network::from_params(p);
    const MessageId b = net.send({0, 0}, {1, 0}, bulk, 0);
    const MessageId u = short_bytes ? net.send({0, 0}, {1, 0}, short_bytes, at, {}, +1, false, tc) : b;
    net.run();
    return Run{net.delivery_cycle(u) - at, net.delivery_cycle(b)};
  };
  Network probe = Network::from_params(p);
  const auto ab = probe.neighbour_alpha_beta();
  const auto& prm = probe.params();
  const double P = double(prm.packet_bytes), ser = P / prm.link_payload_bytes_per_cycle();
  const double inject_ser = P / prm.onchip_bytes_per_cycle;
  const uint64_t n = 16 * uint64_t(prm.packet_bytes);
  const double alone = ab.alpha_cycles + double(n) * ab.beta_cycles_per_byte;
  const Run urgent = run(1, n), bulk_class = run(0, n), bulk_alone = run(0, 0);
  // Urgent: its own latency plus at most the one bulk packet on the inject link
  // and the one on the chip link when it arrives (and whole-cycle rounding).
  EXPECT_GE(double(urgent.urgent_latency), alone - 4.0);
  EXPECT_LE(double(urgent.urgent_latency), alone + ser + inject_ser + 4.0);
  // Bulk: behind the long message's packets (all of them, below).
  EXPECT_GT(double(bulk_class.urgent_latency), alone + 0.5 * double(prm.buffer_packets) * ser);
  // Either way the link carries both messages back to back: the urgent one
  // ends the long one its serialisation later; a bulk one waits for all of the
  // long one (the inject link takes a core's transfers to one output oldest
  // first), which ends as if alone.
  const double short_ser = double(n) * ab.beta_cycles_per_byte;
  EXPECT_NEAR(double(urgent.bulk_delivery), double(bulk_alone.bulk_delivery) + short_ser, 4.0);
  EXPECT_EQ(bulk_class.bulk_delivery, bulk_alone.bulk_delivery);
  EXPECT_NEAR(double(at + bulk_class.urgent_latency), double(bulk_alone.bulk_delivery) + short_ser, 4.0);
  EXPECT_THROW(probe.send({0, 0}, {1, 0}, 10, 0, {}, +1, false, 2), IciError);
}

TEST(Counters, StatsJsonKeyedByHierarchicalName) {
  Network net = Network::from_params(config::load_preset("v3-8"));
  net.send({0, 1}, {1, 0}, 10000, 0);  // chip 0 -> chip 1 is +x
  net.run();
  nlohmann::json units = nlohmann::json::object();
  net.add_stats(units);
  ASSERT_TRUE(units.contains("chip0.core1.ici.inject"));
  ASSERT_TRUE(units.contains("chip0.ici.x+"));
  ASSERT_TRUE(units.contains("chip1.core0.ici.eject"));
  EXPECT_EQ(units.size(), 3u);  // idle links are left out
  EXPECT_EQ(units["chip0.ici.x+"]["bytes"], 10000);
  EXPECT_EQ(units["chip0.ici.x+"]["packets"], (10000 + net.params().packet_bytes - 1) / net.params().packet_bytes);
  EXPECT_NEAR(units["chip0.ici.x+"]["busy_cycles"].get<double>(), 10000 / net.params().link_payload_bytes_per_cycle(),
              0.01);
}

TEST(Counters, MessagesBecomeTimelineSlices) {
  Network net = Network::from_params(config::load_preset("v3-8"));
  timeline::Options opt;
  opt.clock_hz = net.params().clock_hz;
  timeline::Timeline tl(opt);
  net.set_timeline(&tl);
  const MessageId a = net.send({0, 1}, {3, 0}, 5000, 10);
  const MessageId b = net.send({0, 1}, {1, 1}, 100, 20, {}, +1, false, 1);  // urgent
  net.run();
  EXPECT_EQ(tl.recorded_events(), 2u);
  const auto j = nlohmann::json::parse(tl.to_json());
  int found = 0;
  for (const auto& ev : j["traceEvents"])
    if (ev.value("name", "") == "dma 5000 B" || ev.value("name", "") == "dma 100 B") {
      ++found;
      const bool big = ev["name"] == "dma 5000 B";
      const double us_per_cycle = 1e6 / net.params().clock_hz;
      EXPECT_NEAR(ev["ts"].get<double>(), (big ? 10 : 20) * us_per_cycle, 1e-6);
      EXPECT_NEAR(ev["dur"].get<double>(),
                  double(net.delivery_cycle(big ? a : b) - (big ? 10 : 20)) * us_per_cycle, 1e-6);
      EXPECT_EQ(ev["args"].value("class", "bulk"), big ? "bulk" : "urgent");
    }
  EXPECT_EQ(found, 2);
}

struct Traffic {
  Endpoint src, dst;
  uint64_t bytes, at;
  int tie;
};

std::vector<Traffic> random_traffic(const Network& net, int count, uint32_t seed, uint64_t max_bytes) {
  std::mt19937 rng(seed);
  std::vector<Traffic> out;
  const int chips = net.topology().chips(), cores = net.params().cores_per_chip;
  uint64_t at = 0;
  for (int i = 0; i < count; ++i) {
    at += rng() % 200;
    out.push_back({{int(rng() % chips), int(rng() % cores)},
                   {int(rng() % chips), int(rng() % cores)},
                   rng() % (max_bytes + 1),
                   at,
                   rng() % 2 ? 1 : -1});
  }
  return out;
}

TEST(Determinism, TickSkipAndRunAgree) {
  const auto p = config::load_preset("v2-4x4", {"ici.buffer_packets=4"});
  std::vector<std::vector<uint64_t>> results;
  std::vector<std::vector<uint64_t>> bytes;
  for (int mode = 0; mode < 3; ++mode) {
    Network net = Network::from_params(p);
    const auto traffic = random_traffic(net, 300, 7, 40000);
    size_t next = 0;
    std::vector<MessageId> ids;
    auto issue_due = [&] {
      while (next < traffic.size() && traffic[next].at <= net.now()) {
        const auto& t = traffic[next++];
        ids.push_back(net.send(t.src, t.dst, t.bytes, net.now(), {}, t.tie));
      }
    };
    while (next < traffic.size()) {
      issue_due();
      if (next >= traffic.size()) break;
      const uint64_t until = traffic[next].at;
      if (mode == 0) {
        while (net.now() < until) net.tick();
      } else {
        // skip in uneven strides, and through next_event() hops
        while (net.now() < until) {
          const uint64_t ne = net.next_event();
          const uint64_t step = mode == 1 ? std::min<uint64_t>(until - net.now(), 37)
                                          : std::min(until, std::max(ne, net.now() + 1)) - net.now();
          net.skip(step);
        }
      }
    }
    if (mode == 0) {
      while (net.messages_in_flight()) net.tick();
    } else {
      net.run();
    }
    std::vector<uint64_t> r;
    for (MessageId id : ids) r.push_back(net.delivery_cycle(id));
    results.push_back(r);
    std::vector<uint64_t> b;
    for (const auto& c : net.link_counters()) {
      b.push_back(c.bytes);
      b.push_back(c.credit_stall_cycles);
      b.push_back(uint64_t(c.busy_cycles * 65536));
    }
    bytes.push_back(b);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  EXPECT_EQ(bytes[0], bytes[1]);
  EXPECT_EQ(bytes[0], bytes[2]);
}

TEST(Deadlock, AllToAllOnWrappedRingsWithTinyBuffersCompletes) {
  // Without the dateline VC, DOR on a ring with two-packet buffers and every
  // chip streaming half-way round deadlocks.
  for (const char* preset : {"v2-4x4", "v4-4x4x4"}) {
    Network net = Network::from_params(config::load_preset(preset, {"ici.buffer_packets=2"}));
    const int chips = net.topology().chips();
    uint64_t total = 0;
    for (int a = 0; a < chips; ++a)
      for (int b = 0; b < chips; ++b)
        if (a != b) {
          net.send({a, 0}, {b, 1}, 8192, 0);
          total += 8192;
        }
    ASSERT_NO_THROW(net.run());
    EXPECT_EQ(net.messages_in_flight(), 0u);
    uint64_t ejected = 0;
    for (const auto& c : net.link_counters())
      if (c.name.find("eject") != std::string::npos) ejected += c.bytes;
    EXPECT_EQ(ejected, total);
  }
}

TEST(Messages, BadRequestsAreErrors) {
  Network net = Network::from_params(config::load_preset("v3-8"));
  EXPECT_THROW(net.send({4, 0}, {0, 0}, 10, 0), IciError);
  EXPECT_THROW(net.send({0, 0}, {0, 2}, 10, 0), IciError);
  net.skip(100);
  EXPECT_THROW(net.send({0, 0}, {1, 0}, 10, 50), IciError);
  // An empty message still pays the fixed cost and is delivered.
  const MessageId id = net.send({0, 0}, {1, 0}, 0, 100);
  net.run();
  EXPECT_TRUE(net.delivered(id));
  EXPECT_GT(net.delivery_cycle(id), 100u + uint64_t(net.params().remote_setup_cycles));
}

TEST(Messages, CallbackRunsAtDeliveryAndMaySendOn) {
  Network net = Network::from_params(config::load_preset("v3-8"));
  uint64_t second_done = 0;
  net.send({0, 0}, {1, 0}, 5000, 0, [&](MessageId, uint64_t t) {
    EXPECT_EQ(net.now(), t);
    net.send({1, 0}, {3, 0}, 5000, t, [&](MessageId, uint64_t t2) { second_done = t2; });
  });
  net.run();
  Network ref = Network::from_params(config::load_preset("v3-8"));
  const double single = double(one_transfer(ref, {0, 0}, {1, 0}, 5000));
  EXPECT_NEAR(double(second_done), 2 * single, 2.0);
}

// A gated message (a DMA streaming its source out of HBM, hw/dma/remote_hbm.h):
// released whole before it activates it is delivered exactly as an ungated one;
// released late, its packets wait: released half at cycle R1 and all at R2, it
// lands no earlier than R2 plus the second half's trip, and the first half's
// packets have gone ahead (it lands before a message released whole at R2).
TEST(Messages, GatedMessageWaitsForItsReleases) {
  const auto p = config::load_preset("v3-8");
  const uint64_t kBytes = 256 * 1024;
  const auto deliver = [&](bool gated, std::vector<std::pair<uint64_t, uint64_t>> releases) {
    Network net = Network::from_params(p);
    uint64_t at = 0;
    const MessageId id = net.send({0, 0}, {1, 0}, kBytes, 0, [&](MessageId, uint64_t t) { at = t; }, +1, gated);
    for (const auto& [bytes, cycle] : releases) net.release(id, bytes, cycle);
    net.run();
    return at;
  };
  const uint64_t free = deliver(false, {});
  EXPECT_EQ(deliver(true, {{kBytes, 10}}), free);
  EXPECT_EQ(deliver(true, {{kBytes / 4, 5}, {kBytes, 20}}), free);
  const uint64_t late = 20000;
  const uint64_t whole_late = deliver(true, {{kBytes, late}});
  const uint64_t half_early = deliver(true, {{kBytes / 2, 0}, {kBytes, late}});
  const double per_byte = 1.0 / (82.0e9 * 0.8681 / 940e6);
  EXPECT_GE(double(whole_late), double(late) + double(kBytes) * per_byte);
  EXPECT_GE(double(half_early), double(late) + double(kBytes / 2) * per_byte);
  EXPECT_LT(half_early, whole_late);
  EXPECT_GT(half_early, free);
  // Never released: never delivered (run() reports the stuck message).
  Network net = Network::from_params(p);
  net.send({0, 0}, {1, 0}, kBytes, 0, {}, +1, true);
  EXPECT_THROW(net.run(), IciError);
}

}  // namespace
}  // namespace tpusim::ici

namespace tpusim::ici {
namespace {

// The per-link traffic counters of the timeline: one sample per window of
// kTrafficWindow cycles that carried packets (bytes per cycle), a zero after an
// idle stretch; summed back over the windows they give each link's byte count.
TEST(Counters, LinkTrafficCountersAddUpToTheLinkBytes) {
  Network net = Network::from_params(config::load_preset("v3-8"));
  timeline::Options opt;
  opt.clock_hz = net.params().clock_hz;
  timeline::Timeline tl(opt);
  net.set_timeline(&tl);
  net.send({0, 0}, {1, 0}, 300000, 0);
  net.send({0, 0}, {1, 0}, 7000, 200000);  // after an idle stretch
  net.run();
  net.flush_timeline();
  const auto j = nlohmann::json::parse(tl.to_json());
  std::map<std::string, double> summed;
  std::map<std::string, int> zeros;
  for (const auto& ev : j["traceEvents"]) {
    if (ev.value("ph", "") != "C") continue;
    const std::string name = ev["name"];
    const double v = ev["args"]["value"].get<double>();
    summed[name] += v * double(Network::kTrafficWindow);
    zeros[name] += v == 0;
  }
  for (const auto& c : net.link_counters()) {
    if (!c.packets) continue;
    const std::string name = c.name + " B/cycle";
    ASSERT_TRUE(summed.count(name)) << name;
    EXPECT_NEAR(summed[name], double(c.bytes), 1e-6 * double(c.bytes)) << name;
    EXPECT_GE(zeros[name], 1) << name << ": the idle stretch reads as zero";
  }
  EXPECT_TRUE(timeline::validate(tl.to_json()).empty());
}

}  // namespace
}  // namespace tpusim::ici

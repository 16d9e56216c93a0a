// HostLink against the closed forms of hw/host/host_link.h, computed here from
// the parameters: the PCIe FIFO (serialisation shared, latency pipelined) and the
// infeed source that prepares batches back to back from cycle 0.
#include <gtest/gtest.h>

#include <cmath>

#include "hw/config/params.h"
#include "hw/host/host_link.h"

namespace {

using tpusim::hw::HostLink;
using tpusim::hw::HostParams;

HostParams params(double rate, double prep_us) {
  HostParams p;
  p.latency_cycles = 1000;
  p.cycles_per_kib = 64;  // 16 B/cycle
  p.infeed_bytes_per_s = rate;
  p.batch_prep_us = prep_us;
  p.clock_hz = 1e9;
  return p;
}

TEST(HostLink, OneTransferIsLatencyPlusSerialisation) {
  HostLink h(params(0, 0));
  EXPECT_EQ(h.transfer(16384, false, 100), 100u + 1024u + 1000u);
}

TEST(HostLink, ConcurrentTransfersShareTheLinkButNotTheLatency) {
  HostLink h(params(0, 0));
  const uint64_t a = h.transfer(16384, true, 0);
  const uint64_t b = h.transfer(16384, true, 0);
  EXPECT_EQ(a, 1024u + 1000u);
  EXPECT_EQ(b, 2 * 1024u + 1000u);  // queued behind a's bytes, latency overlapped
  // The other direction has its own wire.
  EXPECT_EQ(h.transfer(16384, false, 0), 1024u + 1000u);
}

TEST(HostLink, StarvedInfeedPacesBatchesAtPrepPlusBytesOverRate) {
  // 1e8 B/s at 1 GHz = 0.1 B/cycle: 16 KiB take 163840 cycles, plus 5 us prep.
  HostLink h(params(1e8, 5.0));
  const double per_batch = 16384 / 1e8 * 1e9 + 5000;
  uint64_t prev = 0;
  for (int i = 0; i < 5; ++i) {
    const uint64_t done = h.transfer(16384, true, 0);
    EXPECT_EQ(done, static_cast<uint64_t>(std::ceil((i + 1) * per_batch + 1024 + 1000))) << "batch " << i;
    if (i) {
      EXPECT_NEAR(static_cast<double>(done - prev), per_batch, 1.0);
    }
    prev = done;
  }
  EXPECT_EQ(h.batches, 5u);
  EXPECT_GT(h.producer_wait_cycles, 4 * per_batch);
}

TEST(HostLink, AmpleInfeedIsHiddenBehindASlowConsumer) {
  HostLink h(params(1e10, 0));  // 10 B/cycle
  // Asked for far apart: the host prepared each batch long before.
  EXPECT_EQ(h.transfer(4096, true, 1000000), 1000000u + 256u + 1000u);
  EXPECT_EQ(h.transfer(4096, true, 2000000), 2000000u + 256u + 1000u);
}

TEST(HostLink, InfeedPendingFlagsCountTransfers) {
  HostLink h(params(0, 0));
  h.infeed_pending(1, 3, +1);
  h.infeed_pending(1, 3, +1);
  EXPECT_TRUE(h.infeed_pending(1, 3));
  EXPECT_FALSE(h.infeed_pending(0, 3));
  h.infeed_pending(1, 3, -1);
  EXPECT_TRUE(h.infeed_pending(1, 3));
  h.infeed_pending(1, 3, -1);
  EXPECT_FALSE(h.infeed_pending(1, 3));
  h.infeed_pending(1, -1, +1);  // no flag: nothing to wait on
  EXPECT_FALSE(h.infeed_pending(1, -1));
}

// The presets' host path is the one published measurement (TPU v4, architecture.md:
// HBM -> host ~ 131,718 + 72.3 K cycles at 1.05 GHz) in each chip's own clock, so the
// same PCIe link takes the same microseconds and bytes per second on every chip
// (v2, v3 and v4 share PCIe Gen3 x16); v5e's ~15 GB/s link scales the rate by 15/16.
// The presets once copied v4's cycle counts, which gave v5e at 1.5 GHz a host link
// faster (21.2 GB/s) than its PCIe.
TEST(HostPresets, EveryChipTimesTheV4BenchmarkInItsClock) {
  const double v4_latency_s = 131718 / 1.05e9, v4_rate = 1024 / 72.3 * 1.05e9;
  for (const char* name : {"v2", "v3", "v4", "v5e", "v3-8", "v4-4x4x4"}) {
    const auto c = tpusim::config::load_preset(name);
    const HostParams p = HostParams::from_config(c);
    const double nominal = c.get_double("host.pcie_bytes_per_s");
    EXPECT_NEAR(p.latency_cycles / p.clock_hz, v4_latency_s, 1.0 / p.clock_hz) << name;
    const double rate = 1024 / p.cycles_per_kib * p.clock_hz;
    EXPECT_NEAR(rate, v4_rate * nominal / 16e9, 1e-4 * rate) << name;
    EXPECT_LT(rate, nominal) << name << ": the timed rate must stay below the link's nominal one";
  }
}

TEST(HostPresets, NominalRateOutOfRangeNamesTheKey) {
  for (const char* bad : {"host.pcie_bytes_per_s=-1", "host.pcie_bytes_per_s=0", "host.pcie_bytes_per_s=1e16"}) {
    try {
      HostParams::from_config(tpusim::config::load_preset("v4", {bad}));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const tpusim::config::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("host.pcie_bytes_per_s must be in 1..1e15"), std::string::npos) << e.what();
    }
  }
}

}  // namespace

// Fast mode runs the chips of a pod slice apart, each alone up to the next cycle
// the network could deliver anything (hw/system, Board "windows";
// Network::next_delivery_bound). That must change nothing: the torus all-reduce
// program on all 256 chips of v2-16x16 (64 KiB per chip, the pod test's program,
// random inputs) gives the same cycles, the same counters of every unit and link
// and the same output bytes with windows as ticking every active chip each cycle,
// and both equal the functional reference. With --threads 2 (chip groups ticked on
// two threads in each window, their transfers queued and sent in chip order) the
// results are the same again.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "hw/config/params.h"
#include "hw/ici/collective_program.h"
#include "hw/ici/collectives.h"
#include "hw/ici/topology.h"

namespace fs = std::filesystem;
using namespace tpusim;

namespace {

// dir/prog.s on `preset` in fast mode with extra core_run flags; its stats as JSON.
nlohmann::json run(const fs::path& dir, const std::string& flags, const std::string& tag,
                   const std::string& preset = "v2-16x16") {
  const std::string cmd = std::string(TPUSIM_CORE_RUN) + " '" + (dir / "prog.s").string() + "' " + preset + " fast '" +
                          (dir / (tag + ".json")).string() + "'" + flags;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json j;
  std::ifstream in(dir / (tag + ".json"));
  if (in) in >> j;
  return j;
}

// `program` on `preset` with windows, ticking every chip and two threads: all three
// must agree on cycles, outputs and every unit's counters (links included), and the
// windowed run must equal the functional reference. Returns the windowed run's stats.
nlohmann::json expect_modes_agree(const std::string& program, const std::string& tag, const std::string& preset) {
  const fs::path dir = fs::temp_directory_path() / (tag + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "prog.s") << program;
  const nlohmann::json win = run(dir, "", "windows", preset);
  const nlohmann::json tick = run(dir, " --no-windows", "ticks", preset);
  const nlohmann::json two = run(dir, " --threads 2", "threads", preset);
  fs::remove_all(dir);
  EXPECT_FALSE(win.value("faulted", true)) << win.value("fault", std::string());
  EXPECT_TRUE(win.value("ref_ok", false));
  EXPECT_EQ(win["outputs"], win["ref_outputs"]);
  EXPECT_EQ(win["cycles"], tick["cycles"]);
  EXPECT_EQ(win["outputs"], tick["outputs"]);
  // Every unit of every chip, counter by counter.
  EXPECT_EQ(win["units"].size(), tick["units"].size());
  for (const auto& [name, counters] : tick["units"].items()) EXPECT_EQ(win["units"].value(name, nlohmann::json()), counters) << name;
  EXPECT_EQ(two["cycles"], tick["cycles"]);
  EXPECT_EQ(two["outputs"], tick["outputs"]);
  EXPECT_EQ(two["units"], tick["units"]);
  return win;
}

TEST(PodWindows, SameCyclesCountersAndValuesAsTickingEveryChipOnOneOrTwoThreads) {
  const config::Params preset = config::load_preset("v2-16x16", {});
  const ici::Topology topo = ici::Topology::from_params(preset);
  constexpr int64_t kElements = 16384;
  const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, ici::Algorithm::kTorus, topo, kElements);
  ici::ProgramOptions po;  // what ici_program --pod chooses
  po.unroll = 8;
  po.io_tiles = kElements / 1024;
  po.allow_ragged = true;
  const nlohmann::json win = expect_modes_agree(ici::collective_program(s, po), "pod_windows", "v2-16x16");
  ASSERT_FALSE(::testing::Test::HasFailure());  // the checks below read the windowed run's units
  // The run is long enough to have links busy and chips waiting on them.
  EXPECT_GT(win["units"]["chip0.ici.x+"].value("bytes", uint64_t{0}), 0u);
}

// Remote transfers with HBM ends (hw/dma/remote_hbm.h) on the 64 chips of
// v4-4x4x4, where windows apply: every chip pushes 256 KiB from its HBM into the
// next chip's HBM, pulls 128 KiB from a chip further on into its own HBM and
// streams a local HBM read meanwhile, so reads gate packets, writes retire after
// landings and pulls start reads from delivery callbacks. Windows, ticks and two
// threads give the same cycles, counters and bytes, equal to the reference.
TEST(PodWindows, RemoteHbmTrafficSameWithWindowsTicksAndThreads) {
  constexpr int kChips = 64;
  std::string text = ".target chips=64 cores=2 mxus=1\n";
  for (int c = 0; c < kChips; ++c) {
    const std::string n = std::to_string(c);
    text += ".input x" + n + " f32 [65536] hbm@chip" + n + ":0x0\n";
    text += ".output p" + n + " f32 [256] hbm@chip" + n + ":0x13FC00\n";  // the pushed data's last KiB
    text += ".output q" + n + " f32 [256] hbm@chip" + n + ":0x21FC00\n";  // the pulled data's last KiB
  }
  for (int c = 0; c < kChips; ++c) {
    const std::string next = std::to_string((c + 1) % kChips), far = std::to_string((c + 21) % kChips);
    text += ".core chip" + std::to_string(c) + ".core0\n";
    text += "  dma hbm@chip" + next + ".c0:[s0 + 0x100000], hbm:[s0 + 0], bytes=262144, flag=f1, rflag=f3\n";
    text += "  dma hbm:[s0 + 0x200000], hbm@chip" + far + ":[s0 + 0], bytes=131072, flag=f2\n";
    text += "  dma vmem:[s0 + 0], hbm:[s0 + 0x400000], bytes=1048576, flag=f4\n";
    text += "  wait.sub f1, 1\n  wait.sub f2, 1\n  wait.sub f3, 1\n  wait.sub f4, 1\n  halt\n";
  }
  const nlohmann::json win = expect_modes_agree(text, "pod_windows_hbm", "v4-4x4x4");
  ASSERT_FALSE(::testing::Test::HasFailure());  // the checks below read the windowed run's units
  // Every chip's memory carried its remote reads (256 + 128 KiB) and writes.
  for (int c = 0; c < kChips; ++c) {
    const auto& r = win["units"]["chip" + std::to_string(c) + ".ici_hbm"];
    EXPECT_EQ(r.value("bytes_read", uint64_t{0}), 262144u + 131072u) << c;
    EXPECT_EQ(r.value("bytes_written", uint64_t{0}), 262144u + 131072u) << c;
  }
}

}  // namespace

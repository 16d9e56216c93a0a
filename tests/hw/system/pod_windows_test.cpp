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

nlohmann::json run(const fs::path& dir, const std::string& flags, const std::string& tag) {
  const std::string cmd = std::string(TPUSIM_CORE_RUN) + " '" + (dir / "prog.s").string() + "' v2-16x16 fast '" +
                          (dir / (tag + ".json")).string() + "'" + flags;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json j;
  std::ifstream in(dir / (tag + ".json"));
  if (in) in >> j;
  return j;
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
  const fs::path dir = fs::temp_directory_path() / ("pod_windows_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "prog.s") << ici::collective_program(s, po);
  const nlohmann::json win = run(dir, "", "windows");
  const nlohmann::json tick = run(dir, " --no-windows", "ticks");
  const nlohmann::json two = run(dir, " --threads 2", "threads");
  fs::remove_all(dir);
  ASSERT_FALSE(win.value("faulted", true)) << win.value("fault", std::string());
  ASSERT_TRUE(win.value("ref_ok", false));
  EXPECT_EQ(win["outputs"], win["ref_outputs"]);
  EXPECT_EQ(win["cycles"], tick["cycles"]);
  EXPECT_EQ(win["outputs"], tick["outputs"]);
  // Every unit of every chip, the links included, counter by counter.
  ASSERT_EQ(win["units"].size(), tick["units"].size());
  for (const auto& [name, counters] : tick["units"].items()) EXPECT_EQ(win["units"][name], counters) << name;
  EXPECT_EQ(two["cycles"], tick["cycles"]);
  EXPECT_EQ(two["outputs"], tick["outputs"]);
  EXPECT_EQ(two["units"], tick["units"]);
  // The run is long enough to have links busy and chips waiting on them.
  EXPECT_GT(win["units"]["chip0.ici.x+"].value("bytes", uint64_t{0}), 0u);
}

}  // namespace

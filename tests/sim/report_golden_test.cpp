// The report as users read it, against numbers worked out by hand
// (golden/matmul_v3.md derives every figure of golden/matmul_v3.report from the
// v3 preset), and the per-op profile and timeline of a compiled model checked
// against the run's own totals and the trace-event validator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw/timeline/timeline.h"
#include "sim/run/stats.h"
#include "tests/sim/cli_fixture.h"

namespace fs = std::filesystem;
using tpusim::testing::Completed;
using tpusim::testing::slurp;
using tpusim::testing::spawn;

namespace {

const std::string kSrc = TPUSIM_SOURCE_DIR;

// The report without the host wall time line, the only figure that is not a
// function of the bundle and the preset.
std::string without_wall_time(const std::string& report) {
  std::istringstream in(report);
  std::string line, out;
  while (std::getline(in, line))
    if (line.find("host wall time") == std::string::npos) out += line + "\n";
  return out;
}

class ReportGolden : public tpusim::testing::TpusimCli {};

TEST_F(ReportGolden, SingleMatmulOnV3MatchesTheHandDerivedReport) {
  const std::string bundle = dir_ + "/mm.tpu";
  Completed c = tpusim({"asm", kSrc + "/tests/sim/golden/matmul_v3.s", "-o", bundle});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::string golden = slurp(kSrc + "/tests/sim/golden/matmul_v3.report");
  ASSERT_FALSE(golden.empty());
  for (const std::string mode : {"fast", "detailed"}) {
    const std::string out = dir_ + "/" + mode;
    c = tpusim({"run", bundle, "--preset", "v3", "--mode", mode, "--random-inputs", "1", "--out", out});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    std::string expected = golden;
    if (mode == "detailed") expected.replace(expected.find("fast mode"), 9, "detailed mode");
    EXPECT_EQ(without_wall_time(c.out), expected) << mode;
    EXPECT_EQ(c.err, "") << "no progress line when stderr is not a terminal";
    // The reprint is the same text, wall time included.
    const Completed r = tpusim({"report", out + "/stats.json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c.out);
  }
}

// A data-parallel all-reduce on the 4 chips of a v3-8: its remote DMAs read and
// write HBM on both chips (hw/dma/remote_hbm.h), and the ops, and the chips' HBM
// bandwidth counters, still account for every byte the chips' memories carried.
TEST_F(ReportGolden, BoardProfileCountsRemoteTransfersHbmEnds) {
  const std::string graph = dir_ + "/ar.graph", bundle = dir_ + "/ar.tpb";
  {
    std::ofstream g(graph);
    g << "graph ar {\n  input %x : f32[8,1]\n"
         "  %a = pad(%x) {pads=[0,0,0,65535], value=1.0} : f32[8,65536] #0\n"
         "  %g = all_reduce(%a) : f32[8,65536] #1\n"
         "  %o = slice(%g) {starts=[0,0], ends=[1,8], axes=[0,1], steps=[1,1]} : f32[1,8] #2\n"
         "  output %o\n}\n";
  }
  Completed c = tpusim({"compile", graph, "--preset", "v3-8", "--replicas", "8", "-o", bundle});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::string tl = dir_ + "/t.json";
  c = tpusim(
      {"run", bundle, "--preset", "v3-8", "--random-inputs", "1", "--out", dir_ + "/run", "-q", "--timeline", tl});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const nlohmann::json s = tpusim::run::read_stats(dir_ + "/run/stats.json");
  uint64_t hbm = 0, all_reduce = 0;
  for (const auto& op : s["ops"]) {
    hbm += op["hbm_bytes"].get<uint64_t>();
    if (op["id"] == 1) all_reduce = op["hbm_bytes"].get<uint64_t>();
  }
  EXPECT_EQ(hbm, s["hbm"]["bytes_read"].get<uint64_t>() + s["hbm"]["bytes_written"].get<uint64_t>());
  // Each replica at least reads its 256 KiB and writes the sum back.
  EXPECT_GE(all_reduce, 8u * 2 * 65536 * 4);
  // Without barriers every stalled cycle but a full queue's is a wait on a flag:
  // the per-flag waits add up to the op's hbm + infeed + sync stalls, and the
  // all-reduce waits on its streams' landing flags (f64 and up).
  for (const auto& op : s["ops"]) {
    uint64_t by_flag = 0, landings = 0;
    for (const auto& [flag, n] : op["wait_cycles_by_flag"].items()) {
      by_flag += n.get<uint64_t>();
      if (std::stoi(flag.substr(1)) >= 64) landings += n.get<uint64_t>();
    }
    const auto& st = op["stall_cycles"];
    EXPECT_EQ(by_flag, st["hbm"].get<uint64_t>() + st["infeed"].get<uint64_t>() + st["sync"].get<uint64_t>())
        << op["name"];
    if (op["id"] == 1) {
      EXPECT_GT(landings, 0u);
    }
  }
  // The 4 chips' counters (GB/s per 256-cycle window) integrate to the same bytes.
  const nlohmann::json doc = nlohmann::json::parse(slurp(tl));
  double integrated = 0;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "C" && e["name"] == "HBM bandwidth (GB/s)")
      integrated += e["args"]["value"].get<double>() * 1e9 * 256.0 / s["clock_hz"].get<double>();
  EXPECT_NEAR(integrated, double(hbm), 1e-6 * double(hbm));

  // `--timeline-scope chip2`: only chip 2's process, and its counter integrates to
  // chip 2's own HBM bytes; a window keeps only the events that reach into it.
  const std::string tl2 = dir_ + "/t2.json";
  c = tpusim({"run", bundle, "--preset", "v3-8", "--random-inputs", "1", "--out", dir_ + "/run2", "-q", "--timeline",
              tl2, "--timeline-scope", "chip2"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const nlohmann::json doc2 = nlohmann::json::parse(slurp(tl2));
  std::set<std::string> processes;
  double chip2 = 0;
  for (const auto& e : doc2["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] == "C" && e["name"] == "HBM bandwidth (GB/s)")
      chip2 += e["args"]["value"].get<double>() * 1e9 * 256.0 / s["clock_hz"].get<double>();
  }
  EXPECT_EQ(processes, std::set<std::string>{"chip2"});
  const auto& unit = s["units"]["chip2.hbm"];
  const double chip2_bytes = unit["bytes_read"].get<double>() + unit["bytes_written"].get<double>();
  EXPECT_GT(chip2_bytes, 0.0);
  EXPECT_NEAR(chip2, chip2_bytes, 1e-6 * chip2_bytes);
  const uint64_t begin = s["cycles"].get<uint64_t>() / 2, end = begin + 1000;
  const std::string tl3 = dir_ + "/t3.json";
  c = tpusim({"run", bundle, "--preset", "v3-8", "--random-inputs", "1", "--out", dir_ + "/run3", "-q", "--timeline",
              tl3, "--timeline-begin", std::to_string(begin), "--timeline-end", std::to_string(end)});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const double us_per_cycle = 1e6 / s["clock_hz"].get<double>();
  size_t slices = 0;
  const nlohmann::json doc3 = nlohmann::json::parse(slurp(tl3));
  for (const auto& e : doc3["traceEvents"])
    if (e["ph"] == "X") {
      ++slices;
      EXPECT_LE(e["ts"].get<double>(), double(end) * us_per_cycle + 1e-6);
      EXPECT_GE(e["ts"].get<double>() + e["dur"].get<double>(), double(begin) * us_per_cycle - 1e-6);
    }
  EXPECT_GT(slices, 0u);
}

// A compiled model: the per-op profile accounts for the run's totals, and the
// timeline has op slices on the sequencer, DMA-to-wait flows, and validates.
TEST_F(ReportGolden, CompiledModelProfileAddsUpAndTimelineValidates) {
  const std::string bundle = dir_ + "/mlp.tpb";
  Completed c = tpusim({"compile", kSrc + "/tests/compiler/lower/data/mlp.ir", "--preset", "v3", "--cores", "2",
                        "-o", bundle});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::string tl = dir_ + "/t.json";
  c = tpusim({"run", bundle, "--preset", "v3", "--random-inputs", "1", "--out", dir_ + "/run", "--timeline", tl});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const nlohmann::json s = tpusim::run::read_stats(dir_ + "/run/stats.json");  // check_stats included
  ASSERT_TRUE(s.contains("ops") && s.contains("time_by_cause"));
  uint64_t flops = 0, hbm = 0, core_cycles = 0;
  for (const auto& op : s["ops"]) {
    flops += op["flops"].get<uint64_t>();
    hbm += op["hbm_bytes"].get<uint64_t>();
    core_cycles += op["core_cycles"].get<uint64_t>();
    EXPECT_LE(op["cycles"].get<uint64_t>(), s["cycles"].get<uint64_t>());
  }
  // Every MAC and every HBM byte belongs to exactly one op.
  EXPECT_EQ(flops, s["flops"].get<uint64_t>());
  // The model's FLOPs, and the arrays' padded work: 8 rows a core, N = 200 in two
  // 128-column tiles; the report says how much more that is.
  EXPECT_EQ(flops, 2u * 16 * 300 * 200);
  uint64_t array_flops = 0;
  for (const auto& op : s["ops"]) array_flops += op["mxu_flops"].get<uint64_t>();
  EXPECT_EQ(array_flops, 2u * 16 * 300 * 256);
  EXPECT_NE(c.out.find("  MXU array work  : 2457600 FLOP, 1.28x the model's"), std::string::npos) << c.out;
  EXPECT_EQ(hbm, s["hbm"]["bytes_read"].get<uint64_t>() + s["hbm"]["bytes_written"].get<uint64_t>());
  // Op time over all cores is each core's non-idle time.
  uint64_t busy = 0;
  ASSERT_EQ(s["time_by_cause"].size(), 2u);
  for (const auto& [core, t] : s["time_by_cause"].items())
    busy += s["cycles"].get<uint64_t>() - t["idle"].get<uint64_t>();
  EXPECT_EQ(core_cycles, busy);
  // The units carry no profile records any more (they went into "ops").
  for (const auto& [unit, rec] : s["units"].items()) EXPECT_EQ(unit.find(".profile"), std::string::npos) << unit;

  const std::string text = slurp(tl);
  const auto problems = tpusim::timeline::validate(text);
  EXPECT_TRUE(problems.empty()) << problems.front();
  const nlohmann::json doc = nlohmann::json::parse(text);
  size_t flows = 0, op_slices_on_sequencer = 0;
  std::vector<int64_t> sequencer_tids;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" &&
        e["args"]["name"].get<std::string>().find(".sequencer") != std::string::npos)
      sequencer_tids.push_back(e["tid"].get<int64_t>());
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "s") ++flows;
    if (e["ph"] == "X" && e["name"].get<std::string>().rfind("op ", 0) == 0 &&
        std::find(sequencer_tids.begin(), sequencer_tids.end(), e["tid"].get<int64_t>()) != sequencer_tids.end())
      ++op_slices_on_sequencer;
  }
  EXPECT_GT(flows, 0u) << "no DMA-to-wait flow arrows";
  // The HBM bandwidth counter (GB/s per 256-cycle window) integrates to the
  // run's HBM bytes: sum(value x 1e9 x 256 / clock_hz).
  double integrated = 0;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "C" && e["name"] == "HBM bandwidth (GB/s)")
      integrated += e["args"]["value"].get<double>() * 1e9 * 256.0 / s["clock_hz"].get<double>();
  EXPECT_NEAR(integrated, double(hbm), 1e-6 * double(hbm));
  EXPECT_GE(op_slices_on_sequencer, s["ops"].size()) << "sequencer tracks lack op slices";
}

// scripts/plot.py places the run's ops on a roofline (PNG) and classifies them as
// the report does.
TEST_F(ReportGolden, PlotPlacesTheOpsOfARunOnTheRoofline) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string bundle = dir_ + "/mm.tpu";
  Completed c = tpusim({"asm", kSrc + "/tests/sim/golden/matmul_v3.s", "-o", bundle});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"run", bundle, "--preset", "v3", "--random-inputs", "1", "--out", dir_, "-q"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::string png = dir_ + "/roofline.png";
  ::setenv("MPLBACKEND", "Agg", 1);
  c = spawn({"/usr/bin/python3", kSrc + "/scripts/plot.py", dir_ + "/stats.json", "--roofline", png, "--summary"},
            dir_);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const std::string bytes = slurp(png);
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  // op 7: 16384 FLOP, no HBM bytes: infinite intensity, compute bound (matmul_v3.md).
  bool seen = false;
  std::istringstream in(c.out);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"point\": 7") == std::string::npos && line.find("\"point\": \"7\"") == std::string::npos) continue;
    seen = true;
    EXPECT_NE(line.find("\"bound\": \"compute\""), std::string::npos) << line;
    EXPECT_NE(line.find("Infinity"), std::string::npos) << line;
  }
  EXPECT_TRUE(seen) << c.out;
}

}  // namespace

// stats.json schema and derived figures, checked against closed forms of the
// contract (shared/spec/cli.md): seconds = cycles / clock_hz,
// mxu_utilization = flops / (peak_flops_per_s * seconds).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "sim/run/profile.h"
#include "sim/run/report.h"
#include "sim/run/stats.h"

namespace tpusim::run {
namespace {

using nlohmann::json;

RunFigures v3_figures() {
  RunFigures f;
  f.preset = "v3";
  f.mode = "fast";
  f.clock_hz = 940e6;
  f.cycles = 1880;  // 2 us at 940 MHz
  // v3 peak: 2 cores x 2 MXUs x 128 x 128 MACs x 2 FLOP x 940 MHz.
  f.peak_flops_per_s = 2.0 * 2 * 2 * 128 * 128 * 940e6;
  // A quarter of the chip's MXU MACs over the run.
  f.flops = uint64_t(2) * 2 * 2 * 128 * 128 * 1880 / 4;
  f.hbm_bytes_read = 1 << 20;
  f.hbm_bytes_written = 1 << 19;
  f.hbm_peak_bytes_per_s = 0.9e12;
  f.wall_seconds = 0.25;
  f.units = {{"chip0.core0.mxu0", {{"busy_cycles", 470}, {"lhs_vregs", 12}}}};
  return f;
}

TEST(Stats, DerivedFiguresFollowTheContract) {
  const json s = make_stats(v3_figures());
  EXPECT_EQ(s["preset"], "v3");
  EXPECT_EQ(s["mode"], "fast");
  EXPECT_EQ(s["cycles"].get<uint64_t>(), 1880u);
  EXPECT_DOUBLE_EQ(s["seconds"].get<double>(), 2e-6);
  EXPECT_DOUBLE_EQ(s["mxu_utilization"].get<double>(), 0.25);
  EXPECT_EQ(s["hbm"]["bytes_read"].get<uint64_t>(), 1u << 20);
  EXPECT_EQ(s["hbm"]["bytes_written"].get<uint64_t>(), 1u << 19);
  EXPECT_DOUBLE_EQ(s["hbm"]["peak_bytes_per_s"].get<double>(), 0.9e12);
  EXPECT_DOUBLE_EQ(s["host"]["wall_seconds"].get<double>(), 0.25);
  EXPECT_EQ(s["units"]["chip0.core0.mxu0"]["busy_cycles"].get<int>(), 470);
  EXPECT_TRUE(check_stats(s).empty()) << check_stats(s).front();
}

// --critical-path's summary: its causes must add up to its cycles, and the report
// names the core it ends on and the causes, largest first.
TEST(Stats, CriticalPathSummaryIsCheckedAndReported) {
  RunFigures f = v3_figures();
  f.critical_path = {{"cycles", 1880},          {"ends_on", "chip0.core1"},
                     {"by_cause", {{"ici", 1410}, {"hbm", 470}}},
                     {"by_op", json::object()}, {"dma_hops", 3}, {"barrier_hops", 0}};
  json s = make_stats(f);
  EXPECT_TRUE(check_stats(s).empty()) << check_stats(s).front();
  const std::string r = format_report(s);
  EXPECT_NE(r.find("critical path: 1880 cycles, ending on chip0.core1 (3 DMA hops, 0 barrier hops):\n  ici 75.0% hbm 25.0%\n"),
            std::string::npos)
      << r;
  s["critical_path"]["by_cause"]["hbm"] = 469;
  const auto p = check_stats(s);
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p.front().find("critical_path.by_cause does not sum"), std::string::npos) << p.front();
  s["critical_path"]["by_cause"]["hbm"] = -1;
  EXPECT_FALSE(check_stats(s).empty());
}

TEST(Stats, ZeroCycleRunIsValidJsonWithZeroUtilization) {
  RunFigures f = v3_figures();
  f.cycles = 0;
  f.flops = 0;
  const json s = make_stats(f);
  EXPECT_EQ(s["seconds"].get<double>(), 0.0);
  EXPECT_EQ(s["mxu_utilization"].get<double>(), 0.0);
  EXPECT_TRUE(check_stats(s).empty());
  // NaN would serialise as null and break every reader.
  EXPECT_EQ(json::parse(stats_text(s)), s);
}

TEST(Stats, EveryRequiredKeyIsChecked) {
  const json good = make_stats(v3_figures());
  const char* top[] = {"preset", "mode", "clock_hz", "cycles", "seconds", "flops",
                       "peak_flops_per_s", "mxu_utilization", "hbm", "host", "units"};
  for (const char* key : top) {
    json s = good;
    s.erase(key);
    const auto p = check_stats(s);
    ASSERT_FALSE(p.empty()) << key;
    EXPECT_NE(p.front().find(key), std::string::npos) << p.front();
  }
  for (const char* key : {"bytes_read", "bytes_written", "peak_bytes_per_s"}) {
    json s = good;
    s["hbm"].erase(key);
    ASSERT_FALSE(check_stats(s).empty()) << key;
  }
  json s = good;
  s["host"].erase("wall_seconds");
  EXPECT_FALSE(check_stats(s).empty());
}

TEST(Stats, WrongTypesAndInconsistentFiguresAreReported) {
  const json good = make_stats(v3_figures());
  json s = good;
  s["cycles"] = -5;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["cycles"] = "1880";
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["mode"] = "turbo";
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["seconds"] = 1.0;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["mxu_utilization"] = 0.5;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["units"]["chip0.core0.mxu0"]["busy_cycles"] = nullptr;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["units"]["chip0.hbm"]["latency_ns"]["p99"] = nullptr;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["units"]["chip0.mxu"] = 3;
  EXPECT_FALSE(check_stats(s).empty());
  // Histograms and labels are fine.
  s = good;
  s["units"]["chip0.hbm"] = {{"model", "simple"}, {"latency_ns", {{"p50", 100}, {"mean", 100.0}}}};
  EXPECT_TRUE(check_stats(s).empty());
  // Per-channel records come as arrays of objects; a null deep inside one is still caught.
  s["units"]["chip0.hbm"]["channels"] = json::array({{{"reads", 4}, {"row_hits", 3}}, {{"reads", 0}}});
  EXPECT_TRUE(check_stats(s).empty());
  s["units"]["chip0.hbm"]["channels"][1]["reads"] = nullptr;
  const auto problems = check_stats(s);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("units.chip0.hbm.channels[1].reads"), std::string::npos) << problems[0];
  EXPECT_FALSE(check_stats(json::array()).empty());
}

TEST(Stats, DeterministicPartDropsOnlyWallTime) {
  RunFigures a = v3_figures(), b = v3_figures();
  b.wall_seconds = 9.5;
  EXPECT_NE(make_stats(a), make_stats(b));
  EXPECT_EQ(deterministic_part(make_stats(a)), deterministic_part(make_stats(b)));
  b.cycles += 1;
  EXPECT_NE(deterministic_part(make_stats(a)), deterministic_part(make_stats(b)));
  // Across modes only "mode" may differ.
  RunFigures d = v3_figures();
  d.mode = "detailed";
  EXPECT_NE(deterministic_part(make_stats(a)), deterministic_part(make_stats(d)));
  EXPECT_EQ(deterministic_part(make_stats(a), true), deterministic_part(make_stats(d), true));
  EXPECT_TRUE(deterministic_part(make_stats(a))["host"].is_object());
}

TEST(Stats, WriteThenReadRoundTripsExactly) {
  const std::string dir = ::testing::TempDir() + "stats_rt_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/stats.json";
  const json s = make_stats(v3_figures());
  write_stats(path, s);
  EXPECT_EQ(read_stats(path), s);
  // No temporary left beside the file.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(dir);
}

TEST(Stats, ReadRejectsNonStatsFilesWithTheirName) {
  const std::string dir = ::testing::TempDir() + "stats_bad_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/stats.json";
  std::ofstream(path) << "{\"cycles\": 3";
  try {
    read_stats(path);
    FAIL() << "truncated JSON accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::ofstream(path, std::ios::trunc) << "{\"cycles\": 3}";
  EXPECT_THROW(read_stats(path), std::runtime_error);
  EXPECT_THROW(read_stats(dir + "/absent.json"), std::runtime_error);
  std::filesystem::remove_all(dir);
}

TEST(Report, StatesCyclesTimeThroughputAndUtilization) {
  const std::string r = format_report(make_stats(v3_figures()));
  EXPECT_NE(r.find("1880"), std::string::npos) << r;
  EXPECT_NE(r.find("2.000 us"), std::string::npos) << r;
  EXPECT_NE(r.find("940 MHz"), std::string::npos) << r;
  // Peak 123.2 TFLOPS; a quarter of it achieved.
  EXPECT_NE(r.find("30.802 TFLOPS of 123.2 TFLOPS peak"), std::string::npos) << r;
  EXPECT_NE(r.find("25.00%"), std::string::npos) << r;
  EXPECT_NE(r.find("v3"), std::string::npos) << r;
}


// Two cores' profile records as hw/core/op_profile.cpp writes them: op 3 ran on
// both (a matmul), op 4 on core 0 only; core 1 also carries the host model's
// infeed counter. Every expected figure is worked out by hand from these numbers.
json two_core_units() {
  auto op = [](int64_t id, uint64_t cycles, uint64_t macs, uint64_t bytes, uint64_t c, uint64_t h, uint64_t i,
               uint64_t y) {
    return json{{"id", id}, {"cycles", cycles}, {"macs", macs}, {"hbm_bytes", bytes}, {"instructions", 10},
                {"vector_ops", 2}, {"mxu_busy_cycles", 5}, {"vpu_busy_cycles", 1}, {"dma_busy_cycles", 7},
                {"stall_compute_cycles", c}, {"stall_hbm_cycles", h}, {"stall_infeed_cycles", i},
                {"stall_sync_cycles", y}};
  };
  json units;
  units["chip0.core0.profile"] = {{"ops", {op(3, 600, 1000, 4096, 10, 300, 0, 20), op(4, 300, 0, 512, 0, 100, 0, 0)}},
                                  {"stall_cycles", {{"compute", 10}, {"hbm", 400}, {"infeed", 0}, {"sync", 20}}},
                                  {"active_cycles", 900}};
  units["chip0.core1.profile"] = {{"ops", {op(3, 700, 3000, 8192, 0, 100, 50, 40)}},
                                  {"stall_cycles", {{"compute", 0}, {"hbm", 100}, {"infeed", 50}, {"sync", 40}}},
                                  {"active_cycles", 700}};
  units["chip0.core1.sequencer"] = {{"stall_infeed_cycles", 80}, {"stall_flag_cycles", 110}};
  units["chip0.core0.mxu0"] = {{"busy_cycles", 5}};
  return units;
}

TEST(Profile, FoldsOpsOverCoresAndTimeByCauseSumsToTheRun) {
  json units = two_core_units();
  const json p = fold_profiles(units, 1000);
  // Profile records leave units; the others stay.
  EXPECT_FALSE(units.contains("chip0.core0.profile"));
  EXPECT_FALSE(units.contains("chip0.core1.profile"));
  EXPECT_TRUE(units.contains("chip0.core0.mxu0"));
  ASSERT_EQ(p["ops"].size(), 2u);
  const json& op3 = p["ops"][0];
  EXPECT_EQ(op3["id"], 3);
  EXPECT_EQ(op3["name"], "op 3");
  EXPECT_EQ(op3["cycles"], 700u);       // the longer core
  EXPECT_EQ(op3["core_cycles"], 1300u);  // 600 + 700
  EXPECT_EQ(op3["cores"], 2u);
  EXPECT_EQ(op3["flops"], 8000u);  // 2 x (1000 + 3000)
  EXPECT_EQ(op3["mxu_flops"], 8000u);
  EXPECT_EQ(op3["hbm_bytes"], 12288u);
  EXPECT_EQ(op3["stall_cycles"]["hbm"], 400u);
  EXPECT_EQ(op3["stall_cycles"]["infeed"], 50u);
  EXPECT_EQ(p["ops"][1]["id"], 4);
  EXPECT_EQ(p["ops"][1]["cycles"], 300u);
  // core 0: active 900 of 1000, waits 400 HBM + 20 sync: compute 480, idle 100.
  const json& t0 = p["time_by_cause"]["chip0.core0"];
  EXPECT_EQ(t0, (json{{"compute", 480}, {"hbm", 400}, {"infeed", 0}, {"sync", 20}, {"idle", 100}}));
  // core 1: the host model counted 80 infeed cycles, 30 more than the profile's
  // 50: they come out of sync (40 -> 10). compute 700 - 100 - 80 - 10 = 510.
  const json& t1 = p["time_by_cause"]["chip0.core1"];
  EXPECT_EQ(t1, (json{{"compute", 510}, {"hbm", 100}, {"infeed", 80}, {"sync", 10}, {"idle", 300}}));
}

// With the bundle's op FLOPs an op's flops are the model's, once for all its cores;
// mxu_flops keeps the arrays' padded count; an op without an entry keeps the MXUs'.
TEST(Profile, TheBundlesOpFlopsReplaceThePaddedCount) {
  json units = two_core_units();
  const json p = fold_profiles(units, 1000, {}, {{3, 2500}, {9, 77}});
  ASSERT_EQ(p["ops"].size(), 2u);
  EXPECT_EQ(p["ops"][0]["flops"], 2500u);
  EXPECT_EQ(p["ops"][0]["mxu_flops"], 8000u);
  EXPECT_EQ(p["ops"][1]["flops"], 0u);  // op 4: no entry, no MXU work
  EXPECT_EQ(p["ops"][1]["mxu_flops"], 0u);
}

TEST(Profile, StatsWithOpsPassTheCheckAndBadOnesAreNamed) {
  RunFigures f = v3_figures();
  json units = two_core_units();
  const json p = fold_profiles(units, f.cycles);
  f.ops = p["ops"];
  f.time_by_cause = p["time_by_cause"];
  json s = make_stats(f);
  EXPECT_TRUE(check_stats(s).empty()) << check_stats(s).front();
  json bad = s;
  bad["time_by_cause"]["chip0.core0"]["idle"] = 0;
  ASSERT_FALSE(check_stats(bad).empty());
  EXPECT_NE(check_stats(bad).front().find("does not sum to cycles"), std::string::npos);
  bad = s;
  bad["ops"][0]["cycles"] = 0;
  ASSERT_FALSE(check_stats(bad).empty());
  EXPECT_NE(check_stats(bad).front().find("ops[0].cycles"), std::string::npos);
  bad = s;
  bad["ops"][1].erase("hbm_bytes");
  ASSERT_FALSE(check_stats(bad).empty());
  EXPECT_NE(check_stats(bad).front().find("ops[1].hbm_bytes"), std::string::npos);
  bad = s;
  bad["ops"][0]["mxu_flops"] = "x";  // the report sums it
  ASSERT_FALSE(check_stats(bad).empty());
  EXPECT_NE(check_stats(bad).front().find("ops[0].mxu_flops is not an unsigned integer"), std::string::npos);
  bad = s;
  for (auto& op : bad["ops"]) op.erase("mxu_flops");  // a file from before it
  EXPECT_TRUE(check_stats(bad).empty());
}

TEST(Report, BreakdownAndTopOpsWithRooflineBound) {
  RunFigures f = v3_figures();
  json units = two_core_units();
  const json p = fold_profiles(units, f.cycles);
  f.ops = p["ops"];
  f.time_by_cause = p["time_by_cause"];
  const std::string r = format_report(make_stats(f));
  // core 0 of 1880 cycles: active 900, hbm 400 = 21.3%, idle 980 = 52.1%.
  EXPECT_NE(r.find("21.3%"), std::string::npos) << r;
  EXPECT_NE(r.find("52.1%"), std::string::npos) << r;
  // Mean over both cores' 2 x 1880 cycles: compute 480 + 510 = 26.3%, HBM
  // 400 + 100 = 13.3%, idle 980 + 1180 = 57.4%.
  const size_t mean = r.find("  mean ");
  ASSERT_NE(mean, std::string::npos) << r;
  const std::string mean_line = r.substr(mean, r.find('\n', mean) - mean);
  for (const char* v : {"26.3%", "13.3%", "57.4%"}) EXPECT_NE(mean_line.find(v), std::string::npos) << mean_line;
  // Ridge 123.2e12 / 0.9e12 = 136.9 FLOP/B; op 3: 8000 / 12288 = 0.65: memory;
  // op 4: no FLOPs, 512 bytes: intensity 0, memory.
  EXPECT_NE(r.find("ridge 136.9 FLOP/B"), std::string::npos) << r;
  EXPECT_NE(r.find("top 2 of 2 ops"), std::string::npos) << r;
  const size_t op3 = r.find("op 3 ");
  ASSERT_NE(op3, std::string::npos) << r;
  const std::string line = r.substr(op3, r.find('\n', op3) - op3);
  EXPECT_NE(line.find("0.65"), std::string::npos) << line;
  EXPECT_NE(line.find("memory"), std::string::npos) << line;
  EXPECT_LT(op3, r.find("op 4 ")) << "longest op first";
}

// A slice of 16 chips x 2 cores: the table lists its first 16 cores in chip
// order (chip0..chip7), not in stats.json's string order (chip0, chip1, chip10..),
// and the mean still covers all 32. Of equal VMEM peaks the first in chip order
// is named.
TEST(Report, ListsTheCoresOfASliceInChipOrder) {
  RunFigures f = v3_figures();
  f.time_by_cause = json::object();
  f.vmem = json::object();
  for (int chip = 0; chip < 16; ++chip)
    for (int core = 0; core < 2; ++core) {
      const std::string name = "chip" + std::to_string(chip) + ".core" + std::to_string(core);
      f.time_by_cause[name] = {{"compute", 10 * chip + core}, {"hbm", 0}, {"infeed", 0}, {"sync", 0}, {"idle", 0}};
      f.vmem[name] = {{"capacity_bytes", 1024}, {"peak_bytes_in_use", chip >= 2 ? 512 : 256}};
    }
  const std::string r = format_report(make_stats(f));
  std::vector<std::string> listed;
  for (size_t at = r.find("\n  chip"); at != std::string::npos; at = r.find("\n  chip", at + 1))
    listed.push_back(r.substr(at + 3, r.find(' ', at + 3) - at - 3));
  std::vector<std::string> want;
  for (int chip = 0; chip < 8; ++chip)
    for (int core = 0; core < 2; ++core) want.push_back("chip" + std::to_string(chip) + ".core" + std::to_string(core));
  EXPECT_EQ(listed, want) << r;
  EXPECT_NE(r.find("... 16 more cores"), std::string::npos) << r;
  EXPECT_NE(r.find("  mean "), std::string::npos) << r;
  EXPECT_NE(r.find("peak VMEM in use: 512 of 1024 bytes (50.00%, chip2.core0)"), std::string::npos) << r;
}

// The "mostly" column: the largest share of an op's core cycles by the per-core
// table's causes, compute being what no wait took (issue and the core's own units).
TEST(Report, OpsSayWhatTheirCoresWaitedOn) {
  RunFigures f = v3_figures();
  json units = two_core_units();
  json p = fold_profiles(units, f.cycles);
  auto row = [](const std::string& r, const std::string& op) {
    const size_t at = r.find("  " + op + " ");
    return at == std::string::npos ? std::string() : r.substr(at, r.find('\n', at) - at);
  };
  f.ops = p["ops"];
  f.time_by_cause = p["time_by_cause"];
  std::string r = format_report(make_stats(f));
  EXPECT_NE(r.find("bound  mostly"), std::string::npos) << r;
  // op 3: 1300 core cycles, waits 400 HBM + 50 infeed + 60 sync: compute 790 = 61%.
  EXPECT_NE(row(r, "op 3").find("memory  compute 61%"), std::string::npos) << r;
  // op 4: 300 cycles, 100 of them HBM: compute 200 = 67%.
  EXPECT_NE(row(r, "op 4").find("compute 67%"), std::string::npos) << r;
  // An op that mostly waited on other cores (a collective's or a remote output's
  // flags), and one that mostly waited on its HBM transfers.
  f.ops[0]["stall_cycles"] = {{"compute", 0}, {"hbm", 100}, {"infeed", 0}, {"sync", 884}};
  f.ops[1]["stall_cycles"] = {{"compute", 0}, {"hbm", 250}, {"infeed", 0}, {"sync", 0}};
  r = format_report(make_stats(f));
  EXPECT_NE(row(r, "op 3").find("sync/ICI 68%"), std::string::npos) << r;  // 884 / 1300
  EXPECT_NE(row(r, "op 4").find("HBM wait 83%"), std::string::npos) << r;  // 250 / 300
  f.ops[1]["stall_cycles"] = {{"compute", 0}, {"hbm", 0}, {"infeed", 240}, {"sync", 0}};
  r = format_report(make_stats(f));
  EXPECT_NE(row(r, "op 4").find("infeed 80%"), std::string::npos) << r;
  // Even shares: the first in the table's order (compute 150 = HBM 150).
  f.ops[1]["stall_cycles"] = {{"compute", 0}, {"hbm", 150}, {"infeed", 0}, {"sync", 0}};
  r = format_report(make_stats(f));
  EXPECT_NE(row(r, "op 4").find("compute 50%"), std::string::npos) << r;
}

// Ops of a compiled bundle carry the graph node they came from: in stats.json as
// "node" (an unnamed op has none) and beside "op N" in the report, a long name cut
// to the column's 40 characters.
TEST(Report, OpsShowTheirGraphNodeNames) {
  RunFigures f = v3_figures();
  json units = two_core_units();
  const std::string long_name = "conv2d %" + std::string(60, 'x');
  const json p = fold_profiles(units, f.cycles, {{3, "matmul %logits"}, {4, long_name}, {9, "relu %unused"}});
  ASSERT_EQ(p["ops"].size(), 2u);
  EXPECT_EQ(p["ops"][0]["name"], "op 3");
  EXPECT_EQ(p["ops"][0]["node"], "matmul %logits");
  EXPECT_EQ(p["ops"][1]["node"], long_name);
  f.ops = p["ops"];
  f.time_by_cause = p["time_by_cause"];
  const json s = make_stats(f);
  EXPECT_TRUE(check_stats(s).empty());
  const std::string r = format_report(s);
  EXPECT_NE(r.find("  op 3 matmul %logits "), std::string::npos) << r;
  const std::string cut = ("op 4 " + long_name).substr(0, 38) + "..";
  const size_t at = r.find(cut);
  ASSERT_NE(at, std::string::npos) << r;
  EXPECT_EQ(r[at + cut.size()], ' ') << "cut at 40 characters";
  // Without names the entries have no "node" and the rows read "op N".
  json plain_units = two_core_units();
  const json plain = fold_profiles(plain_units, f.cycles);
  EXPECT_FALSE(plain["ops"][0].contains("node"));
}

}  // namespace
}  // namespace tpusim::run

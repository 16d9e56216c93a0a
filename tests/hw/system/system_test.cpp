// The chip model against independent expectations: every trace bit-exact with the
// functional reference, both modes identical (cycles, counters, bytes), and
// closed-form cycle counts for small programs built from the preset's figures.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hw/timeline/timeline.h"
#include "tests/hw/wave/vcd_parse.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <algorithm>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct RunOut {
  nlohmann::json j;
  int status = -1;
};

RunOut core_run(const std::string& prog, const std::string& mode, const std::vector<std::string>& extra = {},
             const std::string& preset = "v4") {
  static int counter = 0;
  const fs::path out = fs::temp_directory_path() /
                       ("core_run_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".json");
  std::string cmd = std::string(TPUSIM_CORE_RUN) + " '" + prog + "' " + preset + " " + mode + " '" + out.string() + "'";
  for (const auto& e : extra) cmd += " '" + e + "'";
  RunOut r;
  r.status = std::system(cmd.c_str());
  std::ifstream in(out);
  if (in) in >> r.j;
  fs::remove(out);
  return r;
}

std::vector<std::string> trace_inputs(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& f : fs::directory_iterator(dir)) {
    const std::string n = f.path().filename().string();
    if (n.rfind("in_", 0) == 0 && f.path().extension() == ".npy")
      v.push_back(n.substr(3, n.size() - 7) + "=" + f.path().string());
  }
  return v;
}

// Writes a program to a temporary .s file.
std::string temp_program(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".s");
  std::ofstream(p) << text;
  return p.string();
}

uint64_t cycles_of(const std::string& text, const std::vector<std::string>& extra = {}, const std::string& mode = "fast") {
  const std::string p = temp_program("prog", text);
  RunOut r = core_run(p, mode, extra);
  fs::remove(p);
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.j.value("faulted", true)) << r.j.value("fault", std::string());
  return r.j.value("cycles", uint64_t{0});
}


const char* kHeader = ".target chips=1 cores=1 mxus=1\n.core chip0.core0\n";

// N copies of `body` (with {r} replaced by a register cycling through v1..v30).
std::string program_of(const std::string& body, int n, const std::string& prologue = "") {
  std::string s = std::string(kHeader) + prologue;
  for (int i = 0; i < n; ++i) {
    std::string line = body;
    const auto at = line.find("{r}");
    if (at != std::string::npos) line.replace(at, 3, "v" + std::to_string(1 + i % 30));
    s += "  " + line + "\n";
  }
  return s + "  halt\n";
}

// Extra cycles that N more copies of `body` cost: the per-instruction cost with
// every fixed overhead cancelled.
int64_t marginal(const std::string& body, int n, const std::vector<std::string>& extra = {},
                 const std::string& prologue = "") {
  const uint64_t a = cycles_of(program_of(body, n, prologue), extra);
  const uint64_t b = cycles_of(program_of(body, 2 * n, prologue), extra);
  return static_cast<int64_t>(b) - static_cast<int64_t>(a);
}

// Closed forms from the v4 preset's figures (configs/chips/v4.yaml, core.vpu).
TEST(VpuTiming, DependentAddsTakeLatencyEach) {
  EXPECT_EQ(marginal("vadd v1, v1, v2", 20), 20 * 1);
  EXPECT_EQ(marginal("vadd v1, v1, v2", 20, {"--set", "core.vpu.alu_latency_cycles.add=3"}), 20 * 3);
}

TEST(VpuTiming, DependentMulsTakeLatencyEach) { EXPECT_EQ(marginal("vmul v1, v1, v2", 20), 20 * 2); }

// Two ALUs a lane (core.vpu.alu_per_cycle 2, the bundle's two vector ALU slots).
TEST(VpuTiming, IndependentAddsIssueTwoPerCycle) {
  EXPECT_EQ(marginal("vadd {r}, v0, v31", 40), 40 / 2);
  EXPECT_EQ(marginal("vadd {r}, v0, v31", 40, {"--set", "core.vpu.alu_per_cycle=1"}), 40);
}

// A bundle's vector slots: a load and two ALU ops go in one cycle, where a
// one-wide unit takes three. A load and a store do not: a dense 4 KiB tile uses
// all 16 banks of 256 B (core.vmem), so they take a cycle each.
TEST(VpuTiming, LoadAndAluOpsDispatchTogether) {
  const std::string triple = "vld {r}, [s0 + 0]\n  vadd v31, v0, v0\n  vcmp.lt m1, v0, v0";
  EXPECT_EQ(marginal(triple, 30), 30);
  EXPECT_EQ(marginal(triple, 30, {"--set", "core.vpu.dispatch_per_cycle=1"}), 3 * 30);
  const std::string with_store = "vld {r}, [s0 + 0]\n  vadd v31, v0, v0\n  vst v0, [s1 + 0]";
  EXPECT_EQ(marginal(with_store, 30, {}, "  li s1, 8192\n"), 2 * 30);
}

// The transcendental unit takes one op every 2 cycles and an ALU slot in its
// cycle: vexp + 4 ALU ops go as (vexp, a) (a, a) (a, next vexp)...,
// 5 instructions in 2.5 cycles; without the slot they would take 2.
TEST(VpuTiming, TranscendentalTakesAnAluSlot) {
  const std::string group =
      "vexp {r}, v0\n  vadd v31, v0, v0\n  vcmp.lt m1, v0, v0\n  vcmp.lt m2, v0, v0\n  vcmp.lt m3, v0, v0";
  EXPECT_EQ(marginal(group, 20), 20 * 5 / 2);
  // The same when the sequencer's bundles could carry more: the VPU is the limit.
  EXPECT_EQ(marginal(group, 20, {"--set", "core.sequencer.slots.vector_alu=4"}), 20 * 5 / 2);
}

TEST(VpuTiming, TranscendentalLatencyAndIssueInterval) {
  EXPECT_EQ(marginal("vexp v1, v1", 10), 10 * 7);     // dependent: latency 7
  EXPECT_EQ(marginal("vexp {r}, v0", 20), 20 * 2);    // independent: one every 2 cycles
}

TEST(VpuTiming, VldOnePerCycleWhenConflictFree) { EXPECT_EQ(marginal("vld {r}, [s0 + 0]", 64), 64); }

TEST(VpuTiming, StridedVldSerialisesOnOneBankPair) {
  // Rows 4096 B apart start in the same bank (16 banks x 256 B interleave): each
  // of the two banks a 512 B row touches must deliver 8 granules, one per cycle.
  EXPECT_EQ(marginal("vld {r}, [s0 + 0], stride=4096", 16), 16 * 8);
  // 16 banks x 256 B: rows 512 B apart are a dense tile, one pass.
  EXPECT_EQ(marginal("vld {r}, [s0 + 0], stride=512", 16), 16);
}

TEST(VpuTiming, TransposeAndLaneReduce) {
  EXPECT_EQ(marginal("vxpose v16, v0", 2), 2 * 259);
  EXPECT_EQ(marginal("vreduce.lanes.sum v1, v1", 4), 4 * 79);
  EXPECT_EQ(marginal("vreduce.sublanes.sum v1, v1", 4), 4 * 8);
}

TEST(SequencerTiming, QueueFullStallsWithoutChangingTime) {
  const std::string p = temp_program("qf", program_of("vmul v1, v1, v2", 40));
  const RunOut deep = core_run(p, "fast", {"--set", "core.sequencer.queue_depth.vector=64"});
  const RunOut shallow = core_run(p, "fast", {"--set", "core.sequencer.queue_depth.vector=2"});
  fs::remove(p);
  // The VPU is the bottleneck either way (one vmul per 2 cycles).
  EXPECT_EQ(deep.j["cycles"], shallow.j["cycles"]);
  EXPECT_EQ(deep.j["units"]["chip0.core0.sequencer"].value("stall_queue_full_cycles", 0), 0);
  // vmul k leaves the queue (dispatches) in cycle 1 + 2k. With 2 entries the
  // sequencer fills the queue by cycle 2 and from then on issues vmul k in cycle
  // 2k - 3 (k >= 3), right after vmul k - 2 left: the cycles between, 4, 6, ...,
  // 2 * 40 - 6, are queue-full stalls: 40 - 4 of them.
  EXPECT_EQ(shallow.j["units"]["chip0.core0.sequencer"].value("stall_queue_full_cycles", 0), 40 - 4);
}

TEST(SequencerTiming, WaitOnFlagThatNeverRisesIsADeadlock) {
  const std::string p = temp_program("dl", std::string(kHeader) + "  wait f3, 1\n  halt\n");
  const RunOut r = core_run(p, "fast");
  fs::remove(p);
  ASSERT_EQ(r.status, 0);
  EXPECT_TRUE(r.j["faulted"].get<bool>());
  EXPECT_NE(r.j["fault"].get<std::string>().find("deadlock"), std::string::npos) << r.j["fault"];
  EXPECT_NE(r.j["fault"].get<std::string>().find("waits for f3 >= 1"), std::string::npos) << r.j["fault"];
}

TEST(SequencerTiming, InfiniteLoopStopsAtTheInstructionBudget) {
  const std::string p = temp_program("inf", std::string(kHeader) + "top:\n  jmp top\n");
  const RunOut r = core_run(p, "fast", {"--max-instructions", "100000"});
  fs::remove(p);
  ASSERT_EQ(r.status, 0);
  EXPECT_TRUE(r.j["faulted"].get<bool>());
  EXPECT_NE(r.j["fault"].get<std::string>().find("infinite loop"), std::string::npos) << r.j["fault"];
  // One jmp per cycle: the budget is reached after as many cycles.
  EXPECT_EQ(r.j["cycles"].get<uint64_t>(), 100000u);
}

TEST(SequencerTiming, OutOfRangeVldFaultsWithInstructionAndLine) {
  const std::string p = temp_program("oob", std::string(kHeader) + "  li s1, 0x7fffff00\n  vld v1, [s1 + 0]\n  halt\n");
  const RunOut r = core_run(p, "fast");
  fs::remove(p);
  ASSERT_EQ(r.status, 0);
  EXPECT_TRUE(r.j["faulted"].get<bool>());
  EXPECT_NE(r.j["fault"].get<std::string>().find("instruction 1"), std::string::npos) << r.j["fault"];
  EXPECT_NE(r.j["fault"].get<std::string>().find(":4, vld"), std::string::npos) << r.j["fault"];
}

// DMA of K KiB, one in flight, against the published v4 figures (within 10%).
double dma_cycles(bool to_vmem, uint64_t kib) {
  const std::string op = to_vmem ? "dma vmem:[s0 + 0], hbm:[s0 + 0]" : "dma hbm:[s0 + 0], vmem:[s0 + 0]";
  return static_cast<double>(cycles_of(std::string(kHeader) + "  " + op + ", bytes=" + std::to_string(kib * 1024) +
                                       ", flag=f1\n  wait.sub f1, 1\n  halt\n"));
}

TEST(DmaCalibration, HbmToVmemWithinTenPercent) {
  for (uint64_t k : {1, 16, 256, 2048}) {
    const double want = 483.6 + 1.105 * static_cast<double>(k);
    EXPECT_NEAR(dma_cycles(true, k), want, 0.1 * want) << k << " KiB";
  }
}

// The engines' head is the published latency minus one beat through the
// preset's own memory (docs/tensorcore.md "DMA"), so a what-if memory moves a
// transfer by its own beat time only. On v4 that beat is a row miss of 41 DRAM
// cycles (ACT; RD tRCD = 17 later; a second RD tCCD_L = 4 later; data tCL = 17
// + BL/2 = 2 after it): 35.0 ns at the preset's 1171.875 MHz, 17.5 ns at twice
// that clock, 70.0 ns at half. The head took the gain before: twice the HBM
// clock made this load no faster, and a 4x clock made traces/matmul 2.5% slower.
// Refresh is pushed out of the way, so each load meets an idle memory.
TEST(DmaCalibration, WhatIfMemoryMovesOnlyTheMemorysShare) {
  const std::string load =
      std::string(kHeader) + "  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=1024, flag=f1\n  wait.sub f1, 1\n  halt\n";
  const double preset_hz = 1171875000.0, core_hz = 1.05e9;
  const auto cycles_at = [&](double scale) {
    const std::string hz = std::to_string(static_cast<uint64_t>(preset_hz * scale));
    return static_cast<double>(cycles_of(load, {"--set", "hbm.clock_hz=" + hz, "--set", "hbm.tREFI=100000000"}));
  };
  const auto beat_cycles = [&](double scale) { return 41.0 / (preset_hz * scale) * core_hz; };
  const double base = cycles_at(1.0), fast = cycles_at(2.0), slow = cycles_at(0.5);
  EXPECT_NEAR(base, 483.6 + 1.105, 0.02 * 483.6);  // the published figure on the preset's memory
  EXPECT_NEAR(fast - base, beat_cycles(2.0) - beat_cycles(1.0), 2.0);  // about -18
  EXPECT_NEAR(slow - base, beat_cycles(0.5) - beat_cycles(1.0), 2.0);  // about +37
}

TEST(DmaCalibration, VmemToHbmWithinTenPercent) {
  for (uint64_t k : {1, 16, 256, 2048}) {
    const double want = 417.5 + 1.051 * static_cast<double>(k);
    EXPECT_NEAR(dma_cycles(false, k), want, 0.1 * want) << k << " KiB";
  }
}

// What every multi-chip case checks first: the fast run exits 0 without a fault,
// its outputs are the functional reference's, and the detailed run gives the same
// cycles, outputs and counters of every unit.
void expect_clean_and_modes_agree(const RunOut& fast, const RunOut& det) {
  ASSERT_EQ(fast.status, 0);
  ASSERT_FALSE(fast.j.value("faulted", true)) << fast.j.value("fault", std::string());
  ASSERT_TRUE(fast.j.value("ref_ok", false)) << fast.j.value("ref_message", std::string());
  EXPECT_EQ(fast.j["outputs"], fast.j["ref_outputs"]);
  EXPECT_EQ(det.j["cycles"], fast.j["cycles"]);
  EXPECT_EQ(det.j["outputs"], fast.j["outputs"]);
  EXPECT_EQ(det.j["units"], fast.j["units"]);
}

class TraceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TraceTest, FastAndDetailedMatchReferenceAndEachOther) {
  const fs::path dir = fs::path(TPUSIM_TRACES_DIR) / GetParam();
  const auto inputs = trace_inputs(dir);
  const RunOut fast = core_run((dir / "prog.s").string(), "fast", inputs);
  ASSERT_EQ(fast.status, 0);
  ASSERT_TRUE(fast.j.value("ref_ok", false)) << fast.j.value("ref_message", std::string());
  ASSERT_FALSE(fast.j["faulted"].get<bool>()) << fast.j["fault"].get<std::string>();
  for (auto& [name, bytes] : fast.j["ref_outputs"].items())
    EXPECT_TRUE(bytes == fast.j["outputs"][name]) << "output " << name << " differs from the reference";
  const RunOut det = core_run((dir / "prog.s").string(), "detailed", inputs);
  ASSERT_EQ(det.status, 0);
  EXPECT_EQ(det.j["cycles"], fast.j["cycles"]);
  EXPECT_EQ(det.j["outputs"], fast.j["outputs"]);
  EXPECT_EQ(det.j["units"], fast.j["units"]) << "fast:\n" << fast.j["units"].dump(1) << "\ndetailed:\n"
                                               << det.j["units"].dump(1);
  EXPECT_GT(fast.j["cycles"].get<uint64_t>(), 0u);
}

std::vector<std::string> traces() {
  std::vector<std::string> v;
  for (const auto& d : fs::directory_iterator(TPUSIM_TRACES_DIR))
    if (fs::exists(d.path() / "prog.s")) v.push_back(d.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

INSTANTIATE_TEST_SUITE_P(Traces, TraceTest, ::testing::ValuesIn(traces()),
                         [](const auto& info) { return info.param; });

}  // namespace

namespace {

TEST(SystemOutputs, TimelineIsValidAndHasEveryUnitTrack) {
  const fs::path dir = fs::path(TPUSIM_TRACES_DIR) / "matmul";
  const fs::path tl = fs::temp_directory_path() / ("tl_" + std::to_string(::getpid()) + ".json");
  auto args = trace_inputs(dir);
  args.push_back("--timeline");
  args.push_back(tl.string());
  const RunOut r = core_run((dir / "prog.s").string(), "fast", args);
  ASSERT_EQ(r.status, 0);
  std::ifstream in(tl);
  std::stringstream text;
  text << in.rdbuf();
  fs::remove(tl);
  EXPECT_TRUE(tpusim::timeline::validate(text.str()).empty());
  for (const char* track : {"core0.vpu", "core0.mxu0", "core0.dma"})
    EXPECT_NE(text.str().find(track), std::string::npos) << track;
}

TEST(SystemOutputs, WaveformHasOnlyTheRequestedScope) {
  const fs::path dir = fs::path(TPUSIM_TRACES_DIR) / "exchange";
  const fs::path vcd = fs::temp_directory_path() / ("w_" + std::to_string(::getpid()) + ".vcd");
  auto args = trace_inputs(dir);
  for (const char* a : {"--wave", "", "--scope", "chip0.core1.*"}) args.push_back(a);
  args[args.size() - 3] = vcd.string();
  const RunOut r = core_run((dir / "prog.s").string(), "detailed", args);
  ASSERT_EQ(r.status, 0);
  std::ifstream in(vcd);
  std::stringstream text;
  text << in.rdbuf();
  fs::remove(vcd);
  const std::string v = text.str();
  EXPECT_NE(v.find("$scope module core1 $end"), std::string::npos);
  EXPECT_EQ(v.find("$scope module core0 $end"), std::string::npos);
  EXPECT_NE(v.find("busy"), std::string::npos);
  // The last cycle's values are written: the final time stamp is past the last cycle.
  const auto last_hash = v.rfind("\n#");
  ASSERT_NE(last_hash, std::string::npos);
  const uint64_t last_ps = std::stoull(v.substr(last_hash + 2));
  EXPECT_GE(last_ps, (r.j["cycles"].get<uint64_t>() - 1) * 952);
}

}  // namespace

namespace {

// Two chips: chip0 sends K KiB from its VMEM to chip1's VMEM over ICI (rflag on
// chip1), both meet at a barrier, chip1 writes what it got to its HBM. Values
// must equal the reference; the transfer time must follow the neighbour
// VMEM->VMEM figure (1941 + 24.77 K cycles, v4); both modes agree.
std::string two_chip_program(uint64_t kib) {
  const std::string bytes = std::to_string(kib * 1024);
  return ".target chips=2 cores=1 mxus=1\n"
         ".input x f32 [" + std::to_string(kib * 256) + "] hbm:0x0\n"
         ".output y f32 [" + std::to_string(kib * 256) + "] hbm@chip1:0x100000\n"
         ".core chip0.core0\n"
         "  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=" + bytes + ", flag=f1\n"
         "  wait.sub f1, 1\n"
         "  dma vmem@chip1.c0:[s0 + 0], vmem:[s0 + 0], bytes=" + bytes + ", flag=f2, rflag=f3\n"
         "  wait.sub f2, 1\n"
         "  barrier\n"
         "  halt\n"
         ".core chip1.core0\n"
         "  wait.sub f3, 1\n"
         "  barrier\n"
         "  dma hbm:[s0 + 0x100000], vmem:[s0 + 0], bytes=" + bytes + ", flag=f1\n"
         "  wait.sub f1, 1\n"
         "  halt\n";
}

TEST(MultiChip, RemoteDmaAndBarrierMatchReferenceAndFigures) {
  uint64_t cycles[2] = {0, 0};
  const uint64_t kib[2] = {4, 64};
  for (int i = 0; i < 2; ++i) {
    const std::string p = temp_program("chips", two_chip_program(kib[i]));
    const RunOut fast = core_run(p, "fast", {}, "v4-8");
    const RunOut det = core_run(p, "detailed", {}, "v4-8");
    fs::remove(p);
    ASSERT_NO_FATAL_FAILURE(expect_clean_and_modes_agree(fast, det));
    cycles[i] = fast.j["cycles"].get<uint64_t>();
  }
  // Only the ICI leg and the two HBM legs grow with K: 24.77 + 1.105 + 1.051 cycles/KiB.
  const double slope = static_cast<double>(cycles[1] - cycles[0]) / static_cast<double>(kib[1] - kib[0]);
  EXPECT_NEAR(slope, 24.77 + 1.105 + 1.051, 0.1 * (24.77 + 1.105 + 1.051));
}

// A push from chip0's VMEM into chip1's through the chip model: the receiver's wait
// retires the cycle after the landing, so its sequencer's active cycles (wait,
// then halt) are the landing + 2, which must follow the published v4 neighbour
// VMEM->VMEM figure 1941 + 24.77 K cycles within 1%.
TEST(MultiChip, NeighbourPushLandsAtThePublishedFigure) {
  for (const uint64_t kib : {1, 16, 1024}) {
    const std::string text = ".target chips=2 cores=1 mxus=1\n.core chip0.core0\n  dma vmem@chip1.c0:[s0 + 0], vmem:[s0 + 0], bytes=" +
                             std::to_string(kib * 1024) + ", rflag=f3\n  halt\n.core chip1.core0\n  wait.sub f3, 1\n  halt\n";
    const std::string p = temp_program("neighbour", text);
    const RunOut r = core_run(p, "fast", {}, "v4-8");
    fs::remove(p);
    ASSERT_EQ(r.status, 0);
    ASSERT_FALSE(r.j["faulted"].get<bool>()) << r.j["fault"];
    const double landed = double(r.j["units"]["chip1.core0.sequencer"]["active_cycles"].get<uint64_t>()) - 2;
    const double published = 1941 + 24.77 * double(kib);
    EXPECT_NEAR(landed, published, 0.01 * published) << kib << " KiB";
  }
}

// A DMA's way round (docs/isa.md "Way round"): chip 1 of v5e-8's 2x4 torus is
// chip 0's neighbour on its size-2 dimension, joined by an x+ and an x- link. Two
// 1 MiB pushes from one-core chip 0 both take x+ by default, one after the other;
// with `way=-` on the second they take a link each and land in about half the
// time. Values equal the reference and both modes agree.
TEST(MultiChip, WayRoundSplitsASizeTwoDimensionOverBothLinks) {
  auto run = [](const std::string& way) {
    const std::string text =
        ".target chips=8 cores=1 mxus=1\n.input x f32 [524288] vmem@chip0.c0:0x0\n"
        ".output y f32 [524288] vmem@chip1.c0:0x0\n.core chip0.core0\n"
        "  dma vmem@chip1.c0:[s0 + 0], vmem:[s0 + 0], bytes=1048576, flag=f1, rflag=f3\n"
        "  dma vmem@chip1.c0:[s0 + 0x100000], vmem:[s0 + 0x100000], bytes=1048576, flag=f1, rflag=f3" + way + "\n"
        "  wait.sub f1, 2\n  halt\n.core chip1.core0\n  wait.sub f3, 2\n  halt\n";
    const std::string p = temp_program("way", text);
    const RunOut fast = core_run(p, "fast", {}, "v5e-8");
    const RunOut det = core_run(p, "detailed", {}, "v5e-8");
    fs::remove(p);
    EXPECT_NO_FATAL_FAILURE(expect_clean_and_modes_agree(fast, det));
    return fast.j;
  };
  const nlohmann::json one = run(""), both = run(", way=-");
  const auto bytes = [](const nlohmann::json& j, const std::string& link) {
    return j["units"].contains(link) ? j["units"][link].value("bytes", uint64_t{0}) : uint64_t{0};
  };
  EXPECT_EQ(bytes(one, "chip0.ici.x+"), 2u << 20);
  EXPECT_EQ(bytes(one, "chip0.ici.x-"), 0u);
  EXPECT_EQ(bytes(both, "chip0.ici.x+"), 1u << 20);
  EXPECT_EQ(bytes(both, "chip0.ici.x-"), 1u << 20);
  // 1 MiB on one 50 GB/s link (86.81% payload, 1.5 GHz) is 36.2 K cycles.
  const double saved = one["cycles"].get<double>() - both["cycles"].get<double>();
  EXPECT_NEAR(saved, 1048576 / (50e9 * 0.8681 / 1.5e9), 0.05 * 36234) << one["cycles"] << " -> " << both["cycles"];
}

// core.dma.remote_queue (docs/tensorcore.md "DMA"): a push queued behind four 1 MiB
// HBM loads, which hold all four engines for >= 483.6 + 1.105 x 1024 cycles. Shared
// (the default), it starts only when the first load is done, so it lands at least
// that much later than the published neighbour figure; own, it holds no engine and
// lands at that figure (1941 + 24.77 K cycles) within 1%. Values equal the
// reference and both modes agree either way.
TEST(MultiChip, RemoteQueueOwnLetsAPushPassLoadsWaitingForEngines) {
  std::string text = ".target chips=2 cores=1 mxus=1\n.input x f32 [1024] vmem@chip0.c0:0x0\n"
                     ".output y f32 [1024] vmem@chip1.c0:0x0\n.core chip0.core0\n";
  for (int i = 0; i < 4; ++i)
    text += "  dma vmem:[s0 + " + std::to_string(0x100000 * (i + 1)) + "], hbm:[s0 + " + std::to_string(0x100000 * i) +
            "], bytes=1048576, flag=f1\n";
  text += "  dma vmem@chip1.c0:[s0 + 0], vmem:[s0 + 0], bytes=4096, rflag=f3\n  wait.sub f1, 4\n  halt\n"
          ".core chip1.core0\n  wait.sub f3, 1\n  halt\n";
  const std::string p = temp_program("remote_queue", text);
  const double published = 1941 + 24.77 * 4, load = 483.6 + 1.105 * 1024;
  for (const std::string q : {"shared", "own"}) {
    const RunOut fast = core_run(p, "fast", {"--set", "core.dma.remote_queue=" + q}, "v4-8");
    const RunOut det = core_run(p, "detailed", {"--set", "core.dma.remote_queue=" + q}, "v4-8");
    ASSERT_NO_FATAL_FAILURE(expect_clean_and_modes_agree(fast, det));
    const double landed = double(fast.j["units"]["chip1.core0.sequencer"]["active_cycles"].get<uint64_t>()) - 2;
    if (q == "own")
      EXPECT_NEAR(landed, published, 0.01 * published);
    else
      EXPECT_GE(landed, published + load);
  }
  // A value other than shared or own is refused.
  const RunOut bad = core_run(p, "fast", {"--set", "core.dma.remote_queue=fifo"}, "v4-8");
  fs::remove(p);
  EXPECT_NE(bad.status, 0);
}

// A transfer to the chip's other core (docs/tensorcore.md "DMA") goes on the
// core's on-chip path, which takes the core's transfers in turn at the published
// 2.0 cycles/KiB; the engine hands it over as it does one to another chip. So, on
// v4 (414 + 2.0 K cycles alone): one 256 KiB transfer lands at that figure, two
// land one after the other (the second at 414 + 2 x 2.0 x 256); and with a single
// engine a 4 KiB HBM load issued behind the 256 KiB transfer still lands at the
// load's own figure (483.6 + 1.105 x 4), not after the transfer's 926 cycles.
// A landing is the waiting core's sequencer's active cycles (wait, then halt) - 2.
TEST(TwoCores, TransfersToTheOtherCoreTakeTurnsOnTheOnChipPathAndFreeTheEngine) {
  const std::string head = ".target chips=1 cores=2 mxus=1\n.input x f32 [65536] vmem@chip0.c0:0x0\n"
                           ".output y f32 [65536] vmem@chip0.c1:0x0\n.core chip0.core0\n";
  const auto push = [](int i) {
    return "  dma vmem@chip0.c1:[s0 + " + std::to_string(0x40000 * i) + "], vmem:[s0 + " + std::to_string(0x40000 * i) +
           "], bytes=262144, rflag=f3\n";
  };
  const auto landed = [](const RunOut& r, const char* core) {
    return double(r.j["units"][std::string("chip0.") + core + ".sequencer"]["active_cycles"].get<uint64_t>()) - 2;
  };
  const double one = 414 + 2.0 * 256, load = 483.6 + 1.105 * 4;
  struct Case {
    const char* name;
    std::string text;
    std::vector<std::string> set;
    const char* core;  // whose landing
    double want;
  };
  const Case cases[] = {
      {"alone", head + push(0) + "  halt\n.core chip0.core1\n  wait.sub f3, 1\n  halt\n", {}, "core1", one},
      {"two in turn", head + push(0) + push(1) + "  halt\n.core chip0.core1\n  wait.sub f3, 2\n  halt\n", {}, "core1",
       414 + 2 * 2.0 * 256},
      {"engine freed",
       head + push(0) + "  dma vmem:[s0 + 0x100000], hbm:[s0 + 0], bytes=4096, flag=f1\n  wait.sub f1, 1\n  halt\n"
                        ".core chip0.core1\n  wait.sub f3, 1\n  halt\n",
       {"--set", "core.dma.engines=1"}, "core0", load},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = temp_program("onchip_path", c.text);
    const RunOut fast = core_run(p, "fast", c.set);
    const RunOut det = core_run(p, "detailed", c.set);
    fs::remove(p);
    ASSERT_NO_FATAL_FAILURE(expect_clean_and_modes_agree(fast, det));
    EXPECT_NEAR(landed(fast, c.core), c.want, 0.01 * c.want);
  }
}

// On more than one chip the waveform has each ICI link's payload bytes and
// packets so far (chip0.ici.x+.bytes, ...): a 16 KiB push from chip0 to chip1
// shows on one of chip0's chip links, rising from 0 in steps no earlier than the
// DMA's setup (dma_setup + remote_setup cycles) to the 16384 bytes and the
// packets stats.json counts on that link, in both modes; the scope filter keeps
// chip0's links only.
TEST(MultiChip, WaveformTracesEachLinksBytesAndPackets) {
  const std::string text = ".target chips=2 cores=1 mxus=1\n.core chip0.core0\n  dma vmem@chip1.c0:[s0 + 0], vmem:[s0 + 0], "
                           "bytes=16384, rflag=f3\n  halt\n.core chip1.core0\n  wait.sub f3, 1\n  halt\n";
  const std::string p = temp_program("wave_links", text);
  for (const char* mode : {"fast", "detailed"}) {
    SCOPED_TRACE(mode);
    const fs::path vcd = fs::temp_directory_path() / ("wl_" + std::to_string(::getpid()) + ".vcd");
    const RunOut r = core_run(p, mode, {"--wave", vcd.string(), "--scope", "chip0.ici.*"}, "v4-8");
    ASSERT_EQ(r.status, 0);
    std::ifstream in(vcd);
    std::stringstream text_in;
    text_in << in.rdbuf();
    fs::remove(vcd);
    const tpusim::testing::ParsedVcd wave = tpusim::testing::parse_vcd(text_in.str());
    ASSERT_FALSE(wave.id_to_name.empty());
    for (const auto& [id, name] : wave.id_to_name) EXPECT_EQ(name.rfind("chip0.ici.", 0), 0u) << name;
    size_t carried = 0;
    for (const auto& [name, u] : r.j["units"].items()) {
      if (name.rfind("chip0.ici.", 0) != 0 || u.value("bytes", uint64_t{0}) == 0) continue;
      ++carried;
      EXPECT_EQ(u["bytes"].get<uint64_t>(), 16384u) << name;
      for (const char* what : {"bytes", "packets"}) {
        const auto it = wave.changes.find(name + "." + what);
        ASSERT_NE(it, wave.changes.end()) << name << "." << what;
        std::vector<std::pair<uint64_t, uint64_t>> ch;  // (ps, value)
        for (const auto& [ps, v] : it->second) ch.emplace_back(ps, std::stoull(v));
        EXPECT_EQ(ch.back().second, u[what].get<uint64_t>()) << name << "." << what;
        for (size_t i = 1; i < ch.size(); ++i) EXPECT_GE(ch[i].second, ch[i - 1].second) << name << "." << what;
        for (const auto& [ps, v] : ch) {
          if (v > 0) {
            EXPECT_GE(ps, uint64_t{1243} * 952) << name << "." << what;  // v4: 952 ps a cycle
          }
        }
      }
    }
    EXPECT_EQ(carried, 1u);
  }
  fs::remove(p);
}

// Reads of another chip's memory (a request goes there, the data comes back), a
// DMA between two other chips, and a push, all at once on v3-8: values equal the
// reference, both modes agree (cycles and every counter, per-link ones included),
// every link that carried data has bytes, busy and credit-stall counters, and the
// timeline has the per-link traffic counters and stays valid.
TEST(MultiChip, RemoteReadsThirdPartyDmaAndLinkStats) {
  const std::string text =
      ".target chips=4 cores=2 mxus=1\n"
      ".input a f32 [2048] vmem@chip1.c0:0x0\n"
      ".input b f32 [2048] vmem@chip3.c1:0x0\n"
      ".output ya f32 [2048] vmem@chip0.c0:0x10000\n"
      ".output yb f32 [2048] hbm@chip1:0x0\n"
      ".output yc f32 [2048] vmem@chip0.c1:0x20000\n"
      ".core chip0.core0\n"
      "  dma vmem:[s0 + 0x10000], vmem@chip1.c0:[s0 + 0], bytes=8192, flag=f1\n"
      "  wait.sub f1, 1\n  halt\n"
      ".core chip2.core1\n"
      "  dma hbm@chip1:[s0 + 0], vmem@chip3.c1:[s0 + 0], bytes=8192, flag=f1\n"
      "  wait.sub f1, 1\n  halt\n"
      ".core chip3.core1\n"
      "  dma vmem@chip0.c1:[s0 + 0x20000], vmem:[s0 + 0], bytes=8192, flag=f1, rflag=f4\n"
      "  wait.sub f1, 1\n  halt\n"
      ".core chip0.core1\n"
      "  wait.sub f4, 1\n  halt\n";
  const std::string p = temp_program("remote_reads", text);
  const fs::path tl = fs::temp_directory_path() / ("tl_ici_" + std::to_string(::getpid()) + ".json");
  const RunOut fast = core_run(p, "fast", {"--timeline", tl.string()}, "v3-8");
  const RunOut det = core_run(p, "detailed", {}, "v3-8");
  fs::remove(p);
  ASSERT_NO_FATAL_FAILURE(expect_clean_and_modes_agree(fast, det));
  // Chip links: 3 transfers of 8 KiB plus 2 header-only requests; each crosses
  // at least one link, so the chip links carried at least 3 x 8 KiB.
  uint64_t link_bytes = 0, links = 0;
  for (const auto& [name, u] : fast.j["units"].items()) {
    if (name.find(".ici.") == std::string::npos || name.find(".core") != std::string::npos) continue;
    ++links;
    link_bytes += u.value("bytes", uint64_t{0});
    EXPECT_TRUE(u.contains("busy_cycles") && u.contains("credit_stall_cycles")) << name;
  }
  EXPECT_GE(links, 3u);
  EXPECT_GE(link_bytes, 3u * 8192u);
  EXPECT_EQ(link_bytes % 8192, 0u);  // requests carry no payload
  std::ifstream in(tl);
  std::stringstream t;
  t << in.rdbuf();
  fs::remove(tl);
  EXPECT_TRUE(tpusim::timeline::validate(t.str()).empty());
  EXPECT_NE(t.str().find(".ici.x+ B/cycle"), std::string::npos);
}

// The HBM ends of a remote transfer (hw/dma/remote_hbm.h, docs/ici.md "HBM ends"):
// a 16 MiB push from chip0's HBM into chip1's reads exactly its bytes from chip0's
// memory and writes them into chip1's, the values land as in the reference, and the
// receiver's rflag rises only after the writes (the landing plus 16 MiB at no more
// than the memory's peak).
TEST(MultiChip, RemotePushChargesHbmOnBothEnds) {
  const uint64_t kBytes = 16u << 20;
  const std::string text =
      ".target chips=4 cores=2 mxus=1\n"
      ".input x f32 [4194304] hbm@chip0:0x0\n"
      ".output y f32 [1024] hbm@chip1:0xFFF000\n"
      ".core chip0.core0\n"
      "  dma hbm@chip1.c0:[s0 + 0], hbm:[s0 + 0], bytes=16777216, flag=f1, rflag=f3\n"
      "  wait.sub f1, 1\n  halt\n"
      ".core chip1.core0\n"
      "  wait.sub f3, 1\n  halt\n";
  const std::string p = temp_program("push_hbm", text);
  const RunOut r = core_run(p, "fast", {}, "v3-8");
  const RunOut det = core_run(p, "detailed", {}, "v3-8");
  fs::remove(p);
  ASSERT_NO_FATAL_FAILURE(expect_clean_and_modes_agree(r, det));
  const auto& u = r.j["units"];
  EXPECT_EQ(u["chip0.hbm"]["bytes_read"].get<uint64_t>(), kBytes);
  EXPECT_EQ(u["chip0.hbm"]["bytes_written"].get<uint64_t>(), 0u);
  EXPECT_EQ(u["chip1.hbm"]["bytes_read"].get<uint64_t>(), 0u);
  EXPECT_EQ(u["chip1.hbm"]["bytes_written"].get<uint64_t>(), kBytes);
  EXPECT_EQ(u["chip0.ici_hbm"]["bytes_read"].get<uint64_t>(), kBytes);
  EXPECT_EQ(u["chip1.ici_hbm"]["bytes_written"].get<uint64_t>(), kBytes);
  EXPECT_EQ(r.j["hbm_bytes_read"].get<uint64_t>(), kBytes);
  EXPECT_EQ(r.j["hbm_bytes_written"].get<uint64_t>(), kBytes);
  // The issuer's flag is a posted write's (the landing plus the way back); the
  // receiver waits for the writes too: at least 16 MiB at the HBM's peak later.
  const double issuer = double(u["chip0.core0.sequencer"]["active_cycles"].get<uint64_t>());
  const double receiver = double(u["chip1.core0.sequencer"]["active_cycles"].get<uint64_t>());
  EXPECT_GT(receiver, issuer - 1000 + double(kBytes) / (900e9 / 940e6));
}

// A push into chip1's HBM while chip1's core streams local HBM reads: the push's
// writes and the reads share chip1's memory, so together they take longer than
// either alone; the same push VMEM -> VMEM does not touch HBM and is unchanged.
TEST(MultiChip, RemotePushIntoHbmContendsWithLocalReads) {
  const std::string head = ".target chips=4 cores=2 mxus=1\n";
  const std::string push = ".core chip0.core0\n  dma hbm@chip1.c0:[s0 + 0], hbm:[s0 + 0], bytes=4194304, rflag=f3\n  halt\n";
  std::string reads = "  dma vmem:[s0 + 0], hbm:[s0 + 0x1000000], bytes=8388608, flag=f1\n";
  std::string local = "";
  for (int i = 0; i < 16; ++i) local += reads;
  local += "  wait.sub f1, 16\n";
  const auto cycles = [&](const std::string& text) {
    const std::string p = temp_program("contend", text);
    const RunOut r = core_run(p, "fast", {}, "v3-8");
    fs::remove(p);
    EXPECT_EQ(r.status, 0);
    EXPECT_FALSE(r.j.value("faulted", true)) << r.j.value("fault", std::string());
    EXPECT_TRUE(r.j.value("ref_ok", false));
    return r.j.value("cycles", uint64_t{0});
  };
  const uint64_t push_alone = cycles(head + push + ".core chip1.core0\n  wait.sub f3, 1\n  halt\n");
  const uint64_t reads_alone = cycles(head + ".core chip1.core0\n" + local + "  halt\n");
  const uint64_t together = cycles(head + push + ".core chip1.core0\n" + local + "  wait.sub f3, 1\n  halt\n");
  // 128 MiB of reads outlast the push's landing (~103 k cycles); its 4 MiB of
  // writes then take a share of the memory the reads had.
  EXPECT_GT(reads_alone, push_alone);
  EXPECT_GT(together, reads_alone + 2000) << push_alone << " " << reads_alone;
  // VMEM -> VMEM: no HBM at either end, the same cycles with the reads beside it.
  const std::string vpush = ".core chip0.core0\n  dma vmem@chip1.c1:[s0 + 0], vmem:[s0 + 0], bytes=4194304, rflag=f3\n  halt\n";
  const uint64_t vpush_alone = cycles(head + vpush + ".core chip1.core1\n  wait.sub f3, 1\n  halt\n");
  const uint64_t vpush_with = cycles(head + vpush + ".core chip1.core1\n  wait.sub f3, 1\n  halt\n.core chip1.core0\n" +
                                     local + "  halt\n");
  EXPECT_EQ(std::max(vpush_alone, reads_alone), vpush_with);
}

RunOut both_modes_agree(const std::string& name, const std::string& text);

// A DMA between two HBM regions of one chip (core 0 into core 1's part) reads and
// writes every byte through the memory: both directions counted, slower than the
// read alone, values as the reference, both modes identical.
TEST(MemoryContention, SameChipHbmToHbmChargesReadsAndWrites) {
  const std::string text =
      ".target chips=1 cores=2 mxus=1\n"
      ".input x f32 [262144] hbm@chip0:0x0\n"
      ".output y f32 [262144] hbm@chip0:0x1000000\n"
      ".core chip0.core0\n"
      "  dma hbm@chip0.c1:[s0 + 0x1000000], hbm:[s0 + 0], bytes=1048576, flag=f1\n"
      "  wait.sub f1, 1\n  halt\n";
  const RunOut fast = both_modes_agree("hbm2hbm", text);
  EXPECT_EQ(fast.j["hbm_bytes_read"].get<uint64_t>(), 1048576u);
  EXPECT_EQ(fast.j["hbm_bytes_written"].get<uint64_t>(), 1048576u);
  // 2 MiB through a v4 memory of 1143 B/cycle, not 1 MiB.
  EXPECT_GT(fast.j["cycles"].get<double>(), 2.0 * 1048576 / (1.2e12 / 1.05e9));
}

// Runs `text` in both modes: no fault, outputs equal to the reference, and the two
// modes agree on cycles and every counter. Returns the fast run.
RunOut both_modes_agree(const std::string& name, const std::string& text) {
  const std::string p = temp_program(name, text);
  const RunOut fast = core_run(p, "fast");
  const RunOut det = core_run(p, "detailed");
  fs::remove(p);
  EXPECT_EQ(fast.status, 0);
  EXPECT_EQ(det.status, 0);
  EXPECT_TRUE(fast.j.value("ref_ok", false)) << fast.j.value("ref_message", std::string());
  EXPECT_FALSE(fast.j.value("faulted", true)) << fast.j.value("fault", std::string());
  EXPECT_FALSE(det.j.value("faulted", true)) << det.j.value("fault", std::string());
  const auto get = [](const RunOut& r, const char* key) { return r.j.value(key, nlohmann::json::object()); };
  EXPECT_EQ(get(fast, "outputs"), get(fast, "ref_outputs"));
  EXPECT_EQ(get(det, "outputs"), get(fast, "outputs"));
  EXPECT_EQ(det.j.value("cycles", uint64_t{0}), fast.j.value("cycles", uint64_t{1}));
  EXPECT_EQ(get(det, "units"), get(fast, "units")) << "fast:\n" << get(fast, "units").dump(1) << "\ndetailed:\n"
                                                   << get(det, "units").dump(1);
  return fast;
}

// A core may halt with mmul results never popped (the reference leaves them in the
// FIFO). The MXU's rows still in flight are an event: the run ends when they have
// landed instead of reporting a deadlock of a halted core.
TEST(EndOfRun, HaltWithUnpoppedMxuResultsFinishes) {
  const RunOut r = both_modes_agree("unpopped", std::string(kHeader) + "  vbcast v1, 1.0\n  mmul mxu0, v1\n  halt\n");
  EXPECT_GT(r.j.value("cycles", uint64_t{0}), 0u);
}

// A barrier first waits for the core's MXUs to drain; the end of an mmul's rows
// in flight must wake the sequencer in fast mode at the cycle the clocked view
// sees it (else a deadlock when nothing else happens, or a late arrival and
// different stall_barrier* counters when another core's events wake it).
TEST(Barrier, DrainOfMxuWakesTheSequencer) {
  const std::string core0 = ".core chip0.core0\n  vbcast v1, 1.0\n  mmul mxu0, v1\n  barrier\n  halt\n";
  // Alone with a core that is already waiting: nothing but the MXU can wake it.
  both_modes_agree("drain_alone", ".target chips=1 cores=2 mxus=1\n" + core0 + ".core chip0.core1\n  barrier\n  halt\n");
  // Next to a core whose VPU and DMA have events of their own.
  std::string core1 = ".core chip0.core1\n  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=4096, flag=f1\n  vbcast v2, 2.0\n";
  for (int i = 0; i < 80; ++i) core1 += i == 0 ? "  vmul v3, v2, v2\n" : "  vmul v3, v3, v2\n";
  core1 += "  wait.sub f1, 1\n  barrier\n  dma hbm:[s0 + 0x100000], vmem:[s0 + 0], bytes=4096, flag=f1\n"
           "  wait.sub f1, 1\n  halt\n";
  const RunOut r = both_modes_agree(
      "drain_busy", ".target chips=1 cores=2 mxus=1\n.output y f32 [1024] hbm:0x100000\n" + core0 + core1);
  EXPECT_GT(r.j["units"]["chip0.core0.sequencer"].value("stall_barrier_drain_cycles", 0), 0);
}

}  // namespace

namespace {

// traces/calib: the published v4 micro-benchmarks (architecture.md), each within
// 10%. Rates are differences of two program lengths, so fixed costs cancel.
uint64_t calib(const std::string& name) {
  const RunOut r = core_run(std::string(TPUSIM_TRACES_DIR) + "/calib/" + name, "fast");
  EXPECT_EQ(r.status, 0) << name;
  EXPECT_FALSE(r.j.value("faulted", true)) << name;
  return r.j.value("cycles", uint64_t{0});
}

double per(const std::string& a, const std::string& b, int n) {
  return static_cast<double>(calib(b) - calib(a)) / n;
}

TEST(Calibration, V4MicroBenchmarksWithinTenPercent) {
  EXPECT_NEAR(per("vld_64.s", "vld_128.s", 64), 1.0, 0.1);                // vld 1 per cycle
  EXPECT_NEAR(per("vexp_dep_16.s", "vexp_dep_32.s", 16), 7.0, 0.7);       // transcendental latency
  EXPECT_NEAR(per("vexp_indep_16.s", "vexp_indep_32.s", 16), 2.0, 0.2);   // transcendental issue interval
  EXPECT_NEAR(per("vxpose_1.s", "vxpose_2.s", 1), 259.0, 25.9);           // 128x128 transpose
  EXPECT_NEAR(per("lane_reduce_1.s", "lane_reduce_2.s", 1), 79.0, 7.9);   // cross-lane reduce
  for (int k : {1, 16, 256, 2048}) {
    const double h2v = 483.6 + 1.105 * k, v2h = 417.5 + 1.051 * k;
    EXPECT_NEAR(static_cast<double>(calib("dma_h2v_" + std::to_string(k) + "k.s")), h2v, 0.1 * h2v) << k;
    EXPECT_NEAR(static_cast<double>(calib("dma_v2h_" + std::to_string(k) + "k.s")), v2h, 0.1 * v2h) << k;
  }
}

}  // namespace

namespace {

// vld/vst and DMA share the VMEM banks: a stream of tile loads over the banks a
// 64 KiB HBM->VMEM transfer is landing in must lose cycles to it, and both views
// must count the same.
TEST(VmemBanksShared, DmaBeatsDelayTileLoads) {
  std::string text = std::string(kHeader) + "  dma vmem:[s0 + 0x10000], hbm:[s0 + 0], bytes=65536, flag=f1\n";
  text += "  li s1, 0x20000\n";
  for (int i = 0; i < 700; ++i) text += "  vld v" + std::to_string(1 + i % 30) + ", [s1 + 0]\n";
  text += "  wait.sub f1, 1\n  halt\n";
  const std::string p = temp_program("banks", text);
  // The placeholder memory lands the beats evenly at the path's rate, which the
  // closed form below assumes; the HBM controller delivers them in clumps of
  // bursts from several channels at once, so fewer cycles carry a landing.
  const std::vector<std::string> even_beats = {"--set", "hbm.model=simple"};
  const RunOut fast = core_run(p, "fast", even_beats);
  const RunOut det = core_run(p, "detailed", even_beats);
  fs::remove(p);
  ASSERT_EQ(fast.status, 0);
  ASSERT_FALSE(fast.j["faulted"].get<bool>()) << fast.j["fault"];
  const uint64_t conflicts = fast.j["units"]["chip0.core0.vpu"].value("stall_bank_conflict_cycles", uint64_t{0});
  // 128 beats of 512 B land while the loads run, at the path's 1.105 cycles/KiB:
  // over 64 x 1.105 = 71 cycles. A dense tile needs all 16 banks and a beat takes
  // 2, so every cycle with a landing costs the load stream one cycle.
  EXPECT_NEAR(static_cast<double>(conflicts), 64 * 1.105, 3.0);
  EXPECT_EQ(det.j["units"], fast.j["units"]);
  EXPECT_EQ(det.j["cycles"], fast.j["cycles"]);
}

}  // namespace

namespace {

// Both cores of a v4 chip pull 1 MiB from HBM at once: together they ask for
// 2 x 927 B/cycle, the memory gives 1.2e12 / 1.05e9 = 1143 B/cycle, so the pair
// finishes after the published latency plus 2 MiB at the memory's rate instead of
// the single-transfer 483.6 + 1.105 x 1024 cycles.
TEST(MemoryContention, TwoCoresShareHbmBandwidth) {
  const std::string dma = "  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=1048576, flag=f1\n  wait.sub f1, 1\n  halt\n";
  const std::string two = ".target chips=1 cores=2 mxus=1\n.core chip0.core0\n" + dma + ".core chip0.core1\n" + dma;
  const std::string p = temp_program("two", two);
  const RunOut fast = core_run(p, "fast");
  const RunOut det = core_run(p, "detailed");
  fs::remove(p);
  ASSERT_EQ(fast.status, 0);
  const double single = 483.6 + 1.105 * 1024;
  const double shared = 483.6 + 2.0 * 1048576 / (1.2e12 / 1.05e9);
  EXPECT_NEAR(fast.j["cycles"].get<double>(), shared, 0.1 * shared);
  EXPECT_GT(fast.j["cycles"].get<double>(), 1.1 * single);
  EXPECT_EQ(det.j["units"], fast.j["units"]);
  EXPECT_EQ(fast.j["hbm_bytes_read"].get<uint64_t>(), 2u * 1048576u);
  // The memory is shared fairly: the same transfer on each core takes about as long
  // (with one core always first to the memory's queues, core 0 finished near the
  // single-transfer time and core 1 at the shared one).
  const double b0 = fast.j["units"]["chip0.core0.dma0"]["busy_cycles"].get<double>();
  const double b1 = fast.j["units"]["chip0.core1.dma0"]["busy_cycles"].get<double>();
  EXPECT_NEAR(b0, b1, 0.05 * std::max(b0, b1)) << "core 0 " << b0 << ", core 1 " << b1;
}

}  // namespace

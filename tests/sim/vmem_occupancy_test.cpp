// VMEM occupancy (docs/cli.md "VMEM occupancy"): the compiler's plan travels in the
// bundle, `tpusim run` turns it into a per-core timeline counter, stats.json's
// "vmem" and one report line. Checked against occupancies worked out here from the
// graph's shapes (a tiny matmul) or from the plan `tpusim disasm` prints (byte by
// byte), never from the code under test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw/timeline/timeline.h"
#include "sim/run/stats.h"
#include "tests/sim/cli_fixture.h"

namespace fs = std::filesystem;
using nlohmann::json;
using tpusim::testing::Completed;
using tpusim::testing::slurp;
using tpusim::testing::spawn;

namespace {

const std::string kSrc = TPUSIM_SOURCE_DIR;
constexpr uint64_t kV3Vmem = 16ull << 20;  // configs/chips/v3.yaml core.vmem.bytes

class VmemOccupancy : public tpusim::testing::TpusimCli {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

struct Sample {
  double ts;
  double value;
};
struct OpSlice {
  double ts, end;
  std::string name;
};

// The "chipX.coreN.vmem bytes in use" samples and the op slices of coreN.sequencer, by core.
void read_timeline(const std::string& path, std::map<std::string, std::vector<Sample>>& counters,
                   std::map<std::string, std::vector<OpSlice>>& slices) {
  const std::string text = slurp(path);
  const auto problems = tpusim::timeline::validate(text);
  ASSERT_TRUE(problems.empty()) << problems.front();
  const json doc = json::parse(text);
  std::map<std::pair<int64_t, int64_t>, std::string> sequencer;  // (pid, tid) -> "coreN"
  std::map<int64_t, std::string> chip;                           // pid -> "chipX"
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "M") continue;
    const std::string n = e["args"]["name"].is_string() ? e["args"]["name"].get<std::string>() : "";
    if (e["name"] == "process_name") chip[e["pid"]] = n;
    if (e["name"] == "thread_name" && n.size() > 10 && n.compare(n.size() - 10, 10, ".sequencer") == 0)
      sequencer[{e["pid"], e["tid"]}] = n.substr(0, n.size() - 10);
  }
  const std::string suffix = ".vmem bytes in use";
  for (const auto& e : doc["traceEvents"]) {
    const std::string name = e["name"];
    if (e["ph"] == "C" && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      counters[name.substr(0, name.size() - suffix.size())].push_back({e["ts"], e["args"]["value"]});
    if (e["ph"] == "X") {
      const auto it = sequencer.find({e["pid"], e["tid"]});
      if (it != sequencer.end())
        slices[chip.at(e["pid"]) + "." + it->second].push_back(
            {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>(), name});
    }
  }
  for (auto& [core, list] : counters)
    std::stable_sort(list.begin(), list.end(), [](const Sample& a, const Sample& b) { return a.ts < b.ts; });
  for (auto& [core, list] : slices)
    std::sort(list.begin(), list.end(), [](const OpSlice& a, const OpSlice& b) { return a.ts < b.ts; });
}

// The counter's value at time `ts` (its last sample at or before it; 0 before the first).
double value_at(const std::vector<Sample>& list, double ts) {
  double v = 0;
  for (const Sample& s : list)
    if (s.ts <= ts + 1e-7) v = s.value;
  return v;
}

// A tiny matmul keeps its three operands in VMEM, each once: the weights resident
// (K x N), the LHS rows (M x K) and the output rows (M x N), all f32 and dense
// (each row is one full 128-lane tile row, so no padding).
TEST_F(VmemOccupancy, TinyMatmulCounterIsItsOperandsSizes) {
  constexpr uint64_t M = 8, K = 128, N = 128;
  const uint64_t expect = 4 * (K * N + M * K + M * N);  // 73728
  const std::string ir = write("mm.ir", "graph mm {\n  input %x : f32[8,128]\n  input %w : f32[128,128]\n"
                                        "  %y = matmul(%x, %w) {} : f32[8,128] #0\n  output %y\n}\n");
  Completed c = tpusim({"compile", ir, "--preset", "v3", "-o", dir_ + "/mm.tpb"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"run", dir_ + "/mm.tpb", "--preset", "v3", "--random-inputs", "1", "--out", dir_ + "/run",
              "--timeline", dir_ + "/t.json"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out.find("  peak VMEM in use: " + std::to_string(expect) + " of " + std::to_string(kV3Vmem) +
                       " bytes (0.44%, chip0.core0)\n"),
            std::string::npos)
      << c.out;
  const json s = tpusim::run::read_stats(dir_ + "/run/stats.json");
  EXPECT_EQ(s["vmem"]["chip0.core0"]["peak_bytes_in_use"].get<uint64_t>(), expect);
  EXPECT_EQ(s["vmem"]["chip0.core0"]["capacity_bytes"].get<uint64_t>(), kV3Vmem);

  std::map<std::string, std::vector<Sample>> counters;
  std::map<std::string, std::vector<OpSlice>> slices;
  read_timeline(dir_ + "/t.json", counters, slices);
  ASSERT_EQ(counters.count("chip0.core0"), 1u);
  const auto& list = counters["chip0.core0"];
  ASSERT_EQ(slices["chip0.core0"].size(), 1u);
  const OpSlice& op = slices["chip0.core0"][0];
  EXPECT_EQ(op.name, "op 0: matmul %y");  // named after the graph node
  // In use from the op's start to the program's end, then free.
  ASSERT_EQ(list.size(), 2u);
  EXPECT_DOUBLE_EQ(list[0].ts, op.ts);
  EXPECT_EQ(list[0].value, double(expect));
  EXPECT_NEAR(list[1].ts, op.end, 1e-6);
  EXPECT_EQ(list[1].value, 0.0);
}

// Several ops on two cores: at the start of every op slice of a core's sequencer
// the counter holds the number of distinct bytes the plan gives that op on that
// core (counted byte by byte here from the `.vmem` lines of `tpusim disasm`); it
// never exceeds the capacity; the stats' peak is the largest; fast and detailed
// runs, and two fast runs, give the same counter.
TEST_F(VmemOccupancy, CompiledModelCounterFollowsThePlanOpByOp) {
  const std::string ir = write("multi.ir", R"(graph multi {
  input %x : f32[16,300]
  input %w : f32[300,200]
  %h = matmul(%x, %w) {} : f32[16,200] #0
  %s = softmax(%h) {axis=1} : f32[16,200] #1
  %t = transpose(%s) {perm=[1,0]} : f32[200,16] #2
  output %t
}
)");
  Completed c = tpusim({"compile", ir, "--preset", "v3", "--cores", "2", "-o", dir_ + "/m.tpb"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"disasm", dir_ + "/m.tpb"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  // core -> op -> distinct bytes, from ".vmem op=N addr=0xA bytes=B" under ".core chipX.coreY".
  std::map<std::string, std::map<int, std::vector<bool>>> marked;
  {
    std::istringstream in(c.out);
    std::string line, core;
    while (std::getline(in, line)) {
      if (line.rfind(".core ", 0) == 0) core = line.substr(6);
      int op = 0;
      unsigned long long addr = 0, bytes = 0;
      if (std::sscanf(line.c_str(), ".vmem op=%d addr=%llx bytes=%llu", &op, &addr, &bytes) == 3) {
        auto& bits = marked[core][op];
        bits.resize(kV3Vmem);
        ASSERT_LE(addr + bytes, kV3Vmem) << line;
        std::fill(bits.begin() + static_cast<std::ptrdiff_t>(addr), bits.begin() + static_cast<std::ptrdiff_t>(addr + bytes),
                  true);
      }
    }
  }
  std::map<std::string, std::map<std::string, double>> in_use;  // core -> "op N" -> bytes
  for (const auto& [core, ops] : marked)
    for (const auto& [op, bits] : ops)
      in_use[core]["op " + std::to_string(op)] = double(std::count(bits.begin(), bits.end(), true));
  ASSERT_EQ(in_use.size(), 2u) << c.out;
  ASSERT_GE(in_use["chip0.core0"].size(), 2u) << "the matmul and the softmax both plan VMEM on core 0";

  std::string first_counters;
  for (const std::string run : {"fast", "detailed", "fast2"}) {
    SCOPED_TRACE(run);
    const std::string out = dir_ + "/" + run, tl = dir_ + "/" + run + ".json";
    c = tpusim({"run", dir_ + "/m.tpb", "--preset", "v3", "--mode", run == "detailed" ? "detailed" : "fast",
                "--random-inputs", "1", "--out", out, "--timeline", tl, "-q"});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const json s = tpusim::run::read_stats(out + "/stats.json");
    std::map<std::string, std::vector<Sample>> counters;
    std::map<std::string, std::vector<OpSlice>> slices;
    read_timeline(tl, counters, slices);
    ASSERT_EQ(counters.size(), 2u);
    std::string dump;
    for (const auto& [core, list] : counters) {
      double peak = 0;
      for (const Sample& x : list) {
        EXPECT_LE(x.value, double(kV3Vmem)) << core;
        peak = std::max(peak, x.value);
        dump += core + " " + std::to_string(x.ts) + " " + std::to_string(x.value) + "\n";
      }
      ASSERT_FALSE(slices[core].empty()) << core;
      for (const OpSlice& op : slices[core]) {
        // Slices name the graph node behind each op id: "op N: <op> %<output>".
        const std::string id = op.name.substr(0, op.name.find(':'));
        const std::map<std::string, std::string> nodes = {
            {"op 0", "matmul %h"}, {"op 1", "softmax %s"}, {"op 2", "transpose %t"}};
        ASSERT_TRUE(nodes.count(id)) << op.name;
        EXPECT_EQ(op.name, id + ": " + nodes.at(id));
        const auto it = in_use[core].find(id);
        EXPECT_EQ(value_at(list, op.ts), it == in_use[core].end() ? 0.0 : it->second) << core << " " << op.name;
      }
      EXPECT_EQ(list.back().value, 0.0) << core << ": nothing in use after the program";
      EXPECT_EQ(s["vmem"][core]["peak_bytes_in_use"].get<double>(), peak) << core;
      EXPECT_EQ(s["vmem"][core]["capacity_bytes"].get<uint64_t>(), kV3Vmem) << core;
    }
    if (first_counters.empty()) first_counters = dump;
    else EXPECT_EQ(dump, first_counters);
  }
}

// A hand-written program without a plan: no counter, no peak, no report line;
// with `.vmem` lines it gets all three.
TEST_F(VmemOccupancy, HandWrittenProgramsDeclareTheirPlanOrHaveNone) {
  const std::string body = ".core chip0.core0\n%s  op 5\n  vbcast v0, 1.0\n  vst v0, [s0 + 0x4000]\n  halt\n";
  for (const bool planned : {false, true}) {
    SCOPED_TRACE(planned ? "planned" : "no plan");
    std::string text = body;
    text.replace(text.find("%s"), 2, planned ? ".vmem op=5 addr=0x4000 bytes=4096\n" : "");
    const std::string bundle = dir_ + "/p.tpb";
    Completed c = tpusim({"asm", write("p.s", ".target vmem=64K\n" + text), "-o", bundle});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    c = tpusim({"run", bundle, "--preset", "v3", "--out", dir_ + "/run", "--timeline", dir_ + "/t.json"});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const json s = tpusim::run::read_stats(dir_ + "/run/stats.json");
    EXPECT_EQ(s["vmem"]["chip0.core0"]["capacity_bytes"].get<uint64_t>(), 65536u);
    EXPECT_EQ(s["vmem"]["chip0.core0"].contains("peak_bytes_in_use"), planned);
    EXPECT_EQ(c.out.find("peak VMEM in use: 4096 of 65536 bytes (6.25%, chip0.core0)") != std::string::npos, planned)
        << c.out;
    std::map<std::string, std::vector<Sample>> counters;
    std::map<std::string, std::vector<OpSlice>> slices;
    read_timeline(dir_ + "/t.json", counters, slices);
    EXPECT_EQ(counters.size(), planned ? 1u : 0u);
    if (planned) {
      EXPECT_EQ(counters["chip0.core0"].front().value, 4096.0);
    }
  }
}

}  // namespace

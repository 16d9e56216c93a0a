// The waveform post-processing against a real sc_trace VCD: scopes, windows,
// determinism, FST through vcd2fst and back through fst2vcd.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <systemc>
#include <thread>

#include "hw/wave/vcd_filter.h"
#include "tests/hw/wave/vcd_parse.h"

namespace tpusim::wave {
namespace {

namespace fs = std::filesystem;

// Two units whose key state changes every 10 ns: busy counts 0..4, x = 0.5 + i.
struct Unit : sc_core::sc_module {
  int busy = 0;
  double x = 0.5;
  SC_HAS_PROCESS(Unit);
  explicit Unit(sc_core::sc_module_name n) : sc_module(n) { SC_THREAD(run); }
  void run() {
    for (int i = 1; i <= 4; ++i) {
      wait(10, sc_core::SC_NS);
      busy = i;
      x += 1;
    }
    // SystemC writes a time step's values only once time moves past it: without
    // this last wait the changes at 40 ns would never reach the file.
    wait(10, sc_core::SC_NS);
  }
};

// Runs the simulation once per process (one elaboration per process) and returns
// the raw VCD path.
std::string trace_once() {
  static std::string path;
  if (!path.empty()) return path;
  path = (fs::temp_directory_path() / ("tpusim_wave_" + std::to_string(::getpid()))).string();
  static Unit mxu("mxu0"), vpu("vpu");
  auto* tf = sc_core::sc_create_vcd_trace_file(path.c_str());
  tf->set_time_unit(1, sc_core::SC_PS);
  sc_core::sc_trace(tf, mxu.busy, "chip0.core0.mxu0.busy");
  sc_core::sc_trace(tf, vpu.x, "chip0.core0.vpu.x");
  sc_core::sc_trace(tf, vpu.busy, "chip0.core1.vpu.busy");
  sc_core::sc_start();
  sc_core::sc_close_vcd_trace_file(tf);
  path += ".vcd";
  std::atexit([] { std::remove(path.c_str()); });
  return path;
}

std::string filtered(const FilterOptions& opt) {
  std::ifstream in(trace_once());
  std::ostringstream out;
  filter_vcd(in, out, opt);
  return out.str();
}

using Parsed = testing::ParsedVcd;
Parsed parse(const std::string& vcd) { return testing::parse_vcd(vcd); }

TEST(VcdFilter, KeepsOnlyMatchingScopes) {
  FilterOptions opt;
  opt.scopes = {"chip0.core0"};
  const Parsed p = parse(filtered(opt));
  ASSERT_EQ(p.id_to_name.size(), 2u);
  for (const auto& [id, name] : p.id_to_name) EXPECT_EQ(name.rfind("chip0.core0.", 0), 0u) << name;
  EXPECT_EQ(p.last.at("chip0.core0.mxu0.busy"), "4");
  EXPECT_EQ(p.last.at("chip0.core0.vpu.x"), "4.5");

  opt.scopes = {"*.vpu.*"};
  const Parsed q = parse(filtered(opt));
  EXPECT_EQ(q.id_to_name.size(), 2u);
  EXPECT_EQ(q.last.count("chip0.core0.mxu0.busy"), 0u);
}

TEST(VcdFilter, WindowStartsWithTheStateAtItsBeginning) {
  FilterOptions opt;
  opt.begin_ps = 15000;  // between the changes at 10 ns and 20 ns
  opt.end_ps = 30000;
  const std::string text = filtered(opt);
  const Parsed p = parse(text);
  ASSERT_FALSE(p.times.empty());
  EXPECT_EQ(p.times.front(), 15000u);
  EXPECT_EQ(p.times.back(), 30000u);
  for (uint64_t t : p.times) {
    EXPECT_GE(t, 15000u);
    EXPECT_LE(t, 30000u);
  }
  EXPECT_EQ(p.last.at("chip0.core0.mxu0.busy"), "3");  // set at 30 ns; the 4 at 40 ns is outside
  // The dump at 15 ns carries the value set at 10 ns.
  const auto dump = text.find("#15000\n$dumpvars\n");
  ASSERT_NE(dump, std::string::npos);
  EXPECT_NE(text.find("b1 ", dump), std::string::npos);
}

TEST(VcdFilter, OutputIsDeterministic) {
  // The raw file has a $date line; the filtered one must not.
  const std::string a = filtered({});
  EXPECT_EQ(a.find("$date"), std::string::npos);
  EXPECT_EQ(a, filtered({}));
}

// vcd2fst stamps the wall-clock time into the FST header when the VCD has no
// $date (two runs a second apart differed in bytes 221-222): the same trace
// converted twice, more than a second apart, gives the same bytes.
TEST(VcdFilter, FstIsDeterministic) {
  const std::string raw = trace_once();
  std::string bytes[2];
  for (int i = 0; i < 2; ++i) {
    if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    const std::string fst = (fs::temp_directory_path() / ("tpusim_wave_det_" + std::to_string(::getpid()) + ".fst")).string();
    finish_wave(raw, fst, {});
    std::ifstream in(fst, std::ios::binary);
    std::stringstream b;
    b << in.rdbuf();
    bytes[i] = b.str();
    fs::remove(fst);
  }
  EXPECT_FALSE(bytes[0].empty());
  EXPECT_TRUE(bytes[0] == bytes[1]) << "the two .fst files differ";
}

TEST(VcdFilter, FstRoundTripsThroughFst2vcd) {
  const std::string fst = (fs::temp_directory_path() / ("tpusim_wave_" + std::to_string(::getpid()) + ".fst")).string();
  finish_wave(trace_once(), fst, {});
  ASSERT_TRUE(fs::exists(fst));
  EXPECT_FALSE(fs::exists(fst + ".partial"));
  const std::string back = fst + ".back.vcd";
  ASSERT_EQ(std::system(("fst2vcd -f " + fst + " -o " + back + " > /dev/null 2>&1").c_str()), 0);
  std::ifstream in(back);
  std::stringstream text;
  text << in.rdbuf();
  const Parsed p = parse(text.str());
  EXPECT_EQ(p.last.at("chip0.core0.mxu0.busy"), "4");
  EXPECT_EQ(p.last.at("chip0.core1.vpu.busy"), "4");
  fs::remove(fst);
  fs::remove(back);
}

TEST(VcdFilter, TruncatedInputIsAnError) {
  std::istringstream in("$timescale 1 ps $end\n$scope module a $end\n$var wire 1 ! b $end\n");
  std::ostringstream out;
  EXPECT_THROW(filter_vcd(in, out, {}), std::runtime_error);
}

TEST(VcdFilter, UnwritableOutputLeavesNothing) {
  EXPECT_THROW(finish_wave(trace_once(), "/nonexistent-dir/w.vcd", {}), std::runtime_error);
}

}  // namespace
}  // namespace tpusim::wave

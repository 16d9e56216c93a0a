// `tpusim run` / `tpusim report` as a user meets them: every bad preset, override,
// input file or output path is one line on stderr naming the problem and exit
// status 2; program faults and deadlocks are exit status 1; none of them leaves a
// stats.json behind (shared/spec/cli.md). Runs the real binary.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "hw/config/params.h"
#include "isa/io/npy.h"
#include "sim/run/stats.h"
#include "tests/sim/cli_fixture.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;
using testing::Completed;
using testing::spawn;

// One input x [8,128] f32 in HBM, y = x + x written back to HBM.
constexpr const char* kProgram = R"(.target chips=1 cores=1 mxus=1
.input  x f32 [8, 128] hbm:0x0
.output y f32 [8, 128] hbm:0x10000
.core chip0.core0
  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=4096, flag=f1
  wait f1, 1
  vld v1, [s0 + 0]
  vadd v2, v1, v1
  vst v2, [s0 + 0x1000]
  dma hbm:[s0 + 0x10000], vmem:[s0 + 0x1000], bytes=4096, flag=f2
  wait f2, 1
  halt
)";

class RunCli : public testing::TpusimCli {
 protected:
  void SetUp() override {
    TpusimCli::SetUp();
    bundle_ = assemble("prog", kProgram);
    io::NpyArray x;
    x.dtype = io::NpyDtype::kF32;
    x.shape = {8, 128};
    x.data.resize(8 * 128 * 4);
    for (size_t i = 0; i < 8 * 128; ++i) {
      const float f = float(i) * 0.25f - 100.0f;
      std::memcpy(x.data.data() + 4 * i, &f, 4);
    }
    good_input_ = dir_ + "/x.npy";
    io::write_npy(good_input_, x);
  }
  std::string assemble(const std::string& name, const std::string& text) {
    const std::string src = dir_ + "/" + name + ".s", out = dir_ + "/" + name + ".tpu";
    std::ofstream(src) << text;
    const Completed c = tpusim({"asm", src, "-o", out});
    EXPECT_EQ(c.exit_code, 0) << c.err;
    return out;
  }

  // Exit status `code`, exactly one line on stderr containing every `needles`,
  // and no stats.json in DIR.
  void expect_error(const Completed& c, int code, const std::vector<std::string>& needles) {
    EXPECT_EQ(c.exit_code, code) << c.err;
    EXPECT_EQ(testing::count_lines(c.err), 1) << c.err;
    for (const auto& n : needles) EXPECT_NE(c.err.find(n), std::string::npos) << "'" << n << "' not in: " << c.err;
    EXPECT_FALSE(fs::exists(out() + "/stats.json"));
  }

  std::string out() const { return dir_ + "/out"; }
  std::string input_arg(const std::string& file) const { return "x=" + file; }

  std::string bundle_, good_input_;
};

TEST_F(RunCli, UnknownPreset) {
  expect_error(tpusim({"run", bundle_, "--preset", "v99", "--input", input_arg(good_input_), "--out", out()}), 2,
               {"v99"});
}

TEST_F(RunCli, UnknownSetKeyNamesTheKey) {
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "core.mxu.rowz=64", "--input",
                       input_arg(good_input_), "--out", out()}),
               2, {"core.mxu.rowz"});
}

TEST_F(RunCli, InconsistentOverrideIsBadInput) {
  // Valid on its own, but v4 lists a fixed MXU latency for each of its 4 MXUs.
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "core.mxu.count=2", "--input",
                       input_arg(good_input_), "--out", out()}),
               2, {"fixed_latency_cycles"});
}

TEST_F(RunCli, BadSetValueNamesTheKey) {
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "clock_hz=fast", "--input", input_arg(good_input_),
                       "--out", out()}),
               2, {"clock_hz"});
}

// The bundle's target sizes the memories (16 MiB of VMEM by default): a preset
// with less cannot host it, and a size below 1 byte is no size; neither used to
// be read by `run`, so a --set of them changed nothing.
TEST_F(RunCli, MemorySizesBelowTheBundlesAreBadInput) {
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "core.vmem.bytes=8388608", "--input",
                       input_arg(good_input_), "--out", out()}),
               2, {"16777216 bytes of VMEM per core, the preset has 8388608 (core.vmem.bytes)"});
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "hbm.bytes=-1", "--input", input_arg(good_input_),
                       "--out", out()}),
               2, {"hbm.bytes must be at least 1, is -1"});
}

// A DMA path's figures must keep a transfer's cycles in 64 bits (1e30 cycles per
// KiB overflowed into a run shorter than the preset's).
TEST_F(RunCli, DmaFiguresOutOfRangeAreBadInput) {
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "core.dma.hbm_to_vmem.cycles_per_kib=1e30",
                       "--input", input_arg(good_input_), "--out", out()}),
               2, {"core.dma.hbm_to_vmem", "0..1e9"});
}

// The chip's cycle is its period rounded to the model's 1 ps step: a clock whose
// period rounds by more than 1% ran off its own clock_hz without a word
// (7e11 Hz ran a 1 ps cycle, 43% fast), and a non-positive one exited 1, as if
// the program had faulted.
TEST_F(RunCli, AChipClockTheTimeStepCannotHoldIsBadInput) {
  for (const char* bad : {"clock_hz=700000000000", "clock_hz=2000000000000"})
    expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", bad, "--input", input_arg(good_input_), "--out",
                         out()}),
                 2, {"clock_hz", "round by more than 1%"});
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "clock_hz=-5", "--input", input_arg(good_input_),
                       "--out", out()}),
               2, {"clock_hz must be positive"});
  // 20 GHz (50 ps) and 1 THz (exactly 1 ps) are held exactly.
  for (const char* good : {"clock_hz=20000000000", "clock_hz=1000000000000"}) {
    const Completed c = tpusim({"run", bundle_, "--preset", "v4", "--set", good, "--input", input_arg(good_input_),
                                "--out", out(), "-q"});
    EXPECT_EQ(c.exit_code, 0) << good << ": " << c.err;
  }
}

// A pipe whose requests in flight cannot cover its latency carries less than its
// bytes_per_s (SimpleMemoryConfig::sustained_bytes_per_s): the run goes on, with
// one note on stderr naming the ceiling and the key to raise; none where the
// pipe reaches its rate.
TEST_F(RunCli, SimpleMemoryBelowItsRateSaysSo) {
  const std::vector<std::string> run = {"run", bundle_, "--preset", "v4", "--input", input_arg(good_input_),
                                        "--out", out(), "-q", "--set", "hbm.model=simple"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = run;
    args.insert(args.end(), extra.begin(), extra.end());
    return tpusim(args);
  };
  const Completed at_peak = with({});
  EXPECT_EQ(at_peak.exit_code, 0) << at_peak.err;
  EXPECT_EQ(at_peak.err, "");
  const Completed fast = with({"--set", "hbm.simple.bytes_per_s=1.2e13"});
  EXPECT_EQ(fast.exit_code, 0) << fast.err;
  EXPECT_EQ(testing::count_lines(fast.err), 1) << fast.err;
  for (const char* n : {"note:", "256 requests in flight of 512 B over a 100000 ps latency carry at most 1.31e+12 B/s",
                        "bytes_per_s 1.2e+13", "hbm.simple.max_outstanding to at least 2345"})
    EXPECT_NE(fast.err.find(n), std::string::npos) << "'" << n << "' not in: " << fast.err;
  EXPECT_TRUE(fs::exists(out() + "/stats.json"));
  const Completed deep = with({"--set", "hbm.simple.bytes_per_s=1.2e13", "--set", "hbm.simple.max_outstanding=2345"});
  EXPECT_EQ(deep.exit_code, 0) << deep.err;
  EXPECT_EQ(deep.err, "");
}

TEST_F(RunCli, MissingInputNamesIt) {
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--out", out()}), 2, {"'x'", "--random-inputs"});
}

TEST_F(RunCli, UnknownInputNameListsTheInputs) {
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--input", "z=" + good_input_, "--out", out()}), 2,
               {"'z'", "x"});
}

TEST_F(RunCli, WrongShapeNamesBothShapes) {
  io::NpyArray a;
  a.dtype = io::NpyDtype::kF32;
  a.shape = {4, 128};
  a.data.resize(4 * 128 * 4);
  io::write_npy(dir_ + "/short.npy", a);
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--input", input_arg(dir_ + "/short.npy"), "--out", out()}),
               2, {"short.npy", "[8, 128]", "[4, 128]"});
}

TEST_F(RunCli, WrongDtypeNamesBoth) {
  io::NpyArray a;
  a.dtype = io::NpyDtype::kI32;
  a.shape = {8, 128};
  a.data.resize(8 * 128 * 4);
  io::write_npy(dir_ + "/ints.npy", a);
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--input", input_arg(dir_ + "/ints.npy"), "--out", out()}),
               2, {"ints.npy", "f32", "<i4"});
}

TEST_F(RunCli, NotAnNpyFile) {
  std::ofstream(dir_ + "/junk.npy") << "this is not numpy";
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--input", input_arg(dir_ + "/junk.npy"), "--out", out()}),
               2, {"junk.npy"});
}

TEST_F(RunCli, UnwritableOutputDirectory) {
  // A path below a regular file can never be created, even by root (which
  // permission bits would not stop).
  std::ofstream(dir_ + "/plainfile") << "x";
  const std::string bad = dir_ + "/plainfile/out";
  const Completed c =
      tpusim({"run", bundle_, "--preset", "v4", "--input", input_arg(good_input_), "--out", bad});
  expect_error(c, 2, {bad});
}

TEST_F(RunCli, BadBundleFile) {
  std::ofstream(dir_ + "/junk.tpu") << "not a bundle at all";
  expect_error(tpusim({"run", dir_ + "/junk.tpu", "--preset", "v4", "--random-inputs", "1", "--out", out()}), 2,
               {"junk.tpu"});
}

// A folder where a file belongs: an ifstream opens it and failed at the first
// read with "basic_filebuf::underflow error reading the file: Is a directory",
// which named neither the path nor the fix.
TEST_F(RunCli, AFolderForAFileNamesIt) {
  expect_error(tpusim({"run", dir_, "--preset", "v4", "--random-inputs", "1", "--out", out()}), 2,
               {dir_ + ": is a directory"});
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--input", "x=" + dir_, "--out", out()}), 2,
               {dir_ + ": is a directory"});
  expect_error(tpusim({"run", bundle_, "--preset", dir_, "--random-inputs", "1", "--out", out()}), 2,
               {dir_ + ": is a directory"});
  for (const char* cmd : {"ref", "disasm"}) {
    const Completed c = tpusim({cmd, dir_});
    EXPECT_EQ(c.exit_code, 2) << cmd << ": " << c.err;
    EXPECT_EQ(testing::count_lines(c.err), 1) << c.err;
    EXPECT_NE(c.err.find(dir_ + ": is a directory"), std::string::npos) << c.err;
  }
  fs::create_directories(dir_ + "/m.onnx");
  const Completed c = tpusim({"compile", dir_ + "/m.onnx", "--preset", "v4", "-o", dir_ + "/m.tpb"});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find(dir_ + "/m.onnx: is a directory, not an ONNX model"), std::string::npos) << c.err;
  EXPECT_FALSE(fs::exists(dir_ + "/m.tpb"));
}

// A preset file of the user's own: a key it lacks is missing (it was "unknown", from
// the top-level handler, as if the user had misspelt it), and a control byte in it
// is shown as \xNN so the error stays one line.
TEST_F(RunCli, AHandWrittenPresetsFaultsAreOneLineNamingTheFile) {
  std::ofstream(dir_ + "/lacks.yaml") << "core: {mxu: {rows: 8}}\n";
  expect_error(tpusim({"run", bundle_, "--preset", dir_ + "/lacks.yaml", "--random-inputs", "1", "--out", out()}), 2,
               {"tpusim run: error: " + dir_ + "/lacks.yaml: missing parameter 'clock_hz'"});
  std::ofstream(dir_ + "/cr.yaml") << "include: ../chips/v4\r.yaml\n";
  expect_error(tpusim({"run", bundle_, "--preset", dir_ + "/cr.yaml", "--random-inputs", "1", "--out", out()}), 2,
               {dir_ + "/cr.yaml:1:10: include '../chips/v4\\x0d.yaml': ", ": cannot open"});
}

// `tpusim run` takes bundles; a program's text gets the command that makes one.
TEST_F(RunCli, ProgramTextForABundleSaysToAssembleIt) {
  expect_error(tpusim({"run", dir_ + "/prog.s", "--preset", "v4", "--random-inputs", "1", "--out", out()}), 2,
               {"prog.s: not a tpusim bundle", "tpusim asm"});
}

// host.pcie_bytes_per_s is the link's nominal rate, which no transfer reads; it
// took -1 without a word, and `presets` printed its figures before failing.
TEST_F(RunCli, NominalHostRateOutOfRangeIsBadInput) {
  expect_error(tpusim({"run", bundle_, "--preset", "v4", "--set", "host.pcie_bytes_per_s=-1", "--random-inputs", "1",
                       "--out", out()}),
               2, {"host.pcie_bytes_per_s must be in 1..1e15"});
  const Completed c = tpusim({"presets", "v4", "--set", "host.pcie_bytes_per_s=0"});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_EQ(c.out, "");
  EXPECT_NE(c.err.find("host.pcie_bytes_per_s"), std::string::npos) << c.err;
  const Completed ok = tpusim({"presets", "v4"});
  EXPECT_NE(ok.out.find("host link per chip : 16 GB/s nominal, 14.9 GB/s timed (host.hbm_to_host)"), std::string::npos)
      << ok.out;
}

// The list form names each board's topology and links, which a sweep over boards
// changes, read here from the preset files themselves.
TEST_F(RunCli, PresetListShowsTopologyLinksAndHost) {
  const Completed c = tpusim({"presets"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  auto line_of = [&](const std::string& name) {
    std::istringstream in(c.out);
    for (std::string l; std::getline(in, l);)
      if (l.rfind("  " + name + " ", 0) == 0) return l;
    return std::string();
  };
  for (const auto& name : config::preset_names()) {
    const auto p = config::load_preset(name);
    std::string topo = p.get_string("system.topology");
    if (topo != "single") {
      std::string dims;
      for (int64_t d : p.get_int_list("system.dims")) dims += (dims.empty() ? "" : "x") + std::to_string(d);
      topo += " " + dims;
    }
    const std::string line = line_of(name);
    ASSERT_FALSE(line.empty()) << name << " missing from\n" << c.out;
    EXPECT_NE(line.find("  " + topo + " "), std::string::npos) << line;
    EXPECT_NE(line.find(fmt::format("ICI {} x {:>2.0f} GB/s", p.get_int("ici.links"),
                                    p.get_double("ici.link_bytes_per_s") / 1e9)),
              std::string::npos)
        << line;
  }
  EXPECT_NE(line_of("v4-4x4x4").find("torus3d 4x4x4  ICI 6 x 50 GB/s  host 16 GB/s"), std::string::npos) << c.out;
}

TEST_F(RunCli, BadModeAndMissingPresetAreUsageErrors) {
  Completed c = tpusim({"run", bundle_, "--preset", "v4", "--mode", "turbo", "--random-inputs", "1", "--out", out()});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find("turbo"), std::string::npos) << c.err;
  c = tpusim({"run", bundle_, "--random-inputs", "1", "--out", out()});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find("--preset"), std::string::npos) << c.err;
  EXPECT_FALSE(fs::exists(out() + "/stats.json"));
}

TEST_F(RunCli, TimelineWindowEndingBeforeItBeginsIsBadInput) {
  const Completed c = tpusim({"run", bundle_, "--preset", "v4", "--random-inputs", "1", "--out", out(), "--timeline",
                              dir_ + "/t.json", "--timeline-begin", "500", "--timeline-end", "100"});
  expect_error(c, 2, {"--timeline-begin 500", "--timeline-end 100"});
  EXPECT_FALSE(fs::exists(dir_ + "/t.json"));
  EXPECT_FALSE(fs::exists(out() + "/stats.json"));
}

TEST_F(RunCli, ReportOfAMissingOrForeignFile) {
  expect_error(tpusim({"report", dir_ + "/absent.json"}), 2, {"absent.json"});
  std::ofstream(dir_ + "/other.json") << "{\"cycles\": 12}";
  expect_error(tpusim({"report", dir_ + "/other.json"}), 2, {"other.json", "missing key"});
}

// ---- with the chip model ---------------------------------------------------------

bool chip_model_missing(const Completed& c) { return c.err.find("chip model is not built yet") != std::string::npos; }

TEST_F(RunCli, SuccessfulRunWritesOutputsStatsAndTheSameReportTwice) {
  const Completed c = tpusim({"run", bundle_, "--preset", "v4", "--input", input_arg(good_input_), "--out", out()});
  if (chip_model_missing(c)) GTEST_SKIP() << c.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  // y = x + x exactly (every x is a multiple of 0.25 far from overflow).
  const io::NpyArray y = io::read_npy(out() + "/y.npy");
  ASSERT_EQ(y.shape, (std::vector<int64_t>{8, 128}));
  for (size_t i = 0; i < 8 * 128; ++i) ASSERT_EQ(y.as<float>()[i], 2.0f * (float(i) * 0.25f - 100.0f)) << i;
  const auto stats = run::read_stats(out() + "/stats.json");
  EXPECT_EQ(stats["preset"], "v4");
  EXPECT_EQ(stats["mode"], "fast");
  EXPECT_EQ(stats["clock_hz"].get<double>(), 1.05e9);
  EXPECT_GT(stats["cycles"].get<uint64_t>(), 0u);
  EXPECT_EQ(stats["flops"].get<uint64_t>(), 0u);  // no MXU work in this program
  // One 4 KiB tile in and one out through HBM.
  EXPECT_EQ(stats["hbm"]["bytes_read"].get<uint64_t>(), 4096u);
  EXPECT_EQ(stats["hbm"]["bytes_written"].get<uint64_t>(), 4096u);
  // v4: 2 cores x 4 MXUs x 128 x 128 x 2 FLOP x 1.05 GHz.
  EXPECT_DOUBLE_EQ(stats["peak_flops_per_s"].get<double>(), 2.0 * 4 * 128 * 128 * 2 * 1.05e9);
  const Completed rep = tpusim({"report", out() + "/stats.json"});
  EXPECT_EQ(rep.exit_code, 0) << rep.err;
  EXPECT_EQ(rep.out, c.out);
  // No temporary file left next to the outputs.
  for (const auto& e : fs::directory_iterator(out()))
    EXPECT_TRUE(e.path().extension() == ".npy" || e.path().filename() == "stats.json") << e.path();
}

TEST_F(RunCli, ProgramFaultExitsOneAndRemovesAStaleStatsFile) {
  const std::string bad = assemble("fault", R"(.target chips=1 cores=1 mxus=1
.output y f32 [8, 128] vmem:0x0
.core chip0.core0
  li s1, 0x7fff0000
  vld v1, [s1 + 0]
  halt
)");
  fs::create_directories(out());
  std::ofstream(out() + "/stats.json") << "{}";  // left by an earlier run
  const Completed c = tpusim({"run", bad, "--preset", "v4", "--out", out()});
  if (chip_model_missing(c)) GTEST_SKIP() << c.err;
  expect_error(c, 1, {"vld"});
}

TEST_F(RunCli, DeadlockExitsOne) {
  const std::string bad = assemble("deadlock", R"(.target chips=1 cores=1 mxus=1
.output y f32 [8, 128] vmem:0x0
.core chip0.core0
  wait f3, 1
  halt
)");
  const Completed c = tpusim({"run", bad, "--preset", "v4", "--out", out()});
  if (chip_model_missing(c)) GTEST_SKIP() << c.err;
  expect_error(c, 1, {"f3"});
}

// A copied output promises the same tensor at every place (a data-parallel step's
// updated weights on every replica): when the two cores of a chip leave different
// values, `run` and `ref` both exit 1 naming the output, the copy and the first
// element that differs, and write no output; when they agree, y is written.
TEST_F(RunCli, CopiesThatDisagreeExitOneAndWriteNoOutput) {
  // Core 0 runs kProgram's code (y = x + x), core 1 the same with `core1_op` and
  // its y at 0x20000.
  const std::string core0 = std::string(kProgram).substr(std::string(kProgram).find(".core chip0.core0\n"));
  auto program = [&](const std::string& core1_op) {
    std::string core1 = core0;
    core1.replace(core1.find("core0"), 5, "core1");
    core1.replace(core1.find("vadd"), 4, core1_op);
    core1.replace(core1.find("hbm:[s0 + 0x10000]"), 18, "hbm:[s0 + 0x20000]");
    return ".target chips=1 cores=2 mxus=1\n.input  x f32 [8, 128] hbm:0x0 copies=[hbm@chip0.c1:0x0]\n"
           ".output y f32 [8, 128] hbm:0x10000 copies=[hbm@chip0.c1:0x20000]\n" +
           core0 + core1;
  };
  const std::string agree = assemble("agree", program("vadd")), differ = assemble("differ", program("vmul"));
  const Completed ok = tpusim({"run", agree, "--preset", "v4", "--input", input_arg(good_input_), "--out", out()});
  if (chip_model_missing(ok)) GTEST_SKIP() << ok.err;
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(out() + "/y.npy"));
  fs::remove_all(out());
  // x[0] = -100: core 1's x * x = 10000 (0x461c4000) against core 0's x + x = -200 (0xc3480000).
  const std::vector<std::string> needles = {"differ.tpu: output 'y': its copy 1 at hbm@chip0.c1:0x20000 differs from copy 0 at "
                                            "hbm@chip0.c0:0x10000, first at flat index 0 (bits 0x461c4000 against 0xc3480000)"};
  expect_error(tpusim({"run", differ, "--preset", "v4", "--input", input_arg(good_input_), "--out", out()}), 1, needles);
  EXPECT_FALSE(fs::exists(out() + "/y.npy"));
  const Completed ref = tpusim({"ref", differ, "--input", input_arg(good_input_), "--out", out()});
  expect_error(ref, 1, needles);
  EXPECT_FALSE(fs::exists(out() + "/y.npy"));
}

// A what-if array size reaches the compiler too: `compile --set` builds the bundle
// for the overridden MXU shape, the run with the same --set gives the functional
// reference's values bit for bit and the same real FLOPs (2 M K N, the shape does
// not change the work), the preset without it refuses the bundle, and a shape the
// ISA cannot take (past a vreg's 128 lanes) is the preset's one-line error on
// `presets` and `compile`, with no bundle written.
TEST_F(RunCli, CompileTakesTheRunsSetsSoAWhatIfArrayRuns) {
  const std::string model = dir_ + "/mm.ir";
  std::ofstream(model) << "graph mm {\n  input %x : f32[16,300]\n  input %w : f32[300,200]\n"
                          "  %h = matmul(%x, %w) {} : f32[16,200] #0\n  output %h\n}\n";
  const std::vector<std::string> sets = {"--set", "core.mxu.rows=64", "--set", "core.mxu.cols=64"};
  auto with_sets = [&](std::vector<std::string> args) {
    args.insert(args.end(), sets.begin(), sets.end());
    return args;
  };
  const std::string bundle = dir_ + "/mm64.tpb";
  Completed c = tpusim(with_sets({"compile", model, "--preset", "v4", "-o", bundle}));
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"disasm", bundle});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out.find("mxu_rows=64 mxu_cols=64"), std::string::npos) << c.out.substr(0, 200);

  c = tpusim(with_sets({"run", bundle, "--preset", "v4", "--random-inputs", "3", "--out", out(), "-q"}));
  if (chip_model_missing(c)) GTEST_SKIP() << c.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  // The model's FLOPs; the arrays ran 8-row LHS vregs by whole 64-column tiles
  // (200 -> 256 columns), which the op's mxu_flops counts.
  const nlohmann::json stats = run::read_stats(out() + "/stats.json");
  EXPECT_EQ(stats["flops"].get<uint64_t>(), 2u * 16 * 300 * 200);
  ASSERT_EQ(stats["ops"].size(), 1u);
  EXPECT_EQ(stats["ops"][0]["flops"].get<uint64_t>(), 2u * 16 * 300 * 200);
  EXPECT_EQ(stats["ops"][0]["mxu_flops"].get<uint64_t>(), 2u * 16 * 300 * 256);
  c = tpusim({"ref", bundle, "--random-inputs", "3", "--out", dir_ + "/ref"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"diff", dir_ + "/ref", out()});
  EXPECT_EQ(c.exit_code, 0) << c.out << c.err;

  c = tpusim({"run", bundle, "--preset", "v4", "--random-inputs", "3", "--out", dir_ + "/plain"});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find("MXU 64x64, the preset's is 128x128"), std::string::npos) << c.err;

  const std::string too_wide = dir_ + "/mm256.tpb";
  c = tpusim({"compile", model, "--preset", "v4", "-o", too_wide, "--set", "core.mxu.rows=256"});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_EQ(testing::count_lines(c.err), 1) << c.err;
  EXPECT_NE(c.err.find("v4.yaml: core.mxu: rows=256 must be a multiple of 8 in 8..128"), std::string::npos) << c.err;
  EXPECT_FALSE(fs::exists(too_wide));
  c = tpusim({"presets", "v4", "--set", "core.mxu.cols=136"});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_EQ(testing::count_lines(c.err), 1) << c.err;
  EXPECT_NE(c.err.find("cols=136 must be a multiple of 8 in 8..128"), std::string::npos) << c.err;
  EXPECT_EQ(c.out.find("peak bf16"), std::string::npos) << c.out;
}

// Op ids are any non-negative 32-bit value: the largest runs and is profiled under
// its own id (the per-op profile used to be a vector sized by the id, and a run
// died in the SystemC kernel); a negative one is refused when assembling.
TEST_F(RunCli, OpIdsAtTheEndsOfTheirRange) {
  const std::string big = assemble("big_op", R"(.target chips=1 cores=1 mxus=1
.output y f32 [8, 128] vmem:0x0
.core chip0.core0
  op 2147483647
  vbcast v1, 2.0
  vst v1, [s0 + 0]
  op 0
  halt
)");
  const Completed c = tpusim({"run", big, "--preset", "v4", "--out", out()});
  if (chip_model_missing(c)) GTEST_SKIP() << c.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const nlohmann::json s = nlohmann::json::parse(testing::slurp(out() + "/stats.json"));
  std::vector<int64_t> ids;
  for (const auto& op : s.at("ops")) ids.push_back(op.at("id").get<int64_t>());
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 2147483647}));
  const std::string src = dir_ + "/neg.s";
  std::ofstream(src) << "  op -3\n  halt\n";
  const Completed a = tpusim({"asm", src, "-o", dir_ + "/neg.tpu"});
  EXPECT_EQ(a.exit_code, 2);
  EXPECT_EQ(testing::count_lines(a.err), 1) << a.err;
  EXPECT_NE(a.err.find("neg.s:1: error: chip0.core0 instruction 0 (line 1): op id -3 is negative"), std::string::npos)
      << a.err;
  EXPECT_FALSE(fs::exists(dir_ + "/neg.tpu"));
}

}  // namespace
}  // namespace tpusim

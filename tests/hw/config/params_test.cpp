// The preset tree: includes, typed overrides, unknown-key errors, and the derived
// peaks of every bundled preset against the published figures of
// shared/design/architecture.md.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "hw/config/params.h"
#include "hw/config/peaks.h"

namespace tpusim::config {
namespace {

namespace fs = std::filesystem;

// Writes files into a fresh temporary folder for include tests.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tpusim_params_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                        "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    fs::create_directories((path / name).parent_path());
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

TEST(Params, IncludeMergesSectionsKeyByKey) {
  TempDir dir;
  dir.write("chips/base.yaml", "name: base\nclock_hz: 1000\ncore: {mxu: {rows: 128, cols: 128}, vmem: 16}\n");
  const auto board = dir.write("boards/b.yaml", "include: ../chips/base.yaml\nname: b\ncore: {mxu: {cols: 64}}\n");
  const Params p = Params::load(board);
  EXPECT_EQ(p.get_string("name"), "b");
  EXPECT_EQ(p.get_int("clock_hz"), 1000);
  EXPECT_EQ(p.get_int("core.mxu.rows"), 128);  // kept from the base
  EXPECT_EQ(p.get_int("core.mxu.cols"), 64);   // replaced by the board
  EXPECT_EQ(p.get_int("core.vmem"), 16);
  EXPECT_FALSE(p.has("include"));
}

TEST(Params, IncludeCycleIsAnErrorNotAHang) {
  TempDir dir;
  const auto a = dir.write("a.yaml", "include: b.yaml\nx: 1\n");
  dir.write("b.yaml", "include: a.yaml\ny: 2\n");
  try {
    Params::load(a);
    FAIL() << "a cycle of includes was accepted";
  } catch (const ConfigError& e) {
    // Named where the cycle closes: b.yaml's include of a.yaml, line 1, column 10.
    EXPECT_NE(std::string(e.what()).find("b.yaml:1:10: include 'a.yaml': includes itself"), std::string::npos)
        << e.what();
  }
}

std::string load_error(const std::string& path) {
  try {
    Params::load(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Params, BadIncludesAndKeysNameFileLineAndColumn) {
  TempDir dir;
  // A file that cannot be read is named with the include that asked for it.
  EXPECT_NE(load_error(dir.write("c.yaml", "x: 1\ninclude: gone.yaml\n")).find("c.yaml:2:10: include 'gone.yaml': "),
            std::string::npos);
  // yaml-cpp alone would say "bad conversion" with no file.
  for (const char* text : {"include: [1, 2]\n", "include: {a: 1}\n"}) {
    const std::string msg = load_error(dir.write("d.yaml", text));
    EXPECT_NE(msg.find("d.yaml:1:10: an include must be a plain word"), std::string::npos) << msg;
  }
  const std::string msg = load_error(dir.write("e.yaml", "a: 1\n? [b, c]\n: 3\n"));
  EXPECT_NE(msg.find("e.yaml:2:3: a key must be a plain word"), std::string::npos) << msg;
}

TEST(Params, AKeyThePresetLacksIsMissingNotUnknown) {
  // Reading: the file left the key out (or misspelt it), which is not the reader's typo.
  const Params p = Params::parse("core: {mxu: {rowz: 128}}\n", "chip.yaml");
  try {
    p.get_int("core.mxu.rows");
    FAIL() << "a missing key was read";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "chip.yaml: missing parameter 'core.mxu.rows' (the preset has 'core.mxu.rowz')");
  }
}

TEST(Params, SetKeepsTypes) {
  Params p = Params::parse("a: 3\nb: 2.5\nc: true\nd: text\ne: [1, 2]\nf: {g: 7}\n", "t.yaml");
  p.set("a=5");
  EXPECT_EQ(p.get_int("a"), 5);
  p.set("b=4");  // an integer is a fine number
  EXPECT_DOUBLE_EQ(p.get_double("b"), 4.0);
  p.set("c", "false");
  EXPECT_FALSE(p.get_bool("c"));
  p.set("d", "other");
  EXPECT_EQ(p.get_string("d"), "other");
  p.set("e", "[3, 4, 5]");
  EXPECT_EQ(p.get_int_list("e"), (std::vector<int64_t>{3, 4, 5}));
  p.set("f.g=9");
  EXPECT_EQ(p.get_int("f.g"), 9);
  EXPECT_THROW(p.set("a=1.5"), ConfigError);    // not an integer
  EXPECT_THROW(p.set("a=abc"), ConfigError);
  EXPECT_THROW(p.set("c=maybe"), ConfigError);
  EXPECT_THROW(p.set("e=[1, x]"), ConfigError);
  EXPECT_THROW(p.set("f=1"), ConfigError);      // a section, not a parameter
  EXPECT_THROW(p.set("novalue"), ConfigError);
}

// Clocks and sizes written as sweeps write them: 1.05e9 is the integer
// 1050000000; 1.5, 1e-3, a value past 2^53 (where a double skips integers) and
// inf are not integers.
TEST(Params, WholeNumbersInExponentFormAreIntegers) {
  Params p = Params::parse("clock_hz: 940000000\nbytes: 16\n", "t.yaml");
  p.set("clock_hz=1.05e9");
  EXPECT_EQ(p.get_int("clock_hz"), 1050000000);
  p.set("bytes=4E6");
  EXPECT_EQ(p.get_int("bytes"), 4000000);
  p.set("bytes=-2e3");
  EXPECT_EQ(p.get_int("bytes"), -2000);
  for (const char* bad : {"bytes=1.5", "bytes=1e-3", "bytes=1.2345e0", "bytes=1e300", "bytes=.inf"})
    EXPECT_THROW(p.set(bad), ConfigError) << bad;
  EXPECT_EQ(p.get_int("bytes"), -2000);
}

// as_loaded() is the preset before any override, for the units calibrated on it;
// the overridden tree stays as set.
TEST(Params, AsLoadedIsThePresetBeforeOverrides) {
  Params p = Params::parse("hbm: {clock_hz: 1000, tRCD: 17}\nclock_hz: 5\n", "t.yaml");
  EXPECT_EQ(p.as_loaded().dump(), p.dump());  // no override yet: the same tree
  p.set("hbm.clock_hz=2000");
  p.set("clock_hz=6");
  p.set("hbm.clock_hz=3000");
  const Params base = p.as_loaded();
  EXPECT_EQ(base.get_int("hbm.clock_hz"), 1000);
  EXPECT_EQ(base.get_int("clock_hz"), 5);
  EXPECT_EQ(base.source(), "t.yaml");
  EXPECT_EQ(p.get_int("hbm.clock_hz"), 3000);
  EXPECT_EQ(p.get_int("clock_hz"), 6);
  EXPECT_EQ(p.node("hbm")["tRCD"].as<int>(), base.node("hbm")["tRCD"].as<int>());
}

TEST(Params, UnknownKeySuggestsTheNearestOne) {
  Params p = Params::parse("core: {mxu: {rows: 128}}\n", "chip.yaml");
  try {
    p.set("core.mxu.rowz=64");
    FAIL() << "an unknown key was accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("chip.yaml"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unknown parameter 'core.mxu.rowz'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'core.mxu.rows'"), std::string::npos) << msg;
  }
  EXPECT_FALSE(p.has("core.mxu.rowz"));  // asking did not create it
  EXPECT_EQ(p.leaf_keys(), std::vector<std::string>{"core.mxu.rows"});
}

TEST(Params, MalformedYamlNamesFileAndLine) {
  TempDir dir;
  const auto bad = dir.write("bad.yaml", "a: 1\nb: [1, 2\n");
  try {
    Params::load(bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml:"), std::string::npos) << e.what();
  }
}

TEST(Presets, UnknownPresetListsKnownOnes) {
  try {
    find_preset("v9");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown preset 'v9'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("v3-8"), std::string::npos);
  }
}

// Published per-chip figures (architecture.md, "TPU facts").
struct Published {
  const char* name;
  int chips;
  double tflops_per_chip;
  double hbm_gbps_per_chip;
  double ici_gbps_per_chip;  // links x per-link rate, one direction
};

class PresetPeaks : public ::testing::TestWithParam<Published> {};

TEST_P(PresetPeaks, MatchPublishedFigures) {
  const Published& pub = GetParam();
  const PeakFigures f = peak_figures(load_preset(pub.name));
  EXPECT_EQ(f.chips, pub.chips);
  // Published TFLOPS are rounded to 3 significant digits.
  EXPECT_NEAR(f.flops_per_s / 1e12 / pub.chips, pub.tflops_per_chip, 0.005 * pub.tflops_per_chip);
  EXPECT_NEAR(f.hbm_bytes_per_s / 1e9 / pub.chips, pub.hbm_gbps_per_chip, 0.5);
  EXPECT_NEAR(f.ici_bytes_per_s / 1e9, pub.ici_gbps_per_chip, 0.01 * pub.ici_gbps_per_chip);
}

INSTANTIATE_TEST_SUITE_P(Bundled, PresetPeaks,
                         ::testing::Values(Published{"v2", 1, 45.9, 700, 4 * 496 / 8.0},
                                           Published{"v3", 1, 123.0, 900, 4 * 656 / 8.0},
                                           Published{"v4", 1, 275.0, 1200, 6 * 50.0},
                                           Published{"v5e", 1, 197.0, 819, 4 * 50.0},
                                           Published{"v2-8", 4, 45.9, 700, 4 * 496 / 8.0},
                                           Published{"v3-8", 4, 123.0, 900, 4 * 656 / 8.0},
                                           Published{"v4-8", 4, 275.0, 1200, 6 * 50.0},
                                           Published{"v5e-8", 8, 197.0, 819, 4 * 50.0}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(Presets, OverrideMovesDerivedPeak) {
  // An architect's sweep: a 256x256 array quadruples the peak.
  const auto base = peak_figures(load_preset("v3"));
  const auto big = peak_figures(load_preset("v3", {"core.mxu.rows=256", "core.mxu.cols=256"}));
  EXPECT_DOUBLE_EQ(big.flops_per_s, 4 * base.flops_per_s);
}

TEST(Presets, HbmPeakFollowsTheTimingTable) {
  // v4: 4 stacks x 8 channels x 2 pseudo-channels x 8 B x 2 edges x 1171875000 Hz.
  EXPECT_DOUBLE_EQ(peak_figures(load_preset("v4")).hbm_bytes_per_s, 4.0 * 8 * 2 * 8 * 2 * 1171875000.0);
  // Half the stacks, half the peak; a slower clock scales it; the simple pipe states its own.
  EXPECT_DOUBLE_EQ(peak_figures(load_preset("v4", {"hbm.stacks=2"})).hbm_bytes_per_s, 600e9);
  EXPECT_DOUBLE_EQ(peak_figures(load_preset("v4", {"hbm.clock_hz=585937500"})).hbm_bytes_per_s, 600e9);
  EXPECT_DOUBLE_EQ(peak_figures(load_preset("v4", {"hbm.model=simple", "hbm.simple.bytes_per_s=1e11"})).hbm_bytes_per_s,
                   1e11);
  // A board multiplies by its chips.
  EXPECT_DOUBLE_EQ(peak_figures(load_preset("v4-8")).hbm_bytes_per_s, 4 * 1200e9);
}

}  // namespace
}  // namespace tpusim::config

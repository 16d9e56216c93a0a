// The bit-exact harness of the TensorCore issue. For every trace program and for
// 1000 random valid programs (program_gen.h): the chip model's outputs equal the
// functional reference's byte for byte in fast and in detailed mode, the two modes
// report identical cycles and stats, and a second run reproduces outputs and stats
// exactly (stats.json minus host.wall_seconds). The random programs run in ten
// chunks of 100 so ctest can spread them over cores.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "isa/asm/assembler.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/tensors.h"
#include "sim/run/stats.h"
#include "tests/random/program_gen.h"
#include "tests/sim/spawn.h"

namespace tpusim {
namespace {

namespace fs = std::filesystem;
using testing::spawn;

constexpr int kChunks = 10;
constexpr int kProgramsPerChunk = 100;
// Each seed runs on one preset, with a target that fits it, so the harness covers
// every chip's parameters: v4 (2 cores x 4 MXUs) most often, then v3 (2 x 2),
// v5e (1 x 4), v2 (2 x 1), and the v4-8 board, where half of the two-core
// programs put their second core on chip 1.
struct Variant {
  const char* preset;
  int cores, mxus;
  bool two_chips;
};
Variant variant(uint64_t seed) {
  static const Variant kVariants[8] = {{"v4", 2, 4, false}, {"v3", 2, 2, false}, {"v5e", 1, 4, false},
                                       {"v4", 2, 4, false}, {"v2", 2, 1, false}, {"v3", 2, 2, false},
                                       {"v4-8", 2, 4, true}, {"v5e", 1, 4, false}};
  return kVariants[seed % 8];
}
randprog::GenOptions gen_options(uint64_t seed) {
  randprog::GenOptions o;
  o.max_cores = variant(seed).cores;
  o.mxus = variant(seed).mxus;
  o.two_chips = variant(seed).two_chips;
  return o;
}
// Detailed mode ticks every cycle; rerunning it for every program would double the
// harness's time for little: every 10th program is rerun in detailed mode too.
constexpr int kDetailedRerunEvery = 10;

std::string tpusim_bin() { return TPUSIM_BIN; }

// A scratch directory per test process, removed at the end.
struct WorkDir {
  std::string path;
  explicit WorkDir(const std::string& tag) {
    path = ::testing::TempDir() + "tpusim_bitexact_" + tag + "_" + std::to_string(::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~WorkDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

// "" when equal, else which element differs first (by byte offset of the .npy data).
std::string compare_outputs(const std::string& dir_a, const std::string& dir_b, const std::string& label,
                            bool require_outputs = true) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_a))
    if (e.path().extension() == ".npy") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  if (names.empty() && require_outputs) return label + ": no outputs in " + dir_a;
  for (const auto& n : names) {
    if (!fs::exists(dir_b + "/" + n)) return label + ": " + n + " missing";
    const std::string a = testing::slurp(dir_a + "/" + n), b = testing::slurp(dir_b + "/" + n);
    if (a == b) continue;
    if (a.size() != b.size())
      return label + ": " + n + " has " + std::to_string(b.size()) + " bytes, expected " + std::to_string(a.size());
    size_t i = 0;
    while (a[i] == b[i]) ++i;
    // The .npy header is identical for identical shapes; name the element.
    const size_t header = io::parse_npy(std::vector<uint8_t>(a.begin(), a.end()), n).data.size();
    const size_t data_start = a.size() - header;
    const size_t elem = i >= data_start ? (i - data_start) / 4 : 0;
    return label + ": " + n + " differs first at byte " + std::to_string(i) + " (about element " +
           std::to_string(elem) + ")";
  }
  return "";
}

nlohmann::json load_stats(const std::string& dir) { return run::read_stats(dir + "/stats.json"); }

std::string diff_keys(const nlohmann::json& a, const nlohmann::json& b) {
  const auto patch = nlohmann::json::diff(a, b);
  return patch.empty() ? "" : patch.dump().substr(0, 400);
}

// Runs one bundle through ref and the chip model and checks every agreement.
// Returns the problems ("" when all hold). `inputs` are --input arguments.
std::string check_bundle(const std::string& bundle, const std::vector<std::string>& inputs, const std::string& work,
                         const std::string& preset, bool rerun_detailed, bool require_outputs = true) {
  auto cmd = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), tpusim_bin());
    argv.insert(argv.end(), inputs.begin(), inputs.end());
    return spawn(argv, work);
  };
  fs::remove_all(work + "/ref");
  auto r = cmd({"ref", bundle, "--out", work + "/ref"});
  if (r.exit_code != 0) return "tpusim ref failed (" + std::to_string(r.exit_code) + "): " + one_line(r.err);
  std::vector<std::pair<std::string, std::string>> runs = {{"fast", "fast"}, {"detailed", "detailed"},
                                                           {"fast", "fast2"}};
  if (rerun_detailed) runs.push_back({"detailed", "detailed2"});
  for (const auto& [mode, dir] : runs) {
    fs::remove_all(work + "/" + dir);
    // Generated programs run for thousands of cycles; a hundred million means a hang.
    r = cmd({"run", bundle, "--preset", preset, "--mode", mode, "--out", work + "/" + dir, "-q", "--max-cycles",
             "100000000"});
    if (r.exit_code != 0)
      return "tpusim run --mode " + mode + " failed (" + std::to_string(r.exit_code) + "): " + one_line(r.err);
    const std::string d = compare_outputs(work + "/ref", work + "/" + dir, "ref vs " + dir, require_outputs);
    if (!d.empty()) return d;
  }
  const auto fast = load_stats(work + "/fast"), detailed = load_stats(work + "/detailed");
  if (fast["cycles"] != detailed["cycles"])
    return "cycles differ: fast " + fast["cycles"].dump() + ", detailed " + detailed["cycles"].dump();
  std::string d = diff_keys(run::deterministic_part(fast, true), run::deterministic_part(detailed, true));
  if (!d.empty()) return "stats differ between fast and detailed: " + d;
  d = diff_keys(run::deterministic_part(fast), run::deterministic_part(load_stats(work + "/fast2")));
  if (!d.empty()) return "stats differ between two fast runs: " + d;
  if (rerun_detailed) {
    d = diff_keys(run::deterministic_part(detailed), run::deterministic_part(load_stats(work + "/detailed2")));
    if (!d.empty()) return "stats differ between two detailed runs: " + d;
  }
  return "";
}

// Writes a random program, its bundle and its inputs under `dir`; returns the
// --input arguments. Fails the test when the generator's program does not assemble.
std::vector<std::string> materialise(uint64_t seed, const std::string& dir, std::string& bundle_path) {
  const auto p = randprog::generate(seed, gen_options(seed));
  fs::create_directories(dir);
  const std::string src = dir + "/prog.s";
  io::write_file_atomic(src, p.assembly);
  std::vector<std::string> args;
  for (const auto& [name, arr] : p.inputs) {
    io::write_npy(dir + "/" + name + ".npy", arr);
    args.push_back("--input");
    args.push_back(name + "=" + dir + "/" + name + ".npy");
  }
  bundle_path = dir + "/prog.tpu";
  auto r = spawn({tpusim_bin(), "asm", src, "-o", bundle_path}, dir);
  if (r.exit_code != 0) ADD_FAILURE() << "seed " << seed << ": generated program does not assemble: " << r.err;
  return args;
}

// A short class of a problem for the chunk's summary.
std::string kind_of(const std::string& problem) {
  if (problem.find("tpusim ref failed") == 0) return "reference failed";
  if (problem.find("deadlock") != std::string::npos) return "model deadlock";
  if (problem.find("tpusim run") == 0) return "model run failed";
  if (problem.find("ref vs") == 0) return "outputs differ";
  if (problem.find("cycles differ") == 0) return "cycles differ between modes";
  if (problem.find("between fast and detailed") != std::string::npos) return "stats differ between modes";
  return "rerun differs";
}

// True when the chip model is still the stub that cannot run anything; the
// harness then has nothing to compare and says so instead of failing.
bool chip_model_missing(const std::string& err) { return err.find("chip model is not built yet") != std::string::npos; }

// ---- the harness's own comparator ------------------------------------------------

TEST(HarnessComparator, NamesTheFirstElementThatDiffersInOneBit) {
  WorkDir work("cmp");
  fs::create_directories(work.path + "/a");
  fs::create_directories(work.path + "/b");
  io::NpyArray y;
  y.dtype = io::NpyDtype::kF32;
  y.shape = {8, 128};
  y.data.assign(8 * 128 * 4, 0);
  io::write_npy(work.path + "/a/y.npy", y);
  io::write_npy(work.path + "/b/y.npy", y);
  EXPECT_EQ(compare_outputs(work.path + "/a", work.path + "/b", "t"), "");
  y.data[4 * 300 + 3] ^= 0x80;  // -0.0 instead of +0.0 in element 300: equal as floats, not as bytes
  io::write_npy(work.path + "/b/y.npy", y);
  const std::string d = compare_outputs(work.path + "/a", work.path + "/b", "t");
  EXPECT_NE(d.find("y.npy"), std::string::npos) << d;
  EXPECT_NE(d.find("element 300"), std::string::npos) << d;
  fs::remove(work.path + "/b/y.npy");
  EXPECT_NE(compare_outputs(work.path + "/a", work.path + "/b", "t").find("missing"), std::string::npos);
  // An output directory with nothing in it is a failure, never a vacuous pass.
  fs::create_directories(work.path + "/empty");
  EXPECT_NE(compare_outputs(work.path + "/empty", work.path + "/b", "t"), "");
}

// ---- the generator alone, on the reference (no chip model needed) -------------

class RandomProgramsOnReference : public ::testing::TestWithParam<int> {};

TEST_P(RandomProgramsOnReference, AssembleRoundTripAndRunWithoutFault) {
  for (int i = 0; i < kProgramsPerChunk; ++i) {
    const uint64_t seed = uint64_t(GetParam()) * kProgramsPerChunk + uint64_t(i);
    const auto p = randprog::generate(seed, gen_options(seed));
    isa::Bundle b;
    try {
      b = isa::assemble(p.assembly, "seed" + std::to_string(seed) + ".s");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what();
      continue;
    }
    // The printer and the parser agree on every generated instruction.
    EXPECT_EQ(isa::print_bundle(isa::assemble(isa::print_bundle(b), "printed.s")), isa::print_bundle(b))
        << "seed " << seed;
    exec::Interpreter interp(b);
    for (const auto& e : b.io)
      if (e.kind == isa::IoKind::kInput) exec::write_tensor(interp.machine(), e, exec::tensor_from_npy(p.inputs.at(e.name), e));
    const auto r = interp.run();
    EXPECT_TRUE(r.ok()) << "seed " << seed << ": " << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Chunks, RandomProgramsOnReference, ::testing::Range(0, kChunks));

// ---- random programs: reference vs chip model ------------------------------------

class RandomProgramsBitExact : public ::testing::TestWithParam<int> {};

TEST_P(RandomProgramsBitExact, ReferenceFastDetailedAndRerunAgree) {
  WorkDir work("rand" + std::to_string(GetParam()));
  // Every program runs even after a failure, so the summary says how many fail;
  // the first few are detailed with a command line that reproduces them.
  constexpr int kDetailed = 3;
  std::vector<uint64_t> failed;
  std::map<std::string, int> kinds;
  for (int i = 0; i < kProgramsPerChunk; ++i) {
    const uint64_t seed = uint64_t(GetParam()) * kProgramsPerChunk + uint64_t(i);
    const std::string dir = work.path + "/p";
    fs::remove_all(dir);
    std::string bundle;
    const auto inputs = materialise(seed, dir, bundle);
    const Variant var = variant(seed);
    const std::string problem = check_bundle(bundle, inputs, dir, var.preset, seed % kDetailedRerunEvery == 0);
    if (problem.empty()) continue;
    if (i == 0 && chip_model_missing(problem)) GTEST_SKIP() << "chip model not built yet: " << problem;
    failed.push_back(seed);
    ++kinds[kind_of(problem)];
    if (failed.size() <= kDetailed)
      ADD_FAILURE() << "seed " << seed << " (" << var.preset << "): " << problem
                    << "\n  reproduce: tpusim_randprog --seed " << seed << " --cores " << var.cores << " --mxus "
                    << var.mxus << (var.two_chips ? " --two-chips" : "") << " --out /tmp/p  (prints the --input arguments), tpusim asm /tmp/p/prog.s -o "
                    << "/tmp/p/prog.tpu, then tpusim ref / tpusim run /tmp/p/prog.tpu --preset " << var.preset
                    << " --mode fast|detailed";
  }
  if (!failed.empty()) {
    std::string seeds;
    for (uint64_t s : failed) seeds += " " + std::to_string(s);
    std::string by_kind;
    for (const auto& [k, n] : kinds) by_kind += " " + k + ": " + std::to_string(n) + ";";
    ADD_FAILURE() << failed.size() << " of " << kProgramsPerChunk << " programs disagree (" << by_kind
                  << " ); seeds:" << seeds;
  }
}

INSTANTIATE_TEST_SUITE_P(Chunks, RandomProgramsBitExact, ::testing::Range(0, kChunks));

// ---- checked-in traces: reference vs chip model ----------------------------------

// Every checked-in program: traces/NAME/prog.s (with in_*.npy inputs and
// expected outputs) and the calibration micro-benchmarks traces/calib/*.s (often
// without outputs: then cycles and stats are what the modes must agree on).
std::vector<std::string> trace_programs() {
  std::vector<std::string> progs;
  const fs::path root(TPUSIM_TRACES_DIR);
  for (const fs::path& dir : {root, root / "calib"}) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_directory() && fs::exists(e.path() / "prog.s")) progs.push_back((e.path() / "prog.s").string());
      if (e.is_regular_file() && e.path().extension() == ".s") progs.push_back(e.path().string());
    }
  }
  std::sort(progs.begin(), progs.end());
  return progs;
}

class TracesBitExact : public ::testing::TestWithParam<std::string> {};

TEST_P(TracesBitExact, AgreesWithTheReferenceInBothModes) {
  const fs::path prog(GetParam());
  const bool trace_dir = prog.filename() == "prog.s";
  const std::string dir = prog.parent_path().string();
  WorkDir work("trace_" + (trace_dir ? prog.parent_path().filename().string() : prog.stem().string()));
  const std::string bundle = work.path + "/prog.tpu";
  auto r = spawn({tpusim_bin(), "asm", prog.string(), "-o", bundle}, work.path);
  ASSERT_EQ(r.exit_code, 0) << prog << ": " << r.err;
  // Inputs as traces/run_trace.sh passes them: in_NAME.npy is input NAME.
  std::vector<std::string> files, inputs;
  if (trace_dir)
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string f = e.path().filename().string();
      if (f.rfind("in_", 0) == 0 && e.path().extension() == ".npy") files.push_back(f);
    }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    inputs.push_back("--input");
    inputs.push_back(f.substr(3, f.size() - 7) + "=" + dir + "/" + f);
  }
  if (inputs.empty()) inputs = {"--random-inputs", "1"};
  // v4 has every resource a trace may target (2 cores, 4 MXUs per core).
  const std::string problem = check_bundle(bundle, inputs, work.path, "v4", true, trace_dir);
  if (chip_model_missing(problem)) GTEST_SKIP() << "chip model not built yet: " << problem;
  EXPECT_EQ(problem, "") << prog;
}

INSTANTIATE_TEST_SUITE_P(Traces, TracesBitExact, ::testing::ValuesIn(trace_programs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           const fs::path p(info.param);
                           std::string n = p.filename() == "prog.s"
                                               ? p.parent_path().filename().string()
                                               : p.parent_path().filename().string() + "_" + p.stem().string();
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tpusim

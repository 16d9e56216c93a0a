// Where the report puts host-bound time, against closed forms of the host link
// (docs/ici.md "Host link and infeed"; the link's latency and per-KiB cost are
// set here, so the expectations are this file's own):
// - traces/infeed waits once for its input (infeed) and once for its outputs to
//   leave for the host (outfeed): only the first is infeed in time_by_cause; the
//   outfeed wait is sync/ICI (docs/cli.md).
// - the MLP training step on v3-8 (8 replicas, per-core batch 8) compiled with
//   --infeed, run with an ample and a starved host: the outputs are the same, the
//   infeed column carries the extra cycles, and the starved step is the host-rate
//   bound of docs/training.md ("Inputs from the host").
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/sim/cli_fixture.h"

namespace fs = std::filesystem;
using tpusim::testing::Completed;
using tpusim::testing::slurp;
using tpusim::testing::spawn;

namespace {

const std::string kSrc = TPUSIM_SOURCE_DIR;
constexpr double kLatency = 20000;  // host.hbm_to_host.latency_cycles, set below
constexpr double kCyclesPerKib = 100;

class InfeedReport : public tpusim::testing::TpusimCli {
 protected:
  nlohmann::json stats(const std::string& out) { return nlohmann::json::parse(slurp(out + "/stats.json")); }
  static std::vector<std::string> link() {
    return {"--set", "host.hbm_to_host.latency_cycles=" + std::to_string(static_cast<int>(kLatency)), "--set",
            "host.hbm_to_host.cycles_per_kib=" + std::to_string(kCyclesPerKib)};
  }
};

uint64_t cause(const nlohmann::json& s, const std::string& core, const char* c) {
  return s.at("time_by_cause").at(core).at(c).get<uint64_t>();
}

TEST_F(InfeedReport, OutfeedAndOtherFlagWaitsAreNotInfeed) {
  const std::string bundle = dir_ + "/infeed.tpb", out = dir_ + "/out";
  Completed c = tpusim({"asm", kSrc + "/traces/infeed/prog.s", "-o", bundle});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  std::vector<std::string> args = {"run", bundle, "--preset", "v3", "--input", "x=" + kSrc + "/traces/infeed/in_x.npy",
                                   "--out", out};
  for (const auto& a : link()) args.push_back(a);
  c = tpusim(args);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const nlohmann::json s = stats(out);
  const std::string core = "chip0.core0";
  // The input: 4096 bytes issued at cycle 0, waited on from the next instruction.
  const double in_landed = 4096 * kCyclesPerKib / 1024 + kLatency;
  // The outputs: ten 4 KiB rows in one DMA, waited on right after it is issued;
  // the engine starts it once the vector stores before it retire (a few cycles).
  const double out_landed = 10 * 4096 * kCyclesPerKib / 1024 + kLatency;
  const auto infeed = static_cast<double>(cause(s, core, "infeed"));
  const auto sync = static_cast<double>(cause(s, core, "sync"));
  EXPECT_NEAR(infeed, in_landed, 2);
  EXPECT_GE(sync, out_landed - 2);
  EXPECT_LE(sync, out_landed + 100);
  EXPECT_EQ(cause(s, core, "hbm"), 0u);
  uint64_t sum = 0;
  for (const char* k : {"compute", "hbm", "infeed", "sync", "idle"}) sum += cause(s, core, k);
  EXPECT_EQ(sum, s.at("cycles").get<uint64_t>());
  // The same split as the host link's own counters of the sequencer.
  const auto& seq = s.at("units").at(core + ".sequencer");
  EXPECT_EQ(cause(s, core, "infeed"), seq.at("stall_infeed_cycles").get<uint64_t>());
  EXPECT_EQ(cause(s, core, "sync"), seq.at("stall_flag_cycles").get<uint64_t>());
  // And per op (one op here): the outfeed wait is no infeed stall.
  ASSERT_EQ(s.at("ops").size(), 1u);
  EXPECT_EQ(s.at("ops")[0].at("stall_cycles").at("infeed").get<uint64_t>(), cause(s, core, "infeed"));
}

TEST_F(InfeedReport, StarvedTrainingStepRunsAtTheHostRateBound) {
  const std::string ir = dir_ + "/mlp.ir", bundle = dir_ + "/dp.tpb";
  Completed c = spawn({"/usr/bin/python3", kSrc + "/traces/models/make_mlp_train.py", ir, "--batch", "64"}, dir_);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"compile", ir, "--preset", "v3-8", "--replicas", "8", "--train", "sgd:lr=0.05,momentum=0.9", "--infeed",
           "-o", bundle});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  c = tpusim({"ref", bundle, "--random-inputs", "1", "--out", dir_ + "/ref"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  constexpr double kRate = 0.05e9, kPrepUs = 5;  // starved: bytes/s and us per batch
  const auto host = [](double rate, double prep) {
    return std::vector<std::string>{"--set", "host.infeed_bytes_per_s=" + std::to_string(rate), "--set",
                                    "host.batch_prep_us=" + std::to_string(prep)};
  };
  nlohmann::json s[2];
  for (int starved = 0; starved < 2; ++starved) {
    const std::string out = dir_ + (starved ? "/starved" : "/ample");
    std::vector<std::string> args = {"run", bundle, "--preset", "v3-8", "--random-inputs", "1", "-q", "--out", out};
    for (const auto& a : link()) args.push_back(a);
    for (const auto& a : starved ? host(kRate, kPrepUs) : host(0, 0)) args.push_back(a);
    c = tpusim(args);
    ASSERT_EQ(c.exit_code, 0) << c.err;
    c = tpusim({"diff", dir_ + "/ref", out});
    EXPECT_EQ(c.exit_code, 0) << c.out << c.err;  // the host rate changes no value
    s[starved] = stats(out);
  }
  const double clock = s[1].at("clock_hz").get<double>();
  // Per chip: 2 replicas x (x: 8 x 784 f32, labels: 8 x 10 f32), 4 infeed batches,
  // the last one a labels slice.
  const double x = 8 * 784 * 4, labels = 8 * 10 * 4, chip_bytes = 2 * (x + labels), batches = 4;
  // Ample, every chip's bytes are ready at once: they land after the link
  // serialises them all plus one latency. Starved, the last batch is ready after
  // the host prepared all four, and crosses the idle link alone.
  const double landed_ample = chip_bytes * kCyclesPerKib / 1024 + kLatency;
  const double landed_starved =
      clock * (batches * kPrepUs * 1e-6 + chip_bytes / kRate) + labels * kCyclesPerKib / 1024 + kLatency;
  const auto cycles = [&](int i) { return static_cast<double>(s[i].at("cycles").get<uint64_t>()); };
  // The rest of the step (compute, all_reduce, update) does not depend on the host.
  const double bound = landed_starved + (cycles(0) - landed_ample);
  // (0.9999 of it in docs/training.md's run; the acceptance asks 5%.)
  EXPECT_NEAR(cycles(1), bound, 0.005 * bound) << "starved " << cycles(1) << " cycles, host-rate bound " << bound;
  EXPECT_GT(cycles(1), 2 * cycles(0)) << "the host must dominate the starved step";
  // Every core's infeed column carries the difference, to 0.1%: each chip feeds
  // from its own host memory from cycle 0 (when chip 0 first pushed chips 1-3
  // their rows, chip 0's cores carried up to 0.5% more than the others).
  const double extra = cycles(1) - cycles(0);
  double infeed_extra = 0;
  const auto& cores = s[1].at("time_by_cause");
  ASSERT_EQ(cores.size(), 8u);
  for (const auto& [core, t] : cores.items()) {
    const double d = static_cast<double>(cause(s[1], core, "infeed")) - static_cast<double>(cause(s[0], core, "infeed"));
    EXPECT_NEAR(d, extra, 0.001 * extra) << core;
    infeed_extra += d / 8;
  }
  EXPECT_NEAR(infeed_extra, extra, 0.001 * extra);
  // Per op, the same split: every core's infeed cycles, the second core's (which
  // waits on its rflag, raised by core 0's infeed DMA) included, are the infeed's
  // own op's, named for it, and that op is infeed waits but for issuing its DMAs
  // (99.87% here; it read sync/ICI 50% when the second cores' waits were filed by
  // their flag's cause).
  uint64_t by_cores = 0;
  for (const auto& [core, t] : cores.items()) by_cores += cause(s[1], core, "infeed");
  uint64_t by_ops = 0;
  const nlohmann::json* in_op = nullptr;
  for (const auto& op : s[1].at("ops")) {
    by_ops += op.at("stall_cycles").at("infeed").get<uint64_t>();
    if (op.value("node", "") == "infeed: inputs from the host") in_op = &op;
  }
  EXPECT_EQ(by_ops, by_cores);
  ASSERT_NE(in_op, nullptr);
  EXPECT_EQ(in_op->at("stall_cycles").at("infeed").get<uint64_t>(), by_cores);
  EXPECT_GE(static_cast<double>(by_cores), 0.99 * static_cast<double>(in_op->at("core_cycles").get<uint64_t>()));
}

}  // namespace

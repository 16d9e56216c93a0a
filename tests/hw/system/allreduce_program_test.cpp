// A ring all-reduce written as a program (ici::collective_program: DMAs over ICI
// and vadds in the add order of docs/ici.md) run on the v3-8 chip model:
//  - values: equal bit for bit to the functional reference (`tpusim ref` of the
//    same program) and to the documented left fold, rebuilt here from the text of
//    docs/ici.md ("block b = ((x[b+1] + x[b+2]) + ...) + x[b+k]", positions on
//    Topology::ring_order());
//  - time: against the network-level run of the same schedule (collective_sim)
//    and the alpha-beta closed form 2 (p-1) (alpha + beta n / p). The program
//    also pays what the network-level run leaves out (the vadds of each reducing
//    step at the sequencer's issue rate, and flag/issue cycles per step); the
//    tolerance is that bound, derived from the preset's parameters.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "hw/config/params.h"
#include "hw/ici/collective_program.h"
#include "hw/ici/collective_sim.h"
#include "hw/ici/collectives.h"
#include "hw/ici/network.h"
#include "isa/io/npy.h"
#include "tests/hw/system/output_hex.h"

namespace fs = std::filesystem;
using namespace tpusim;

namespace {

struct Result {
  nlohmann::json j;
  std::vector<std::vector<float>> inputs;
};

Result run_program(const ici::Schedule& s, const std::string& mode, const std::string& tag,
                   const std::string& preset = "v3-8", const ici::ProgramOptions& po = {}) {
  const fs::path dir = fs::temp_directory_path() / ("allreduce_" + std::to_string(::getpid()) + "_" + tag);
  fs::create_directories(dir);
  std::ofstream(dir / "prog.s") << ici::collective_program(s, po);
  Result r;
  std::mt19937 rng(1234);
  // Wide exponent range, normal numbers only: a wrong add order changes bits.
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::string cmd = std::string(TPUSIM_CORE_RUN) + " '" + (dir / "prog.s").string() + "' " + preset + " " + mode + " '" +
                    (dir / "out.json").string() + "'";
  for (int c = 0; c < s.chips; ++c) {
    std::vector<float> x(size_t(s.elements));
    for (float& v : x) v = std::ldexp(mant(rng), expo(rng));
    io::NpyArray a;
    a.shape = {s.elements};
    a.data.resize(x.size() * 4);
    std::memcpy(a.data.data(), x.data(), a.data.size());
    const fs::path f = dir / ("x" + std::to_string(c) + ".npy");
    io::write_npy(f.string(), a);
    cmd += " x" + std::to_string(c) + "=" + f.string();
    r.inputs.push_back(std::move(x));
  }
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(dir / "out.json");
  if (in) in >> r.j;
  fs::remove_all(dir);
  return r;
}

// docs/ici.md, "Add order", ring (G = 1): block b of the k ring positions is the
// left fold over positions b+1, .., b+k (mod k), every chip ends with all blocks.
std::vector<float> documented_sum(const std::vector<std::vector<float>>& x, const std::vector<int>& ring) {
  const int64_t E = int64_t(x[0].size()), k = int64_t(ring.size());
  std::vector<float> y(static_cast<size_t>(E));
  for (int64_t b = 0; b < k; ++b)
    for (int64_t e = E * b / k; e < E * (b + 1) / k; ++e) {
      volatile float acc = x[size_t(ring[size_t((b + 1) % k)])][size_t(e)];
      for (int64_t i = 2; i <= k; ++i) acc = acc + x[size_t(ring[size_t((b + i) % k)])][size_t(e)];
      y[size_t(e)] = acc;
    }
  return y;
}

TEST(AllReduceProgram, RingOnV3x8MatchesReferenceFoldAndNetworkFigures) {
  const config::Params preset = config::load_preset("v3-8", {});
  const ici::Topology topo = ici::Topology::from_params(preset);
  const std::vector<int> ring = topo.ring_order();
  const int p = topo.chips();
  std::cout << "| bytes/chip | program cycles | network-level | closed form | program/closed | bound |\n";
  for (const int64_t elements : {int64_t(16384), int64_t(262144), int64_t(1048576)}) {
    const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, ici::Algorithm::kRing, topo, elements);
    const Result r = run_program(s, "fast", std::to_string(elements));
    ASSERT_FALSE(r.j.value("faulted", true)) << r.j.value("fault", std::string());
    ASSERT_TRUE(r.j.value("ref_ok", false));
    const std::vector<float> want = documented_sum(r.inputs, ring);
    for (int c = 0; c < p; ++c) {
      const std::string y = "y" + std::to_string(c);
      EXPECT_EQ(r.j["outputs"][y], r.j["ref_outputs"][y]) << y;
      const std::vector<float> got = from_hex(r.j["outputs"][y].get<std::string>());
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << y << " differs from the documented fold";
    }
    ici::Network net = ici::Network::from_params(preset);
    const double network_level = double(ici::simulate(net, s, 4).cycles);
    const auto ab = net.neighbour_alpha_beta();
    const double bytes = double(elements) * 4;
    const double closed = ici::closed_form_cycles(ici::CollectiveKind::kAllReduce, ici::Algorithm::kRing, topo, bytes,
                                                  ab.alpha_cycles, ab.beta_cycles_per_byte);
    // What the network-level run leaves out: per reducing step the adds of one
    // block, 4 instructions per 4 KiB tile (2 vld, vadd, vst) at the sequencer's
    // one issue per cycle (core.sequencer.issue_per_cycle), and per step at most
    // 100 cycles of flag, wait, VPU pipeline and DMA ordering (~90 measured).
    const double tiles = bytes / p / 4096;
    const double bound = double(p - 1) * 4 * tiles + double(2 * (p - 1)) * 100;
    const double program = double(r.j["cycles"].get<uint64_t>());
    std::cout << "| " << bytes << " | " << program << " | " << network_level << " | " << closed << " | "
              << program / closed << " | " << bound << " |\n";
    EXPECT_GE(program, network_level - 0.005 * closed);
    EXPECT_LE(program, network_level + bound + 0.005 * closed);
    EXPECT_NEAR(program, closed, bound + 0.01 * closed);
    // Every chip-link byte of the schedule is in the per-link stats.
    uint64_t link_bytes = 0;
    for (const auto& [name, u] : r.j["units"].items())
      if (name.find(".ici.") != std::string::npos && name.find(".core") == std::string::npos)
        link_bytes += u.value("bytes", uint64_t{0});
    EXPECT_EQ(link_bytes, uint64_t(2 * (p - 1)) * uint64_t(bytes));  // each chip sends 2(p-1) blocks of n/p, one hop
  }
}

// The program ran cleanly and its outputs equal the reference's and the
// schedule's own semantics (ici::execute with fp32 adds), bit for bit.
void expect_schedule_semantics(const ici::Schedule& s, const Result& r) {
  ASSERT_FALSE(r.j.value("faulted", true)) << r.j.value("fault", std::string());
  ASSERT_TRUE(r.j.value("ref_ok", false));
  std::vector<std::vector<float>> state = r.inputs;
  ici::execute<float>(s, state, std::numeric_limits<float>::infinity(), [](float a, float b) {
    volatile float sum = a + b;
    return float(sum);
  });
  for (int c = 0; c < s.chips; ++c) {
    const std::string y = "y" + std::to_string(c);
    EXPECT_EQ(r.j["outputs"][y], r.j["ref_outputs"][y]) << y;
    const std::vector<float> got = from_hex(r.j["outputs"][y].get<std::string>());
    ASSERT_EQ(got.size(), state[size_t(c)].size());
    EXPECT_EQ(std::memcmp(got.data(), state[size_t(c)].data(), got.size() * 4), 0) << y;
  }
}

// The torus algorithm on a v2 4x4 slice (4 groups, two phases each): the program's
// outputs equal the reference and the schedule's own semantics (ici::execute with
// fp32 adds), and it runs no faster than the network-level figure.
TEST(AllReduceProgram, TorusOnV2x4x4MatchesScheduleSemantics) {
  const config::Params preset = config::load_preset("v2-4x4", {});
  const ici::Topology topo = ici::Topology::from_params(preset);
  const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, ici::Algorithm::kTorus, topo, 65536);
  const Result r = run_program(s, "fast", "torus", "v2-4x4");
  ASSERT_NO_FATAL_FAILURE(expect_schedule_semantics(s, r));
  ici::Network net = ici::Network::from_params(preset);
  EXPECT_GE(double(r.j["cycles"].get<uint64_t>()), double(ici::simulate(net, s, 4).cycles));
}

// The torus algorithm on v5e-8's 2x4 one-core chips: the - groups' messages on
// the size-2 dimension name the way (`way=-`, docs/isa.md "Way round"), so the
// program uses chip 0's x+ and x- links alike, as the network-level run routes
// them, and runs within 10% of that run; outputs equal the schedule's semantics.
TEST(AllReduceProgram, TorusOnV5e8UsesBothLinksOfTheSizeTwoDimension) {
  const config::Params preset = config::load_preset("v5e-8", {});
  const ici::Topology topo = ici::Topology::from_params(preset);
  const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, ici::Algorithm::kTorus, topo, 262144);
  EXPECT_NE(ici::collective_program(s).find(", way=-"), std::string::npos);
  ici::ProgramOptions po;
  po.cores_per_chip = 1;
  const Result r = run_program(s, "fast", "torus_v5e", "v5e-8", po);
  ASSERT_NO_FATAL_FAILURE(expect_schedule_semantics(s, r));
  const auto bytes = [&](const std::string& link) {
    const nlohmann::json& u = r.j["units"];
    return u.contains(link) ? u[link].value("bytes", uint64_t{0}) : uint64_t{0};
  };
  const uint64_t xp = bytes("chip0.ici.x+"), xm = bytes("chip0.ici.x-");
  EXPECT_GT(xp, 0u);
  EXPECT_EQ(xp, xm);
  ici::Network net = ici::Network::from_params(preset);
  const double network_level = double(ici::simulate(net, s, 4).cycles), program = double(r.j["cycles"].get<uint64_t>());
  std::cout << "v5e-8 torus 1 MiB: program " << program << ", network-level " << network_level << "\n";
  EXPECT_GE(program, network_level);
  EXPECT_LE(program, 1.1 * network_level);
}

TEST(AllReduceProgram, FastAndDetailedAgree) {
  const config::Params preset = config::load_preset("v3-8", {});
  const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, ici::Algorithm::kRing,
                                             ici::Topology::from_params(preset), 16384);
  const Result fast = run_program(s, "fast", "f");
  const Result det = run_program(s, "detailed", "d");
  EXPECT_EQ(fast.j["cycles"], det.j["cycles"]);
  EXPECT_EQ(fast.j["units"], det.j["units"]);
  EXPECT_EQ(fast.j["outputs"], det.j["outputs"]);
}

}  // namespace

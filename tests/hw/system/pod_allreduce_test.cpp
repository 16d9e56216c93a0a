// The pod-scale all-reduce program (ici::collective_program in its per-link form,
// as `ici_program --pod` writes it) on all 256 chips of a v2-16x16 slice, scaled
// down to 64 KiB per chip so it runs in seconds:
//  - values: the chip model (fast mode) equals the functional reference bit for bit,
//    and both equal the torus add order of docs/ici.md ("Add order"), rebuilt here
//    from its text (groups, phases, left folds over ring positions);
//  - time: the network-level run of the same schedule is within 1% of the
//    alpha-beta closed form, and the program lies between the network-level run and
//    that run plus what the program adds per step (one send per link in flight:
//    the completion's return latency; flag and issue cycles) and per tile (4 issues);
//  - determinism: a second run gives the same cycles and counters.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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

constexpr int kSide = 16;            // v2-16x16
constexpr int64_t kElements = 16384;  // 64 KiB of fp32 per chip

// docs/ici.md "Add order", torus on a 2-D torus: group g = 2j + (dir == -1) of G = 4
// takes [E g / G, E (g+1) / G) and reduces dimension j, then j+1 (mod 2); a phase
// over k ring positions splits its range into k blocks [lo + len b / k, ..) (floor),
// block b being the left fold over positions b+1, .., b+k (mod k); direction +
// visits coordinates 0..k-1, direction - visits 0, k-1, .., 1. An element in blocks
// b1, b2 is the fold over dimension d2's positions of the folds over d1's.
std::vector<float> documented_torus_sum(const std::vector<std::vector<float>>& x) {
  const int64_t E = kElements, G = 4, k = kSide;
  std::vector<float> y(static_cast<size_t>(E));
  const auto coord = [&](int64_t pos, int dir) { return dir > 0 ? pos : (k - pos) % k; };
  for (int64_t g = 0; g < G; ++g) {
    const int d1 = int(g / 2), dir = g % 2 ? -1 : +1;  // then d2 = the other dimension
    const int64_t lo = E * g / G, len = E * (g + 1) / G - lo;
    for (int64_t b1 = 0; b1 < k; ++b1) {
      const int64_t lo1 = lo + len * b1 / k, len1 = lo + len * (b1 + 1) / k - lo1;
      for (int64_t b2 = 0; b2 < k; ++b2)
        for (int64_t e = lo1 + len1 * b2 / k; e < lo1 + len1 * (b2 + 1) / k; ++e) {
          volatile float outer = 0.0f;
          for (int64_t i2 = 1; i2 <= k; ++i2) {
            const int64_t c2 = coord((b2 + i2) % k, dir);
            volatile float inner = 0.0f;
            for (int64_t i1 = 1; i1 <= k; ++i1) {
              const int64_t c1 = coord((b1 + i1) % k, dir);
              const int64_t xy[2] = {d1 == 0 ? c1 : c2, d1 == 0 ? c2 : c1};
              const float v = x[size_t(xy[0] + kSide * xy[1])][size_t(e)];  // dim 0 fastest in the chip id
              inner = i1 == 1 ? v : inner + v;
            }
            outer = i2 == 1 ? float(inner) : outer + inner;
          }
          y[size_t(e)] = outer;
        }
    }
  }
  return y;
}

nlohmann::json run(const fs::path& dir, const std::string& cmd_tail, const std::string& tag) {
  const std::string cmd = std::string(TPUSIM_CORE_RUN) + " '" + (dir / "prog.s").string() + "' v2-16x16 fast '" +
                          (dir / (tag + ".json")).string() + "'" + cmd_tail;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::json j;
  std::ifstream in(dir / (tag + ".json"));
  if (in) in >> j;
  return j;
}

TEST(PodAllReduce, TorusOn256ChipsMatchesReferenceAddOrderAndClosedForm) {
  const config::Params preset = config::load_preset("v2-16x16", {});
  const ici::Topology topo = ici::Topology::from_params(preset);
  const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, ici::Algorithm::kTorus, topo, kElements);
  ASSERT_EQ(s.chips, 256);
  ici::ProgramOptions po;  // what ici_program --pod chooses
  po.unroll = 8;
  po.io_tiles = kElements / 1024;
  po.allow_ragged = true;
  const fs::path dir = fs::temp_directory_path() / ("pod_allreduce_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "prog.s") << ici::collective_program(s, po);

  std::mt19937 rng(4321);
  // Wide exponent range, normal numbers only: a wrong add order changes bits.
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<std::vector<float>> x;
  std::string inputs;
  for (int c = 0; c < s.chips; ++c) {
    std::vector<float> v(static_cast<size_t>(kElements));
    for (float& f : v) f = std::ldexp(mant(rng), expo(rng));
    io::NpyArray a;
    a.shape = {kElements / 1024, 1024};
    a.data.resize(v.size() * 4);
    std::memcpy(a.data.data(), v.data(), a.data.size());
    const fs::path f = dir / ("x" + std::to_string(c) + ".npy");
    io::write_npy(f.string(), a);
    inputs += " x" + std::to_string(c) + "=" + f.string();
    x.push_back(std::move(v));
  }
  const nlohmann::json a = run(dir, inputs, "a");
  const nlohmann::json b = run(dir, inputs, "b");
  fs::remove_all(dir);
  ASSERT_FALSE(a.value("faulted", true)) << a.value("fault", std::string());
  ASSERT_TRUE(a.value("ref_ok", false));

  const std::vector<float> want = documented_torus_sum(x);
  for (int c = 0; c < s.chips; ++c) {
    const std::string y = "y" + std::to_string(c);
    ASSERT_EQ(a["outputs"][y], a["ref_outputs"][y]) << y << ": chip model and reference differ";
    const std::vector<float> got = from_hex(a["outputs"][y].get<std::string>());
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << y << " differs from the documented add order";
  }

  // Determinism: everything but the host's wall time.
  EXPECT_EQ(a["cycles"], b["cycles"]);
  EXPECT_EQ(a["units"], b["units"]);

  ici::Network net = ici::Network::from_params(preset);
  const auto ab = net.neighbour_alpha_beta();
  const double closed = ici::closed_form_cycles(ici::CollectiveKind::kAllReduce, ici::Algorithm::kTorus, topo,
                                                double(kElements) * 4, ab.alpha_cycles, ab.beta_cycles_per_byte);
  const double network = double(ici::simulate(net, s, 4).cycles);
  EXPECT_NEAR(network / closed, 1.0, 0.01);
  // Per step of a group the next send to the same neighbour waits for the previous
  // one's completion (delivery + return over one link) plus flag and issue cycles;
  // per received tile (masked pieces count as tiles) 4 issues.
  int64_t steps_into_chip0 = 0, tiles_into_chip0 = 0;
  for (const auto& step : s.steps)
    for (const auto& m : step)
      if (m.dst == 0) {
        ++steps_into_chip0;
        if (m.reduce) tiles_into_chip0 += s.chunks[size_t(m.dst_chunk)].elems / 1024 + 2;
      }
  const double per_step = double(preset.get_int("ici.link_latency_cycles")) + 100.0;
  const double bound = network + double(steps_into_chip0) / 4.0 * per_step + 4.0 * double(tiles_into_chip0);
  const double cycles = double(a["cycles"].get<uint64_t>());
  std::printf("v2-16x16 torus, %lld B/chip: program %.0f cycles, network-level %.0f, closed form %.0f, "
              "program/closed %.3f, bound %.0f\n",
              static_cast<long long>(kElements * 4), cycles, network, closed, cycles / closed, bound);
  EXPECT_GE(cycles, network);
  EXPECT_LE(cycles, bound);
}

}  // namespace

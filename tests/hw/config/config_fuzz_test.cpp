// Bounded random mutation of every bundled preset through what reads it: the
// preset tree (includes resolved), the derived peaks, the TensorCore's, the HBM
// controller's and the host link's parameters. Any text must give parameters or a
// ConfigError naming the file, never a crash, a hang or another exception (yaml-cpp
// alone threw a "bad conversion" naming nothing for a key written as a list).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hw/chip/core.h"
#include "hw/config/params.h"
#include "hw/config/peaks.h"
#include "hw/hbm/hbm_config.h"
#include "hw/host/host_link.h"

namespace tpusim::config {
namespace {

namespace fs = std::filesystem;

struct Seed {
  std::string path, text;
};

std::vector<Seed> seeds() {
  std::vector<Seed> out;
  for (const char* kind : {"chips", "boards"})
    for (const auto& e : fs::directory_iterator(fs::path(configs_dir()) / kind)) {
      std::ifstream in(e.path());
      std::stringstream s;
      s << in.rdbuf();
      out.push_back({e.path().string(), s.str()});
    }
  return out;
}

std::string mutate(std::mt19937& g, std::string b) {
  static const char* kTokens[] = {":", "- ", "[", "]", "{", "}", ",", "\n", "  ", "-1", "0", "1e400", "nan",
                                  "99999999999999999999", "include: ", "? [a]\n: 1\n", "&a ", "*a", "!!str ",
                                  "\"", "'", "#", "\t", "~", "true"};
  const int n = 1 + static_cast<int>(g() % 6);
  for (int i = 0; i < n; ++i) {
    const size_t pos = b.empty() ? 0 : g() % b.size();
    switch (g() % 5) {
      case 0: if (!b.empty()) b[pos] = static_cast<char>(g()); break;
      case 1: if (!b.empty()) b.erase(pos, 1 + g() % 16); break;
      case 2: b.insert(pos, 1, static_cast<char>(g())); break;
      case 3: if (!b.empty()) b.resize(pos); break;
      default: b.insert(pos, kTokens[g() % (sizeof kTokens / sizeof *kTokens)]);
    }
  }
  return b;
}

TEST(ConfigFuzz, EveryReaderOfAMutatedPresetGivesParametersOrAConfigError) {
  const auto base = seeds();
  ASSERT_GE(base.size(), 8u);
  std::mt19937 g(2026);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 4000; ++i) {
    const Seed& s = base[static_cast<size_t>(i) % base.size()];
    const std::string text = mutate(g, s.text);
    // The mutated text stands where its file is, so its includes resolve as the file's.
    try {
      const Params p = Params::parse(text, s.path);
      (void)peak_figures(p);
      (void)hw::CoreParams::from_config(p, static_cast<int>(p.get_int("core.mxu.count")));
      (void)hbm::hbm_config_from_yaml(p.node("hbm"), p.source());
      (void)hw::HostParams::from_config(p);
      ++accepted;
    } catch (const ConfigError& e) {
      ++rejected;
      const std::string msg = e.what();
      // An included file that the mutation broke names itself, not the seed.
      EXPECT_TRUE(msg.find(".yaml") != std::string::npos) << "mutation " << i << " of " << s.path << ": " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << i << " of " << s.path << " threw " << typeid(e).name() << ": " << e.what()
                    << "\n--- text ---\n" << text;
    }
  }
  // Mutations in comments and values keep some presets valid; most break one.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace tpusim::config

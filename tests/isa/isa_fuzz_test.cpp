// Bounded random mutation of every trace's source and bundle through the
// assembler and the loader (the libFuzzer targets run the same steps unbounded).
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "isa/io/npy.h"
#include "tests/isa/fuzz_support.h"

namespace tpusim::isa {
namespace {

std::vector<std::vector<uint8_t>> seeds(bool bundles) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& d : std::filesystem::directory_iterator(TPUSIM_TRACES_DIR)) {
    const auto prog = d.path() / "prog.s";
    if (!std::filesystem::exists(prog)) continue;
    if (bundles) out.push_back(serialize_bundle(assemble_file(prog.string())));
    else out.push_back(io::read_file(prog.string()));
  }
  return out;
}

std::vector<uint8_t> mutate(std::mt19937& g, std::vector<uint8_t> b, bool text) {
  static const char* kTokens[] = {",", "[", "]", "=", ":", "-", "0x", "v99", "s31", "mxu7", "@chip9", ".core", "\n",
                                  "dim=0:0:0", "bytes=", "#", "99999999999", "nan", "f63", "1e39"};
  const int n = 1 + static_cast<int>(g() % 8);
  for (int i = 0; i < n; ++i) {
    const size_t pos = b.empty() ? 0 : g() % b.size();
    switch (g() % (text ? 5 : 4)) {
      case 0: if (!b.empty()) b[pos] = static_cast<uint8_t>(g()); break;
      case 1: if (!b.empty()) b.erase(b.begin() + static_cast<std::ptrdiff_t>(pos)); break;
      case 2: b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<uint8_t>(g())); break;
      case 3: if (!b.empty()) b.resize(pos); break;
      default: {
        const std::string t = kTokens[g() % (sizeof kTokens / sizeof *kTokens)];
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), t.begin(), t.end());
      }
    }
  }
  return b;
}

TEST(IsaFuzz, AssemblerSurvivesRandomMutations) {
  const auto base = seeds(false);
  ASSERT_FALSE(base.empty());
  std::mt19937 g(1234);
  for (int i = 0; i < 12000; ++i) {
    const auto input = mutate(g, base[static_cast<size_t>(i) % base.size()], true);
    fuzz::assemble_once(input.data(), input.size());
  }
}

TEST(IsaFuzz, LoaderSurvivesRandomMutations) {
  const auto base = seeds(true);
  ASSERT_FALSE(base.empty());
  std::mt19937 g(99);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    const auto input = mutate(g, base[static_cast<size_t>(i) % base.size()], false);
    try {
      parse_bundle(input, "m.tpb");
      ++accepted;
    } catch (const BundleError&) {
    }
  }
  // Some mutations (inside constant data, label names) stay valid bundles.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace tpusim::isa

// `tpusim diff DIR_A DIR_B [--max-ulp N]`: compares every .npy of two output
// directories bit by bit and names the first differing element. Exit 0 when
// equal, 1 when they differ, 2 on unreadable input.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "isa/io/npy.h"
#include "sim/commands.h"

namespace tpusim::cli {

namespace {

std::string index_text(const std::vector<int64_t>& shape, size_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = static_cast<int64_t>(flat % static_cast<size_t>(shape[d]));
    flat /= static_cast<size_t>(shape[d]);
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

// Distance in units in the last place between two fp32 values (monotonic integer
// mapping); NaNs are only close to identical NaN bits.
uint64_t ulp_distance(uint32_t a, uint32_t b) {
  if (a == b) return 0;
  float fa, fb;
  std::memcpy(&fa, &a, 4);
  std::memcpy(&fb, &b, 4);
  if (std::isnan(fa) || std::isnan(fb)) return UINT64_MAX;
  auto ordered = [](uint32_t u) -> int64_t { return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7FFFFFFFu) : u; };
  const int64_t d = ordered(a) - ordered(b);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

std::string element_text(const io::NpyArray& a, size_t i) {
  const size_t es = io::npy_itemsize(a.dtype);
  uint64_t bits = 0;
  std::memcpy(&bits, a.data.data() + i * es, es);
  char buf[96];
  if (a.dtype == io::NpyDtype::kF32) {
    float f;
    std::memcpy(&f, a.data.data() + i * 4, 4);
    std::snprintf(buf, sizeof buf, "0x%08llx (%.9g)", static_cast<unsigned long long>(bits), static_cast<double>(f));
  } else {
    std::snprintf(buf, sizeof buf, "0x%0*llx", static_cast<int>(2 * es), static_cast<unsigned long long>(bits));
  }
  return buf;
}

int run_diff(const std::string& a, const std::string& b, uint64_t max_ulp) {
  namespace fs = std::filesystem;
  std::set<std::string> names;
  try {
    for (const auto& dir : {a, b}) {
      if (!fs::is_directory(dir)) throw std::runtime_error(dir + ": not a directory");
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".npy") names.insert(e.path().filename().string());
    }
  } catch (const std::exception& e) {
    print_error(std::string("tpusim diff: error: ") + e.what());
    return kExitBadInput;
  }
  int differences = 0;
  for (const auto& n : names) {
    const std::string pa = a + "/" + n, pb = b + "/" + n;
    if (!fs::exists(pa) || !fs::exists(pb)) {
      std::printf("%s: only in %s\n", n.c_str(), fs::exists(pa) ? a.c_str() : b.c_str());
      ++differences;
      continue;
    }
    io::NpyArray x, y;
    try {
      x = io::read_npy(pa);
      y = io::read_npy(pb);
    } catch (const std::exception& e) {
      print_error(std::string("tpusim diff: error: ") + e.what());
      return kExitBadInput;
    }
    if (x.dtype != y.dtype || x.shape != y.shape) {
      std::printf("%s: dtype/shape differ (%s %s vs %s %s)\n", n.c_str(), io::npy_descr(x.dtype),
                  index_text(x.shape, 0).c_str(), io::npy_descr(y.dtype), index_text(y.shape, 0).c_str());
      ++differences;
      continue;
    }
    const size_t es = io::npy_itemsize(x.dtype), count = x.elements();
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; ++i) {
      if (std::memcmp(x.data.data() + i * es, y.data.data() + i * es, es) == 0) continue;
      if (max_ulp > 0 && x.dtype == io::NpyDtype::kF32) {
        uint32_t u, v;
        std::memcpy(&u, x.data.data() + i * 4, 4);
        std::memcpy(&v, y.data.data() + i * 4, 4);
        if (ulp_distance(u, v) <= max_ulp) continue;
      }
      if (bad++ == 0) first = i;
    }
    if (bad) {
      std::printf("%s: %zu of %zu elements differ; first at %s: %s vs %s\n", n.c_str(), bad, count,
                  index_text(x.shape, first).c_str(), element_text(x, first).c_str(), element_text(y, first).c_str());
      ++differences;
    }
  }
  if (differences == 0) std::printf("identical: %zu file(s)\n", names.size());
  return differences ? 1 : kExitOk;
}

}  // namespace

void add_diff_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("diff", "Compare two output directories bit by bit");
  struct Options {
    std::string a, b;
    uint64_t max_ulp = 0;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("dir_a", opt->a, "First directory")->required();
  cmd->add_option("dir_b", opt->b, "Second directory")->required();
  cmd->add_option("--max-ulp", opt->max_ulp, "Accept float32 elements this many ulp apart (default 0: bit exact)");
  cmd->callback([opt, &exit_code]() { exit_code = run_diff(opt->a, opt->b, opt->max_ulp); });
}

}  // namespace tpusim::cli

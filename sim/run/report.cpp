#include "sim/run/report.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tpusim::run {

namespace {

// SI prefix keeping 3-4 significant digits readable: 1.23 T, 456.7 G.
std::string si(double v, const char* unit) {
  static const char* const kPrefix[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (i < 6 && v >= 1000.0) {
    v /= 1000.0;
    ++i;
  }
  return fmt::format("{:.3g} {}{}", v, kPrefix[i], unit);
}

std::string percent(uint64_t part, uint64_t whole) {
  return fmt::format("{:.1f}%", whole > 0 ? 100.0 * double(part) / double(whole) : 0.0);
}

// Where the cores' time in an op went, by the per-core table's causes: the largest
// share of its core_cycles, e.g. "sync/ICI 68%". The roofline verdict says what
// the op's intensity allows; this says what the run waited on (a 1 kB op the
// roofline calls memory bound may spend its time waiting on another chip).
std::string mostly(const nlohmann::json& op) {
  if (!op.contains("stall_cycles") || !op.contains("core_cycles")) return "-";
  const uint64_t all = op["core_cycles"].get<uint64_t>();
  const auto& st = op["stall_cycles"];
  const uint64_t hbm = st.value("hbm", uint64_t{0}), infeed = st.value("infeed", uint64_t{0}),
                 sync = st.value("sync", uint64_t{0});
  if (all == 0 || hbm + infeed + sync > all) return "-";
  // Compute: issuing, or stalled on the core's own units (the table's compute).
  const std::pair<uint64_t, const char*> shares[] = {
      {all - hbm - infeed - sync, "compute"}, {hbm, "HBM wait"}, {infeed, "infeed"}, {sync, "sync/ICI"}};
  const auto* top = &shares[0];
  for (const auto& sh : shares)
    if (sh.first > top->first) top = &sh;  // ties: the first in the table's order
  return fmt::format("{} {:.0f}%", top->second, 100.0 * double(top->first) / double(all));
}

// "chip2.core1" before "chip10.core0": stats.json's objects keep their keys in
// string order, where chip10 comes before chip2, so a slice's table would list
// chips 0, 1, 10..15 first. Digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t ei = i, ej = j;
      while (ei < a.size() && digit(a[ei])) ++ei;
      while (ej < b.size() && digit(b[ej])) ++ej;
      while (i + 1 < ei && a[i] == '0') ++i;  // leading zeros do not make a number larger
      while (j + 1 < ej && b[j] == '0') ++j;
      if (ei - i != ej - j) return ei - i < ej - j;
      const int c = a.compare(i, ei - i, b, j, ej - j);
      if (c != 0) return c < 0;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::vector<std::string> keys_in_chip_order(const nlohmann::json& by_core) {
  std::vector<std::string> keys;
  for (const auto& item : by_core.items()) keys.push_back(item.key());
  std::sort(keys.begin(), keys.end(), natural_less);
  return keys;
}

constexpr size_t kTopOps = 10;
constexpr size_t kOpLabelWidth = 40;  // a long node name is cut, the row stays readable
constexpr size_t kListedCores = 16;

}  // namespace

std::string format_report(const nlohmann::json& s) {
  const double clock = s.at("clock_hz").get<double>();
  const uint64_t cycles = s.at("cycles").get<uint64_t>();
  const double seconds = s.at("seconds").get<double>();
  const uint64_t flops = s.at("flops").get<uint64_t>();
  const double peak = s.at("peak_flops_per_s").get<double>();
  const double util = s.at("mxu_utilization").get<double>();
  const auto& hbm = s.at("hbm");
  const uint64_t rd = hbm.at("bytes_read").get<uint64_t>();
  const uint64_t wr = hbm.at("bytes_written").get<uint64_t>();
  const double hbm_peak = hbm.at("peak_bytes_per_s").get<double>();
  const double wall = s.at("host").at("wall_seconds").get<double>();

  std::string r;
  r += fmt::format("preset {}, {} mode\n", s.at("preset").get<std::string>(), s.at("mode").get<std::string>());
  r += fmt::format("  step time       : {} cycles ({:.3f} us at {:.0f} MHz)\n", cycles, seconds * 1e6, clock / 1e6);
  const double achieved = seconds > 0 ? double(flops) / seconds : 0.0;
  r += fmt::format("  MXU throughput  : {:.3f} TFLOPS of {:.1f} TFLOPS peak ({} FLOP)\n", achieved / 1e12,
                   peak / 1e12, flops);
  r += fmt::format("  MXU utilization : {:.2f}%\n", util * 100.0);
  // What the arrays ran beyond the model's FLOPs: whole tiles (8 LHS rows, every
  // column) where the shapes do not fill them, a reason an MXU looks idle.
  uint64_t array_flops = 0;
  if (s.contains("ops"))
    for (const auto& op : s["ops"])
      if (op.contains("mxu_flops")) array_flops += op["mxu_flops"].get<uint64_t>();
  if (array_flops > flops && flops > 0)
    r += fmt::format("  MXU array work  : {} FLOP, {:.2f}x the model's (tiles padded to 8 rows and every column)\n",
                     array_flops, double(array_flops) / double(flops));
  const double hbm_rate = seconds > 0 ? double(rd + wr) / seconds : 0.0;
  r += fmt::format("  HBM traffic     : {} read, {} written ({}/s of {}/s peak)\n", si(double(rd), "B"),
                   si(double(wr), "B"), si(hbm_rate, "B"), si(hbm_peak, "B"));
  r += fmt::format("  HBM utilization : {:.2f}%\n", hbm_peak > 0 ? 100.0 * hbm_rate / hbm_peak : 0.0);
  r += fmt::format("  host wall time  : {:.3f} s ({} simulated cycles/s)\n", wall,
                   wall > 0 ? si(double(cycles) / wall, "") : std::string("-"));

  if (s.contains("time_by_cause") && !s["time_by_cause"].empty()) {
    r += "where each core's time went (share of the step's cycles):\n";
    r += fmt::format("  {:<14} {:>8} {:>9} {:>8} {:>9} {:>8}\n", "core", "compute", "HBM wait", "infeed",
                     "sync/ICI", "idle");
    const auto& cores = s["time_by_cause"];
    const char* const causes[] = {"compute", "hbm", "infeed", "sync", "idle"};
    uint64_t sum[5] = {0, 0, 0, 0, 0};
    size_t listed = 0;
    for (const std::string& core : keys_in_chip_order(cores)) {
      const auto& t = cores.at(core);
      for (int c = 0; c < 5; ++c) sum[c] += t[causes[c]].get<uint64_t>();
      // A pod slice has hundreds of cores: the first ones, then the mean says the rest.
      if (++listed > kListedCores) continue;
      r += fmt::format("  {:<14} {:>8} {:>9} {:>8} {:>9} {:>8}\n", core, percent(t["compute"], cycles),
                       percent(t["hbm"], cycles), percent(t["infeed"], cycles), percent(t["sync"], cycles),
                       percent(t["idle"], cycles));
    }
    if (cores.size() > kListedCores) r += fmt::format("  ... {} more cores\n", cores.size() - kListedCores);
    if (cores.size() > 1) {
      const uint64_t all = cycles * cores.size();
      r += fmt::format("  {:<14} {:>8} {:>9} {:>8} {:>9} {:>8}\n", "mean", percent(sum[0], all),
                       percent(sum[1], all), percent(sum[2], all), percent(sum[3], all), percent(sum[4], all));
    }
  }

  // What the run's length is made of, along the chain that set it (--critical-path).
  if (s.contains("critical_path")) {
    const auto& c = s["critical_path"];
    const uint64_t total = c.at("cycles").get<uint64_t>();
    std::vector<std::pair<uint64_t, std::string>> causes;
    for (const auto& [cause, n] : c.at("by_cause").items()) causes.emplace_back(n.get<uint64_t>(), cause);
    std::stable_sort(causes.begin(), causes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    r += fmt::format("critical path: {} cycles, ending on {} ({} DMA hops, {} barrier hops):\n", total,
                     c.at("ends_on").get<std::string>(), c.at("dma_hops").get<uint64_t>(),
                     c.at("barrier_hops").get<uint64_t>());
    std::string line = " ";
    for (const auto& [n, cause] : causes) line += fmt::format(" {} {}", cause, percent(n, total));
    r += line + "\n";
  }

  // The largest VMEM occupancy of any core (by the compiler's plan; bundles
  // without one have none to show).
  if (s.contains("vmem")) {
    const nlohmann::json* top = nullptr;
    std::string top_core;
    for (const std::string& core : keys_in_chip_order(s["vmem"]))  // ties: the first in chip order
      if (const auto& v = s["vmem"].at(core); v.contains("peak_bytes_in_use") &&
          (!top || v["peak_bytes_in_use"].get<uint64_t>() > (*top)["peak_bytes_in_use"].get<uint64_t>()))
        top = &v, top_core = core;
    if (top) {
      const uint64_t peak = (*top)["peak_bytes_in_use"].get<uint64_t>();
      const uint64_t cap = (*top)["capacity_bytes"].get<uint64_t>();
      r += fmt::format("  peak VMEM in use: {} of {} bytes ({:.2f}%, {})\n", peak, cap,
                       cap > 0 ? 100.0 * double(peak) / double(cap) : 0.0, top_core);
    }
  }

  if (s.contains("ops") && !s["ops"].empty()) {
    std::vector<const nlohmann::json*> ops;
    for (const auto& op : s["ops"]) ops.push_back(&op);
    // Longest first; ties in id order (the list is in id order and the sort is stable).
    std::stable_sort(ops.begin(), ops.end(), [](const nlohmann::json* a, const nlohmann::json* b) {
      return (*a)["cycles"].get<uint64_t>() > (*b)["cycles"].get<uint64_t>();
    });
    const double ridge = hbm_peak > 0 ? peak / hbm_peak : 0.0;
    const size_t shown = std::min(kTopOps, ops.size());
    r += fmt::format("top {} of {} ops by time (roofline ridge {:.1f} FLOP/B):\n", shown, ops.size(), ridge);
    // "op N" and, for compiled bundles, the graph node it came from.
    std::vector<std::string> labels;
    size_t width = 12;
    for (size_t i = 0; i < shown; ++i) {
      const auto& op = *ops[i];
      std::string label = op["name"].get<std::string>();
      if (op.contains("node")) label += " " + op["node"].get<std::string>();
      if (label.size() > kOpLabelWidth) label = label.substr(0, kOpLabelWidth - 2) + "..";
      width = std::max(width, label.size());
      labels.push_back(std::move(label));
    }
    r += fmt::format("  {:<{}} {:>10} {:>7} {:>12} {:>12} {:>9} {:>8}  {}\n", "op", width, "cycles", "step", "FLOP",
                     "HBM bytes", "FLOP/B", "bound", "mostly");
    for (size_t i = 0; i < shown; ++i) {
      const auto& op = *ops[i];
      const uint64_t f = op["flops"].get<uint64_t>();
      const uint64_t b = op["hbm_bytes"].get<uint64_t>();
      const uint64_t c = op["cycles"].get<uint64_t>();
      std::string intensity = "-", bound = "-";
      if (b > 0) {
        const double in = double(f) / double(b);
        intensity = fmt::format("{:.2f}", in);
        bound = in >= ridge ? "compute" : "memory";
      } else if (f > 0) {
        intensity = "inf";
        bound = "compute";
      }
      r += fmt::format("  {:<{}} {:>10} {:>7} {:>12} {:>12} {:>9} {:>8}  {}\n", labels[i], width, c, percent(c, cycles),
                       f, b, intensity, bound, mostly(op));
    }
  }
  return r;
}

}  // namespace tpusim::run

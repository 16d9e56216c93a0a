#include "sim/run/report.h"

#include <fmt/core.h>

#include <cstdint>

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
  r += fmt::format("  cycles          : {} ({:.3f} us at {:.0f} MHz)\n", cycles, seconds * 1e6, clock / 1e6);
  const double achieved = seconds > 0 ? double(flops) / seconds : 0.0;
  r += fmt::format("  MXU throughput  : {:.3f} TFLOPS of {:.1f} TFLOPS peak ({} FLOP)\n", achieved / 1e12,
                   peak / 1e12, flops);
  r += fmt::format("  MXU utilization : {:.2f}%\n", util * 100.0);
  const double hbm_rate = seconds > 0 ? double(rd + wr) / seconds : 0.0;
  r += fmt::format("  HBM traffic     : {} read, {} written ({}/s of {}/s peak)\n", si(double(rd), "B"),
                   si(double(wr), "B"), si(hbm_rate, "B"), si(hbm_peak, "B"));
  r += fmt::format("  host wall time  : {:.3f} s ({} simulated cycles/s)\n", wall,
                   wall > 0 ? si(double(cycles) / wall, "") : std::string("-"));
  return r;
}

}  // namespace tpusim::run

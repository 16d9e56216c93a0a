// The peak figures a preset implies, derived from its parameters (never stored
// beside them, so a `--set` of an array size or a clock moves them too).
#pragma once

#include "hw/config/params.h"

namespace tpusim::config {

struct PeakFigures {
  int64_t chips = 0;
  int64_t cores = 0;                // TensorCores in the whole system
  double flops_per_s = 0;           // 2 per MXU multiply-accumulate, all MXUs busy
  double hbm_bytes_per_s = 0;       // all chips
  double ici_bytes_per_s = 0;       // per chip, all links, one direction
  double host_bytes_per_s = 0;      // per chip
};

// One chip's HBM peak from its timing table: every pseudo-channel moving data on
// both clock edges (the same product as hbm::HbmConfig::peak_bytes_per_s, which
// the memory model reports). With `model: simple` the pipe's rate is the peak; a
// preset without a timing table (hw/system's latency + bandwidth fallback) states
// its rate as hbm.peak_bytes_per_s.
inline double hbm_peak_bytes_per_s(const Params& p) {
  if (!p.has("hbm.model")) return p.get_double("hbm.peak_bytes_per_s");
  if (p.get_string("hbm.model") == "simple") return p.get_double("hbm.simple.bytes_per_s");
  return double(p.get_int("hbm.stacks")) * double(p.get_int("hbm.channels_per_stack")) *
         double(p.get_int("hbm.pseudo_channels_per_channel")) *
         (double(p.get_int("hbm.pseudo_channel_width_bits")) / 8.0) * 2.0 * p.get_double("hbm.clock_hz");
}

inline PeakFigures peak_figures(const Params& p) {
  PeakFigures f;
  f.chips = p.get_int("system.chips");
  f.cores = f.chips * p.get_int("cores_per_chip");
  const double macs_per_cycle_per_core =
      double(p.get_int("core.mxu.rows")) * double(p.get_int("core.mxu.cols")) * double(p.get_int("core.mxu.count"));
  f.flops_per_s = 2.0 * macs_per_cycle_per_core * double(f.cores) * p.get_double("clock_hz");
  f.hbm_bytes_per_s = hbm_peak_bytes_per_s(p) * double(f.chips);
  f.ici_bytes_per_s = double(p.get_int("ici.links")) * p.get_double("ici.link_bytes_per_s");
  f.host_bytes_per_s = p.get_double("host.pcie_bytes_per_s");
  return f;
}

}  // namespace tpusim::config

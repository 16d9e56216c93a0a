#include "hw/mxu/mxu_params.h"

#include <stdexcept>
#include <string>

#include "hw/config/params.h"

namespace tpusim::hw::mxu {

namespace {
int ceil_div(int a, int b) { return (a + b - 1) / b; }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("core.mxu: " + what);
}
}  // namespace

int MxuParams::array_skew_cycles() const {
  return ceil_div(rows, pes_per_cycle) + ceil_div(cols, pes_per_cycle) - 1;
}

int MxuParams::first_result_latency_cycles() const { return fixed_latency_cycles + array_skew_cycles(); }

int MxuParams::pop_cycles() const { return ceil_div(kSublanes, result_rows_per_cycle); }

void MxuParams::validate() const {
  // As the ISA's target (isa/asm: mxu_rows/mxu_cols): k and n are vreg lanes, and
  // an mpush / mpush.t fills 8 rows / columns at a time.
  require(rows >= kSublanes && rows <= kLanes && rows % kSublanes == 0,
          "rows=" + std::to_string(rows) + " must be a multiple of 8 in 8..128");
  require(cols >= kSublanes && cols <= kLanes && cols % kSublanes == 0,
          "cols=" + std::to_string(cols) + " must be a multiple of 8 in 8..128");
  require(pes_per_cycle >= 1, "pes_per_cycle=" + std::to_string(pes_per_cycle) + " must be at least 1");
  // The array takes one LHS row per cycle, so an 8-row vreg needs at least 8.
  require(lhs_cycles_per_vreg >= kSublanes,
          "lhs_cycles_per_vreg=" + std::to_string(lhs_cycles_per_vreg) + " must be at least 8 (one LHS row per cycle)");
  // The bottom register of the array is the first of the fixed stages.
  require(fixed_latency_cycles >= 1,
          "fixed_latency_cycles=" + std::to_string(fixed_latency_cycles) + " must be at least 1 (MXU " +
              std::to_string(index) + ")");
  // The array emits one row per cycle; a faster read port would only wait for it.
  require(result_rows_per_cycle == 1,
          "result_rows_per_cycle=" + std::to_string(result_rows_per_cycle) + " is unsupported (the array emits 1)");
  require(weight_push_cycles_per_vreg >= 1,
          "weight_push_cycles_per_vreg=" + std::to_string(weight_push_cycles_per_vreg) + " must be at least 1");
  require(weight_swap_cycles >= 1, "weight_swap_cycles=" + std::to_string(weight_swap_cycles) + " must be at least 1");
  require(result_fifo_vregs >= 1, "result_fifo_vregs=" + std::to_string(result_fifo_vregs) + " must be at least 1");
}

std::vector<MxuParams> MxuParams::all_from_config(const config::Params& p) {
  std::vector<MxuParams> all;
  for (int64_t i = 0; i < p.get_int("core.mxu.count"); ++i) all.push_back(from_config(p, static_cast<int>(i)));
  return all;
}

MxuParams MxuParams::from_config(const config::Params& p, int index) {
  const std::string s = "core.mxu.";
  auto narrow = [&](const std::string& key, int64_t v) {
    if (v < -(int64_t(1) << 30) || v > (int64_t(1) << 30))
      throw config::ConfigError(p.source() + ": " + s + key + ": " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
  };
  auto get = [&](const std::string& key) { return narrow(key, p.get_int(s + key)); };
  const int count = get("count");
  if (index < 0 || index >= count)
    throw config::ConfigError(p.source() + ": MXU index " + std::to_string(index) + " out of range (core.mxu.count=" +
                              std::to_string(count) + ")");
  const auto fixed = p.get_int_list(s + "fixed_latency_cycles");
  if (fixed.size() != static_cast<size_t>(count))
    throw config::ConfigError(p.source() + ": core.mxu.fixed_latency_cycles has " + std::to_string(fixed.size()) +
                              " entries, core.mxu.count is " + std::to_string(count) + " (one per MXU)");
  MxuParams m;
  m.index = index;
  m.rows = get("rows");
  m.cols = get("cols");
  m.lhs_cycles_per_vreg = get("lhs_cycles_per_vreg");
  m.pes_per_cycle = get("pes_per_cycle");
  m.fixed_latency_cycles = narrow("fixed_latency_cycles", fixed[static_cast<size_t>(index)]);
  m.result_rows_per_cycle = get("result_rows_per_cycle");
  m.weight_push_cycles_per_vreg = get("weight_push_cycles_per_vreg");
  m.weight_swap_cycles = get("weight_swap_cycles");
  m.result_fifo_vregs = get("result_fifo_vregs");
  try {
    m.validate();
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(p.source() + ": " + e.what());
  }
  return m;
}

}  // namespace tpusim::hw::mxu

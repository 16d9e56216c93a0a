// The parameters of one MXU, read from the `core.mxu` section of a chip preset, and
// the timing that follows from them (docs/mxu.md, "Timing").
//
// The array is weight-stationary, R rows (reduction index k) by C columns (output
// column n). Activations flow right along a row, partial sums flow down a column.
// A value crosses `pes_per_cycle` PEs per cycle (a pipeline register every P PEs),
// so the wavefront of one LHS row needs ceil(R/P) cycles to run down a column and
// its last column starts ceil(C/P) - 1 cycles after its first: the array skew is
// ceil(R/P) + ceil(C/P) - 1 cycles. Everything else between issue and the result
// FIFO (operand delivery, bf16 conversion, deskew, result path, wires to the far
// MXUs) is `fixed_latency_cycles`, per MXU. Only the sum is published (83 cycles,
// 101 on MXU 2/3, TPU v4 at 128 x 128); keeping the two parts separate lets a
// `--set core.mxu.rows=32` move the latency the way the array's geometry does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tpusim::config {
class Params;
}

namespace tpusim::hw::mxu {

// A vreg is 8 sublanes x 128 lanes of 32-bit values (architecture.md).
inline constexpr int kSublanes = 8;
inline constexpr int kLanes = 128;

struct MxuParams {
  int index = 0;                        // which MXU of the core (selects the fixed latency)
  int rows = 128;                       // R, PEs per column = reduction depth = numerics chunk length
  int cols = 128;                       // C, PEs per row = output columns
  int lhs_cycles_per_vreg = 8;          // cycles between two mmul issues
  int pes_per_cycle = 4;                // P, PEs a value crosses per cycle
  int fixed_latency_cycles = 20;        // issue to first result row, minus the array skew
  int result_rows_per_cycle = 1;        // rows an mpop reads per cycle
  int weight_push_cycles_per_vreg = 8;  // cycles the staging port is busy per mpush
  int weight_swap_cycles = 16;          // cycles of the staging -> array bulk load
  int result_fifo_vregs = 32;           // result FIFO depth in 8-row groups

  // ceil(R/P) + ceil(C/P) - 1: first PE of row 0 to the result of the last column.
  int array_skew_cycles() const;
  // Issue to the first result row in the FIFO: fixed + skew (83 for v4's MXU 0).
  int first_result_latency_cycles() const;
  // Cycles an mpop occupies the FIFO read port: 8 rows at result_rows_per_cycle.
  int pop_cycles() const;
  int result_fifo_rows() const { return result_fifo_vregs * kSublanes; }

  // Throws std::invalid_argument naming the first unusable parameter.
  void validate() const;

  // MXU `index` of a core, from `core.mxu.*` of a preset. Throws
  // config::ConfigError (file and key named) on a missing, mistyped or unusable key.
  static MxuParams from_config(const config::Params& params, int index);
  // Every MXU of a core (core.mxu.count of them), each checked as above.
  static std::vector<MxuParams> all_from_config(const config::Params& params);
};

}  // namespace tpusim::hw::mxu

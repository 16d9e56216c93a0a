// The two SystemC views of one MXU, both wrapping the same MxuCore:
//  * MxuFast: event-driven, no clock. Its thread sleeps until the core's
//    next_event_cycle() (the head op can issue, or a popped vreg is written) or
//    until a new op is submitted; the core's skip() covers the cycles between.
//  * MxuDetailed: a clocked wrapper that ticks the core every cycle; with
//    Datapath::kPerPe the values come from a PeGrid of R x C PE modules.
// Both take ops in program order from an input queue (the sequencer's matrix
// queue for this MXU), issue at most one per cycle, and report each finished mpop
// through on_pop. Tests hold them equal cycle for cycle and counter for counter.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <systemc>

#include "hw/mxu/mxu_core.h"
#include "hw/mxu/mxu_queue.h"
#include "hw/mxu/pe_grid.h"

namespace tpusim::hw::mxu {

// What both views share: the core, the op queue, callbacks and traced state.
class MxuUnit : public sc_core::sc_module {
 public:
  // The op queue: set its on_pop / on_fault callbacks; submit() below adds ops.
  MxuOpQueue& queue() { return queue_; }
  void submit(MxuOp op);
  const MxuCore& core() const { return core_; }
  MxuCore& core() { return core_; }
  // Nothing left to issue and nothing under way (see MxuOpQueue::drained).
  bool idle() const { return queue_.drained(core_); }
  const std::string& fault() const { return queue_.fault(); }
  // Brings the core to the current simulation time (the fast view lags between events).
  virtual void sync() {}
  // busy, FIFO rows, rows in flight, staging rows, queue depth, last issued op
  // (1 + MxuOpKind, 0 none), stall reason of the head op (MxuStall).
  virtual void trace(sc_core::sc_trace_file* tf);

 protected:
  MxuUnit(sc_core::sc_module_name name, const MxuParams& params, MxuCore::Datapath datapath,
          sc_core::sc_time cycle);
  uint64_t cycle_now() const;  // the cycle that has begun at or before sc_time_stamp()
  void update_trace();

  MxuCore core_;
  sc_core::sc_time cycle_;
  MxuOpQueue queue_;
  sc_core::sc_event op_submitted_;

  // traced state
  bool tr_busy_ = false;
  int tr_fifo_rows_ = 0, tr_inflight_rows_ = 0, tr_staging_rows_ = 0, tr_queue_ = 0, tr_op_ = 0, tr_stall_ = 0;
};

class MxuFast : public MxuUnit {
 public:
  SC_HAS_PROCESS(MxuFast);
  MxuFast(sc_core::sc_module_name name, const MxuParams& params, sc_core::sc_time cycle);
  void sync() override;

 private:
  void run();
};

class MxuDetailed : public MxuUnit {
 public:
  enum class Datapath { kTile, kPerPe };
  sc_core::sc_in<bool> clk{"clk"};

  SC_HAS_PROCESS(MxuDetailed);
  MxuDetailed(sc_core::sc_module_name name, const MxuParams& params, sc_core::sc_time cycle,
              Datapath datapath = Datapath::kTile);
  // The unit's state, and with the per-PE datapath every PE's partial sum.
  void trace(sc_core::sc_trace_file* tf) override;
  PeGrid* grid() { return grid_.get(); }

 private:
  void on_clock();
  void collect_grid_outputs();
  void drive_grid_inputs();

  std::unique_ptr<PeGrid> grid_;
  std::deque<ArrayLaunch> in_array_;      // launches whose rows are still entering
  // Rows leaving the array, by wavefront tag: the columns seen so far and their count.
  std::map<uint64_t, std::pair<std::vector<float>, int>> open_rows_;
};

}  // namespace tpusim::hw::mxu

// The in-order op queue in front of one MXU (the sequencer's matrix queue for it):
// it issues the head op as soon as the core accepts it, at most one op per cycle,
// hands finished mpops to the owner and stops at the first program fault. Plain
// C++; both SystemC views and the non-SystemC tests and benchmarks drive the core
// through it, so they issue exactly alike.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "hw/mxu/mxu_core.h"

namespace tpusim::hw::mxu {

// One MXU instruction as the sequencer hands it over.
struct MxuOp {
  MxuOpKind kind = MxuOpKind::kMatmul;
  Vreg data;            // mpush/mpush.t: the weight vreg; mmul: the LHS vreg
  int valid_rows = 0;   // mswap k=ROWS (0: as pushed, as the ISA encodes no k)
  uint64_t tag = 0;     // the owner's id (instruction index), echoed in PoppedVreg and faults
};

class MxuOpQueue {
 public:
  // Called when an mpop's vreg is written (at its done cycle).
  std::function<void(const PoppedVreg&)> on_pop;
  // Called once when the head op is a program fault; the queue then stops issuing.
  // The message names the MXU, the op, its tag, the cycle and the problem.
  std::function<void(const MxuOp&, const std::string&)> on_fault;

  void submit(MxuOp op) { ops_.push_back(std::move(op)); }
  size_t size() const { return ops_.size(); }
  bool empty() const { return ops_.empty(); }
  const std::string& fault() const { return fault_; }
  int last_op() const { return last_op_; }  // 1 + MxuOpKind of the latest issue, 0 before any

  // The owner's work in cycle core.now(): finished pops out, the head op in if it
  // can go, the next head declared pending (so its stall cycles are counted).
  void step(MxuCore& core);

  // Nothing left to issue (or stopped at a fault) and the core idle: no mmul in
  // the pipeline, no push, bulk load or mpop under way. Unpopped results may remain.
  bool drained(const MxuCore& core) const;

  // Plain C++ run to completion (or fault): step, then tick (use_skip = false, as
  // the clocked view) or skip to the core's next event (as the event-driven view).
  // Returns the cycle at which everything had drained.
  uint64_t run(MxuCore& core, bool use_skip);

 private:
  std::deque<MxuOp> ops_;
  uint64_t last_issue_cycle_ = kNever;
  std::string fault_;
  int last_op_ = 0;
};

}  // namespace tpusim::hw::mxu

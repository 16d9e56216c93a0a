// The sequencer's queue in front of one MXU and the glue to the MXU engineer's
// timing core (hw/mxu/mxu_core.h). The MXU core decides WHEN each op issues and
// when an mpop's vreg is written; the values come from isa/exec applied to the
// reference's MxuState in program order: mpush/mswap/mmul at issue, mpop pops the
// FIFO at issue and writes its register when the MXU core finishes reading the rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "hw/core/core_env.h"
#include "hw/mxu/mxu_core.h"
#include "hw/mxu/result_values.h"

namespace tpusim::hw {

// num::fp32_to_bf16 of n fp32 bit patterns, branch-free so that it vectorises
// (the LHS of every mmul goes through it).
void fp32_bits_to_bf16(const uint32_t* src, uint16_t* dst, size_t n);

class MatrixQueue {
 public:
  MatrixQueue(CoreEnv& env, const mxu::MxuParams& p, int index, size_t queue_depth);

  bool queue_full() const { return queue_.size() >= depth_; }
  void push(Issued&& it) { queue_.push_back(std::move(it)); }
  bool idle() const;

  void tick(uint64_t cycle);
  void skip(uint64_t n);
  uint64_t next_event_cycle(uint64_t now) const;

  nlohmann::json counters_json() const;
  uint64_t macs() const { return real_macs_; }
  // Traced state.
  bool busy_ = false;
  int queue_depth_now_ = 0;
  int current_op_ = -1;

 private:
  // What a popping mpop still needs of its Issued (a tenth of its size: it is
  // copied for every mpop of a stream).
  struct PendingPop {
    const isa::Instr* in = nullptr;
    RegUse use;
    uint64_t seq = 0;
    uint64_t issue_cycle = 0;
    uint64_t done = 0;  // its values wait in values_, in pop order
  };
  static mxu::MxuOpKind kind_of(const isa::Instr& in);
  void issue_mmul(exec::CoreState& st, const isa::Instr& in);
  bool head_ready() const;
  void declare_pending();

  CoreEnv& env_;
  int index_;
  size_t depth_;
  mxu::MxuCore core_;
  // The FIFO's values (the reference's MxuState::fifo stays empty): computed in
  // batches, written into an mpop's register when it has read its rows.
  mxu::ResultFifoValues values_;
  RingQueue<Issued> queue_;
  RingQueue<PendingPop> pops_;
  uint64_t real_macs_ = 0;
  uint64_t stall_dependency_ = 0;
  bool dependency_stalled_ = false;
  timeline::TrackId track_ = 0;
  // head_ready()'s last answer, for the head `ready_seq_` at scoreboard version `ready_version_`.
  mutable bool ready_ = false;
  mutable uint64_t ready_seq_ = ~uint64_t{0};
  mutable uint64_t ready_version_ = 0;
};

}  // namespace tpusim::hw

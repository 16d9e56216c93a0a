// Per-op profile of one TensorCore: where the core's time and work went, keyed by
// the compiler's graph op ids (Instr::op_id, from `op N` markers). The units call
// one-line hooks; everything here is a few integer adds per instruction, so it is
// always on (no switch to thread through the run options).
//
// Time is attributed in program order at the sequencer: every cycle the sequencer
// is active goes to the op of the instruction at its head, whether it issues that
// cycle or stalls there, and each stalled cycle is filed under its cause (waiting
// on HBM, on infeed, on sync/ICI, or on the core's own units = computing). The
// sum over ops is the sequencer's active_cycles in either mode, since the
// sequencer's stall counting is mode-independent. The units add what the op
// occupied them for (MXU matmul rows, VPU instruction latencies, DMA transfers)
// and its work (MACs, vector instructions, HBM bytes).
//
// A wait on a flag is infeed while an infeed transfer this core issued on that
// flag (host -> this chip) is pending: the host link's own test (hw/host), so the
// two agree. Otherwise it is classified by the last DMA this core issued on the
// flag: HBM (either end in this chip's HBM), anything else is sync/ICI: core to
// core, ICI, a flag raised by another core's rflag, and outfeed (chip -> host),
// which is host-bound but not input starvation (docs/cli.md). An infeed that
// raises another core's flag (rflag) is only known to that core's host-link
// counter (hw/chip/core.cpp), which tells this profile (host_infeed_stall), so
// to_json moves them from sync to infeed per op, as sim/run/profile.cpp does per core.
//
// With a timeline, the sequencer track gets one slice per op span and every DMA
// that raises a flag gets a flow arrow to the wait that consumed it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw/timeline/timeline.h"
#include "isa/asm/instr.h"

namespace tpusim::hw {

class OpProfile {
 public:
  enum Cause : uint8_t { kCompute = 0, kHbm, kInfeed, kSync, kCauses };

  struct Op {
    uint64_t cycles = 0;  // sequencer-active cycles at this op's instructions
    uint64_t instructions = 0;
    std::array<uint64_t, kCauses> stall{};  // stalled cycles by cause (kCompute: queue full, barrier drain)
    uint64_t macs = 0;
    uint64_t hbm_bytes = 0;
    uint64_t vector_ops = 0;
    uint64_t mxu_busy_cycles = 0;  // union of its matmuls' row streams, per MXU, summed over MXUs
    uint64_t vpu_busy_cycles = 0;  // union of its vector instructions' latencies
    uint64_t dma_busy_cycles = 0;  // engine-cycles of its transfers (engines overlap)
    // Stalled cycles at its `wait`s, per flag (sparse): which wait holds the op up,
    // e.g. one flag shared by many buffers where each should have its own.
    std::map<int, uint64_t> wait_by_flag;
    // While more than one instruction stream runs: per (stream, flag), the cycles
    // that stream waited there, whether or not another stream issued meanwhile
    // (wait_by_flag sees only cycles the whole core stalled, charged to one stream).
    std::map<std::pair<int, int>, uint64_t> stream_wait;
    // Cycles the host link counted as infeed at this op's waits (TensorCore's
    // stall_infeed_cycles), another core's infeed on this core's rflag included:
    // to_json moves what the flag's cause filed under sync/ICI or HBM to infeed,
    // so an op's causes agree with the core's time_by_cause.
    uint64_t host_infeed = 0;
    // to_json adds the drain after the sequencer halted to the last op's cycles.
    bool seen = false;
  };

  OpProfile() = default;
  OpProfile(const OpProfile&) = delete;  // at()'s cached pointer is into this object's map
  OpProfile& operator=(const OpProfile&) = delete;

  // Sequencer: a cycle it was active and not stalled, at `in` (null: ran off the end).
  void issue_cycle(const isa::Instr* in, uint64_t cycle) {
    progress_cycle.store(cycle, std::memory_order_relaxed);
    seq_end_ = cycle + 1;
    if (in) cur_op_ = in->op_id;
    Op& o = at(cur_op_);
    ++o.cycles;
    if (in) {
      ++o.instructions;
      if (tl_) timeline_issue(*in, cycle);
    }
  }
  // Sequencer: a later instruction of the bundle issued this cycle (the cycle
  // itself went to the bundle's first instruction's op).
  void issue_bundled(const isa::Instr& in, uint64_t cycle) {
    cur_op_ = in.op_id;
    ++at(cur_op_).instructions;
    if (tl_) timeline_issue(in, cycle);
  }
  // Sequencer: n cycles stalled at `in`; `flag` >= 0 for a wait on that flag,
  // `sync` for a barrier, neither for the core's own units (queue full, drain).
  void stall(const isa::Instr& in, int flag, bool sync, uint64_t n) {
    Op& o = at(in.op_id);
    o.cycles += n;
    Cause c = sync ? kSync : kCompute;
    if (flag >= 0 && flag < isa::kSyncFlags) {
      const size_t f = static_cast<size_t>(flag);
      c = infeed_pending_[f] > 0 ? kInfeed : flag_cause_[f];
      o.wait_by_flag[flag] += n;
    }
    o.stall[c] += n;
  }
  // The core's host link: n cycles of the stall at an instruction of op `op_id`
  // were a wait for an infeed transfer (possibly another core's).
  void host_infeed_stall(int32_t op_id, uint64_t n) { at(op_id).host_infeed += n; }
  // Sequencer: stream `stream`, one of several running, waited n cycles at `in`
  // (a wait on a flag).
  void stream_wait(const isa::Instr& in, int stream, uint64_t n) { at(in.op_id).stream_wait[{stream, in.a}] += n; }
  // Sequencer: a DMA instruction issued by this core (on chip `chip`).
  void dma_issued(const isa::Instr& in, uint32_t chip);
  // MXU `mxu`: a matmul of `macs` streaming rows over [begin, end).
  void matmul(int mxu, const isa::Instr& in, uint64_t macs, uint64_t begin, uint64_t end);
  // VPU: a vector instruction over [begin, end).
  void vector(const isa::Instr& in, uint64_t begin, uint64_t end);
  // DMA engines: a transfer over [begin, end) that moved `hbm_bytes` through HBM
  // (read + written, on every chip it touched: the op's count), `chip_hbm_bytes`
  // of them through this chip's (the chip's bandwidth counter); `track` is the
  // DMA's timeline track (flow arrows).
  void dma_done(const isa::Instr& in, uint64_t hbm_bytes, uint64_t chip_hbm_bytes, uint64_t begin, uint64_t end,
                timeline::TrackId track);

  // The sequencer's timeline track (slices per op span, flow ends).
  void attach_timeline(timeline::Timeline* tl, const std::string& process, const std::string& unit);

  // Ops by id (-1: instructions before any op marker).
  const std::map<int32_t, Op>& ops() const { return ops_; }
  // {"ops": [{"id": N, "cycles": .., ...}], "stall": {"hbm": .., ...}}; ops never seen are left out.
  nlohmann::json to_json() const;

  static const char* cause_name(Cause c);

  // The latest cycle any core's sequencer was active in, for a progress line read
  // by another thread (relaxed: an approximate, monotone-enough figure).
  inline static std::atomic<uint64_t> progress_cycle{0};

 private:
  // Op ids are whatever the bundle's markers say (any 32-bit value), so the ops
  // live in a map; the current op is cached, as nearly every call is for it.
  Op& at(int32_t op_id) {
    if (!last_ || last_id_ != op_id) {
      last_ = &ops_[op_id];
      last_id_ = op_id;
    }
    last_->seen = true;
    return *last_;
  }
  void timeline_issue(const isa::Instr& in, uint64_t cycle);
  static std::array<Cause, isa::kSyncFlags> all_sync() {
    std::array<Cause, isa::kSyncFlags> a;
    a.fill(kSync);
    return a;
  }

  std::map<int32_t, Op> ops_;
  Op* last_ = nullptr;  // ops_[last_id_] (map nodes stay put)
  int32_t last_id_ = 0;
  int32_t cur_op_ = -1;
  // Cause of a wait on each flag; kSync until this core issues a DMA on it.
  std::array<Cause, isa::kSyncFlags> flag_cause_ = all_sync();
  // Per flag: this core's infeed transfers issued on it and not yet finished.
  std::array<uint32_t, isa::kSyncFlags> infeed_pending_{};
  uint32_t chip_ = 0;  // this core's chip (from dma_issued)
  bool is_infeed(const isa::Instr& in) const;
  std::vector<uint64_t> mxu_busy_until_;  // per MXU: end of the last matmul counted
  // After the sequencer's last active cycle (seq_end_ - 1) the units may still
  // drain until units_end_; that tail is the last op's, counted as computing.
  uint64_t seq_end_ = 0, units_end_ = 0;
  uint64_t vpu_busy_until_ = 0;

  // Timeline state.
  timeline::Timeline* tl_ = nullptr;
  timeline::TrackId track_ = 0;
  bool tl_open_ = false;
  int32_t tl_op_ = -1;
  uint64_t tl_begin_ = 0, tl_last_ = 0;
  // Per flag: DMAs finished since the last wait on it (track, cycle inside the slice).
  std::array<std::vector<std::pair<timeline::TrackId, uint64_t>>, isa::kSyncFlags> flag_sources_;
};

}  // namespace tpusim::hw

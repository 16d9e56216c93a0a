// The vector unit of a TensorCore: 8 sublanes x 128 lanes, fed in order from its
// instruction queue. Each cycle it dispatches what one VLIW bundle's vector slots
// hold: up to core.vpu.dispatch_per_cycle instructions, of them at most
// alu_per_cycle ALU/transcendental/XLU ops (two ALUs a lane) and one load and one
// store (vld_per_cycle, vst_per_cycle). Each instruction class has its
// latency and issue interval from the preset (core.vpu.*): ALU ops, the
// transcendental unit, the VMEM load/store port (banked VMEM, see VmemBanks) and
// the transpose/reduce unit (XLU). An instruction's semantics (isa/exec) run at
// the cycle it completes; the scoreboard keeps values sequential.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "hw/config/params.h"
#include "hw/core/core_env.h"
#include "hw/vmem/vmem_banks.h"

namespace tpusim::hw {

struct VpuParams {
  int add = 1, mul = 2, cmp = 1, select = 1, move = 1, convert = 1, div = 8;
  int transcendental_latency = 7, transcendental_interval = 2;
  int vld_per_cycle = 1, vst_per_cycle = 1;
  int dispatch_per_cycle = 4, alu_per_cycle = 2;
  int transpose_cycles = 259, lane_reduce_latency = 79, sublane_reduce_latency = 8;
  static VpuParams from_config(const config::Params& p);
};

class Vpu {
 public:
  enum class Stall { kNone, kDependency, kStructural, kBankConflict };

  Vpu(CoreEnv& env, VmemBanks& banks, const VpuParams& p, size_t queue_depth);

  bool queue_full() const { return queue_.size() >= depth_; }
  size_t queue_size() const { return queue_.size(); }
  void push(Issued&& it) { queue_.push_back(std::move(it)); }
  bool idle() const { return queue_.empty() && inflight_.empty(); }
  uint64_t mem_ops_retired() const { return mem_retired_; }

  void tick(uint64_t cycle);
  void skip(uint64_t n);
  uint64_t next_event_cycle(uint64_t now) const;

  const Counters& counters() const { return counters_; }
  // Traced state (plain members sc_trace reads).
  bool busy_ = false;
  int queue_depth_now_ = 0;
  int current_op_ = -1;

 private:
  struct InFlight {
    InFlight(Issued&& i, uint64_t b, uint64_t d, bool m) : it(std::move(i)), begin(b), done(d), mem(m) {}
    Issued it;
    uint64_t begin, done;
    bool mem;  // a VMEM load or store: these retire in program order
  };
  enum class Pipe { kAlu, kTrans, kLoad, kStore, kXlu };
  struct PerPipe {  // instructions dispatched into each pipe this cycle
    int alu = 0, trans = 0, load = 0, store = 0, xlu = 0;
    int& operator[](Pipe p) {
      switch (p) {
        case Pipe::kTrans: return trans;
        case Pipe::kLoad: return load;
        case Pipe::kStore: return store;
        case Pipe::kXlu: return xlu;
        default: return alu;
      }
    }
  };
  struct Timing {
    Pipe pipe;
    int latency;
    int interval;
  };
  Timing timing(const isa::Instr& in) const;
  uint64_t& pipe_free(Pipe p);
  uint64_t pipe_free(Pipe p) const;
  int per_cycle(Pipe p) const;
  void retire(InFlight& f, uint64_t cycle);
  void update_trace();

  CoreEnv& env_;
  VmemBanks& banks_;
  VpuParams p_;
  size_t depth_;
  RingQueue<Issued> queue_;
  std::vector<InFlight> inflight_;  // dispatch order
  struct Passes {  // a multi-pass tile access past its first cycle
    uint64_t seq;  // its instruction (in inflight_)
    bool store;
    VmemBanks::TileAccess acc;
    int next;  // the pass of the coming cycle
  };
  std::vector<Passes> passes_;  // at most one per port
  uint64_t alu_free_ = 0, trans_free_ = 0, load_free_ = 0, store_free_ = 0, xlu_free_ = 0;
  uint64_t mem_retired_ = 0;
  Stall stall_ = Stall::kNone;
  Counters counters_;
  timeline::TrackId track_ = 0;
  uint64_t last_tick_ = 0;
  int recorded_depth_ = 0;
};

}  // namespace tpusim::hw

// One TensorCore: sequencer, vector unit, MXUs, DMA engines and VMEM banks, ticked
// in a fixed order each cycle (DMA, MXUs, VPU, sequencer) so that every view of the
// model (event-driven or clocked) sees the same interleaving.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hw/config/params.h"
#include "hw/core/core_env.h"
#include "hw/core/matrix_queue.h"
#include "hw/core/sequencer.h"
#include "hw/dma/dma_engines.h"
#include "hw/vmem/vmem_banks.h"
#include "hw/vpu/vpu.h"

namespace tpusim::hw {

struct CoreParams {
  size_t vector_queue = 16, matrix_queue = 16, dma_queue = 16;
  int vmem_banks = 16, vmem_bank_bytes = 256;
  VpuParams vpu;
  SequencerParams sequencer;  // default: single issue
  DmaParams dma;
  std::vector<mxu::MxuParams> mxus;
  static CoreParams from_config(const config::Params& p, int mxus);
};

class TensorCore {
 public:
  TensorCore(const CoreParams& p, exec::Machine& m, uint32_t chip, uint32_t core, const isa::CoreProgram* prog,
             Barrier& barrier, MemoryHub& hub, uint64_t read_beat_cycles, uint64_t write_beat_cycles,
             timeline::Timeline* tl, RemotePort remote, HostLink& host);

  void tick(uint64_t cycle);
  void skip(uint64_t n);
  uint64_t next_event_cycle(uint64_t now) const;
  // Fast mode without a timeline or waveform (hw/system, Board::lazy): units with
  // nothing to do are not ticked (docs/tensorcore.md, "Speed"). Same counters and
  // cycles; traced per-cycle state (waveforms) would differ, hence the switch.
  void set_quiet_units_skip(bool on) { quiet_skip_ = on; }
  // Whether any core of the chip has a DMA reading host space (else no wait can be
  // an infeed stall, and the per-cycle test is skipped).
  void set_infeed_possible(bool on) { infeed_possible_ = on; }
  // Records what the critical path is walked through into `own` (hw/core/path_log.h).
  void set_path_log(PathLog* own, PathLogs* all) {
    env_.path = own;
    env_.paths = all;
  }
  // Applies the cycles skipped lazily (idle MXUs, a core without a program);
  // call before reading counters.
  void settle();

  bool done() const;
  const std::string& fault() const { return env_.fault; }
  std::string blocked_on() const { return seq_->blocked_on(); }
  bool has_program() const { return env_.prog != nullptr; }
  uint64_t last_activity_cycle() const { return env_.last_activity_cycle; }
  uint64_t macs() const;
  uint64_t instructions() const { return seq_->instructions(); }
  const std::string& name() const { return env_.name; }
  // "chip0.core0.vpu": {...}, ...
  void add_counters(nlohmann::json& units) const;

  Sequencer& sequencer() { return *seq_; }
  Vpu& vpu() { return *vpu_; }
  DmaEngines& dma() { return *dma_; }
  std::vector<std::unique_ptr<MatrixQueue>>& mxus() { return mxus_; }

 private:
  CoreEnv env_;
  VmemBanks banks_;
  std::unique_ptr<Vpu> vpu_;
  std::vector<std::unique_ptr<MatrixQueue>> mxus_;
  std::unique_ptr<DmaEngines> dma_;
  std::unique_ptr<Sequencer> seq_;
  // Sequencer cycles waiting on a flag that a pending host -> chip transfer will
  // raise: reported as "stall_infeed_cycles" instead of stall_flag_cycles.
  bool waits_for_infeed() const;
  void note_infeed_stall(uint64_t cycle, uint64_t n);
  HostLink& host_;
  uint64_t stall_infeed_ = 0;
  uint64_t infeed_since_ = kNever;  // first cycle of the current infeed stall (timeline)
  uint64_t infeed_last_ = 0;        // end (exclusive) of the stall so far
  uint64_t last_tick_ = 0;
  timeline::TrackId infeed_track_ = 0;
  bool quiet_skip_ = false;
  bool infeed_possible_ = true;
  // Cycles an idle MXU (or the whole of a core without a program) has not been
  // ticked yet: skip() is additive for them, so they are applied at once before
  // the unit next changes or is read.
  std::vector<uint64_t> mxu_lag_;
  uint64_t idle_core_lag_ = 0;
  void catch_up_mxu(size_t i) {
    if (mxu_lag_[i]) {
      mxus_[i]->skip(mxu_lag_[i]);
      mxu_lag_[i] = 0;
    }
  }
};

}  // namespace tpusim::hw

#include "hw/chip/core.h"

#include <algorithm>

namespace tpusim::hw {

CoreParams CoreParams::from_config(const config::Params& c, int mxus) {
  CoreParams p;
  const auto depth = [&](const std::string& k) {
    const int64_t v = c.get_int("core.sequencer.queue_depth." + k);
    if (v < 1 || v > 4096) throw config::ConfigError(c.source() + ": core.sequencer.queue_depth." + k + " must be 1..4096");
    return static_cast<size_t>(v);
  };
  p.vector_queue = depth("vector");
  p.matrix_queue = depth("matrix");
  p.dma_queue = depth("dma");
  p.vmem_banks = static_cast<int>(c.get_int("core.vmem.banks"));
  p.vmem_bank_bytes = static_cast<int>(c.get_int("core.vmem.bank_bytes_per_cycle"));
  p.vpu = VpuParams::from_config(c);
  p.sequencer = SequencerParams::from_config(c);
  p.dma = DmaParams::from_config(c);
  for (int i = 0; i < mxus; ++i) p.mxus.push_back(mxu::MxuParams::from_config(c, i));
  return p;
}

TensorCore::TensorCore(const CoreParams& p, exec::Machine& m, uint32_t chip, uint32_t core,
                       const isa::CoreProgram* prog, Barrier& barrier, MemoryHub& hub, uint64_t read_beat_cycles,
                       uint64_t write_beat_cycles, timeline::Timeline* tl, RemotePort remote, HostLink& host)
    : banks_(p.vmem_banks, p.vmem_bank_bytes), host_(host) {
  env_.machine = &m;
  env_.state = &m.core(chip, core);
  env_.prog = prog;
  env_.name = "chip" + std::to_string(chip) + ".core" + std::to_string(core);
  env_.timeline = tl;
  vpu_ = std::make_unique<Vpu>(env_, banks_, p.vpu, p.vector_queue);
  for (size_t i = 0; i < p.mxus.size(); ++i)
    mxus_.push_back(std::make_unique<MatrixQueue>(env_, p.mxus[i], static_cast<int>(i), p.matrix_queue));
  dma_ = std::make_unique<DmaEngines>(env_, banks_, hub, p.dma, p.dma_queue, read_beat_cycles, write_beat_cycles,
                                      core, std::move(remote), host);
  dma_->set_vmem_ops_retired([this] { return vpu_->mem_ops_retired(); });
  Sequencer::Sinks sinks;
  sinks.queue_full = [this](isa::Unit u, const isa::Instr& in) {
    switch (u) {
      case isa::Unit::kVector: return vpu_->queue_full();
      case isa::Unit::kMatrix: {
        const int x = (in.op == isa::Op::kMpop || in.op == isa::Op::kMpopAdd) ? in.b : in.a;
        return mxus_[static_cast<size_t>(x)]->queue_full();
      }
      default: return dma_->queue_full();
    }
  };
  sinks.push = [this](isa::Unit u, Issued&& it) {
    switch (u) {
      case isa::Unit::kVector: vpu_->push(std::move(it)); break;
      case isa::Unit::kMatrix: {
        const isa::Instr& in = *it.in;
        const int x = (in.op == isa::Op::kMpop || in.op == isa::Op::kMpopAdd) ? in.b : in.a;
        catch_up_mxu(static_cast<size_t>(x));
        mxus_[static_cast<size_t>(x)]->push(std::move(it));
        break;
      }
      default: dma_->push(std::move(it));
    }
  };
  sinks.vector_matrix_drained = [this] {
    if (!vpu_->idle()) return false;
    for (const auto& x : mxus_)
      if (!x->idle()) return false;
    return true;
  };
  seq_ = std::make_unique<Sequencer>(env_, barrier, std::move(sinks), p.sequencer);
  mxu_lag_.assign(mxus_.size(), 0);
  if (tl) infeed_track_ = tl->track("chip" + std::to_string(chip), "core" + std::to_string(core) + ".infeed");
}

// The sequencer counts a flag stall when the instruction at pc is a wait whose
// flag is not high enough; this is that test, plus the host link's record of
// which flags a pending infeed transfer will raise.
bool TensorCore::waits_for_infeed() const {
  if (!infeed_possible_ || !env_.prog || seq_->halted() || !env_.fault.empty()) return false;
  const auto& code = env_.prog->code;
  if (seq_->pc() >= code.size()) return false;
  const isa::Instr& in = code[seq_->pc()];
  if (in.op != isa::Op::kWait && in.op != isa::Op::kWaitSub && in.op != isa::Op::kWaitAny) return false;
  return !exec::sync_ready(*env_.state, in) &&
         (host_.infeed_pending(env_.state->core, in.a) ||
          (in.op == isa::Op::kWaitAny && host_.infeed_pending(env_.state->core, in.b)));
}

void TensorCore::note_infeed_stall(uint64_t cycle, uint64_t n) {
  stall_infeed_ += n;
  env_.profile.host_infeed_stall(env_.prog->code[seq_->pc()].op_id, n);  // waits_for_infeed: pc is a wait
  if (infeed_since_ == kNever) infeed_since_ = cycle;
  infeed_last_ = cycle + n;
}

void TensorCore::tick(uint64_t cycle) {
  last_tick_ = cycle;
  if (!quiet_skip_) {
    dma_->tick(cycle);
    for (auto& x : mxus_) x->tick(cycle);
  } else {
    // A core streaming vector work has an event every cycle, its idle DMA engines
    // and MXUs none: their tick would equal skip(1), which is nothing for quiet
    // DMA engines and a deferred count for an idle MXU.
    if (!dma_->quiet(cycle)) dma_->tick(cycle);
    for (size_t i = 0; i < mxus_.size(); ++i) {
      if (mxus_[i]->idle()) {
        ++mxu_lag_[i];
      } else {
        catch_up_mxu(i);
        mxus_[i]->tick(cycle);
      }
    }
  }
  vpu_->tick(cycle);
  if (waits_for_infeed()) {
    note_infeed_stall(cycle, 1);
  } else if (infeed_since_ != kNever) {
    if (env_.timeline) env_.timeline->slice(infeed_track_, "stall: infeed", infeed_since_, infeed_last_);
    infeed_since_ = kNever;
  }
  seq_->tick(cycle);
}

void TensorCore::skip(uint64_t n) {
  if (n == 0) return;
  if (!has_program()) {  // nothing of it ever changes: its units' skips add up
    idle_core_lag_ += n;
    return;
  }
  // The sequencer counts the skipped cycles under the reason it has now.
  if (waits_for_infeed()) note_infeed_stall(last_tick_ + 1, n);
  dma_->skip(n);
  for (size_t i = 0; i < mxus_.size(); ++i) {
    if (quiet_skip_ && mxus_[i]->idle()) {
      mxu_lag_[i] += n;
    } else {
      catch_up_mxu(i);
      mxus_[i]->skip(n);
    }
  }
  vpu_->skip(n);
  seq_->skip(n);
}

void TensorCore::settle() {
  for (size_t i = 0; i < mxus_.size(); ++i) catch_up_mxu(i);
  if (idle_core_lag_) {
    const uint64_t n = idle_core_lag_;
    idle_core_lag_ = 0;
    dma_->skip(n);
    for (auto& x : mxus_) x->skip(n);
    vpu_->skip(n);
    seq_->skip(n);
  }
}

uint64_t TensorCore::next_event_cycle(uint64_t now) const {
  if (!env_.fault.empty()) return kNever;
  uint64_t next = std::min(dma_->next_event_cycle(now), vpu_->next_event_cycle(now));
  for (const auto& x : mxus_) next = std::min(next, x->next_event_cycle(now));
  return std::min(next, seq_->next_event_cycle(now));
}

bool TensorCore::done() const {
  if (!seq_->halted() || !vpu_->idle() || !dma_->idle()) return false;
  for (const auto& x : mxus_)
    if (!x->idle()) return false;
  return true;
}

uint64_t TensorCore::macs() const {
  uint64_t n = 0;
  for (const auto& x : mxus_) n += x->macs();
  return n;
}

void TensorCore::add_counters(nlohmann::json& units) const {
  nlohmann::json seq = seq_->counters().to_json();
  if (env_.prog) {
    seq["stall_infeed_cycles"] = stall_infeed_;
    if (stall_infeed_) seq["stall_flag_cycles"] = seq.value("stall_flag_cycles", uint64_t{0}) - stall_infeed_;
  }
  units[env_.name + ".sequencer"] = seq;
  units[env_.name + ".vpu"] = vpu_->counters().to_json();
  for (size_t i = 0; i < mxus_.size(); ++i) units[env_.name + ".mxu" + std::to_string(i)] = mxus_[i]->counters_json();
  for (int e = 0; e < dma_->engines(); ++e) units[env_.name + ".dma" + std::to_string(e)] = dma_->engine_json(e);
  units[env_.name + ".profile"] = env_.profile.to_json();  // moved into stats.json "ops" by tpusim run
}

}  // namespace tpusim::hw

#include "hw/core/sequencer.h"

namespace tpusim::hw {

using isa::Op;
using isa::Unit;

Sequencer::Sequencer(CoreEnv& env, Barrier& barrier, Sinks sinks)
    : env_(env), barrier_(barrier), sinks_(std::move(sinks)) {
  if (!env_.prog) halted_ = true;  // a core without a program idles from the start
  if (env_.timeline) env_.profile.attach_timeline(env_.timeline, env_.name.substr(0, env_.name.find('.')),
                                                  env_.name.substr(env_.name.find('.') + 1) + ".sequencer");
}

Sequencer::Stall Sequencer::blocked(uint64_t cycle) const {
  if (at_barrier_) return barrier_.release_cycle(barrier_generation_) <= cycle ? Stall::kNone : Stall::kBarrier;
  const auto& code = env_.prog->code;
  if (pc_ >= code.size()) return Stall::kNone;
  const isa::Instr& in = code[pc_];
  const Unit u = isa::op_info(in.op).unit;
  if (u == Unit::kVector || u == Unit::kMatrix || u == Unit::kDma)
    return sinks_.queue_full(u, in) ? Stall::kQueueFull : Stall::kNone;
  if (in.op == Op::kWait || in.op == Op::kWaitSub) return exec::sync_ready(*env_.state, in) ? Stall::kNone : Stall::kFlag;
  if (in.op == Op::kBarrier) return sinks_.vector_matrix_drained() ? Stall::kNone : Stall::kFence;
  return Stall::kNone;
}

void Sequencer::count(Stall s, uint64_t n) {
  if (s != Stall::kNone)
    env_.profile.stall(env_.prog->code[pc_], s == Stall::kFlag ? env_.prog->code[pc_].a : -1, s == Stall::kBarrier, n);
  switch (s) {
    case Stall::kFlag: counters_["stall_flag_cycles"] += n; break;
    case Stall::kQueueFull: counters_["stall_queue_full_cycles"] += n; break;
    case Stall::kBarrier: counters_["stall_barrier_cycles"] += n; break;
    case Stall::kFence: counters_["stall_barrier_drain_cycles"] += n; break;
    default: break;
  }
}

void Sequencer::tick(uint64_t cycle) {
  last_cycle_ = cycle;
  if (halted_ || !env_.fault.empty()) return;
  counters_["active_cycles"]++;
  stall_ = blocked(cycle);
  stall_reason_ = static_cast<int>(stall_);
  pc_now_ = static_cast<int>(pc_);
  if (stall_ != Stall::kNone) {
    count(stall_, 1);
    return;
  }
  env_.note_activity(cycle);
  env_.profile.issue_cycle(at_barrier_ || pc_ >= env_.prog->code.size() ? nullptr : &env_.prog->code[pc_], cycle);
  if (at_barrier_) {  // released: the barrier instruction retires
    at_barrier_ = false;
    ++pc_;
    return;
  }
  const auto& code = env_.prog->code;
  if (pc_ >= code.size() || code[pc_].op == Op::kHalt) {  // running off the end halts, as in the reference
    halted_ = true;
    halt_cycle_ = cycle;
    counters_["instructions"]++;
    return;
  }
  const isa::Instr& in = code[pc_];
  counters_["instructions"]++;
  ++instructions_;
  try {
    switch (isa::op_info(in.op).unit) {
      case Unit::kScalar: pc_ = exec::exec_scalar(*env_.state, in, pc_); break;
      case Unit::kVector:
      case Unit::kMatrix:
      case Unit::kDma: {
        const Unit u = isa::op_info(in.op).unit;
        Issued it;
        it.in = &in;
        it.pc = pc_;
        it.seq = seq_++;
        it.issue_cycle = cycle;
        it.use = reg_use(in);
        it.s = env_.state->s;
        if (u == Unit::kDma) {
          it.vmem_ops_before = vmem_ops_issued_;
          env_.profile.dma_issued(in, env_.state->chip);
          it.plan = exec::plan_dma(*env_.machine, *env_.state, in);  // faults here, as the reference does
        } else {
          env_.scoreboard.reserve(it.use, it.seq);
          if (in.op == Op::kVld || in.op == Op::kVldBf16 || in.op == Op::kVst || in.op == Op::kVstBf16)
            ++vmem_ops_issued_;
        }
        sinks_.push(u, std::move(it));
        ++pc_;
        break;
      }
      case Unit::kSync:
        if (in.op == Op::kBarrier) {
          at_barrier_ = true;
          barrier_generation_ = barrier_.arrive(cycle);
          break;  // retires when released
        }
        exec::exec_sync(*env_.state, in);
        ++pc_;
        break;
    }
  } catch (const exec::Fault& e) {
    env_.raise(pc_, e.what());
  }
}

void Sequencer::skip(uint64_t n) {
  const uint64_t first = last_cycle_ + 1;
  last_cycle_ += n;
  if (halted_ || !env_.fault.empty()) return;
  counters_["active_cycles"] += n;
  // Nothing changes between events, so every skipped cycle stalls for the reason
  // a tick would find at the first of them.
  count(blocked(first), n);
}

uint64_t Sequencer::next_event_cycle(uint64_t now) const {
  if (halted_ || !env_.fault.empty()) return kNever;
  if (at_barrier_) {
    const uint64_t r = barrier_.release_cycle(barrier_generation_);
    return r == kNever ? kNever : std::max(now + 1, r);
  }
  return blocked(now + 1) == Stall::kNone ? now + 1 : kNever;
}

std::string Sequencer::blocked_on() const {
  if (halted_) return "halted";
  if (at_barrier_)
    return env_.where(pc_) + " waits at barrier (" + std::to_string(barrier_.arrived()) + " of " +
           std::to_string(barrier_.participants()) + " cores arrived)";
  const isa::Instr& in = env_.prog->code[pc_];
  if (in.op == Op::kWait || in.op == Op::kWaitSub)
    return env_.where(pc_) + " waits for f" + std::to_string(in.a) + " >= " + std::to_string(in.imm) + " (is " +
           std::to_string(env_.state->flags[in.a]) + ")";
  return env_.where(pc_) + " is stalled";
}

}  // namespace tpusim::hw

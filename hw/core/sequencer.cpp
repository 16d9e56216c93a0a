#include "hw/core/sequencer.h"

#include <algorithm>
#include <utility>

namespace tpusim::hw {

using isa::Op;
using isa::Unit;

Sequencer::Sequencer(CoreEnv& env, Barrier& barrier, Sinks sinks, const SequencerParams& p)
    : env_(env), barrier_(barrier), sinks_(std::move(sinks)), p_(p) {
  if (!env_.prog) halted_ = true;  // a core without a program idles from the start
  else decode_program();
  running_[0] = !halted_;
  if (env_.timeline) env_.profile.attach_timeline(env_.timeline, env_.name.substr(0, env_.name.find('.')),
                                                  env_.name.substr(env_.name.find('.') + 1) + ".sequencer");
}

Sequencer::Stall Sequencer::blocked(int s, uint64_t cycle) const {
  if (s == 0 && at_barrier_) return barrier_.release_cycle(barrier_generation_) <= cycle ? Stall::kNone : Stall::kBarrier;
  const auto& code = env_.prog->code;
  const uint32_t pc = pc_of(s);
  if (pc >= code.size()) return Stall::kNone;
  const isa::Instr& in = code[pc];
  const Unit u = decoded_[pc].unit;
  if (u == Unit::kVector || u == Unit::kMatrix || u == Unit::kDma)
    return sinks_.queue_full(u, in) ? Stall::kQueueFull : Stall::kNone;
  if (in.op == Op::kWait || in.op == Op::kWaitSub || in.op == Op::kWaitAny)
    return exec::sync_ready(*env_.state, in) ? Stall::kNone : Stall::kFlag;
  if (in.op == Op::kBarrier) return sinks_.vector_matrix_drained() ? Stall::kNone : Stall::kFence;
  return Stall::kNone;
}

int Sequencer::first_running() const {
  for (int s = 0; s < isa::kStreams; ++s)
    if (running_[static_cast<size_t>(s)]) return s;
  return 0;
}

void Sequencer::count_stream_waits(int issued, uint64_t cycle, uint64_t n) {
  int running = 0;
  for (int s = 0; s < isa::kStreams; ++s) running += running_[static_cast<size_t>(s)];
  if (running < 2) return;
  for (int s = 0; s < isa::kStreams; ++s)
    if (s != issued && running_[static_cast<size_t>(s)] && blocked(s, cycle) == Stall::kFlag)
      env_.profile.stream_wait(env_.prog->code[pc_of(s)], s, n);
}

void Sequencer::count(Stall s, uint64_t n) {
  if (s != Stall::kNone) {
    const isa::Instr& in = env_.prog->code[at_pc()];
    env_.profile.stall(in, s == Stall::kFlag ? in.a : -1, s == Stall::kBarrier, n);
    // The cycles counted end at last_cycle_ (a tick's cycle, or a skip's last).
    if (env_.path && (s == Stall::kQueueFull || s == Stall::kFence))
      env_.path->stall(last_cycle_ + 1 - n, n,
                       s == Stall::kFence                       ? PathLog::Stall::kDrain
                       : decoded_[at_pc()].unit == Unit::kDma ? PathLog::Stall::kDmaQueue
                                                                : PathLog::Stall::kUnitQueue);
  }
  switch (s) {
    case Stall::kFlag: counters_["stall_flag_cycles"] += n; break;
    case Stall::kQueueFull: counters_["stall_queue_full_cycles"] += n; break;
    case Stall::kBarrier: counters_["stall_barrier_cycles"] += n; break;
    case Stall::kFence: counters_["stall_barrier_drain_cycles"] += n; break;
    default: break;
  }
}

IssueSlot issue_slot(const isa::Instr& in) {
  switch (isa::op_info(in.op).unit) {
    case Unit::kScalar: return IssueSlot::kScalar;
    case Unit::kSync: return IssueSlot::kSync;
    case Unit::kDma: return IssueSlot::kDma;
    case Unit::kMatrix: return IssueSlot::kMatrix;
    case Unit::kVector: break;
  }
  switch (in.op) {
    case Op::kVld: case Op::kVldBf16: return IssueSlot::kVectorLoad;
    case Op::kVst: case Op::kVstBf16: return IssueSlot::kVectorStore;
    default: return IssueSlot::kVectorAlu;
  }
}

const char* issue_slot_key(IssueSlot s) {
  switch (s) {
    case IssueSlot::kScalar: return "scalar";
    case IssueSlot::kSync: return "sync";
    case IssueSlot::kDma: return "dma";
    case IssueSlot::kVectorLoad: return "vector_load";
    case IssueSlot::kVectorStore: return "vector_store";
    case IssueSlot::kVectorAlu: return "vector_alu";
    default: return "matrix";
  }
}

SequencerParams SequencerParams::from_config(const config::Params& c) {
  SequencerParams p;
  const auto get = [&](const std::string& k, int64_t lo) {
    const int64_t v = c.get_int(k);
    if (v < lo || v > 64) throw config::ConfigError(c.source() + ": " + k + " must be " + std::to_string(lo) + "..64");
    return static_cast<int>(v);
  };
  p.issue_per_cycle = get("core.sequencer.issue_per_cycle", 1);
  for (int i = 0; i < kIssueSlots; ++i)
    p.slots[static_cast<size_t>(i)] =
        get(std::string("core.sequencer.slots.") + issue_slot_key(static_cast<IssueSlot>(i)), 1);
  return p;
}

namespace {

// Scalar registers an instruction reads and writes (bit r = sr), from its operand
// signature: the first S of a scalar ALU op, li, ld and loop is its destination.
void scalar_use(const isa::Instr& in, uint32_t* reads, uint32_t* writes) {
  const isa::OpInfo& info = isa::op_info(in.op);
  *reads = *writes = 0;
  if (in.op == Op::kDma) {
    *reads = (1u << in.dst.reg) | (1u << in.src.reg);
    return;
  }
  const uint16_t f[4] = {in.a, in.b, in.c, in.d};
  const bool dest_first = info.unit == Unit::kScalar && in.op != Op::kSt && in.op != Op::kBeq &&
                          in.op != Op::kBne && in.op != Op::kBlt && in.op != Op::kBge;
  int r = 0;
  for (const char* c = info.signature; *c && r < 4; ++c) {
    switch (*c) {
      case 'S':
        if (r == 0 && dest_first) *writes |= 1u << f[r];
        if (r != 0 || !dest_first || in.op == Op::kLoop) *reads |= 1u << f[r];
        ++r;
        break;
      case 'A': *reads |= 1u << f[r++]; break;
      case 'V': case 'M': case 'X': case 'F': ++r; break;
      default: break;
    }
  }
}

bool control_flow(Op op) {
  return op == Op::kBeq || op == Op::kBne || op == Op::kBlt || op == Op::kBge || op == Op::kJmp || op == Op::kLoop;
}

}  // namespace

// Later instructions join the bundle in program order while their slot class has
// room and they do not depend on an earlier member: a bundle's operands are read
// when it issues, so a value written by one member (RAW) or a register two members
// write (WAW) ends the bundle. WAR is allowed; the scoreboard, which every member
// reserves in program order before the next is considered, orders it in the units.
bool Sequencer::joins(const Bundle& b, uint32_t pc) const {
  if (b.size >= p_.issue_per_cycle) return false;
  const Decoded& d = decoded_[pc];
  if (b.used[static_cast<size_t>(d.slot)] >= p_.slots[static_cast<size_t>(d.slot)]) return false;
  if ((d.sreads | d.swrites) & b.swrites) return false;
  return ((d.vreads | d.vwrites) & b.vwrites) == 0;
}

void Sequencer::add(Bundle& b, uint32_t pc) const {
  const Decoded& d = decoded_[pc];
  ++b.size;
  ++b.used[static_cast<size_t>(d.slot)];
  b.swrites |= d.swrites;
  b.vwrites |= d.vwrites;
}

void Sequencer::decode_program() {
  const auto& code = env_.prog->code;
  decoded_.resize(code.size());
  for (size_t pc = 0; pc < code.size(); ++pc) {
    Decoded& d = decoded_[pc];
    d.unit = isa::op_info(code[pc].op).unit;
    d.slot = issue_slot(code[pc]);
    scalar_use(code[pc], &d.sreads, &d.swrites);
    d.use = reg_use(code[pc]);
    for (int i = 0; i < d.use.nreads; ++i) d.vreads |= uint64_t{1} << d.use.reads[i];
    for (int i = 0; i < d.use.nwrites; ++i) d.vwrites |= uint64_t{1} << d.use.writes[i];
  }
}

void Sequencer::tick(uint64_t cycle) {
  last_cycle_ = cycle;
  if (halted_ || !env_.fault.empty()) return;
  counters_["active_cycles"]++;
  // The first running stream, in turn from next_, that can issue; if none, the
  // cycle is counted as a stall of the lowest running stream.
  int pick = -1;
  for (int k = 0; k < isa::kStreams && pick < 0; ++k) {
    const int s = (next_ + k) % isa::kStreams;
    if (running_[static_cast<size_t>(s)] && blocked(s, cycle) == Stall::kNone) pick = s;
  }
  cur_ = pick >= 0 ? pick : first_running();
  stall_ = pick >= 0 ? Stall::kNone : blocked(cycle);
  stall_reason_ = static_cast<int>(stall_);
  pc_now_ = static_cast<int>(at_pc());
  count_stream_waits(pick, cycle, 1);
  if (stall_ != Stall::kNone) {
    count(stall_, 1);
    return;
  }
  next_ = (cur_ + 1) % isa::kStreams;
  env_.note_activity(cycle);
  const bool retiring_barrier = cur_ == 0 && at_barrier_;
  const auto& code = env_.prog->code;
  env_.profile.issue_cycle(retiring_barrier || at_pc() >= code.size() ? nullptr : &code[at_pc()], cycle);
  if (retiring_barrier) {  // released: the barrier instruction retires (its cycle alone)
    at_barrier_ = false;
    if (env_.path) env_.path->barriers.back().released = cycle;
    ++at_pc();
    return;
  }
  Bundle b;
  if (at_pc() < code.size()) add(b, at_pc());
  counters_["bundles"]++;
  if (!issue(cycle)) return;
  // The rest of the bundle: stops at the first instruction that cannot go now.
  while (at_pc() < code.size() && joins(b, at_pc()) && blocked(cycle) == Stall::kNone) {
    const isa::Instr& in = code[at_pc()];
    add(b, at_pc());
    env_.profile.issue_bundled(in, cycle);
    if (!issue(cycle)) break;
  }
  if (b.size > 1) counters_["multi_issue_cycles"]++;
}

bool Sequencer::issue(uint64_t cycle) {
  const auto& code = env_.prog->code;
  uint32_t& pc = at_pc();  // the selected stream's; issue never switches streams
  if (pc >= code.size() || code[pc].op == Op::kHalt) {  // running off the end halts, as in the reference
    running_[static_cast<size_t>(cur_)] = false;
    counters_["instructions"]++;
    if (std::find(running_.begin(), running_.end(), true) == running_.end()) {  // the core halts with its last stream
      halted_ = true;
      halt_cycle_ = cycle;
    }
    return false;
  }
  const isa::Instr& in = code[pc];
  counters_["instructions"]++;
  ++instructions_;
  // The cycle this stream reached `in`: when its previous instruction issued.
  uint64_t reached = 0;
  if (env_.path) reached = std::exchange(env_.path->reached[static_cast<size_t>(cur_)], cycle);
  try {
    const Unit u = decoded_[pc].unit;
    switch (u) {
      case Unit::kScalar: pc = exec::exec_scalar(*env_.state, in, pc); return !control_flow(in.op);
      case Unit::kVector:
      case Unit::kMatrix:
      case Unit::kDma: {
        Issued it;
        it.in = &in;
        it.pc = pc;
        it.seq = seq_++;
        it.issue_cycle = cycle;
        it.use = decoded_[pc].use;
        if (u != Unit::kMatrix) it.s = env_.state->s;  // addresses: the MXU ops have none
        if (u == Unit::kDma) {
          it.vmem_ops_before = vmem_ops_issued_;
          if (env_.path) {
            it.path_dma = static_cast<uint32_t>(env_.path->dmas.size());
            env_.path->dmas.push_back(
                {cycle, cycle, 0, in.op_id, static_cast<uint8_t>(cur_), PathLog::DmaKind::kHbm, pc});
          }
          env_.profile.dma_issued(in, env_.state->chip);
          it.plan = std::make_unique<exec::DmaPlan>(exec::plan_dma(*env_.machine, *env_.state, in));  // faults here, as the reference does
        } else {
          env_.scoreboard.reserve(it.use, it.seq);
          if (in.op == Op::kVld || in.op == Op::kVldBf16 || in.op == Op::kVst || in.op == Op::kVstBf16)
            ++vmem_ops_issued_;
        }
        sinks_.push(u, std::move(it));
        ++pc;
        return true;
      }
      case Unit::kSync:
        if (in.op == Op::kFork) {
          const size_t t = static_cast<size_t>(exec::fork_target(cur_, running_.data()));
          running_[t] = true;
          pcs_[t] = static_cast<uint32_t>(in.imm);
          if (env_.path) {
            env_.path->forks.emplace_back(cycle, static_cast<uint8_t>(t));
            env_.path->reached[t] = cycle;
          }
          counters_["forks"]++;
          ++pc;
          return false;
        }
        if (in.op == Op::kBarrier) {
          exec::check_barrier(cur_);
          at_barrier_ = true;
          barrier_generation_ = barrier_.arrive(cycle);
          if (env_.path) env_.path->barriers.push_back({cycle, kNever, barrier_generation_, in.op_id});
          return false;  // retires when released
        }
        // A wait.any that goes on its second condition alone: the later of two
        // pieces of work arrived first (docs/codegen.md "Arrival order").
        if (in.op == Op::kWaitAny && !exec::flag_at_least(*env_.state, in.a, in.imm)) counters_["wait_any_second"]++;
        if (env_.path) path_sync(in, pc, reached, cycle);
        exec::exec_sync(*env_.state, in);
        ++pc;
        return true;
    }
  } catch (const exec::Fault& e) {
    env_.raise(pc, e.what());
  }
  return false;
}

void Sequencer::path_sync(const isa::Instr& in, uint32_t pc, uint64_t reached, uint64_t cycle) {
  PathLog& pl = *env_.path;
  const auto raise = [&](int flag) {
    if (flag >= 0 && flag < isa::kSyncFlags)
      pl.raised[static_cast<size_t>(flag)] = PathLog::Raise{pl.id, PathLog::kBySelf, cycle, static_cast<uint8_t>(cur_)};
  };
  switch (in.op) {
    case Op::kWait:
    case Op::kWaitSub:
    case Op::kWaitAny: {
      // wait.any passes on its first flag when that one holds, else on its second.
      const int flag = in.op == Op::kWaitAny && !exec::flag_at_least(*env_.state, in.a, in.imm) ? in.b : in.a;
      if (flag < 0 || flag >= isa::kSyncFlags) return;
      pl.waits.push_back({reached, cycle, in.op_id, static_cast<uint8_t>(cur_), pl.raised[static_cast<size_t>(flag)], pc});
      return;
    }
    case Op::kFset:
    case Op::kFadd: raise(in.a); return;
    default: return;
  }
}

void Sequencer::skip(uint64_t n) {
  const uint64_t first = last_cycle_ + 1;
  last_cycle_ += n;
  if (halted_ || !env_.fault.empty()) return;
  counters_["active_cycles"] += n;
  // Nothing changes between events, so every skipped cycle stalls for the reason
  // a tick would find at the first of them.
  cur_ = first_running();
  count(blocked(first), n);
  count_stream_waits(-1, first, n);
}

uint64_t Sequencer::next_event_cycle(uint64_t now) const {
  if (halted_ || !env_.fault.empty()) return kNever;
  uint64_t next = kNever;
  for (int s = 0; s < isa::kStreams; ++s) {
    if (!running_[static_cast<size_t>(s)]) continue;
    if (s == 0 && at_barrier_) {
      const uint64_t r = barrier_.release_cycle(barrier_generation_);
      if (r != kNever) next = std::min(next, std::max(now + 1, r));
    } else if (blocked(s, now + 1) == Stall::kNone) {
      return now + 1;
    }
  }
  return next;
}

std::string Sequencer::blocked_on() const {
  if (halted_) return "halted";
  std::string out;
  for (int s = 0; s < isa::kStreams; ++s) {
    if (!running_[static_cast<size_t>(s)]) continue;
    const uint32_t pc = pc_of(s);
    std::string w = env_.where(pc);
    if (s > 0) w = "stream " + std::to_string(s) + ": " + w;
    if (!out.empty()) out += "; ";
    const isa::Instr* in = pc < env_.prog->code.size() ? &env_.prog->code[pc] : nullptr;
    if (s == 0 && at_barrier_)
      out += w + " waits at barrier (" + std::to_string(barrier_.arrived()) + " of " +
             std::to_string(barrier_.participants()) + " cores arrived)";
    else if (in && (in->op == Op::kWait || in->op == Op::kWaitSub || in->op == Op::kWaitAny))
      out += w + " waits for " + exec::wait_condition(*env_.state, *in);
    else
      out += w + " is stalled";
  }
  return out;
}

}  // namespace tpusim::hw

#include "hw/vpu/vpu.h"

#include <algorithm>

namespace tpusim::hw {

using isa::Op;

VpuParams VpuParams::from_config(const config::Params& c) {
  VpuParams p;
  const std::string a = "core.vpu.alu_latency_cycles.";
  const auto gi = [&](const std::string& k) { return static_cast<int>(c.get_int(k)); };
  p.add = gi(a + "add");
  p.mul = gi(a + "mul");
  p.cmp = gi(a + "cmp");
  p.select = gi(a + "select");
  p.move = gi(a + "move");
  p.convert = gi(a + "convert");
  p.div = gi(a + "div");
  p.transcendental_latency = gi("core.vpu.transcendental_latency_cycles");
  p.transcendental_interval = gi("core.vpu.transcendental_issue_interval_cycles");
  p.vld_per_cycle = gi("core.vpu.vld_per_cycle");
  p.vst_per_cycle = gi("core.vpu.vst_per_cycle");
  p.dispatch_per_cycle = gi("core.vpu.dispatch_per_cycle");
  p.alu_per_cycle = gi("core.vpu.alu_per_cycle");
  p.transpose_cycles = gi("core.vpu.transpose_128x128_cycles");
  p.lane_reduce_latency = gi("core.vpu.lane_reduce_latency_cycles");
  p.sublane_reduce_latency = gi("core.vpu.sublane_reduce_latency_cycles");
  for (int v : {p.add, p.mul, p.cmp, p.select, p.move, p.convert, p.div, p.transcendental_latency,
                p.transcendental_interval, p.vld_per_cycle, p.vst_per_cycle, p.dispatch_per_cycle,
                p.alu_per_cycle, p.transpose_cycles,
                p.lane_reduce_latency, p.sublane_reduce_latency})
    if (v < 1) throw config::ConfigError(c.source() + ": core.vpu latencies and rates must be >= 1");
  return p;
}

Vpu::Vpu(CoreEnv& env, VmemBanks& banks, const VpuParams& p, size_t queue_depth)
    : env_(env), banks_(banks), p_(p), depth_(queue_depth) {
  if (env_.timeline) track_ = env_.timeline->track(env_.name.substr(0, env_.name.find('.')),
                                                   env_.name.substr(env_.name.find('.') + 1) + ".vpu");
}

Vpu::Timing Vpu::timing(const isa::Instr& in) const {
  switch (in.op) {
    case Op::kVadd: case Op::kVsub: case Op::kVmax: case Op::kVmin: case Op::kVneg: case Op::kVabs:
      return {Pipe::kAlu, p_.add, 1};
    case Op::kVmul: return {Pipe::kAlu, p_.mul, 1};
    case Op::kVdiv: return {Pipe::kAlu, p_.div, 1};
    case Op::kVcmpEq: case Op::kVcmpNe: case Op::kVcmpLt: case Op::kVcmpLe: case Op::kVcmpGt: case Op::kVcmpGe:
    case Op::kVmask: case Op::kMand: case Op::kMor: case Op::kMnot:
      return {Pipe::kAlu, p_.cmp, 1};
    case Op::kVsel: return {Pipe::kAlu, p_.select, 1};
    case Op::kVmov: case Op::kVbcast: case Op::kVbcastS: return {Pipe::kAlu, p_.move, 1};
    case Op::kVcvtBf16: case Op::kVcvtF32S32: case Op::kVcvtS32F32: return {Pipe::kAlu, p_.convert, 1};
    case Op::kVsqrt: case Op::kVrsqrt: case Op::kVrecip: case Op::kVexp: case Op::kVlog: case Op::kVtanh:
    case Op::kVerf:
      return {Pipe::kTrans, p_.transcendental_latency, p_.transcendental_interval};
    case Op::kVld: case Op::kVldBf16: return {Pipe::kLoad, 1, 1};
    case Op::kVst: case Op::kVstBf16: return {Pipe::kStore, 1, 1};
    case Op::kVredLaneSum: case Op::kVredLaneMax: case Op::kVredLaneMin:
      return {Pipe::kXlu, p_.lane_reduce_latency, 1};
    case Op::kVredSubSum: case Op::kVredSubMax: case Op::kVredSubMin:
      return {Pipe::kAlu, p_.sublane_reduce_latency, 1};
    case Op::kVxpose:  // the XLU holds the whole 128 x 128 block until it is written back
      return {Pipe::kXlu, p_.transpose_cycles, p_.transpose_cycles};
    default: return {Pipe::kAlu, 1, 1};
  }
}

uint64_t& Vpu::pipe_free(Pipe p) {
  switch (p) {
    case Pipe::kAlu: return alu_free_;
    case Pipe::kTrans: return trans_free_;
    case Pipe::kLoad: return load_free_;
    case Pipe::kStore: return store_free_;
    case Pipe::kXlu: return xlu_free_;
  }
  return alu_free_;
}
uint64_t Vpu::pipe_free(Pipe p) const { return const_cast<Vpu*>(this)->pipe_free(p); }

int Vpu::per_cycle(Pipe p) const {
  switch (p) {
    case Pipe::kAlu: return p_.alu_per_cycle;
    case Pipe::kLoad: return p_.vld_per_cycle;
    case Pipe::kStore: return p_.vst_per_cycle;
    default: return 1;  // one transcendental unit, one XLU
  }
}

void Vpu::retire(InFlight& f, uint64_t cycle) {
  const isa::Instr& in = *f.it.in;
  try {
    exec_vector_issued(*env_.state, f.it);
  } catch (const exec::Fault& e) {
    env_.raise(f.it.pc, e.what());
  }
  env_.scoreboard.release(f.it.use, f.it.seq);
  const Pipe p = timing(in).pipe;
  if (p == Pipe::kLoad || p == Pipe::kStore) ++mem_retired_;
  env_.note_activity(cycle);
  ++counters_["instructions"];
  if (env_.timeline) env_.timeline->slice(track_, CoreEnv::slice_name(in), f.begin, cycle);
  env_.profile.vector(in, f.begin, cycle);
}

void Vpu::tick(uint64_t cycle) {
  last_tick_ = cycle;
  banks_.begin_cycle(cycle);
  // Later passes of multi-pass tile accesses hold their banks in their cycles, after
  // the DMA beats of the cycle (which have priority): a pass whose bank a beat
  // holds waits a cycle, and so do the access's completion and its port.
  for (size_t i = 0; i < passes_.size();) {
    Passes& ps = passes_[i];
    const uint64_t mask = ps.acc.pass_mask(ps.next);
    if (banks_.free(mask)) {
      banks_.claim_vpu(mask);
      if (++ps.next == ps.acc.cycles) {
        passes_.erase(passes_.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
    } else {
      for (auto& f : inflight_)
        if (f.it.seq == ps.seq) ++f.done;
      ++pipe_free(ps.store ? Pipe::kStore : Pipe::kLoad);
      ++counters_["stall_bank_conflict_cycles"];
    }
    ++i;
  }
  // Completions first, in dispatch order (the scoreboard forbids two in-flight
  // writers of one register, so order only matters for VMEM, where it is program
  // order). A VMEM access whose earlier one is still in flight (a multi-pass tile,
  // or one a DMA beat held up) waits for it: the scoreboard does not see memory.
  bool mem_pending = false;
  for (size_t i = 0; i < inflight_.size();) {
    InFlight& f = inflight_[i];
    if (f.done == cycle && f.mem && mem_pending) ++f.done;
    mem_pending |= f.mem && f.done != cycle;
    if (f.done == cycle) {
      retire(inflight_[i], cycle);
      inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  // Dispatch, in order, as many queued instructions as this cycle's slots take: at
  // most dispatch_per_cycle in all, alu_per_cycle of them ALU, transcendental or
  // XLU ops (the bundle's vector ALU slots), and each pipe's own per-cycle rate.
  // The first that cannot go ends the cycle's dispatch (and names its stall if
  // nothing went).
  stall_ = Stall::kNone;
  PerPipe went;
  int went_all = 0, went_alu = 0;
  while (!queue_.empty() && went_all < p_.dispatch_per_cycle) {
    Issued& head = queue_.front();
    const isa::Instr& in = *head.in;
    Timing t = timing(in);
    const bool mem = t.pipe == Pipe::kLoad || t.pipe == Pipe::kStore;
    if (!mem && went_alu >= p_.alu_per_cycle) break;  // no vector ALU slot left: not a stall
    VmemBanks::TileAccess acc;
    const bool ready = env_.scoreboard.ready(head.use, head.seq);
    const bool port_free = ready && pipe_free(t.pipe) <= cycle && went[t.pipe] < per_cycle(t.pipe);
    if (mem && port_free) {  // the banks matter only to an access that could go now
      const bool bf16 = in.op == Op::kVldBf16 || in.op == Op::kVstBf16;
      const int64_t base = static_cast<int64_t>(static_cast<uint32_t>(head.s[in.b])) + in.imm;
      acc = banks_.tile(base, isa::kSublanes, in.imm2, isa::kLanes * (bf16 ? 2 : 4));
      // A conflict-free tile takes one pass; each extra granule in one bank adds a
      // cycle, during which the port takes no other access.
      t.latency = acc.cycles;
      t.interval = acc.cycles;
    }
    Stall why = Stall::kNone;
    if (!ready) why = Stall::kDependency;
    else if (!port_free) why = Stall::kStructural;
    else if (mem && !banks_.free(acc.first_mask)) why = Stall::kBankConflict;
    if (why != Stall::kNone) {
      if (went_all == 0) stall_ = why;
      break;
    }
    if (mem) banks_.claim_vpu(acc.first_mask);
    if (mem && acc.cycles > 1) passes_.push_back({head.seq, t.pipe == Pipe::kStore, acc, 1});
    // A pipe taking several a cycle stays free until its rate is used up; one with
    // an issue interval (transcendental, XLU, a multi-pass access) is held for it.
    if (++went[t.pipe] >= per_cycle(t.pipe) || t.interval > 1)
      pipe_free(t.pipe) = cycle + static_cast<uint64_t>(t.interval);
    ++went_all;
    if (!mem) ++went_alu;
    current_op_ = static_cast<int>(in.op);
    inflight_.emplace_back(std::move(head), cycle, cycle + static_cast<uint64_t>(t.latency), mem);
    queue_.pop_front();
    ++counters_["dispatched"];
    if (mem) counters_["vmem_tile_cycles"] += static_cast<uint64_t>(acc.cycles);
    env_.note_activity(cycle);
  }
  if (went_all > 1) ++counters_["multi_dispatch_cycles"];
  switch (stall_) {
    case Stall::kDependency: ++counters_["stall_dependency_cycles"]; break;
    case Stall::kStructural: ++counters_["stall_unit_busy_cycles"]; break;
    case Stall::kBankConflict: ++counters_["stall_bank_conflict_cycles"]; break;
    default: break;
  }
  if (!inflight_.empty()) ++counters_["busy_cycles"];
  update_trace();
}

void Vpu::skip(uint64_t n) {
  // The state is frozen between events, so the reason a tick would give is the
  // reason now (recomputed: the sequencer may have queued work after our tick).
  stall_ = Stall::kNone;
  if (!queue_.empty())
    stall_ = env_.scoreboard.ready(queue_.front().use, queue_.front().seq) ? Stall::kStructural : Stall::kDependency;
  switch (stall_) {
    case Stall::kDependency: counters_["stall_dependency_cycles"] += n; break;
    case Stall::kStructural: counters_["stall_unit_busy_cycles"] += n; break;
    case Stall::kBankConflict: counters_["stall_bank_conflict_cycles"] += n; break;
    default: break;
  }
  if (!inflight_.empty()) counters_["busy_cycles"] += n;
}

uint64_t Vpu::next_event_cycle(uint64_t now) const {
  if (!passes_.empty()) return now + 1;  // each pass claims its banks in its cycle
  uint64_t next = kNever;
  for (const auto& f : inflight_) next = std::min(next, f.done);
  if (!queue_.empty()) {
    const Issued& head = queue_.front();
    if (env_.scoreboard.ready(head.use, head.seq)) {
      const Timing t = timing(*head.in);
      next = std::min(next, std::max(now + 1, pipe_free(t.pipe)));
    }
  }
  return next;
}

void Vpu::update_trace() {
  busy_ = !inflight_.empty();
  queue_depth_now_ = static_cast<int>(queue_.size());
  if (env_.timeline && queue_depth_now_ != recorded_depth_) {
    recorded_depth_ = queue_depth_now_;
    env_.timeline->counter(track_, env_.name + ".vpu queue", last_tick_, queue_depth_now_);
  }
  if (inflight_.empty()) current_op_ = -1;
}

}  // namespace tpusim::hw

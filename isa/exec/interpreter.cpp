#include "isa/exec/interpreter.h"

#include <algorithm>
#include <memory>

#include "isa/exec/race_checker.h"
#include "isa/exec/semantics.h"
#include "isa/exec/tensors.h"

namespace tpusim::exec {

using isa::Op;
using isa::Unit;

Interpreter::Interpreter(const isa::Bundle& b) : machine_(b.target) {
  load_constants(machine_, b);
  std::vector<const isa::CoreProgram*> progs;
  for (const auto& p : b.cores) progs.push_back(&p);
  std::sort(progs.begin(), progs.end(), [](const isa::CoreProgram* x, const isa::CoreProgram* y) {
    return std::make_pair(x->chip, x->core) < std::make_pair(y->chip, y->core);
  });
  programs_ = progs.size();
  for (const isa::CoreProgram* p : progs)
    for (int s = 0; s < isa::kStreams; ++s) {
      cores_.push_back(Context{p, &machine_.core(p->chip, p->core), s});
      if (s > 0) cores_.back().status = CoreStatus::kHalted;
    }
}

std::string Interpreter::where(const Context& c) const {
  std::string s = c.state->name() + (c.stream ? " stream " + std::to_string(c.stream) : "") + " instruction " +
                  std::to_string(c.pc);
  if (c.pc < c.prog->code.size()) {
    const isa::Instr& in = c.prog->code[c.pc];
    s += " (";
    if (in.line) s += c.prog->source + ":" + std::to_string(in.line) + ", ";
    s += std::string(isa::op_info(in.op).mnemonic);
    if (in.op_id >= 0) s += ", op " + std::to_string(in.op_id);
    s += ")";
  }
  return s;
}

namespace {

// The race checker's view of an access: against DMAs in flight, and against the
// core's other streams.
void check_bytes(RaceChecker& rc, size_t who, const Memory* mem, const BytePattern& bytes, bool write) {
  rc.access(who, mem, bytes, write);
  rc.sibling_access(who, mem, bytes, write);
}

// The memory bytes an instruction touches, for the race checker.
void check_access(RaceChecker& rc, size_t who, CoreState& st, const isa::Instr& in) {
  switch (in.op) {
    case Op::kLd:
    case Op::kSt: {
      const int64_t a = effective_address(st, in.b, in.imm);
      check_bytes(rc, who, &st.smem, BytePattern::contiguous(a, a + 4), in.op == Op::kSt);
      return;
    }
    case Op::kVld:
    case Op::kVldBf16:
    case Op::kVst:
    case Op::kVstBf16: {
      // Eight sublane rows of 128 lanes, `stride=` bytes apart. Masked-off lanes are
      // neither read nor written (docs/isa.md), so they are not part of the access: a
      // mask's runs of lanes that are on, as one strided pattern each where every
      // sublane has the same runs (a lane prefix, its complement), else a row at a time.
      const int64_t es = (in.op == Op::kVldBf16 || in.op == Op::kVstBf16) ? 2 : 4;
      const int64_t rows = isa::kSublanes, stride = static_cast<int32_t>(in.imm2);
      const int64_t base = effective_address(st, in.b, in.imm);
      const bool write = in.op == Op::kVst || in.op == Op::kVstBf16;
      if (in.c == 0) {
        check_bytes(rc, who, &st.vmem, BytePattern::strided(base, isa::kLanes * es, 1, &rows, &stride), write);
        return;
      }
      const MaskReg& m = st.m[in.c];
      std::vector<std::pair<int, int>> runs[isa::kSublanes];  // [l0, l1) of each sublane
      for (int sl = 0; sl < isa::kSublanes; ++sl)
        for (int l = 0; l < isa::kLanes; ++l)
          if (m.at(sl, l) && (l == 0 || !m.at(sl, l - 1))) {
            int e = l;
            while (e < isa::kLanes && m.at(sl, e)) ++e;
            runs[sl].push_back({l, e});
          }
      bool same = true;
      for (int sl = 1; sl < isa::kSublanes; ++sl) same = same && runs[sl] == runs[0];
      for (int sl = 0; sl < (same ? 1 : isa::kSublanes); ++sl)
        for (const auto& [l0, l1] : runs[sl]) {
          const int64_t a = base + (same ? 0 : sl * stride) + l0 * es, n = same ? rows : 1;
          check_bytes(rc, who, &st.vmem, BytePattern::strided(a, (l1 - l0) * es, 1, &n, &stride), write);
        }
      return;
    }
    default: return;
  }
}

}  // namespace

RunResult Interpreter::run(const RunOptions& opts) {
  RunResult res;
  const size_t n = cores_.size();
  // The race checker's agents are the cores' streams (cores_ is ordered core by
  // core, kStreams each, so an agent is its index k there). A bundle without
  // `fork` runs stream 0 only: one agent a core then keeps the checker's per-agent
  // bits and agents-squared cursors as small as a core count makes them.
  bool forks = false;
  for (size_t i = 0; opts.check_races && i < n && !forks; i += isa::kStreams)
    for (const isa::Instr& in : cores_[i].prog->code) forks = forks || in.op == Op::kFork;
  auto agent = [&](size_t k) { return forks ? k : k / isa::kStreams; };
  std::unique_ptr<RaceChecker> races;
  if (opts.check_races) races = std::make_unique<RaceChecker>(programs_, forks ? isa::kStreams : 1);
  auto index_of = [&](const CoreState* s) {
    for (size_t i = 0; i < n; i += isa::kStreams)
      if (cores_[i].state == s) return i / isa::kStreams;
    return RaceChecker::kNoCore;
  };
  for (;;) {
    bool progress = false, all_halted = true;
    for (size_t k = 0; k < n; ++k) {
      Context& c = cores_[k];
      if (c.status == CoreStatus::kHalted) continue;
      if (c.status == CoreStatus::kBarrier) {
        if (c.barrier_generation == barrier_generation_) continue;
        c.status = CoreStatus::kReady;
        ++c.pc;
        progress = true;
      }
      const auto& code = c.prog->code;
      CoreState& st = *c.state;
      try {
        for (;;) {
          if (c.pc >= code.size()) {  // running off the end halts
            c.status = CoreStatus::kHalted;
            if (races) races->stream_halted(agent(k));
            break;
          }
          const isa::Instr& in = code[c.pc];
          if (in.op == Op::kWait || in.op == Op::kWaitSub || in.op == Op::kWaitAny) {
            if (!sync_ready(st, in)) {
              c.status = CoreStatus::kWaiting;
              break;
            }
            c.status = CoreStatus::kReady;
            // wait.any: what the stream learns is what it saw, the flags that are high
            if (races && (in.op != Op::kWaitAny || flag_at_least(st, in.a, in.imm)))
              races->wait_satisfied(agent(k), in.a);
            if (races && in.op == Op::kWaitAny && flag_at_least(st, in.b, in.imm2))
              races->wait_satisfied(agent(k), in.b);
          }
          if (res.instructions >= opts.max_instructions) {
            res.status = RunResult::Status::kBudget;
            res.message = "instruction budget of " + std::to_string(opts.max_instructions) +
                          " exhausted, likely an infinite loop; " + where(c);
            return res;
          }
          ++res.instructions;
          progress = true;
          if (in.op == Op::kHalt) {
            c.status = CoreStatus::kHalted;
            if (races) races->stream_halted(agent(k));
            break;
          }
          if (in.op == Op::kFork) {
            const size_t first = k - static_cast<size_t>(c.stream);  // the core's stream 0
            bool runs[isa::kStreams];
            for (int s = 0; s < isa::kStreams; ++s)
              runs[s] = cores_[first + static_cast<size_t>(s)].status != CoreStatus::kHalted;
            const size_t target = first + static_cast<size_t>(fork_target(c.stream, runs));
            Context& t = cores_[target];
            if (races) races->stream_forked(agent(k), agent(target));
            t.status = CoreStatus::kReady;
            t.pc = static_cast<uint32_t>(in.imm);
            ++c.pc;
            continue;
          }
          if (in.op == Op::kBarrier) {
            check_barrier(c.stream);
            if (++barrier_arrived_ == programs_) {
              barrier_arrived_ = 0;
              ++barrier_generation_;
              if (races) races->barrier_released();
              ++c.pc;  // the last to arrive goes on; the others resume when visited
              continue;
            }
            c.status = CoreStatus::kBarrier;
            c.barrier_generation = barrier_generation_;
            break;
          }
          if (races) check_access(*races, agent(k), st, in);
          switch (isa::op_info(in.op).unit) {
            case Unit::kScalar:
              c.pc = exec_scalar(st, in, c.pc);
              // a flag seen high orders the stream after what raised it, as a wait does
              if (races && in.op == Op::kFtest && flag_at_least(st, in.b, in.imm))
                races->wait_satisfied(agent(k), in.b);
              break;
            case Unit::kVector: exec_vector(st, in); ++c.pc; break;
            case Unit::kMatrix: exec_matrix(st, in); ++c.pc; break;
            case Unit::kDma: {
              const DmaPlan p = plan_dma(machine_, st, in);
              if (races) {
                if (p.total_bytes() > 0) {
                  const BytePattern src = BytePattern::dma_src(p), dst = BytePattern::dma_dst(p);
                  races->access(agent(k), p.src, src, false);
                  races->access(agent(k), p.dst, dst, true);
                  // The ends in this core's own memories, against its other streams.
                  auto own = [&](const Memory* m) { return m == &st.vmem || m == &st.smem; };
                  if (own(p.src)) races->sibling_access(agent(k), p.src, src, false);
                  if (own(p.dst)) races->sibling_access(agent(k), p.dst, dst, true);
                }
                races->dma_issued(agent(k), p, index_of(p.rflag_core), where(c));
              }
              dma_copy(p);
              dma_signal_issuer(p);
              dma_signal_destination(p);
              ++c.pc;
              break;
            }
            case Unit::kSync:
              exec_sync(st, in);
              if (races && (in.op == Op::kFadd || in.op == Op::kFset)) races->flag_released(agent(k), in.a);
              ++c.pc;
              break;
          }
        }
      } catch (const Fault& f) {
        res.status = RunResult::Status::kFault;
        res.message = "fault: " + where(c) + ": " + f.what();
        return res;
      }
      if (c.status != CoreStatus::kHalted) all_halted = false;
    }
    if (all_halted) return res;
    if (!progress) {
      res.status = RunResult::Status::kDeadlock;
      res.message = "deadlock: no core can proceed and no transfer is in flight;";
      for (auto& c : cores_) {
        if (c.status == CoreStatus::kHalted) continue;
        const isa::Instr& in = c.prog->code[c.pc];
        res.message += " " + where(c);
        if (c.status == CoreStatus::kWaiting)
          res.message += " waits for " + wait_condition(*c.state, in) + ";";
        else
          res.message += " waits at barrier (" + std::to_string(barrier_arrived_) + " of " + std::to_string(programs_) +
                         " cores arrived);";
      }
      return res;
    }
  }
}

}  // namespace tpusim::exec

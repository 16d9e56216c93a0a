#include "hw/core/matrix_queue.h"

#include <algorithm>

#include "isa/numerics/fp32.h"
#include "isa/numerics/mxu.h"

namespace tpusim::hw {

using isa::Op;

// Built for the baseline ISA and for AVX2 / AVX-512, picked at load time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void fp32_bits_to_bf16(const uint32_t* src,
                                                                                       uint16_t* dst, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    const uint32_t u = src[j];
    const uint32_t mag = u & 0x7FFFFFFFu;
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const uint32_t zero = (u & 0x80000000u) >> 16;  // subnormal: signed zero (FTZ)
    uint32_t r = mag < 0x00800000u ? zero : rounded;
    r = mag > 0x7F800000u ? 0x7FC0u : r;  // NaN: the canonical one
    dst[j] = static_cast<uint16_t>(r);
  }
}

MatrixQueue::MatrixQueue(CoreEnv& env, const mxu::MxuParams& p, int index, size_t queue_depth)
    : env_(env),
      index_(index),
      depth_(queue_depth),
      core_(p),
      values_(p.rows, p.cols, p.result_fifo_vregs, isa::kLanes) {
  core_.set_compute_values(false);  // values come from isa/exec
  core_.set_keep_popped(false);
  if (env_.timeline)
    track_ = env_.timeline->track(env_.name.substr(0, env_.name.find('.')),
                                  env_.name.substr(env_.name.find('.') + 1) + ".mxu" + std::to_string(index));
}

mxu::MxuOpKind MatrixQueue::kind_of(const isa::Instr& in) {
  switch (in.op) {
    case Op::kMpush: return mxu::MxuOpKind::kPush;
    case Op::kMpushT: return mxu::MxuOpKind::kPushTransposed;
    case Op::kMswap: return mxu::MxuOpKind::kSwap;
    case Op::kMmul: return mxu::MxuOpKind::kMatmul;
    case Op::kMpop: return mxu::MxuOpKind::kPop;
    default: return mxu::MxuOpKind::kPopAdd;
  }
}

bool MatrixQueue::idle() const { return queue_.empty() && pops_.empty() && !core_.busy(); }

// Asked several times per cycle of an MXU stream (tick, pending, next event) while
// the head and the scoreboard seldom change in between.
bool MatrixQueue::head_ready() const {
  if (queue_.empty()) return false;
  const Issued& h = queue_.front();
  const uint64_t v = env_.scoreboard.version();
  if (ready_seq_ != h.seq || ready_version_ != v) {
    ready_ = env_.scoreboard.ready(h.use, h.seq);
    ready_seq_ = h.seq;
    ready_version_ = v;
  }
  return ready_;
}

void MatrixQueue::declare_pending() {
  const bool ready = head_ready();
  dependency_stalled_ = !queue_.empty() && !ready;
  if (ready) core_.set_pending(kind_of(*queue_.front().in));
  else core_.set_pending(std::nullopt);
}

void MatrixQueue::tick(uint64_t cycle) {
  // Finished mpops write their register.
  while (!pops_.empty() && pops_.front().done <= cycle) {
    PendingPop& p = pops_.front();
    values_.write_popped(env_.state->v[p.in->a].bits.data(), p.in->op == Op::kMpopAdd);
    env_.scoreboard.release(p.use, p.seq);
    env_.note_activity(cycle);
    if (env_.timeline) env_.timeline->slice(track_, CoreEnv::slice_name(*p.in), p.issue_cycle, cycle);
    pops_.pop_front();
  }
  if (head_ready()) {
    Issued& head = queue_.front();
    const isa::Instr& in = *head.in;
    const mxu::MxuReadiness r = core_.check(kind_of(in));
    if (r.can_issue() || !r.fault.empty()) {
      exec::CoreState& st = *env_.state;
      const bool pop = in.op == Op::kMpop || in.op == Op::kMpopAdd;
      try {
        if (pop) {
          exec::MxuState& ms = exec::mxu_at(st, in.b);
          if (values_.size() == 0) exec::mxu_fifo_pop(ms);  // faults: underflow, in the reference's words
          if (!r.fault.empty()) throw exec::Fault(r.fault);
          const uint64_t done = core_.pop(in.op == Op::kMpopAdd, head.pc);
          values_.pop();  // popped now (program order), written at done
          pops_.push_back(PendingPop{head.in, head.use, head.seq, head.issue_cycle, done});
        } else {
          if (in.op == Op::kMmul) issue_mmul(st, in);
          else exec::exec_matrix(st, in);  // values in program order
          if (in.op == Op::kMswap) {
            const exec::MxuState& ms = exec::mxu_at(st, in.a);
            values_.swap_weights(ms.weights.data(), ms.weights_k);
          }
          if (!r.fault.empty()) throw exec::Fault(r.fault);
          static const mxu::Vreg none;
          switch (in.op) {
            case Op::kMpush: core_.push(none, false); break;
            case Op::kMpushT: core_.push(none, true); break;
            case Op::kMswap: core_.swap(in.imm > 0 ? in.imm : -1); break;
            default: {
              const exec::MxuState& ms = exec::mxu_at(st, in.a);
              const uint64_t macs = static_cast<uint64_t>(isa::kSublanes) * static_cast<uint64_t>(ms.weights_k) *
                                    static_cast<uint64_t>(ms.cols);
              real_macs_ += macs;
              const mxu::MatmulTicket t = core_.matmul(none);
              if (env_.timeline) env_.timeline->slice(track_, CoreEnv::slice_name(in), cycle, t.last_row_cycle + 1);
              env_.profile.matmul(index_, in, macs, cycle, t.last_row_cycle + 1);
            }
          }
          env_.scoreboard.release(head.use, head.seq);
        }
      } catch (const exec::Fault& e) {
        env_.raise(head.pc, e.what());
      } catch (const mxu::MxuFault& e) {
        env_.raise(head.pc, e.what());
      }
      current_op_ = static_cast<int>(in.op);
      queue_.pop_front();
      env_.note_activity(cycle);
    }
  }
  declare_pending();
  if (dependency_stalled_) ++stall_dependency_;
  core_.tick();
  busy_ = core_.busy() || !pops_.empty();
  const int depth_before = queue_depth_now_;
  queue_depth_now_ = static_cast<int>(queue_.size());
  if (env_.timeline && queue_depth_now_ != depth_before)  // sampled at the MXU's ticks
    env_.timeline->counter(track_, env_.name + ".mxu" + std::to_string(index_) + " queue", cycle, queue_depth_now_);
  if (!busy_) current_op_ = -1;
}

void MatrixQueue::skip(uint64_t n) {
  declare_pending();
  if (dependency_stalled_) stall_dependency_ += n;
  core_.skip(n);
}

uint64_t MatrixQueue::next_event_cycle(uint64_t now) const {
  uint64_t next = kNever;
  if (!pops_.empty()) next = std::max(now + 1, pops_.front().done);
  if (head_ready()) {
    const uint64_t c = core_.earliest_issue_cycle(kind_of(*queue_.front().in));
    // A fault is reported when the op reaches the head: issue it next cycle.
    next = std::min(next, c == mxu::kNever ? now + 1 : std::max(now + 1, c));
  }
  // Rows still in flight (or a push / bulk load under way) keep the unit busy, and
  // whether it is idle decides when the core is done and when a barrier's drain
  // ends; the rows arriving before that change nothing anyone else sees, so only
  // the cycle it turns idle is an event (not every row: that would tick the whole
  // core every cycle of a matmul stream). The core's clock is one ahead of `now`
  // (tick(now) entered now + 1), so the change at its cycle e is seen after the
  // tick of e - 1.
  if (core_.busy()) {
    uint64_t e = core_.idle_cycle();
    if (e == mxu::kNever) e = core_.next_internal_event_cycle();
    if (e != mxu::kNever) next = std::min(next, std::max(now + 1, e - 1));
  }
  return next;
}

// The reference computes an mmul's rows when it issues; here values_ computes them
// later, in batches (docs/mxu.md, "Result values"), from the LHS rounded now.
void MatrixQueue::issue_mmul(exec::CoreState& st, const isa::Instr& in) {
  exec::MxuState& m = exec::mxu_at(st, in.a);
  const int used_rows = static_cast<int>(values_.size()) * isa::kSublanes;
  if (used_rows + isa::kSublanes > m.fifo_rows || in.b >= isa::kVectorRegs) {
    // Faults (FIFO overflow, bad register) in the reference's words, on a FIFO as full as ours.
    m.fifo.resize(values_.size());
    exec::exec_matrix(st, in);
    m.fifo.clear();
    return;
  }
  values_.mmul(st.v[in.b].bits.data());
}

nlohmann::json MatrixQueue::counters_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : core_.counters().named()) j[k] = v;
  j["stall_cycles.register_dependency"] = stall_dependency_;
  j["real_macs"] = real_macs_;
  return j;
}

}  // namespace tpusim::hw

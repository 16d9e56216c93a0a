#include "hw/mxu/mxu_queue.h"

#include <stdexcept>

namespace tpusim::hw::mxu {

void MxuOpQueue::step(MxuCore& core) {
  const uint64_t now = core.now();
  while (auto p = core.take_popped())
    if (on_pop) on_pop(*p);
  if (fault_.empty() && !ops_.empty() && last_issue_cycle_ != now) {
    const MxuOp& op = ops_.front();
    const MxuReadiness r = core.check(op.kind);
    std::string fault = r.fault.empty() ? "" : "mxu" + std::to_string(core.params().index) + ": " + r.fault;
    if (r.can_issue()) {
      try {
        switch (op.kind) {
          case MxuOpKind::kPush: core.push(op.data, false); break;
          case MxuOpKind::kPushTransposed: core.push(op.data, true); break;
          case MxuOpKind::kSwap: core.swap(op.valid_rows); break;
          case MxuOpKind::kMatmul: core.matmul(op.data); break;
          case MxuOpKind::kPop: core.pop(false, op.tag); break;
          case MxuOpKind::kPopAdd: core.pop(true, op.tag); break;
        }
        last_op_ = 1 + static_cast<int>(op.kind);
        last_issue_cycle_ = now;
        ops_.pop_front();
      } catch (const MxuFault& e) {
        fault = e.what();
      }
    }
    if (!fault.empty()) {
      fault_ = fault + " (op tag " + std::to_string(op.tag) + ", cycle " + std::to_string(now) + ")";
      if (on_fault) on_fault(op, fault_);
    }
  }
  if (fault_.empty() && !ops_.empty())
    core.set_pending(ops_.front().kind, last_issue_cycle_ == now ? now + 1 : now);
  else
    core.set_pending(std::nullopt);
}

bool MxuOpQueue::drained(const MxuCore& core) const { return (ops_.empty() || !fault_.empty()) && !core.busy(); }

uint64_t MxuOpQueue::run(MxuCore& core, bool use_skip) {
  for (;;) {
    step(core);
    if (drained(core)) {
      step(core);  // hand out a pop that finished in this very cycle
      return core.now();
    }
    if (!use_skip) {
      core.tick();
      continue;
    }
    uint64_t next = core.next_event_cycle();
    if (next == kNever) next = core.next_internal_event_cycle();
    if (next == kNever) throw std::logic_error("mxu: busy with no future event (cannot make progress)");
    core.skip(next - core.now());
  }
}

}  // namespace tpusim::hw::mxu

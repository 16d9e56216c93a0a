#include "hw/mxu/mxu_sc.h"

#include <map>

namespace tpusim::hw::mxu {

// ---------------------------------------------------------------- shared

MxuUnit::MxuUnit(sc_core::sc_module_name name, const MxuParams& params, MxuCore::Datapath datapath,
                 sc_core::sc_time cycle)
    : sc_module(name), core_(params, datapath), cycle_(cycle) {
  if (cycle_ == sc_core::SC_ZERO_TIME) throw std::invalid_argument(std::string(basename()) + ": cycle time is zero");
}

void MxuUnit::submit(MxuOp op) {
  queue_.submit(std::move(op));
  // Before the simulation starts the thread's first run sees the queue anyway.
  if (sc_core::sc_get_status() & (sc_core::SC_RUNNING | sc_core::SC_PAUSED))
    op_submitted_.notify(sc_core::SC_ZERO_TIME);
}

uint64_t MxuUnit::cycle_now() const { return sc_core::sc_time_stamp().value() / cycle_.value(); }

void MxuUnit::update_trace() {
  tr_busy_ = core_.busy();
  tr_fifo_rows_ = core_.fifo_rows();
  tr_inflight_rows_ = core_.inflight_rows();
  tr_staging_rows_ = core_.staging_rows();
  tr_queue_ = static_cast<int>(queue_.size());
  tr_op_ = queue_.last_op();
  tr_stall_ = core_.pending() ? static_cast<int>(core_.check(*core_.pending()).stall) : 0;
}

void MxuUnit::trace(sc_core::sc_trace_file* tf) {
  const std::string n = name();
  sc_core::sc_trace(tf, tr_busy_, n + ".busy");
  sc_core::sc_trace(tf, tr_fifo_rows_, n + ".fifo_rows");
  sc_core::sc_trace(tf, tr_inflight_rows_, n + ".inflight_rows");
  sc_core::sc_trace(tf, tr_staging_rows_, n + ".staging_rows");
  sc_core::sc_trace(tf, tr_queue_, n + ".queue_depth");
  sc_core::sc_trace(tf, tr_op_, n + ".last_op");
  sc_core::sc_trace(tf, tr_stall_, n + ".stall_reason");
}

// ---------------------------------------------------------------- fast view

MxuFast::MxuFast(sc_core::sc_module_name name, const MxuParams& params, sc_core::sc_time cycle)
    : MxuUnit(name, params, MxuCore::Datapath::kTile, cycle) {
  SC_THREAD(run);
}

void MxuFast::sync() {
  const uint64_t target = cycle_now();
  if (target > core_.now()) core_.skip(target - core_.now());
}

void MxuFast::run() {
  for (;;) {
    // An op submitted between clock edges waits for the next cycle, as it would
    // for the detailed view's edge.
    const uint64_t into = sc_core::sc_time_stamp().value() % cycle_.value();
    if (into != 0) {
      wait(sc_core::sc_time::from_value(cycle_.value() - into));
      continue;
    }
    sync();
    queue_.step(core_);
    update_trace();
    const uint64_t wake = core_.next_event_cycle();
    if (wake == kNever)
      wait(op_submitted_);
    else
      wait(sc_core::sc_time::from_value((wake - core_.now()) * cycle_.value()), op_submitted_);
  }
}

// ---------------------------------------------------------------- detailed view

MxuDetailed::MxuDetailed(sc_core::sc_module_name name, const MxuParams& params, sc_core::sc_time cycle,
                         Datapath datapath)
    : MxuUnit(name, params, datapath == Datapath::kPerPe ? MxuCore::Datapath::kExternal : MxuCore::Datapath::kTile,
              cycle) {
  if (datapath == Datapath::kPerPe) {
    grid_ = std::make_unique<PeGrid>("array", core_.params());
    grid_->clk(clk);
  }
  SC_METHOD(on_clock);
  sensitive << clk.pos();
  dont_initialize();
}

void MxuDetailed::trace(sc_core::sc_trace_file* tf) {
  MxuUnit::trace(tf);
  if (grid_) grid_->trace(tf);
}

void MxuDetailed::on_clock() {
  if (core_.now() != cycle_now())
    SC_REPORT_ERROR("tpusim/mxu", (std::string(name()) + ": clock period differs from the unit's cycle time").c_str());
  if (grid_) collect_grid_outputs();
  queue_.step(core_);
  if (grid_) drive_grid_inputs();
  update_trace();
  core_.tick();
}

// The bottom registers hold what left the array in the last cycle. A row is
// complete when its last column is out (the deskew); from there the remaining
// fixed stages take it to the FIFO.
void MxuDetailed::collect_grid_outputs() {
  const MxuParams& p = core_.params();
  const uint64_t arrival = core_.now() + static_cast<uint64_t>(p.fixed_latency_cycles) - 1;
  for (int c = 0; c < p.cols; ++c) {
    const PePartialSum& out = grid_->bottom(c);
    if (!out.valid) continue;
    auto it = open_rows_.find(out.tag);
    if (it == open_rows_.end())
      it = open_rows_.emplace(out.tag, std::make_pair(std::vector<float>(static_cast<size_t>(p.cols), 0.0f), 0)).first;
    it->second.first[static_cast<size_t>(c)] = out.sum;
    if (++it->second.second == p.cols) {
      core_.deliver_row(out.tag >> 3, static_cast<int>(out.tag & 7), it->second.first.data(), arrival);
      open_rows_.erase(it);
    }
  }
}

// LHS row i of an mmul issued in cycle t reaches array row r in cycle
// t + i + floor(r / P): the input skew that lines each wavefront up with the
// partial sums coming down.
void MxuDetailed::drive_grid_inputs() {
  const MxuParams& p = core_.params();
  while (auto l = core_.take_launch()) in_array_.push_back(std::move(*l));
  while (auto w = core_.take_weight_load()) grid_->load_weights(w->bank, w->weights);
  const uint64_t now = core_.now();
  const uint64_t last_row_delay = static_cast<uint64_t>((p.rows - 1) / p.pes_per_cycle);
  while (!in_array_.empty() && in_array_.front().issue_cycle + kSublanes + last_row_delay <= now) in_array_.pop_front();
  for (int r = 0; r < p.rows; ++r) {
    PeActivation a;
    const uint64_t delay = static_cast<uint64_t>(r / p.pes_per_cycle);
    if (now >= delay) {
      const uint64_t entry = now - delay;
      for (const ArrayLaunch& l : in_array_) {
        if (entry >= l.issue_cycle && entry < l.issue_cycle + kSublanes) {
          const int i = static_cast<int>(entry - l.issue_cycle);
          a.value = l.lhs[static_cast<size_t>(i * p.rows + r)];
          a.bank = static_cast<uint8_t>(l.bank);
          a.valid = true;
          a.tag = l.seq * kSublanes + static_cast<uint64_t>(i);
          break;
        }
      }
    }
    grid_->drive_row(r, a);
  }
}

}  // namespace tpusim::hw::mxu

#include "hw/mxu/mxu_core.h"

#include <algorithm>
#include <cstring>

#include "isa/numerics/bf16.h"
#include "isa/numerics/fp32.h"
#include "isa/numerics/mxu.h"

namespace tpusim::hw::mxu {

void add_into(Vreg& vd, const Vreg& popped) {
  for (size_t i = 0; i < vd.v.size(); ++i) vd.v[i] = num::add(vd.v[i], popped.v[i]);
}

const char* op_name(MxuOpKind kind) {
  switch (kind) {
    case MxuOpKind::kPush: return "mpush";
    case MxuOpKind::kPushTransposed: return "mpush.t";
    case MxuOpKind::kSwap: return "mswap";
    case MxuOpKind::kMatmul: return "mmul";
    case MxuOpKind::kPop: return "mpop";
    case MxuOpKind::kPopAdd: return "mpop.add";
  }
  return "?";
}

const char* stall_name(MxuStall stall) {
  switch (stall) {
    case MxuStall::kNone: return "none";
    case MxuStall::kStagingPortBusy: return "staging_port_busy";
    case MxuStall::kArrayBusy: return "array_busy";
    case MxuStall::kFifoFull: return "fifo_full";
    case MxuStall::kWaitingForResults: return "waiting_for_results";
    case MxuStall::kResultPortBusy: return "result_port_busy";
  }
  return "?";
}

bool MxuCounters::operator==(const MxuCounters& o) const {
  return busy_cycles == o.busy_cycles && stall_cycles == o.stall_cycles && macs == o.macs && pushes == o.pushes &&
         swaps == o.swaps && matmuls == o.matmuls && pops == o.pops && result_rows == o.result_rows;
}

std::vector<std::pair<std::string, uint64_t>> MxuCounters::named() const {
  std::vector<std::pair<std::string, uint64_t>> out{{"busy_cycles", busy_cycles}};
  for (int r = 1; r < kMxuStallReasons; ++r)
    out.emplace_back(std::string("stall_cycles.") + stall_name(static_cast<MxuStall>(r)),
                     stall_cycles[static_cast<size_t>(r)]);
  out.insert(out.end(), {{"macs", macs},
                         {"pushes", pushes},
                         {"swaps", swaps},
                         {"matmuls", matmuls},
                         {"pops", pops},
                         {"result_rows", result_rows}});
  return out;
}

MxuCore::MxuCore(const MxuParams& params, Datapath datapath) : params_(params), datapath_(datapath) {
  params_.validate();
  latency_ = params_.first_result_latency_cycles();
  const size_t tile = static_cast<size_t>(params_.rows) * static_cast<size_t>(params_.cols);
  staging_.assign(tile, 0);
  // Before any mswap the array holds no valid weight row: every product is +0.0.
  auto empty = std::make_shared<WeightTile>();
  empty->w.assign(tile, 0);
  active_ = empty;
}

// ---------------------------------------------------------------- readiness

MxuReadiness MxuCore::check(MxuOpKind kind) const { return check_at(kind); }

MxuReadiness MxuCore::check_at(MxuOpKind kind) const {
  MxuReadiness r;
  const int R = params_.rows, C = params_.cols;
  switch (kind) {
    case MxuOpKind::kPush:
      if (staging_rows_ + kSublanes > R)
        r.fault = "mpush: the staging buffer already holds all " + std::to_string(R) + " weight rows (mswap first)";
      else if (now_ < staging_port_free_)
        r.stall = MxuStall::kStagingPortBusy;
      break;
    case MxuOpKind::kPushTransposed:
      if (staging_cols_ + kSublanes > C)
        r.fault = "mpush.t: the staging buffer already holds all " + std::to_string(C) + " weight columns (mswap first)";
      else if (now_ < staging_port_free_)
        r.stall = MxuStall::kStagingPortBusy;
      break;
    case MxuOpKind::kSwap:
      if (now_ < staging_port_free_)
        r.stall = MxuStall::kStagingPortBusy;
      else if (now_ < bank_drain_[static_cast<size_t>(1 - active_bank_)])
        r.stall = MxuStall::kArrayBusy;  // mmuls on the bank it overwrites are still in the array
      break;
    case MxuOpKind::kMatmul: {
      if (unpopped_ >= static_cast<uint64_t>(params_.result_fifo_vregs)) {
        r.fault = "mmul: result FIFO overflow: " + std::to_string(unpopped_) + " result vregs not popped, depth " +
                  std::to_string(params_.result_fifo_vregs);
        break;
      }
      const int reserved = static_cast<int>(results_.size()) * kSublanes - (results_.empty() ? 0 : results_.front().freed);
      if (now_ < lhs_port_free_ || now_ < swap_done_)
        r.stall = MxuStall::kArrayBusy;
      else if (reserved + kSublanes > params_.result_fifo_rows())
        r.stall = MxuStall::kFifoFull;
      break;
    }
    case MxuOpKind::kPop:
    case MxuOpKind::kPopAdd:
      if (unpopped_ == 0) {
        r.fault = std::string(op_name(kind)) + ": result FIFO underflow: no mmul result left to pop";
        break;
      }
      if (pop_)
        r.stall = MxuStall::kResultPortBusy;
      else if (results_.front().arrived == 0)
        r.stall = MxuStall::kWaitingForResults;
      break;
  }
  return r;
}

uint64_t MxuCore::fifo_space_cycle() const {
  const int freed = results_.empty() ? 0 : results_.front().freed;
  const int need = static_cast<int>(results_.size()) * kSublanes - freed + kSublanes - params_.result_fifo_rows();
  if (need <= 0) return now_;
  // Only the mpop under way frees rows, one per cycle from its start.
  if (!pop_ || freed + need > kSublanes) return kNever;
  return pop_->start + static_cast<uint64_t>(freed + need);
}

uint64_t MxuCore::earliest_issue_cycle(MxuOpKind kind) const {
  if (!check_at(kind).fault.empty()) return kNever;
  switch (kind) {
    case MxuOpKind::kPush:
    case MxuOpKind::kPushTransposed:
      return std::max(now_, staging_port_free_);
    case MxuOpKind::kSwap:
      return std::max({now_, staging_port_free_, bank_drain_[static_cast<size_t>(1 - active_bank_)]});
    case MxuOpKind::kMatmul:
      return std::max({now_, lhs_port_free_, swap_done_, fifo_space_cycle()});
    case MxuOpKind::kPop:
    case MxuOpKind::kPopAdd: {
      const ResultVreg& head = results_[pop_ ? 1 : 0];
      const uint64_t port = pop_ ? pop_->done : now_;
      return std::max({now_, port, head.arrival[0]});
    }
  }
  return kNever;
}

uint64_t MxuCore::head_ready_cycle() const {
  if (unpopped_ == 0) return kNever;
  return results_[pop_ ? 1 : 0].arrival[0];
}

void MxuCore::require_issue(MxuOpKind kind) {
  const MxuReadiness r = check_at(kind);
  if (!r.fault.empty()) throw MxuFault("mxu" + std::to_string(params_.index) + ": " + r.fault);
  if (r.stall != MxuStall::kNone)
    throw MxuFault("mxu" + std::to_string(params_.index) + ": " + op_name(kind) + " issued at cycle " +
                   std::to_string(now_) + " while stalled (" + stall_name(r.stall) + ")");
  last_issue_cycle_ = now_;
}

// ---------------------------------------------------------------- issue

void MxuCore::push(const Vreg& v, bool transposed) {
  require_issue(transposed ? MxuOpKind::kPushTransposed : MxuOpKind::kPush);
  const int R = params_.rows, C = params_.cols;
  if (!transposed) {
    for (int s = 0; s < kSublanes; ++s)
      for (int n = 0; n < C; ++n)
        staging_[static_cast<size_t>((staging_rows_ + s) * C + n)] = num::fp32_to_bf16(v.at(s, n));
    staging_rows_ += kSublanes;
  } else {
    for (int s = 0; s < kSublanes; ++s)
      for (int k = 0; k < R; ++k)
        staging_[static_cast<size_t>(k * C + staging_cols_ + s)] = num::fp32_to_bf16(v.at(s, k));
    staging_cols_ += kSublanes;
  }
  staging_port_free_ = now_ + static_cast<uint64_t>(params_.weight_push_cycles_per_vreg);
  busy_until_ = std::max(busy_until_, staging_port_free_);
  ++counters_.pushes;
}

void MxuCore::swap(int valid_rows) {
  const int R = params_.rows, C = params_.cols;
  if (valid_rows > R)
    throw MxuFault("mxu" + std::to_string(params_.index) + ": mswap k=" + std::to_string(valid_rows) +
                   " exceeds the array's " + std::to_string(R) + " rows");
  require_issue(MxuOpKind::kSwap);
  auto tile = std::make_shared<WeightTile>();
  // k=0 is how the ISA writes "no k" (isa/exec: weights_k = k > 0 ? k : ...).
  tile->valid_rows = valid_rows > 0 ? valid_rows : (staging_cols_ > 0 ? R : staging_rows_);
  tile->w = staging_;
  // Rows that are not valid hold zero weights (and see zero activations, see matmul).
  std::fill(tile->w.begin() + static_cast<std::ptrdiff_t>(tile->valid_rows) * C, tile->w.end(), uint16_t{0});
  active_bank_ = 1 - active_bank_;
  active_ = tile;
  std::fill(staging_.begin(), staging_.end(), uint16_t{0});
  staging_rows_ = staging_cols_ = 0;
  staging_port_free_ = swap_done_ = now_ + static_cast<uint64_t>(params_.weight_swap_cycles);
  busy_until_ = std::max(busy_until_, staging_port_free_);
  if (datapath_ == Datapath::kExternal) weight_loads_.push_back({now_, active_bank_, tile->w});
  ++counters_.swaps;
}

MatmulTicket MxuCore::matmul(const Vreg& lhs) {
  require_issue(MxuOpKind::kMatmul);
  const int R = params_.rows;
  ResultVreg e;
  e.seq = next_seq_++;
  e.issue = now_;
  // Timing only (the owner computes the values, as hw/core does): no operand copies,
  // and rows are only materialised (as +0.0) for a row observer.
  const bool values = compute_values_ || row_observer_ || datapath_ == Datapath::kExternal;
  if (compute_values_ && datapath_ == Datapath::kTile) {
    e.weights = active_;
    e.lhs.assign(static_cast<size_t>(kSublanes * R), 0);
    const int valid = active_->valid_rows;
    for (int s = 0; s < kSublanes; ++s)
      for (int k = 0; k < valid; ++k) e.lhs[static_cast<size_t>(s * R + k)] = num::fp32_to_bf16(lhs.at(s, k));
  } else {
    e.computed = true;
  }
  if (values) e.out.assign(static_cast<size_t>(kSublanes * params_.cols), 0.0f);
  const uint64_t first = now_ + static_cast<uint64_t>(latency_);
  for (int j = 0; j < kSublanes; ++j)
    e.arrival[static_cast<size_t>(j)] = datapath_ == Datapath::kTile ? first + static_cast<uint64_t>(j) : kNever;
  if (datapath_ == Datapath::kExternal) {
    std::vector<uint16_t> launch(static_cast<size_t>(kSublanes * R), 0);
    const int valid = active_->valid_rows;
    for (int s = 0; s < kSublanes; ++s)
      for (int k = 0; k < valid; ++k) launch[static_cast<size_t>(s * R + k)] = num::fp32_to_bf16(lhs.at(s, k));
    launches_.push_back({e.seq, now_, active_bank_, std::move(launch)});
    e.computed = true;  // the grid fills `out` row by row
  }
  bank_drain_[static_cast<size_t>(active_bank_)] = first + kSublanes;
  lhs_port_free_ = now_ + static_cast<uint64_t>(params_.lhs_cycles_per_vreg);
  results_.push_back(std::move(e));
  ++unpopped_;
  ++counters_.matmuls;
  counters_.macs += static_cast<uint64_t>(kSublanes) * static_cast<uint64_t>(R) * static_cast<uint64_t>(params_.cols);
  return {results_.back().seq, first, first + kSublanes - 1};
}

uint64_t MxuCore::pop(bool accumulate, uint64_t tag) {
  require_issue(accumulate ? MxuOpKind::kPopAdd : MxuOpKind::kPop);
  pop_ = PopInProgress{now_, now_ + static_cast<uint64_t>(params_.pop_cycles()), tag, accumulate};
  results_.front().pop_started = true;
  --unpopped_;
  ++counters_.pops;
  return pop_->done;
}

std::optional<PoppedVreg> MxuCore::take_popped() {
  if (popped_.empty() || popped_.front().done_cycle > now_) return std::nullopt;
  PoppedVreg p = std::move(popped_.front());
  popped_.pop_front();
  return p;
}

std::optional<ArrayLaunch> MxuCore::take_launch() {
  if (launches_.empty()) return std::nullopt;
  ArrayLaunch l = std::move(launches_.front());
  launches_.pop_front();
  return l;
}

std::optional<WeightLoad> MxuCore::take_weight_load() {
  if (weight_loads_.empty()) return std::nullopt;
  WeightLoad w = std::move(weight_loads_.front());
  weight_loads_.pop_front();
  return w;
}

void MxuCore::deliver_row(uint64_t seq, int row, const float* values, uint64_t cycle) {
  size_t index = 0;
  while (index < results_.size() && results_[index].seq != seq) ++index;
  ResultVreg* e = index < results_.size() ? &results_[index] : nullptr;
  if (datapath_ != Datapath::kExternal || e == nullptr || row < 0 || row >= kSublanes || cycle < now_)
    throw std::logic_error("mxu" + std::to_string(params_.index) + ": result row " + std::to_string(row) +
                           " of mmul " + std::to_string(seq) + " delivered out of place at cycle " +
                           std::to_string(cycle));
  // Rows reach the FIFO in issue order, one after the other.
  int delivered = 0;
  while (delivered < kSublanes && e->arrival[static_cast<size_t>(delivered)] != kNever) ++delivered;
  const bool first_open = index == 0 || results_[index - 1].arrival[kSublanes - 1] != kNever;
  if (delivered != row || !first_open)
    throw std::logic_error("mxu" + std::to_string(params_.index) + ": result row " + std::to_string(row) +
                           " of mmul " + std::to_string(seq) + " overtakes an earlier row");
  std::memcpy(e->out.data() + static_cast<size_t>(row * params_.cols), values,
              sizeof(float) * static_cast<size_t>(params_.cols));
  e->arrival[static_cast<size_t>(row)] = cycle;
  if (cycle == now_) enter_cycle();
}

// ---------------------------------------------------------------- time

bool MxuCore::busy() const {
  if (now_ < busy_until_ || pop_) return true;
  return !results_.empty() && results_.back().arrived < kSublanes;
}

int MxuCore::fifo_rows() const {
  int n = 0;
  for (const auto& e : results_) n += e.arrived - e.freed;
  return n;
}

int MxuCore::inflight_rows() const {
  int n = 0;
  for (const auto& e : results_) n += kSublanes - e.arrived;
  return n;
}

uint64_t MxuCore::next_internal_event_cycle() const {
  uint64_t e = kNever;
  auto consider = [&](uint64_t c) {
    if (c > now_ && c < e) e = c;
  };
  consider(lhs_port_free_);
  consider(staging_port_free_);
  consider(swap_done_);
  consider(busy_until_);
  consider(bank_drain_[0]);
  consider(bank_drain_[1]);
  for (auto it = results_.rbegin(); it != results_.rend() && it->arrived < kSublanes; ++it)
    consider(it->arrival[static_cast<size_t>(it->arrived)]);
  if (pop_) {
    consider(pop_->start + static_cast<uint64_t>(results_.front().freed) + 1);
    consider(pop_->done);
  }
  return e;
}

// Like next_internal_event_cycle, but only the changes that move a counter or
// the pending op's readiness: within a stream of result rows, the ones in between
// only raise `arrived`, which enter_cycle catches up on in one step. So a busy
// MXU costs a few steps per mmul instead of one per cycle.
uint64_t MxuCore::next_accounting_event_cycle() const {
  if (row_observer_) return next_internal_event_cycle();  // the observer sees each row in its cycle
  uint64_t e = kNever;
  auto consider = [&](uint64_t c) {
    if (c > now_ && c < e) e = c;
  };
  consider(lhs_port_free_);
  consider(staging_port_free_);
  consider(swap_done_);
  consider(busy_until_);
  consider(bank_drain_[0]);
  consider(bank_drain_[1]);
  if (!results_.empty()) {
    const ResultVreg& head = results_.front();  // its row 0 ends kWaitingForResults
    if (head.arrived == 0) consider(head.arrival[0]);
    else if (results_.size() > 1 && results_[1].arrived == 0) consider(results_[1].arrival[0]);
    const ResultVreg& last = results_.back();  // its last row ends busy()
    if (last.arrived < kSublanes) consider(last.arrival[kSublanes - 1]);
  }
  if (pop_) {
    // The rows an mpop frees decide whether an mmul has FIFO room.
    if (pending_ == MxuOpKind::kMatmul) consider(pop_->start + static_cast<uint64_t>(results_.front().freed) + 1);
    consider(pop_->done);
  }
  return e;
}

uint64_t MxuCore::idle_cycle() const {
  uint64_t t = std::max(now_, busy_until_);
  if (pop_) t = std::max(t, pop_->done);
  if (!results_.empty() && results_.back().arrived < kSublanes) t = std::max(t, results_.back().arrival[kSublanes - 1]);
  return t;
}

uint64_t MxuCore::next_event_cycle() const {
  uint64_t e = kNever;
  if (pending_) {
    const uint64_t c = earliest_issue_cycle(*pending_);
    if (c != kNever) e = std::max(c, now_ + 1);
  }
  if (pop_) e = std::min(e, pop_->done);
  return e;
}

void MxuCore::account(uint64_t cycles) {
  if (busy()) counters_.busy_cycles += cycles;
  const uint64_t end = now_ + cycles;
  const uint64_t from = std::max({now_, pending_from_, last_issue_cycle_ == kNever ? 0 : last_issue_cycle_ + 1});
  if (pending_ && end > from) {
    const MxuReadiness r = check_at(*pending_);
    if (r.fault.empty() && r.stall != MxuStall::kNone) counters_.stall_cycles[static_cast<size_t>(r.stall)] += end - from;
  }
}

void MxuCore::tick() { skip(1); }

void MxuCore::skip(uint64_t n) {
  const uint64_t target = now_ + n;
  while (now_ < target) {
    const uint64_t step = std::min(next_accounting_event_cycle(), target) - now_;
    account(step);
    now_ += step;
    enter_cycle();
  }
}

void MxuCore::enter_cycle() {
  // Rows the pipeline delivers in this cycle. Only the entries after the first
  // complete_ can still be in flight, and rows arrive in issue order, so the first
  // entry still waiting for a row ends the search.
  for (size_t i = complete_; i < results_.size(); ++i) {
    ResultVreg& e = results_[i];
    while (e.arrived < kSublanes && e.arrival[static_cast<size_t>(e.arrived)] <= now_) {
      if (row_observer_) {
        ensure_computed(i);
        row_observer_(e.seq, e.arrived, now_, e.out.data() + static_cast<size_t>(e.arrived * params_.cols));
      }
      ++e.arrived;
      ++counters_.result_rows;
    }
    if (e.arrived < kSublanes) break;
    ++complete_;
  }
  if (!pop_) return;
  // The mpop under way reads row j in cycle start + j; its slot is free from the next cycle.
  ResultVreg& head = results_.front();
  const int read = static_cast<int>(std::min<uint64_t>(kSublanes, now_ - pop_->start));
  if (read > head.arrived)
    throw std::logic_error("mxu" + std::to_string(params_.index) + ": mpop read result row " +
                           std::to_string(read - 1) + " of mmul " + std::to_string(head.seq) +
                           " before the pipeline delivered it");
  head.freed = read;
  if (now_ < pop_->done) return;
  if (!keep_popped_) {  // the owner takes the values elsewhere: no 4 KiB copies per mpop
    results_.pop_front();
    --complete_;  // an mpop has read all of its rows
    pop_.reset();
    return;
  }
  ensure_computed(0);
  PoppedVreg p;
  p.tag = pop_->tag;
  p.seq = head.seq;
  p.accumulate = pop_->accumulate;
  p.issue_cycle = pop_->start;
  p.done_cycle = pop_->done;
  if (!head.out.empty())  // timing only: the popped rows are +0.0
    for (int s = 0; s < kSublanes; ++s)
      std::memcpy(&p.data.v[static_cast<size_t>(s * kLanes)], head.out.data() + static_cast<size_t>(s * params_.cols),
                  sizeof(float) * static_cast<size_t>(params_.cols));
  popped_.push_back(std::move(p));
  results_.pop_front();
  --complete_;
  pop_.reset();
}

void MxuCore::ensure_computed(size_t index) {
  if (results_[index].computed) return;
  // Consecutive mmuls on the same weights go through the kernel as one matrix, so
  // the packed weights are reused; the values are the same row by row.
  const std::shared_ptr<const WeightTile> w = results_[index].weights;
  size_t end = index;
  while (end < results_.size() && !results_[end].computed && results_[end].weights == w) ++end;
  const int R = params_.rows, C = params_.cols;
  const size_t count = end - index;
  if (compute_values_) {
    std::vector<uint16_t> a(count * kSublanes * static_cast<size_t>(R));
    std::vector<float> c(count * kSublanes * static_cast<size_t>(C));
    for (size_t i = 0; i < count; ++i)
      std::copy(results_[index + i].lhs.begin(), results_[index + i].lhs.end(),
                a.begin() + static_cast<std::ptrdiff_t>(i * kSublanes * static_cast<size_t>(R)));
    num::MatmulArgs args;
    args.a = a.data();
    args.lda = static_cast<size_t>(R);
    args.w = w->w.data();
    args.ldw = static_cast<size_t>(C);
    args.c = c.data();
    args.ldc = static_cast<size_t>(C);
    args.m = static_cast<int>(count) * kSublanes;
    args.k = R;  // one chunk: the whole array, invalid rows as +0.0 x +0.0
    args.n = C;
    args.rows = R;
    num::mxu_matmul(args);
    for (size_t i = 0; i < count; ++i)
      std::copy(c.begin() + static_cast<std::ptrdiff_t>(i * kSublanes * static_cast<size_t>(C)),
                c.begin() + static_cast<std::ptrdiff_t>((i + 1) * kSublanes * static_cast<size_t>(C)),
                results_[index + i].out.begin());
  }
  for (size_t i = index; i < end; ++i) {
    results_[i].computed = true;
    results_[i].lhs = {};
    results_[i].weights.reset();
  }
}

}  // namespace tpusim::hw::mxu

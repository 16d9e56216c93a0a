#include "hw/core/op_profile.h"

#include <algorithm>

namespace tpusim::hw {

namespace {

// Flow arrows per wait: a wait on a flag raised by many tile DMAs would otherwise
// draw a fan of hundreds of arrows into one point.
constexpr size_t kMaxFlowsPerWait = 8;

std::string op_label(int32_t id) { return id >= 0 ? "op " + std::to_string(id) : std::string("unmarked"); }

}  // namespace

const char* OpProfile::cause_name(Cause c) {
  switch (c) {
    case kCompute: return "compute";
    case kHbm: return "hbm";
    case kInfeed: return "infeed";
    case kSync: return "sync";
    default: return "?";
  }
}

// The DMA engines' rule (hw/dma): host space at the source and both ends on this
// chip goes through this chip's host link as an infeed.
bool OpProfile::is_infeed(const isa::Instr& in) const {
  const auto on_chip = [this](const isa::DmaEndpoint& e) { return e.chip < 0 || static_cast<uint32_t>(e.chip) == chip_; };
  return in.src.space == isa::Space::kHost && on_chip(in.src) && on_chip(in.dst);
}

void OpProfile::dma_issued(const isa::Instr& in, uint32_t chip) {
  chip_ = chip;
  if (in.flag < 0 || in.flag >= isa::kSyncFlags) return;
  const auto on_chip = [chip](const isa::DmaEndpoint& e) { return e.chip < 0 || static_cast<uint32_t>(e.chip) == chip; };
  const size_t f = static_cast<size_t>(in.flag);
  if (is_infeed(in)) ++infeed_pending_[f];
  // Host transfers never count as HBM waits: once an infeed has landed, a wait
  // still unsatisfied waits on something else, and an outfeed is not input.
  Cause c = kSync;
  const bool host = in.src.space == isa::Space::kHost || in.dst.space == isa::Space::kHost;
  if (!host && on_chip(in.src) && on_chip(in.dst) &&
      (in.src.space == isa::Space::kHbm || in.dst.space == isa::Space::kHbm))
    c = kHbm;
  flag_cause_[f] = c;
}

void OpProfile::matmul(int mxu, const isa::Instr& in, uint64_t macs, uint64_t begin, uint64_t end) {
  Op& o = at(in.op_id);
  o.macs += macs;
  const size_t m = static_cast<size_t>(mxu);
  if (m >= mxu_busy_until_.size()) mxu_busy_until_.resize(m + 1, 0);
  // Matmuls issue in order and pipeline: count only what extends the busy span.
  const uint64_t from = std::max(begin, mxu_busy_until_[m]);
  if (end > from) o.mxu_busy_cycles += end - from;
  mxu_busy_until_[m] = std::max(mxu_busy_until_[m], end);
  units_end_ = std::max(units_end_, end);
}

void OpProfile::vector(const isa::Instr& in, uint64_t begin, uint64_t end) {
  Op& o = at(in.op_id);
  ++o.vector_ops;
  const uint64_t from = std::max(begin, vpu_busy_until_);
  if (end > from) o.vpu_busy_cycles += end - from;
  vpu_busy_until_ = std::max(vpu_busy_until_, end);
  units_end_ = std::max(units_end_, end + 1);  // the result is written in cycle `end`
}

void OpProfile::dma_done(const isa::Instr& in, uint64_t hbm_bytes, uint64_t chip_hbm_bytes, uint64_t begin,
                         uint64_t end, timeline::TrackId track) {
  if (in.flag >= 0 && in.flag < isa::kSyncFlags && is_infeed(in) && infeed_pending_[static_cast<size_t>(in.flag)] > 0)
    --infeed_pending_[static_cast<size_t>(in.flag)];
  Op& o = at(in.op_id);
  o.hbm_bytes += hbm_bytes;
  o.dma_busy_cycles += end > begin ? end - begin : 0;
  units_end_ = std::max(units_end_, end + 1);  // data and flags land in cycle `end`
  // The chip's HBM bandwidth counter: every core's HBM transfers summed per window.
  if (tl_ && chip_hbm_bytes) tl_->rate(track, "HBM bandwidth (GB/s)", begin, end, double(chip_hbm_bytes), 1e-9);
  if (tl_ && in.flag >= 0 && in.flag < isa::kSyncFlags) {
    auto& src = flag_sources_[static_cast<size_t>(in.flag)];
    // A point strictly inside the transfer's slice [begin, end).
    if (src.size() < kMaxFlowsPerWait) src.push_back({track, end > begin ? end - 1 : begin});
  }
}

void OpProfile::attach_timeline(timeline::Timeline* tl, const std::string& process, const std::string& unit) {
  tl_ = tl;
  if (tl_) track_ = tl_->track(process, unit);
}

void OpProfile::timeline_issue(const isa::Instr& in, uint64_t cycle) {
  // One slice per op span: from the cycle after the previous op's last issue to
  // this op's last issue (so a wait at the head of an op lies inside its slice).
  if (!tl_open_ || in.op_id != tl_op_) {
    if (tl_open_) tl_->slice(track_, op_label(tl_op_), tl_begin_, tl_last_ + 1);
    tl_begin_ = tl_open_ ? tl_last_ + 1 : cycle;
    tl_op_ = in.op_id;
    tl_open_ = true;
  }
  tl_last_ = cycle;
  if ((in.op == isa::Op::kWait || in.op == isa::Op::kWaitSub) && in.a < isa::kSyncFlags) {
    auto& src = flag_sources_[in.a];
    for (const auto& [from_track, from_cycle] : src)
      tl_->flow(from_track, from_cycle, track_, cycle, "f" + std::to_string(in.a));
    src.clear();
  }
  if (in.op == isa::Op::kHalt) {
    tl_->slice(track_, op_label(tl_op_), tl_begin_, cycle + 1);
    tl_open_ = false;
  }
}

nlohmann::json OpProfile::to_json() const {
  nlohmann::json ops = nlohmann::json::array();
  std::array<uint64_t, kCauses> total{};
  uint64_t active = 0;
  const uint64_t drain = units_end_ > seq_end_ && seq_end_ > 0 ? units_end_ - seq_end_ : 0;
  for (const auto& [id, o] : ops_) {
    if (!o.seen) continue;
    nlohmann::json j;
    const uint64_t tail = id == cur_op_ ? drain : 0;
    j["id"] = id;
    j["cycles"] = o.cycles + tail;
    j["drain_cycles"] = tail;
    j["instructions"] = o.instructions;
    j["macs"] = o.macs;
    j["hbm_bytes"] = o.hbm_bytes;
    j["vector_ops"] = o.vector_ops;
    j["mxu_busy_cycles"] = o.mxu_busy_cycles;
    j["vpu_busy_cycles"] = o.vpu_busy_cycles;
    j["dma_busy_cycles"] = o.dma_busy_cycles;
    if (!o.wait_by_flag.empty()) {
      nlohmann::json w = nlohmann::json::object();
      for (const auto& [f, n] : o.wait_by_flag) w["f" + std::to_string(f)] = n;
      j["wait_cycles_by_flag"] = std::move(w);
    }
    if (!o.stream_wait.empty()) {
      nlohmann::json w = nlohmann::json::object();
      for (const auto& [sf, n] : o.stream_wait) w["s" + std::to_string(sf.first) + ".f" + std::to_string(sf.second)] = n;
      j["wait_cycles_by_stream_flag"] = std::move(w);
    }
    std::array<uint64_t, kCauses> stall = o.stall;
    // Infeed waits the flag's cause could not see (another core's infeed on our rflag).
    if (o.host_infeed > stall[kInfeed]) {
      for (const Cause from : {kSync, kHbm}) {
        const uint64_t moved = std::min(o.host_infeed - stall[kInfeed], stall[from]);
        stall[from] -= moved;
        stall[kInfeed] += moved;
      }
    }
    for (int c = 0; c < kCauses; ++c) {
      j[std::string("stall_") + cause_name(static_cast<Cause>(c)) + "_cycles"] = stall[static_cast<size_t>(c)];
      total[static_cast<size_t>(c)] += stall[static_cast<size_t>(c)];
    }
    active += o.cycles + tail;
    ops.push_back(std::move(j));
  }
  nlohmann::json stall = nlohmann::json::object();
  for (int c = 0; c < kCauses; ++c) stall[cause_name(static_cast<Cause>(c))] = total[static_cast<size_t>(c)];
  return {{"ops", ops}, {"stall_cycles", stall}, {"active_cycles", active}};
}

}  // namespace tpusim::hw

// HBM behind the memory-port interface: every pseudo-channel of every stack, the
// splitting of requests into bursts, and the request completions.
//
// Two ways to move time, one result (tests hold them equal):
//  * tick(): one DRAM cycle, every channel evaluated (the detailed mode);
//  * skip(n) / advance_to(t): n cycles, evaluating only the channels that can act,
//    jumping over cycles in which none can (the fast mode). skip(n) == n x tick().
#pragma once

#include "hw/hbm/hbm_channel.h"
#include "hw/hbm/hbm_config.h"
#include "hw/mem/latency_histogram.h"
#include "hw/mem/memory_port.h"

#include <queue>
#include <vector>

namespace tpusim::hbm {

class HbmMemory final : public mem::MemoryPort {
 public:
  explicit HbmMemory(const HbmConfig& cfg);
  HbmMemory(const HbmMemory&) = delete;  // channels point at cfg_
  HbmMemory& operator=(const HbmMemory&) = delete;

  // MemoryPort. try_enqueue throws std::invalid_argument on an empty request or one
  // that runs past the capacity.
  bool try_enqueue(const mem::MemRequest& req, uint64_t now_ps) override;
  void advance_to(uint64_t t_ps) override;
  uint64_t next_event_ps() const override;
  bool pop_completion(mem::MemCompletion& out) override;
  uint64_t outstanding() const override { return outstanding_; }
  double peak_bytes_per_s() const override { return cfg_.peak_bytes_per_s(); }
  nlohmann::json stats_json() const override;
  // Every kTimelineIntervalCycles DRAM cycles (or sample_interval_cycles when set),
  // each pseudo-channel's bandwidth (GB/s) and queued bursts over the interval
  // before, as counters "hbm.chN GB/s" and "hbm.chN queued" on track "hbm.chN";
  // a counter is written only when its value changes, so idle channels cost nothing.
  void set_timeline(timeline::Timeline* tl, const std::string& process, uint64_t cycle_ps) override;
  static constexpr uint64_t kTimelineIntervalCycles = 1024;
  // Channel samples (sample_interval_cycles) kept per pseudo-channel: at the cap the
  // interval doubles and every other sample goes, so a long run or a short interval
  // still spans the whole run in bounded memory (an interval of 3 cycles on a v3-8
  // training step was killed for memory). stats_json() reports the interval used.
  static constexpr size_t kMaxSamplesPerChannel = 1024;

  // The unit-core view, in DRAM cycles.
  void tick();
  void skip(uint64_t cycles);
  uint64_t cycle() const { return next_cycle_; }  // cycles processed so far
  // The earliest cycle >= cycle() at which any channel, idle or not, may act.
  uint64_t next_active_cycle() const;
  // Detailed mode: advance_to() and try_enqueue() tick every cycle instead of skipping.
  void set_every_cycle(bool on) { every_cycle_ = on; }

  const HbmConfig& config() const { return cfg_; }
  const ClockConversion& clock() const { return clock_; }
  const HbmChannel& channel(uint32_t i) const { return channels_[i]; }
  HbmChannel& channel(uint32_t i) { return channels_[i]; }
  uint32_t channel_count() const { return uint32_t(channels_.size()); }
  const mem::LatencyHistogram& request_latency_ps() const { return request_latency_ps_; }

 private:
  struct Slot {
    uint64_t id;
    uint64_t enqueue_ps;
    uint64_t last_end_cycle;
    uint32_t remaining;
    uint32_t source;
    bool is_write;
  };
  struct Later {
    bool operator()(const mem::MemCompletion& a, const mem::MemCompletion& b) const {
      return a.done_ps != b.done_ps ? a.done_ps > b.done_ps : a.id > b.id;
    }
  };
  void run_cycle(uint64_t c, bool all_channels);
  void advance_cycles_to(uint64_t end_cycle);  // process cycles < end_cycle
  void take_samples_until(uint64_t c);         // boundaries <= c not yet sampled
  void finish_bursts();
  void timeline_until(uint64_t c);  // interval boundaries <= c not yet recorded

  HbmConfig cfg_;
  ClockConversion clock_;
  std::vector<HbmChannel> channels_;
  uint64_t next_cycle_ = 0;
  uint64_t now_ps_ = 0;
  uint64_t next_sample_ = 0;
  uint64_t sample_interval_ = 0;  // sample_interval_cycles, doubled at each coarsening
  bool every_cycle_ = false;

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<uint32_t> bursts_per_channel_;  // scratch for try_enqueue
  // Bursts per channel of the last request looked at: a requester retrying after
  // back-pressure offers the same request again, and decoding it every time was
  // most of the simulation time.
  uint64_t memo_addr_ = 0, memo_bytes_ = 0;
  std::vector<std::pair<uint32_t, uint32_t>> memo_counts_;
  std::vector<DecodedAddress> memo_bursts_;
  BurstDecoder decoder_;
  std::vector<BurstDone> done_;
  std::priority_queue<mem::MemCompletion, std::vector<mem::MemCompletion>, Later> completions_;
  uint64_t outstanding_ = 0;

  struct TimelineChannel {
    uint32_t track = 0;
    std::string bw_name, queued_name;
    uint64_t bursts_before = 0;
    double last_bw = 0;
    uint64_t last_queued = 0;
  };
  timeline::Timeline* tl_ = nullptr;
  uint64_t tl_cycle_ps_ = 1;
  uint64_t tl_interval_ = 0;
  uint64_t tl_next_ = 0;  // next boundary to record
  uint64_t tl_bursts_seen_ = 0;  // all channels' bursts at the last boundary
  uint32_t tl_nonzero_ = 0;      // channels whose last written counters are not both 0
  std::vector<TimelineChannel> tl_channels_;

  uint64_t requests_read_ = 0, requests_write_ = 0, bytes_read_ = 0, bytes_written_ = 0, rejected_ = 0;
  mem::LatencyHistogram request_latency_ps_;
};

}  // namespace tpusim::hbm

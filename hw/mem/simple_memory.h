// The placeholder memory: a fixed latency behind one bandwidth-limited pipe. A request
// occupies the pipe for bytes / bandwidth, queued behind the ones before it, and
// completes `latency_ps` after it leaves the pipe. Enough for a TensorCore model
// to run before (or instead of) the HBM controller.
#pragma once

#include "hw/mem/latency_histogram.h"
#include "hw/mem/memory_port.h"

#include <queue>
#include <vector>

namespace tpusim::mem {

struct SimpleMemoryConfig {
  uint64_t latency_ps = 100000;
  double bytes_per_s = 900e9;
  uint32_t max_outstanding = 256;  // back-pressure beyond this many requests in flight

  // The most bytes/s requests of `request_bytes` can get through, by Little's law:
  // a request is counted from its entry until it completes, at least its own
  // pipe time plus the latency, so at most max_outstanding x request_bytes per
  // that time, and never more than bytes_per_s. With the defaults and 512 B
  // requests that is 1.31e12 B/s however high bytes_per_s is set.
  double sustained_bytes_per_s(uint32_t request_bytes) const;
  // The fewest requests in flight that carry bytes_per_s with requests of
  // `request_bytes`: Little's law, N x request_bytes >= bytes_per_s x (latency +
  // request_bytes / bytes_per_s).
  uint32_t outstanding_for_peak(uint32_t request_bytes) const;

  // The memory of a preset without an HBM timing table (no `hbm.model`): a pipe at
  // `bytes_per_s` with the default latency and enough requests of `request_bytes`
  // in flight to carry that rate (at least the default 256).
  static SimpleMemoryConfig peak_pipe(double bytes_per_s, uint32_t request_bytes);
};

class SimpleMemory final : public MemoryPort {
 public:
  explicit SimpleMemory(const SimpleMemoryConfig& cfg);
  bool try_enqueue(const MemRequest& req, uint64_t now_ps) override;
  void advance_to(uint64_t t_ps) override;
  uint64_t next_event_ps() const override;
  bool pop_completion(MemCompletion& out) override;
  uint64_t outstanding() const override { return outstanding_; }
  double peak_bytes_per_s() const override { return cfg_.bytes_per_s; }
  nlohmann::json stats_json() const override;

 private:
  struct Later {
    bool operator()(const MemCompletion& a, const MemCompletion& b) const {
      return a.done_ps != b.done_ps ? a.done_ps > b.done_ps : a.id > b.id;
    }
  };
  SimpleMemoryConfig cfg_;
  uint64_t now_ps_ = 0;
  uint64_t pipe_free_ps_ = 0;
  uint64_t outstanding_ = 0;
  std::priority_queue<MemCompletion, std::vector<MemCompletion>, Later> pending_;
  uint64_t reads_ = 0, writes_ = 0, bytes_ = 0, rejected_ = 0;
  LatencyHistogram latency_ns_;
};

}  // namespace tpusim::mem

#include "hw/hbm/traffic.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <unordered_map>

namespace tpusim::hbm {

Pattern parse_pattern(const std::string& name) {
  std::string known;
  for (Pattern p : kAllPatterns) {
    if (name == pattern_name(p)) return p;
    known += (known.empty() ? "" : ", ") + std::string(pattern_name(p));
  }
  throw std::invalid_argument("unknown traffic pattern '" + name + "' (known: " + known + ")");
}

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kSequential: return "sequential";
    case Pattern::kStrided: return "strided";
    case Pattern::kRandomRead: return "random_read";
    case Pattern::kRandomWrite: return "random_write";
    case Pattern::kMix: return "mix";
    case Pattern::kStreams: return "streams";
  }
  return "?";
}

TrafficSpec TrafficSpec::defaults(Pattern p, uint64_t requests) {
  TrafficSpec s;
  s.pattern = p;
  s.requests = requests;
  switch (p) {
    case Pattern::kSequential:
    case Pattern::kMix: s.request_bytes = 4096; break;
    case Pattern::kStrided: s.request_bytes = 512, s.stride_bytes = 16384; break;
    case Pattern::kRandomRead:
    case Pattern::kRandomWrite: s.request_bytes = 64; break;
    case Pattern::kStreams: s.request_bytes = 512; break;
  }
  return s;
}

TrafficResult run_traffic(mem::MemoryPort& port, const TrafficSpec& spec, uint64_t capacity_bytes, uint64_t start_ps,
                          bool keep_completions) {
  const uint64_t region = spec.region_bytes ? std::min(spec.region_bytes, capacity_bytes) : capacity_bytes;
  if (spec.request_bytes == 0 || spec.request_bytes > region)
    throw std::invalid_argument("traffic: request_bytes must be in 1..region");
  if (spec.pattern == Pattern::kStreams && (spec.streams == 0 || spec.transfer_bytes < spec.request_bytes ||
                                            spec.transfer_bytes % spec.request_bytes || spec.transfer_bytes > region))
    throw std::invalid_argument("traffic: streams needs streams > 0 and transfer_bytes a multiple of request_bytes "
                                "within the region");
  std::mt19937_64 rng(spec.seed);
  const uint64_t slots = region / spec.request_bytes;
  // streams: where each stream's current transfer starts, drawn as the stream begins
  // it (in the run's order of offers, which the port decides, so deterministic).
  std::vector<uint64_t> transfer_start(spec.pattern == Pattern::kStreams ? spec.streams : 0);
  const uint64_t beats = spec.pattern == Pattern::kStreams ? spec.transfer_bytes / spec.request_bytes : 1;
  // streams: beats made so far by each stream (its next beat's index overall).
  std::vector<uint64_t> stream_beats(transfer_start.size(), 0);
  auto make = [&](uint64_t i, uint32_t stream) {
    mem::MemRequest r;
    r.id = i;
    r.bytes = spec.request_bytes;
    switch (spec.pattern) {
      case Pattern::kSequential: r.addr = (i % slots) * spec.request_bytes; break;
      case Pattern::kStrided: r.addr = (i * spec.stride_bytes) % (region - spec.request_bytes + 1); break;
      case Pattern::kRandomRead:
      case Pattern::kRandomWrite: r.addr = (rng() % slots) * spec.request_bytes; break;
      case Pattern::kMix: {
        // A copy-like stream: reads walk the lower half, writes the upper half.
        const uint64_t half = std::max<uint64_t>(1, slots / 2);
        r.is_write = (i % 8) < spec.writes_per_8;
        r.addr = ((i % half) + (r.is_write ? half : 0)) * spec.request_bytes;
        break;
      }
      case Pattern::kStreams: {
        const uint32_t s = stream;
        const uint64_t beat = stream_beats[s]++ % beats;
        if (beat == 0) transfer_start[s] = (rng() % ((region - spec.transfer_bytes) / 64 + 1)) * 64;
        r.addr = transfer_start[s] + beat * spec.request_bytes;
        // Writers spread over every run of streams (3 of 8: streams 0, 3, 6), so
        // two streams are a copy and four two of each.
        r.is_write = (s * spec.writes_per_8) % 8 < spec.writes_per_8;
        r.source = s;
        break;
      }
    }
    r.is_write = r.is_write || spec.pattern == Pattern::kRandomWrite;
    return r;
  };

  TrafficResult res;
  res.start_ps = start_ps;
  std::unordered_map<uint64_t, uint64_t> issued_at;
  issued_at.reserve(spec.max_outstanding * 2);
  uint64_t now = start_ps, next = 0;
  // Requests are offered in order from one queue; the streams pattern has a queue a
  // stream, each going on while another is pushed back, as a core's DMA engines do
  // (hw/dma): with one queue for all, the first stream refused stopped the others.
  const uint32_t queues = spec.pattern == Pattern::kStreams ? spec.streams : 1;
  std::vector<mem::MemRequest> pending;
  for (uint32_t q = 0; q < queues && next < spec.requests; ++q) pending.push_back(make(next++, q));
  std::vector<bool> has_pending(pending.size(), true);
  uint32_t first_queue = 0;  // round robin: who offers first moves on by one each time
  while (res.requests < spec.requests) {
    for (bool offered = true; offered;) {  // a request from each queue in turn while any goes in
      offered = false;
      for (uint32_t k = 0; k < pending.size() && issued_at.size() < spec.max_outstanding; ++k) {
        const uint32_t q = (first_queue + k) % uint32_t(pending.size());
        if (!has_pending[q] || !port.try_enqueue(pending[q], now)) continue;
        issued_at.emplace(pending[q].id, now);
        offered = true;
        has_pending[q] = next < spec.requests;
        if (has_pending[q]) pending[q] = make(next++, q);
      }
    }
    first_queue = (first_queue + 1) % std::max<uint32_t>(1, uint32_t(pending.size()));
    const uint64_t t = port.next_event_ps();
    if (t == mem::kNever) throw std::logic_error("traffic: the port has no next event but requests are outstanding");
    now = t;
    port.advance_to(now);
    mem::MemCompletion c;
    while (port.pop_completion(c)) {
      auto it = issued_at.find(c.id);
      if (it == issued_at.end()) throw std::logic_error("traffic: completion for an unknown request");
      res.latency_ns.add((c.done_ps - it->second) / 1000);
      issued_at.erase(it);
      ++res.requests;
      res.bytes += spec.request_bytes;
      res.end_ps = std::max(res.end_ps, c.done_ps);
      if (keep_completions) res.completions.push_back(c);
    }
  }
  const double seconds = double(res.end_ps - res.start_ps) * 1e-12;
  res.bytes_per_s = seconds > 0 ? double(res.bytes) / seconds : 0;
  res.fraction_of_peak = res.bytes_per_s / port.peak_bytes_per_s();
  return res;
}

}  // namespace tpusim::hbm

// Synthetic traffic for any MemoryPort: the patterns the HBM acceptance numbers are
// measured with (docs/validation.md). A closed loop: requests are offered as fast
// as the port accepts them (up to max_outstanding), and time moves to the port's
// next event whenever it pushes back. Deterministic: mt19937_64 is specified bit
// for bit by the standard, and addresses are taken from it without a distribution.
#pragma once

#include "hw/mem/latency_histogram.h"
#include "hw/mem/memory_port.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tpusim::hbm {

enum class Pattern { kSequential, kStrided, kRandomRead, kRandomWrite, kMix, kStreams };
// Every pattern, in the order tools list and run them.
inline constexpr Pattern kAllPatterns[] = {Pattern::kSequential, Pattern::kStrided, Pattern::kRandomRead,
                                           Pattern::kRandomWrite, Pattern::kMix,     Pattern::kStreams};
// "sequential", "strided", "random_read", "random_write", "mix", "streams"; throws on
// others.
Pattern parse_pattern(const std::string& name);
const char* pattern_name(Pattern p);

struct TrafficSpec {
  Pattern pattern = Pattern::kSequential;
  uint32_t request_bytes = 4096;
  uint64_t stride_bytes = 16384;     // strided: distance between request starts
  uint32_t writes_per_8 = 3;         // mix: of every 8 requests, this many are writes;
                                     // streams: of every 8 streams, this many write
                                     // (spread: 3 of 8 are streams 0, 3, 6)
  // streams: this many DMA-like streams at once, each offering its own requests in
  // order, in turn with the others; a stream the port pushes back does not hold up
  // the rest (as a core's DMA engines, hw/dma). Each moves transfers of
  // transfer_bytes (request_bytes at a time) from random 64 B-aligned starts, as a
  // collective's pieces do.
  uint32_t streams = 8;
  uint64_t transfer_bytes = 87552;
  uint64_t requests = 10000;
  uint32_t max_outstanding = 1u << 16;  // the port's back-pressure is the real limit
  uint64_t region_bytes = 0;         // 0 = the whole capacity
  uint64_t seed = 1;
  // Typical DMA sizes and strides per pattern (sequential and mix: 4 KiB; strided:
  // 512 B every 16 KiB; random: 64 B; streams: 512 B beats of 85.5 KiB transfers).
  static TrafficSpec defaults(Pattern p, uint64_t requests);
};

struct TrafficResult {
  uint64_t requests = 0;
  uint64_t bytes = 0;
  uint64_t start_ps = 0, end_ps = 0;  // first offer, last completion
  double bytes_per_s = 0;
  double fraction_of_peak = 0;
  mem::LatencyHistogram latency_ns;
  std::vector<mem::MemCompletion> completions;  // in the order popped, if kept
};

// Runs `spec` from time `start_ps`; `capacity_bytes` bounds the addresses.
TrafficResult run_traffic(mem::MemoryPort& port, const TrafficSpec& spec, uint64_t capacity_bytes,
                          uint64_t start_ps = 0, bool keep_completions = false);

}  // namespace tpusim::hbm

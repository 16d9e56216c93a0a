// A latency histogram with bounded memory and bounded relative error: values below
// 2^kExactBits are counted exactly; above, each power-of-two octave is split into
// 2^kSubBits equal bins, so a percentile is off by less than 1/2^kSubBits (3%).
// The mean is exact (sum / count).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace tpusim::mem {

class LatencyHistogram {
 public:
  static constexpr int kExactBits = 8;
  static constexpr int kSubBits = 5;

  void add(uint64_t v) {
    const size_t b = bin_of(v);
    if (b >= bins_.size()) bins_.resize(b + 1, 0);
    ++bins_[b];
    ++count_;
    sum_ += v;
    if (v > max_) max_ = v;
  }
  void merge(const LatencyHistogram& o) {
    if (o.bins_.size() > bins_.size()) bins_.resize(o.bins_.size(), 0);
    for (size_t i = 0; i < o.bins_.size(); ++i) bins_[i] += o.bins_[i];
    count_ += o.count_;
    sum_ += o.sum_;
    if (o.max_ > max_) max_ = o.max_;
  }
  uint64_t count() const { return count_; }
  double mean() const { return count_ ? double(sum_) / double(count_) : 0.0; }
  uint64_t max() const { return max_; }
  // The smallest bin lower bound below which at least q of the values lie.
  uint64_t percentile(double q) const {
    if (count_ == 0) return 0;
    const double need = q * double(count_);
    uint64_t seen = 0;
    for (size_t b = 0; b < bins_.size(); ++b) {
      seen += bins_[b];
      if (double(seen) >= need && seen > 0) return lower_bound_of(b);
    }
    return max_;
  }
  nlohmann::json to_json() const {
    return {{"count", count_}, {"mean", mean()}, {"p50", percentile(0.5)}, {"p99", percentile(0.99)},
            {"max", max_}};
  }

 private:
  static size_t bin_of(uint64_t v) {
    if (v < (uint64_t(1) << kExactBits)) return size_t(v);
    const int msb = 63 - __builtin_clzll(v);
    const uint64_t sub = (v >> (msb - kSubBits)) & ((uint64_t(1) << kSubBits) - 1);
    return (size_t(1) << kExactBits) + size_t(msb - kExactBits) * (size_t(1) << kSubBits) + size_t(sub);
  }
  static uint64_t lower_bound_of(size_t b) {
    if (b < (size_t(1) << kExactBits)) return b;
    const size_t r = b - (size_t(1) << kExactBits);
    const int msb = int(r >> kSubBits) + kExactBits;
    const uint64_t sub = r & ((size_t(1) << kSubBits) - 1);
    return (uint64_t(1) << msb) | (sub << (msb - kSubBits));
  }
  std::vector<uint64_t> bins_;
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t max_ = 0;
};

}  // namespace tpusim::mem

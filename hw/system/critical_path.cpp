#include "hw/system/critical_path.h"

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <utility>

namespace tpusim::hw {

namespace {

enum Cause { kIssue, kUnitQueue, kDrain, kDmaQueue, kHbm, kCoreToCore, kIci, kHost, kBarrier, kCauses };
constexpr const char* kCauseNames[kCauses] = {"issue", "unit_queue", "drain",  "dma_queue", "hbm",
                                              "core_to_core", "ici", "host", "barrier"};

Cause transfer_cause(PathLog::DmaKind k) {
  switch (k) {
    case PathLog::DmaKind::kCoreToCore: return kCoreToCore;
    case PathLog::DmaKind::kIci: return kIci;
    case PathLog::DmaKind::kHost: return kHost;
    case PathLog::DmaKind::kHbm: break;
  }
  return kHbm;
}

Cause stall_cause(PathLog::Stall s) {
  switch (s) {
    case PathLog::Stall::kDmaQueue: return kDmaQueue;
    case PathLog::Stall::kDrain: return kDrain;
    case PathLog::Stall::kUnitQueue: break;
  }
  return kUnitQueue;
}

struct Segment {
  int32_t core;
  uint64_t begin, end;
  Cause cause;
  int32_t op;
  int64_t pc;  // the DMA or wait instruction it is the time of; -1: the core's own time
};

// A binding event of a stream: a wait (index into waits) or a barrier (into
// barriers), at the cycle it passed or was released.
struct Binding {
  uint64_t at;
  bool barrier;
  uint32_t index;
};

class Walker {
 public:
  explicit Walker(const PathLogs& logs) : logs_(logs), binding_(logs.cores.size()) {
    // The last arrival at each barrier generation (the lowest core among equals).
    for (const PathLog& l : logs_.cores)
      for (const PathLog::Barrier& b : l.barriers) {
        auto it = last_.find(b.generation);
        if (it == last_.end() || b.arrived > it->second.first) last_[b.generation] = {b.arrived, l.id};
      }
    for (const PathLog& l : logs_.cores) {
      auto& per = binding_[static_cast<size_t>(l.id)];
      for (uint32_t i = 0; i < l.waits.size(); ++i) {
        const PathLog::Wait& w = l.waits[i];
        // Binding: the last raise came after the stream reached the wait, from a
        // DMA, or from an fset / fadd of another stream of this core.
        const bool by_dma = w.by.core >= 0 && w.by.dma != PathLog::kBySelf;
        const bool by_stream = w.by.core == l.id && w.by.dma == PathLog::kBySelf && w.by.stream != w.stream;
        if ((by_dma || by_stream) && w.by.at >= w.reached) per[w.stream].push_back({w.passed, false, i});
      }
      for (uint32_t i = 0; i < l.barriers.size(); ++i) {
        const PathLog::Barrier& b = l.barriers[i];
        if (b.released != UINT64_MAX && last_.at(b.generation).second != l.id) per[0].push_back({b.released, true, i});
      }
      for (auto& v : per)
        std::stable_sort(v.begin(), v.end(), [](const Binding& a, const Binding& b) { return a.at < b.at; });
    }
  }

  nlohmann::json walk(const std::vector<uint64_t>& ends) {
    int32_t c = 0;
    for (size_t i = 0; i < ends.size(); ++i)
      if (ends[i] > ends[static_cast<size_t>(c)]) c = static_cast<int32_t>(i);
    const uint64_t end = ends.empty() ? 0 : ends[static_cast<size_t>(c)];
    const int32_t last_core = c;
    uint8_t s = 0;
    uint64_t t = end;
    int32_t op = -1;  // the op of the event the walk reached t by
    uint64_t dma_hops = 0, barrier_hops = 0;
    size_t budget = 16;  // every step consumes one binding event or ends the walk
    for (const PathLog& l : logs_.cores) budget += l.waits.size() + l.barriers.size() + l.forks.size();
    // A core that ends draining a DMA nobody waited for (a push's completion on
    // its way back, a last store) ends on that DMA.
    const PathLog& lc = logs_.cores[static_cast<size_t>(c)];
    // The walk starts on the stream that issued last: a forked stream may outlive
    // stream 0 (which may halt without joining it).
    for (size_t k = 1; k < lc.reached.size(); ++k)
      if (lc.reached[k] > lc.reached[s]) s = static_cast<uint8_t>(k);
    const PathLog::Dma* tail = nullptr;
    for (const PathLog::Dma& d : lc.dmas)
      if (!tail || d.done > tail->done) tail = &d;
    const uint64_t last_wait = lc.waits.empty() ? 0 : lc.waits.back().passed;
    if (tail && tail->done + 1 >= end && tail->done > last_wait) {
      add(c, tail->done, end, kIssue, tail->op);
      add(c, tail->started, tail->done, transfer_cause(tail->kind), tail->op, tail->pc);
      add(c, tail->issued, tail->started, kDmaQueue, tail->op, tail->pc);
      ++dma_hops;
      s = tail->stream, t = tail->issued, op = tail->op;
    }
    bool at_start = false;
    while (!at_start && budget-- > 0) {
      const PathLog& l = logs_.cores[static_cast<size_t>(c)];
      const auto& v = binding_[static_cast<size_t>(c)][s];
      auto it = std::upper_bound(v.begin(), v.end(), t, [](uint64_t x, const Binding& b) { return x < b.at; });
      const Binding* rec = it == v.begin() ? nullptr : &*(it - 1);
      // A forked stream began at its latest fork at or before t.
      uint64_t fork = 0;
      bool forked = false;
      if (s > 0)
        for (const auto& [at, stream] : l.forks)
          if (stream == s && at <= t) fork = at, forked = true;
      if (rec && (s == 0 || rec->at >= fork)) {
        if (rec->barrier) {
          const PathLog::Barrier& b = l.barriers[rec->index];
          if (op < 0) op = b.op;
          core_time(c, rec->at, t, op);
          const auto& [arrived, who] = last_.at(b.generation);
          add(c, arrived, rec->at, kBarrier, b.op);
          ++barrier_hops;
          c = who, s = 0, t = arrived, op = b.op;
          continue;
        }
        const PathLog::Wait& w = l.waits[rec->index];
        if (op < 0) op = w.op;
        core_time(c, rec->at, t, op);
        add(c, w.by.at, w.passed, kIssue, w.op, w.pc);  // the raise to the pass: a cycle or so
        if (w.by.dma == PathLog::kBySelf) {
          s = w.by.stream, t = w.by.at, op = w.op;
          continue;
        }
        const PathLog::Dma& d = logs_.cores[static_cast<size_t>(w.by.core)].dmas[w.by.dma];
        add(w.by.core, d.started, w.by.at, transfer_cause(d.kind), d.op, d.pc);
        add(w.by.core, d.issued, d.started, kDmaQueue, d.op, d.pc);
        ++dma_hops;
        c = w.by.core, s = d.stream, t = d.issued, op = d.op;
        continue;
      }
      if (forked) {
        core_time(c, fork, t, op);
        s = 0, t = fork;
        continue;
      }
      at_start = true;
    }
    // The core's own time back to cycle 0 (also if the budget ran out: the
    // segments tile [0, end] whatever happens).
    core_time(c, 0, t, op);
    return document(end, last_core, dma_hops, barrier_hops);
  }

 private:
  void add(int32_t core, uint64_t begin, uint64_t end, Cause cause, int32_t op, int64_t pc = -1) {
    if (end > begin) segments_.push_back({core, begin, end, cause, op, pc});
  }
  // [a, b) of core c: its stalls on full queues and drains by their cause, the rest
  // "issue". Added from the end back, as the walk goes.
  void core_time(int32_t c, uint64_t a, uint64_t b, int32_t op) {
    const auto& st = logs_.cores[static_cast<size_t>(c)].stalls;
    auto it = std::upper_bound(st.begin(), st.end(), b, [](uint64_t x, const PathLog::StallRun& r) { return x < r.begin; });
    uint64_t hi = b;
    while (it != st.begin() && hi > a) {
      --it;
      if (it->end <= a) break;
      const uint64_t lo = std::max(a, it->begin), top = std::min(hi, it->end);
      if (top < hi) add(c, top, hi, kIssue, op);
      add(c, lo, top, stall_cause(it->why), op);
      hi = std::min(hi, lo);
    }
    add(c, a, hi, kIssue, op);
  }
  std::string name(int32_t core) const {
    const uint32_t k = logs_.cores_per_chip;
    return "chip" + std::to_string(static_cast<uint32_t>(core) / k) + ".core" + std::to_string(static_cast<uint32_t>(core) % k);
  }
  nlohmann::json document(uint64_t end, int32_t last_core, uint64_t dma_hops, uint64_t barrier_hops) {
    std::reverse(segments_.begin(), segments_.end());  // ascending time
    std::array<uint64_t, kCauses> total{};
    std::map<int32_t, std::array<uint64_t, kCauses>> by_op;
    nlohmann::json segs = nlohmann::json::array();
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& g = segments_[i];
      total[g.cause] += g.end - g.begin;
      by_op[g.op][g.cause] += g.end - g.begin;
      // Neighbours of one core, cause, op and instruction are one segment in the list.
      if (i > 0) {
        const Segment& p = segments_[i - 1];
        if (p.core == g.core && p.cause == g.cause && p.op == g.op && p.pc == g.pc && p.end == g.begin) {
          segs.back()["end"] = g.end;
          continue;
        }
      }
      segs.push_back({{"core", name(g.core)}, {"begin", g.begin}, {"end", g.end}, {"cause", kCauseNames[g.cause]},
                      {"op", g.op}});
      if (g.pc >= 0) segs.back()["pc"] = g.pc;
    }
    auto causes = [](const std::array<uint64_t, kCauses>& a) {
      nlohmann::json j = nlohmann::json::object();
      for (int k = 0; k < kCauses; ++k)
        if (a[static_cast<size_t>(k)] > 0) j[kCauseNames[k]] = a[static_cast<size_t>(k)];
      return j;
    };
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& [op, a] : by_op) ops[std::to_string(op)] = causes(a);
    return {{"cycles", end},
            {"ends_on", name(last_core)},
            {"by_cause", causes(total)},
            {"by_op", ops},
            {"dma_hops", dma_hops},
            {"barrier_hops", barrier_hops},
            {"segments", segs}};
  }

  const PathLogs& logs_;
  std::vector<std::array<std::vector<Binding>, isa::kStreams>> binding_;  // [core][stream], ascending
  std::map<uint64_t, std::pair<uint64_t, int32_t>> last_;                 // generation -> (arrival, core)
  std::vector<Segment> segments_;                                         // as walked: descending time
};

}  // namespace

nlohmann::json walk_critical_path(const PathLogs& logs, const std::vector<uint64_t>& ends) {
  return Walker(logs).walk(ends);
}

}  // namespace tpusim::hw

// Per-register scoreboard shared by the vector and matrix units. Accesses are
// reserved in program order when the sequencer issues an instruction into a unit
// queue, so two decoupled units still see sequential semantics: an access may go
// ahead only when no earlier instruction still has a conflicting access pending
// (RAW: an earlier write; WAR/WAW: any earlier access).
#pragma once

#include <array>
#include <cstdint>
#include <deque>

#include "hw/core/reg_use.h"

namespace tpusim::hw {

class Scoreboard {
 public:
  void reserve(const RegUse& u, uint64_t seq) {
    for (int i = 0; i < u.nreads; ++i) add(u.reads[i], seq, false);
    for (int i = 0; i < u.nwrites; ++i) add(u.writes[i], seq, true);
    ++version_;
  }
  // May instruction `seq` perform its accesses now?
  bool ready(const RegUse& u, uint64_t seq) const {
    for (int i = 0; i < u.nreads; ++i) {
      // A register every MXU's mmul reads has many reads pending and seldom a write.
      if (writes_[u.reads[i]] == 0) continue;
      for (const Access& a : pending_[u.reads[i]]) {
        if (a.seq >= seq) break;
        if (a.write) return false;
      }
    }
    for (int i = 0; i < u.nwrites; ++i) {
      const auto& q = pending_[u.writes[i]];
      if (!q.empty() && q.front().seq < seq) return false;
    }
    return true;
  }
  // Retires every access of instruction `seq`.
  void release(const RegUse& u, uint64_t seq) {
    for (int i = 0; i < u.nreads; ++i) drop(u.reads[i], seq);
    for (int i = 0; i < u.nwrites; ++i) drop(u.writes[i], seq);
    ++version_;
  }
  // Changes whenever an access is reserved or retired: a unit may keep a ready()
  // answer while it is unchanged.
  uint64_t version() const { return version_; }
  bool empty() const {
    for (const auto& q : pending_)
      if (!q.empty()) return false;
    return true;
  }

 private:
  // An access retired out of order stays in place, marked (and no longer a
  // write), until those before it retire: erasing from the middle of the deque
  // moved its neighbours on every mmul of a stream. The front is always live.
  struct Access {
    uint64_t seq;
    bool write;
    bool retired = false;
  };
  void add(int r, uint64_t seq, bool write) {
    pending_[static_cast<size_t>(r)].push_back({seq, write});
    writes_[static_cast<size_t>(r)] += write;
  }
  void drop(int r, uint64_t seq) {
    auto& q = pending_[static_cast<size_t>(r)];
    for (auto it = q.begin(); it != q.end(); ++it)
      if (it->seq == seq && !it->retired) {
        writes_[static_cast<size_t>(r)] -= it->write;
        it->write = false;
        it->retired = true;
        while (!q.empty() && q.front().retired) q.pop_front();
        return;
      }
  }
  std::array<std::deque<Access>, kScoreboardRegs> pending_;
  std::array<uint32_t, kScoreboardRegs> writes_{};  // writes among pending_[r]
  uint64_t version_ = 0;
};

}  // namespace tpusim::hw

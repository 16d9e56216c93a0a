// Per-register scoreboard shared by the vector and matrix units. Accesses are
// reserved in program order when the sequencer issues an instruction into a unit
// queue, so two decoupled units still see sequential semantics: an access may go
// ahead only when no earlier instruction still has a conflicting access pending
// (RAW: an earlier write; WAR/WAW: any earlier access).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

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
      const AccessQueue& q = pending_[u.reads[i]];
      for (size_t k = 0; k < q.size(); ++k) {
        const Access& a = q[k];
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
  // A ring per register (was a std::deque, whose node allocations and pointer
  // chasing showed in every vld/vadd/vst of a pod-scale run).
  class AccessQueue {
   public:
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    const Access& front() const { return buf_[head_]; }
    const Access& operator[](size_t k) const { return buf_[(head_ + k) & (buf_.size() - 1)]; }
    Access& operator[](size_t k) { return buf_[(head_ + k) & (buf_.size() - 1)]; }
    void push_back(const Access& a) {
      if (n_ == buf_.size()) grow();
      buf_[(head_ + n_) & (buf_.size() - 1)] = a;
      ++n_;
    }
    void pop_front() {
      head_ = (head_ + 1) & (buf_.size() - 1);
      --n_;
    }

   private:
    void grow() {
      std::vector<Access> b(buf_.empty() ? 8 : buf_.size() * 2);
      for (size_t k = 0; k < n_; ++k) b[k] = (*this)[k];
      buf_.swap(b);
      head_ = 0;
    }
    std::vector<Access> buf_;  // size a power of two
    size_t head_ = 0, n_ = 0;
  };
  void add(int r, uint64_t seq, bool write) {
    pending_[static_cast<size_t>(r)].push_back({seq, write});
    writes_[static_cast<size_t>(r)] += write;
  }
  void drop(int r, uint64_t seq) {
    auto& q = pending_[static_cast<size_t>(r)];
    for (size_t k = 0; k < q.size(); ++k) {
      Access& a = q[k];
      if (a.seq == seq && !a.retired) {
        writes_[static_cast<size_t>(r)] -= a.write;
        a.write = false;
        a.retired = true;
        while (!q.empty() && q.front().retired) q.pop_front();
        return;
      }
    }
  }
  std::array<AccessQueue, kScoreboardRegs> pending_;
  std::array<uint32_t, kScoreboardRegs> writes_{};  // writes among pending_[r]
  uint64_t version_ = 0;
};

}  // namespace tpusim::hw

// What every unit of a TensorCore shares: the architectural state (in the
// functional reference's types), the program, the scoreboard, fault reporting and
// the timeline. Units are plain C++ (state + tick + skip + next_event_cycle); the
// SystemC views in hw/system wrap them.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw/core/op_profile.h"
#include "hw/core/path_log.h"
#include "hw/core/reg_use.h"
#include "hw/core/scoreboard.h"
#include "hw/timeline/timeline.h"
#include "isa/exec/semantics.h"
#include "isa/exec/state.h"

namespace tpusim::hw {

inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// Named event counters of one unit, written to stats.json under its hierarchical name.
class Counters {
 public:
  Counters() = default;
  // Copies and moves keep the values and drop the literal cache (it points into
  // the source's map).
  Counters(const Counters& o) : values_(o.values_) {}
  Counters(Counters&& o) noexcept : values_(std::move(o.values_)) {}
  Counters& operator=(const Counters& o) {
    values_ = o.values_;
    literals_.clear();
    recent_ = {};
    return *this;
  }
  Counters& operator=(Counters&& o) noexcept {
    values_ = std::move(o.values_);
    literals_.clear();
    recent_ = {};
    return *this;
  }

  uint64_t& operator[](const std::string& name) { return values_[name]; }
  // Units count with string literals, some every cycle: after a literal's first
  // use its slot is found by the literal's address, with no string built or
  // compared (map nodes never move, so the slot stays valid).
  // A unit counting several literals per cycle finds each in one probe of a small
  // table indexed by the literal's address, before the scan of all of them.
  template <size_t N>
  uint64_t& operator[](const char (&name)[N]) {
    auto& hit = recent_[(reinterpret_cast<uintptr_t>(name) >> 2) % recent_.size()];
    if (hit.first == name) return *hit.second;
    for (const auto& [p, slot] : literals_)
      if (p == name) {
        hit = {name, slot};
        return *slot;
      }
    uint64_t& slot = values_[std::string(name)];
    literals_.emplace_back(name, &slot);
    hit = {name, &slot};
    return slot;
  }
  uint64_t get(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? 0 : it->second;
  }
  nlohmann::json to_json() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : values_) j[k] = v;
    return j;
  }

 private:
  std::map<std::string, uint64_t> values_;
  std::vector<std::pair<const char*, uint64_t*>> literals_;
  std::array<std::pair<const char*, uint64_t*>, 16> recent_{};
};

// A FIFO that reuses its slots: std::deque gives an element as large as Issued a
// heap node of its own, so every mmul and mpop of a stream would allocate and free.
template <typename T>
class RingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return slots_[head_]; }
  const T& front() const { return slots_[head_]; }
  void push_back(T&& v) {
    if (size_ == slots_.size()) grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = std::move(v);
    ++size_;
  }
  void pop_front() {
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }

 private:
  void grow() {
    std::vector<T> bigger(std::max<size_t>(8, 2 * slots_.size()));
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(slots_[(head_ + i) & (slots_.size() - 1)]);
    slots_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<T> slots_;  // a power of two of them
  size_t head_ = 0, size_ = 0;
};

// An instruction the sequencer has issued into a unit queue.
struct Issued {
  const isa::Instr* in = nullptr;
  uint32_t pc = 0;
  uint64_t seq = 0;          // program order within the core
  uint64_t issue_cycle = 0;
  RegUse use;
  std::array<int32_t, isa::kScalarRegs> s{};  // scalar registers at issue (addresses)
  uint64_t vmem_ops_before = 0;               // DMA: vld/vst issued before it
  uint32_t path_dma = 0;                      // DMA: its record in CoreEnv::path (when recorded)
  // DMA: resolved at issue. Held apart: every vector instruction moves its Issued
  // through two queues, and the plan was a third of it.
  std::unique_ptr<exec::DmaPlan> plan;
};

// Runs a vector instruction's semantics with the scalar registers it saw at issue:
// the sequencer runs ahead, so the live scalar file may already be newer.
inline void exec_vector_issued(exec::CoreState& st, const Issued& it) {
  if (!reads_scalar_regs(*it.in)) {
    exec::exec_vector(st, *it.in);
    return;
  }
  const isa::Op op = it.in->op;
  const size_t b = it.in->b;
  if ((op == isa::Op::kVld || op == isa::Op::kVldBf16 || op == isa::Op::kVst || op == isa::Op::kVstBf16) &&
      b < st.s.size()) {  // a tile access reads its address register only
    const auto live = st.s[b];
    st.s[b] = it.s[b];
    try {
      exec::exec_vector(st, *it.in);
    } catch (...) {
      st.s[b] = live;
      throw;
    }
    st.s[b] = live;
    return;
  }
  const auto live = st.s;
  st.s = it.s;
  try {
    exec::exec_vector(st, *it.in);
  } catch (...) {
    st.s = live;
    throw;
  }
  st.s = live;
}

struct CoreEnv {
  exec::Machine* machine = nullptr;
  exec::CoreState* state = nullptr;
  const isa::CoreProgram* prog = nullptr;
  std::string name;  // "chip0.core1"
  Scoreboard scoreboard;
  timeline::Timeline* timeline = nullptr;
  OpProfile profile;  // per-op time and work (hw/core/op_profile.h)
  uint32_t timeline_process = 0;
  // First fault of this core; the run stops at the end of the cycle it happened in.
  std::string fault;
  uint64_t last_activity_cycle = 0;  // the last cycle anything architectural changed
  // Critical path records (hw/core/path_log.h), or null when the run does not ask.
  PathLog* path = nullptr;
  PathLogs* paths = nullptr;

  void note_activity(uint64_t cycle) {
    if (cycle > last_activity_cycle) last_activity_cycle = cycle;
  }
  std::string where(uint32_t pc) const {
    std::string s = name + " instruction " + std::to_string(pc);
    if (prog && pc < prog->code.size()) {
      const isa::Instr& in = prog->code[pc];
      s += " (";
      if (in.line) s += prog->source + ":" + std::to_string(in.line) + ", ";
      s += isa::op_info(in.op).mnemonic;
      if (in.op_id >= 0) s += ", op " + std::to_string(in.op_id);
      s += ")";
    }
    return s;
  }
  void raise(uint32_t pc, const std::string& cause) {
    if (fault.empty()) fault = "fault: " + where(pc) + ": " + cause;
  }
  // Timeline slice name: the graph op when known, else the mnemonic.
  static std::string slice_name(const isa::Instr& in) {
    return in.op_id >= 0 ? "op " + std::to_string(in.op_id) : std::string(isa::op_info(in.op).mnemonic);
  }
};

}  // namespace tpusim::hw

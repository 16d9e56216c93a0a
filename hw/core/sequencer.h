// The TensorCore's scalar sequencer: each cycle it issues a bundle of up to
// `issue_per_cycle` instructions in program order (docs/tensorcore.md, "Issue"),
// runs the scalar unit (ALU, SMEM ld/st, branches, loops) itself, and issues
// vector, matrix and DMA instructions into their units' queues, reserving their
// vector and mask registers in the scoreboard. Sync instructions retire here: wait and
// wait.sub stall until the flag is high enough, fset/fadd change it, barrier
// waits (after the core's vector and matrix work has finished) until every core
// with a program has arrived. Every stalled cycle is counted under its reason.
// Streams (docs/isa.md, "Streams"): `fork` starts the core's lowest idle stream
// after 0; each cycle the bundle comes from one stream that can issue, the streams
// taking turns, so a stream blocked on a flag no longer holds up the others' work.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hw/config/params.h"
#include "hw/core/core_env.h"

namespace tpusim::hw {

// The barrier over every core with a program. Arrivals in one cycle release
// everyone one cycle later, whatever order the cores are ticked in.
class Barrier {
 public:
  explicit Barrier(size_t participants) : participants_(participants) {}
  // Returns the generation the caller waits on.
  uint64_t arrive(uint64_t cycle) {
    if (++arrived_ == participants_) {
      arrived_ = 0;
      release_cycle_[generation_ & 1] = cycle + 1;
      return generation_++;
    }
    release_cycle_[generation_ & 1] = kNever;
    return generation_;
  }
  // Cycle at which generation `g` is released (kNever while incomplete).
  uint64_t release_cycle(uint64_t g) const {
    if (g + 1 < generation_) return 0;
    return g < generation_ ? release_cycle_[g & 1] : kNever;
  }
  size_t arrived() const { return arrived_; }
  size_t participants() const { return participants_; }

 private:
  size_t participants_;
  size_t arrived_ = 0;
  uint64_t generation_ = 0;
  uint64_t release_cycle_[2] = {kNever, kNever};
};

// Bundle slot classes: the TPU TensorCore is a VLIW machine whose bundle has a
// few slots of each kind (scalar, vector ALU, vector load, vector store, matrix,
// DMA/sync), so independent instructions of different kinds go out together.
enum class IssueSlot { kScalar, kSync, kDma, kVectorLoad, kVectorStore, kVectorAlu, kMatrix, kCount };
inline constexpr int kIssueSlots = static_cast<int>(IssueSlot::kCount);
IssueSlot issue_slot(const isa::Instr& in);
const char* issue_slot_key(IssueSlot s);  // "vector_load": core.sequencer.slots.<key>

struct SequencerParams {
  int issue_per_cycle = 1;  // bundle width
  std::array<int, kIssueSlots> slots{1, 1, 1, 1, 1, 1, 1};  // most instructions per class in one bundle
  static SequencerParams from_config(const config::Params& p);
};

class Sequencer {
 public:
  enum class Stall { kNone, kFlag, kQueueFull, kBarrier, kFence };
  struct Sinks {
    std::function<bool(isa::Unit, const isa::Instr&)> queue_full;
    std::function<void(isa::Unit, Issued&&)> push;
    std::function<bool()> vector_matrix_drained;  // barrier fence
  };

  Sequencer(CoreEnv& env, Barrier& barrier, Sinks sinks, const SequencerParams& p = {});

  bool halted() const { return halted_; }
  uint64_t halt_cycle() const { return halt_cycle_; }
  uint64_t vmem_ops_issued() const { return vmem_ops_issued_; }
  uint64_t instructions() const { return instructions_; }
  uint32_t pc() const { return pc_of(cur_); }  // the stream issued or stalled last
  Stall stall() const { return stall_; }
  // One line on what the sequencer waits for (deadlock reports).
  std::string blocked_on() const;

  void tick(uint64_t cycle);
  void skip(uint64_t n);
  uint64_t next_event_cycle(uint64_t now) const;
  const Counters& counters() const { return counters_; }
  // Traced state.
  int stall_reason_ = 0;
  int pc_now_ = 0;

 private:
  // Why stream s's instruction cannot go now.
  Stall blocked(int s, uint64_t cycle) const;
  Stall blocked(uint64_t cycle) const { return blocked(cur_, cycle); }
  uint32_t pc_of(int s) const { return pcs_[static_cast<size_t>(s)]; }
  uint32_t& at_pc() { return pcs_[static_cast<size_t>(cur_)]; }  // the selected stream's
  int first_running() const;
  void count(Stall s, uint64_t n);  // at the selected stream's pc
  // With several streams running: n cycles of each one (but `issued`) waiting on a flag.
  void count_stream_waits(int issued, uint64_t cycle, uint64_t n);
  // Issues the instruction at pc; false when the bundle must end after it
  // (control flow, barrier, halt, a fault).
  bool issue(uint64_t cycle);
  // Critical path records (CoreEnv::path) of a sync instruction that issues at pc.
  void path_sync(const isa::Instr& in, uint32_t pc, uint64_t reached, uint64_t cycle);
  // May the instruction at pc join the bundle `b` already holds?
  struct Bundle {
    int size = 0;
    std::array<int, kIssueSlots> used{};
    uint64_t vwrites = 0;  // vector/mask registers written by the bundle (scoreboard numbering)
    uint32_t swrites = 0;  // scalar registers written by the bundle
  };
  bool joins(const Bundle& b, uint32_t pc) const;
  void add(Bundle& b, uint32_t pc) const;
  // What issue needs of each instruction, derived once per program rather than on
  // every try to issue it (every cycle of a stream).
  struct Decoded {
    isa::Unit unit = isa::Unit::kScalar;
    IssueSlot slot = IssueSlot::kScalar;
    uint32_t sreads = 0, swrites = 0;  // scalar registers (bit r = sr)
    uint64_t vreads = 0, vwrites = 0;  // vector/mask registers (scoreboard numbering)
    RegUse use;
  };
  std::vector<Decoded> decoded_;  // by pc
  void decode_program();

  CoreEnv& env_;
  Barrier& barrier_;
  Sinks sinks_;
  SequencerParams p_;
  std::array<uint32_t, isa::kStreams> pcs_{};  // each stream's pc
  std::array<bool, isa::kStreams> running_{};
  int cur_ = 0;   // the selected stream
  int next_ = 0;  // the stream that goes first next cycle (turns)
  uint64_t seq_ = 0;
  bool halted_ = false;
  uint64_t halt_cycle_ = 0;
  bool at_barrier_ = false;
  uint64_t barrier_generation_ = 0;
  uint64_t vmem_ops_issued_ = 0;
  uint64_t instructions_ = 0;
  Stall stall_ = Stall::kNone;
  uint64_t last_cycle_ = 0;
  Counters counters_;
};

}  // namespace tpusim::hw

// The functional reference: a deterministic scheduler over the semantic functions
// of semantics.h. Cores run round robin in (chip, core) order, each until it
// blocks (wait, barrier) or halts, a core's streams in number order (stream 0,
// then those `fork` started); every instruction is atomic; a DMA copies its data
// and moves its flags at issue. docs/isa.md, "Reference semantics".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/asm/instr.h"
#include "isa/exec/state.h"

namespace tpusim::exec {

struct RunOptions {
  uint64_t max_instructions = 2'000'000'000;  // total over all cores; beyond it: "likely an infinite loop"
  bool check_races = false;  // fault on accesses that break the synchronisation rule (race_checker.h)
};

struct RunResult {
  enum class Status { kHalted, kFault, kDeadlock, kBudget };
  Status status = Status::kHalted;
  std::string message;  // one line for kFault/kBudget; deadlock lists every blocked core
  uint64_t instructions = 0;
  bool ok() const { return status == Status::kHalted; }
};

class Interpreter {
 public:
  // Builds the machine and loads the bundle's constants; `b` must outlive the interpreter.
  explicit Interpreter(const isa::Bundle& b);
  Machine& machine() { return machine_; }
  const Machine& machine() const { return machine_; }
  RunResult run(const RunOptions& opts = {});

 private:
  enum class CoreStatus { kReady, kWaiting, kBarrier, kHalted };
  struct Context {
    const isa::CoreProgram* prog;
    CoreState* state;
    int stream = 0;  // streams 1.. are halted until their core's stream 0 forks them
    uint32_t pc = 0;
    CoreStatus status = CoreStatus::kReady;
    uint64_t barrier_generation = 0;
  };
  std::string where(const Context& c) const;

  Machine machine_;
  std::vector<Context> cores_;  // (chip, core) order, each core's streams in turn
  size_t programs_ = 0;         // cores with a program: the barrier's participants
  uint64_t barrier_generation_ = 0;
  size_t barrier_arrived_ = 0;
};

}  // namespace tpusim::exec

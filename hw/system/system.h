// The simulated machine as one object: the chips of a board wired from a preset,
// loaded with a program bundle and its inputs, run in fast or detailed mode. The
// `tpusim run` command and the bit-exact test harness drive the chip model only
// through this header. SystemC allows one elaboration per process, so a process
// builds and runs at most one System.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hw/config/params.h"
#include "isa/asm/instr.h"
#include "isa/exec/state.h"

namespace tpusim::timeline {
class Timeline;
}

namespace tpusim::hw {

enum class Mode { kFast, kDetailed };

struct RunOptions {
  Mode mode = Mode::kFast;
  std::string wave_path;                 // .vcd or .fst; empty = no waveform
  std::vector<std::string> wave_scopes;  // globs on hierarchical names (wave::scope_matches)
  uint64_t wave_begin = 0;               // cycles
  uint64_t wave_end = UINT64_MAX;        // cycles
  timeline::Timeline* timeline = nullptr;
  uint64_t max_cycles = 0;  // 0 = no limit; reaching it is a fault
  // Instructions over all cores before the run stops as a likely infinite loop
  // (the reference's default budget).
  uint64_t max_instructions = 2'000'000'000;
  // Fast mode on slices of 64 chips or more: each chip runs alone up to the next
  // cycle the network could deliver anything (docs/tensorcore.md, "Simulation
  // speed"). Same cycles, values and counters; off only to check that.
  bool windows = true;
  // Record and walk the run's critical path (hw/system/critical_path.h) into
  // RunResult::critical_path.
  bool critical_path = false;
};

struct RunResult {
  uint64_t cycles = 0;  // first instruction issued to the last result written
  bool faulted = false;
  // One line: chip/core, instruction index, source line, cause. Empty when not faulted.
  std::string fault;
  // Per unit counters keyed by hierarchical name: "chip0.core0.mxu0": {"busy_cycles": ..}.
  nlohmann::json units = nlohmann::json::object();
  uint64_t flops = 0;              // 2 per MXU multiply-accumulate of the program's data
  uint64_t hbm_bytes_read = 0;     // all chips
  uint64_t hbm_bytes_written = 0;  // all chips
  // With RunOptions::critical_path: walk_critical_path's document; else null.
  nlohmann::json critical_path;
};

// A problem with the preset, the bundle or the inputs: one line naming it.
class SystemError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class System {
 public:
  // Builds the chips of `preset` for `bundle` (its target must fit the preset) and
  // loads the bundle's constants, as exec::Interpreter does. Throws SystemError.
  // `bundle` must outlive the System.
  System(const config::Params& preset, const isa::Bundle& bundle);
  ~System();
  System(const System&) = delete;
  System& operator=(const System&) = delete;

  // Runs until every core halts, one faults, the model deadlocks or max_cycles
  // passes. Call once.
  RunResult run(const RunOptions& options);

  // The architectural state in the functional reference's own type, so inputs go
  // in and outputs come out exactly as `tpusim ref` does it: exec::write_tensor
  // before run(), exec::read_tensor after.
  exec::Machine& machine();
  const exec::Machine& machine() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpusim::hw

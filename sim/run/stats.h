// stats.json: the record every `tpusim run` leaves (shared/spec/cli.md, "stats.json").
// Built from plain numbers so the CLI, the report command, tests and benches all
// agree on one schema and one set of derived figures (seconds, utilization).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tpusim::run {

// What a finished run measured; the derived keys are computed by make_stats.
struct RunFigures {
  std::string preset;
  std::string mode;                // "fast" | "detailed"
  double clock_hz = 0;
  uint64_t cycles = 0;             // first issue to last result written, chip clock
  uint64_t flops = 0;              // 2 per MXU multiply-accumulate of real data
  double peak_flops_per_s = 0;
  uint64_t hbm_bytes_read = 0;
  uint64_t hbm_bytes_written = 0;
  double hbm_peak_bytes_per_s = 0;
  double wall_seconds = 0;         // host time; the only nondeterministic figure
  nlohmann::json units = nlohmann::json::object();  // "chip0.core0.mxu0": {"busy_cycles": ..}
  // Optional (sim/run/profile.h): per-op profile and per-core time by cause; null = absent.
  nlohmann::json ops;
  nlohmann::json time_by_cause;
  nlohmann::json vmem;  // per core: capacity_bytes [, peak_bytes_in_use] (sim/run/profile.h vmem_use)
  // `tpusim run --critical-path`: hw::walk_critical_path's document without its
  // segments (cycles, ends_on, by_cause, by_op, hops); null = absent.
  nlohmann::json critical_path;
};

// The stats.json document with every key of the contract (keys sorted, so the
// bytes are a function of the values alone).
nlohmann::json make_stats(const RunFigures& f);

// Schema check for a stats document read back from disk: every required key
// present with the right JSON type and the derived figures consistent with the
// measured ones. Returns the problems found, empty when valid.
std::vector<std::string> check_stats(const nlohmann::json& stats);

// The document without host.wall_seconds: what must be identical across two runs
// of the same bundle, inputs and preset (and across modes once "mode" is dropped too).
nlohmann::json deterministic_part(nlohmann::json stats, bool drop_mode = false);

// Serialises with a fixed indent and a trailing newline (stable bytes for diffs).
std::string stats_text(const nlohmann::json& stats);

// Writes DIR/stats.json through a temporary name; throws std::runtime_error.
void write_stats(const std::string& path, const nlohmann::json& stats);
// Reads and parses a stats file; throws std::runtime_error "<path>: <problem>".
nlohmann::json read_stats(const std::string& path);

}  // namespace tpusim::run

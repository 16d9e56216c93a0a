// Turns the VCD that SystemC's sc_trace writes into the waveform the user asked
// for: only the scopes matching `--wave-scope` globs, only the `--wave-window`
// time range, no $date line (so the same run gives the same bytes), written as VCD
// or, through gtkwave's vcd2fst, as FST (~10x smaller). SystemC can neither
// pause tracing nor trace a window, so the whole run is traced into a temporary
// file and cut here.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>
#include <vector>

namespace tpusim::wave {

struct FilterOptions {
  // Globs on dotted hierarchical names ("chip0.core1.*", "*.mxu0"); a glob that
  // names a scope keeps everything below it. Empty keeps every variable.
  std::vector<std::string> scopes;
  uint64_t begin_ps = 0;
  uint64_t end_ps = std::numeric_limits<uint64_t>::max();
};

// True if the dotted `name` is kept by `scopes` (see FilterOptions::scopes).
bool scope_matches(const std::vector<std::string>& scopes, const std::string& name);

// Copies `in` to `out`, keeping what `options` selects. Variables keep absolute
// times; the window starts with a $dumpvars of every kept variable's value at
// begin. Throws std::runtime_error on malformed input.
void filter_vcd(std::istream& in, std::ostream& out, const FilterOptions& options);

// Filters `raw_vcd` into `out_path` (.vcd, or .fst through vcd2fst) through a
// temporary file renamed into place, so no partial waveform is left behind.
void finish_wave(const std::string& raw_vcd, const std::string& out_path, const FilterOptions& options);

}  // namespace tpusim::wave

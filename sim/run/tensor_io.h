// The run command's side of the bundle's I/O table: binding `--input NAME=FILE.npy`
// and `--random-inputs SEED` to the input entries, and writing outputs. The
// conversions themselves are the functional reference's (isa/exec/tensors.h), so
// `run` and `ref` accept the same files and write the same bytes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/asm/instr.h"
#include "isa/io/npy.h"

namespace tpusim::run {

// Bad usage or a bad input file: exit status 2 of the CLI contract.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The dense element bytes of every input entry of `bundle` (in the entry's dtype,
// ready for exec::write_tensor), keyed by entry name. `assignments` are
// "NAME=FILE.npy"; entries not assigned get random_tensor(entry, seed) when a seed
// is given and are an error otherwise. Throws UsageError naming the input.
std::map<std::string, std::vector<uint8_t>> bind_inputs(const isa::Bundle& bundle, const std::string& bundle_name,
                                                          const std::vector<std::string>& assignments,
                                                          std::optional<uint64_t> random_seed);

// Creates DIR if needed and proves it writable (a probe file is created and
// removed), so an unwritable directory is reported before a long simulation.
void prepare_out_dir(const std::string& dir);
// Proves the file `path` can be created (its directory exists and is writable).
void check_writable_file(const std::string& path, const std::string& what);

// The path an output entry is written to: DIR/<name>.npy.
std::string output_path(const std::string& dir, const isa::IoEntry& e);
// Writes one output (dense element bytes in the entry's dtype, as
// exec::read_tensor returns them) the way `tpusim ref` does; atomic per file.
void write_output(const std::string& dir, const isa::IoEntry& e, const std::vector<uint8_t>& dense, bool raw_bf16);

}  // namespace tpusim::run

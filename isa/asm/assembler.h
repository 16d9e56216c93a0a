// Text assembly <-> bundles (docs/isa.md, "Text syntax"). print_bundle writes the
// canonical text; assemble(print_bundle(b)) gives b back (up to source line
// numbers and file names).
#pragma once

#include <stdexcept>
#include <string>

#include "isa/asm/instr.h"

namespace tpusim::isa {

// Message is "file:line:col: error: ..." (col omitted when unknown).
struct AsmError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `filename` names the source in messages; `.npy` references resolve relative to
// `base_dir` (the .s file's directory).
Bundle assemble(const std::string& text, const std::string& filename, const std::string& base_dir = ".");
Bundle assemble_file(const std::string& path);

// pcs: each instruction ends with a `# pc N` comment, its index in the core's
// program (what faults and the critical path name); still assembles
// to the same bundle.
std::string print_bundle(const Bundle& b, bool pcs = false);
// One instruction in canonical form; branch targets use labels of `prog` (or
// __L<index> when the target has no label).
std::string print_instr(const Instr& in, const CoreProgram& prog);

}  // namespace tpusim::isa

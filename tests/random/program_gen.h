// Random valid tpusim programs for the bit-exact harness: valid by construction
// (every address inside its space, every DMA's flag waited before its data is used
// or its source overwritten, MXU weight staging and result FIFO never over- or
// underflowed, loops that terminate, equal barrier counts on every core), so the
// functional reference and the chip model must agree on every output byte
// whatever the timing. Written as assembly text (docs/isa.md, "Text syntax") so a
// failing seed is a file a person can read, assemble and bisect.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "isa/io/npy.h"

namespace tpusim::randprog {

struct GenOptions {
  int max_cores = 2;        // cores the program may use (the preset must have them)
  bool two_chips = false;   // a two-core program may put its second core on chip 1
  int mxus = 4;             // MXUs per core in the target
  int min_ops = 20;         // compute instructions per core, before loops unroll
  int max_ops = 120;
};

struct Program {
  std::string assembly;                          // the .s text
  std::map<std::string, io::NpyArray> inputs;    // one .npy per .input, by name
  int cores = 1;
};

// Same seed and options, same program and inputs, on every machine.
Program generate(uint64_t seed, const GenOptions& options = {});

}  // namespace tpusim::randprog

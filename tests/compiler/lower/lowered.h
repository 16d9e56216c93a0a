// Shared by the lowering tests: a graph's IR text lowered for a target, to inspect
// the code it gets (the tests also run it: expect_bit_exact in each file).
#pragma once

#include <string>

#include "compiler/compiler.h"
#include "compiler/lower/lower.h"

namespace tpusim::compiler {

// `ir` lowered for target t on `cores` cores under policy p.
inline LowerResult lower_with(const std::string& ir, num::PrecisionPolicy p, const isa::Target& t, int cores) {
  LowerOptions lo;
  lo.target = t;
  lo.policy = p;
  lo.cores = cores;
  return lower_graph(parse_graph(ir, "test.ir"), lo);
}

}  // namespace tpusim::compiler

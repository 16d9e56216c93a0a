// What the assembler or the bundle loader says about bad input, as the tests
// compare it: the one-line message, or "no error".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/asm/assembler.h"
#include "isa/bundle/bundle_file.h"

namespace tpusim::isa {

inline std::string asm_error(const std::string& text) {
  try {
    assemble(text, "t.s");
  } catch (const AsmError& e) {
    return e.what();
  }
  return "no error";
}

inline std::string load_error(const std::vector<uint8_t>& bytes) {
  try {
    parse_bundle(bytes, "b.tpb");
  } catch (const BundleError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace tpusim::isa

// What the assembler or the bundle loader says about bad input, as the tests
// compare it: the one-line message, or "no error"; and a bundle file's version.
#pragma once

#include <cstdint>
#include <cstring>
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

// The format version a serialised bundle declares (bytes 8-11).
inline uint32_t version_of(const std::vector<uint8_t>& bytes) {
  uint32_t v = 0;
  std::memcpy(&v, bytes.data() + 8, 4);  // little-endian host (x86/arm64)
  return v;
}

}  // namespace tpusim::isa

// One fuzz step each for the assembler and the bundle loader: any input must give
// a bundle or the documented error type, never a crash, hang or other exception.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/asm/assembler.h"
#include "isa/bundle/bundle_file.h"

namespace tpusim::isa::fuzz {

inline void assemble_once(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    Bundle b = assemble(text, "fuzz.s", "/nonexistent");
    // What assembles must print and assemble again.
    (void)assemble(print_bundle(b), "reprint.s", "/nonexistent");
    (void)parse_bundle(serialize_bundle(b), "fuzz.tpb");
  } catch (const AsmError&) {
  }
}

inline void load_once(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  try {
    Bundle b = parse_bundle(bytes, "fuzz.tpb");
    (void)print_bundle(b);
  } catch (const BundleError&) {
  }
}

}  // namespace tpusim::isa::fuzz

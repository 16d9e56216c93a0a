// Binary form of instructions: a variable-length stream of little-endian 64-bit
// words (docs/isa.md, "Binary encoding"). Decoding is strict: unknown opcodes,
// nonzero unused fields and truncated instructions are errors, so every stream
// has exactly one decoding and decode(encode(p)) == p.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "isa/asm/instr.h"

namespace tpusim::isa {

struct DecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Words an instruction occupies (1, 2, or 3 + 2 * ndims for a DMA).
size_t encoded_words(const Instr& in);
void encode_instr(const Instr& in, std::vector<uint64_t>& out);
std::vector<uint64_t> encode(const std::vector<Instr>& code);
// Decodes the whole stream; line and op_id are left 0 / -1 (the bundle carries
// them in side tables). Throws DecodeError("word N: ...").
std::vector<Instr> decode(const uint64_t* words, size_t n);

}  // namespace tpusim::isa

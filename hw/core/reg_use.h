// Which vector and mask registers an instruction reads and writes, for the
// scoreboard. Registers 0..31 are v0..v31, 32..39 are m0..m7.
#pragma once

#include <array>
#include <cstdint>

#include "isa/asm/instr.h"

namespace tpusim::hw {

inline constexpr int kMaskRegBase = isa::kVectorRegs;
inline constexpr int kScoreboardRegs = isa::kVectorRegs + isa::kMaskRegs;

struct RegUse {
  std::array<uint8_t, 18> reads{};   // vxpose reads 16
  std::array<uint8_t, 16> writes{};  // vxpose writes 16
  uint8_t nreads = 0, nwrites = 0;
  void read(int r) { reads[nreads++] = static_cast<uint8_t>(r); }
  void write(int r) { writes[nwrites++] = static_cast<uint8_t>(r); }
};

// Vector/mask operands of a vector- or matrix-class instruction (empty for others).
RegUse reg_use(const isa::Instr& in);

// True for instructions whose semantics read scalar registers (addresses,
// vbcast.s): they carry a snapshot of the scalar file taken at issue.
bool reads_scalar_regs(const isa::Instr& in);

}  // namespace tpusim::hw

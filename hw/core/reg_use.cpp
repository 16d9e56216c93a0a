#include "hw/core/reg_use.h"

namespace tpusim::hw {

using isa::Op;

RegUse reg_use(const isa::Instr& in) {
  RegUse u;
  const auto m = [](int r) { return kMaskRegBase + r; };
  switch (in.op) {
    case Op::kVld: case Op::kVldBf16: u.write(in.a); u.read(m(in.c)); break;
    case Op::kVst: case Op::kVstBf16: u.read(in.a); u.read(m(in.c)); break;
    case Op::kVcmpEq: case Op::kVcmpNe: case Op::kVcmpLt: case Op::kVcmpLe: case Op::kVcmpGt: case Op::kVcmpGe:
      u.write(m(in.a)); u.read(in.b); u.read(in.c); break;
    case Op::kVsel: u.write(in.a); u.read(m(in.b)); u.read(in.c); u.read(in.d); break;
    case Op::kVbcast: case Op::kVbcastS: u.write(in.a); break;
    case Op::kVmask: u.write(m(in.a)); break;
    case Op::kMand: case Op::kMor: u.write(m(in.a)); u.read(m(in.b)); u.read(m(in.c)); break;
    case Op::kMnot: u.write(m(in.a)); u.read(m(in.b)); break;
    case Op::kVxpose:
      for (int i = 0; i < 16; ++i) {
        if (in.a + i < isa::kVectorRegs) u.write(in.a + i);
        if (in.b + i < isa::kVectorRegs) u.read(in.b + i);
      }
      break;
    case Op::kMpush: case Op::kMpushT: case Op::kMmul: u.read(in.b); break;
    case Op::kMswap: break;
    case Op::kMpop: u.write(in.a); break;
    case Op::kMpopAdd: u.write(in.a); u.read(in.a); break;
    default: {
      const char* sig = isa::op_info(in.op).signature;
      if (isa::op_info(in.op).unit != isa::Unit::kVector) break;
      // Plain vector ops: "VV" / "VVV", destination first.
      const uint16_t f[4] = {in.a, in.b, in.c, in.d};
      for (int i = 0; sig[i] && i < 4; ++i) {
        if (sig[i] != 'V') continue;
        if (i == 0) u.write(f[i]);
        else u.read(f[i]);
      }
    }
  }
  return u;
}

bool reads_scalar_regs(const isa::Instr& in) {
  switch (in.op) {
    case Op::kVld: case Op::kVldBf16: case Op::kVst: case Op::kVstBf16: case Op::kVbcastS: return true;
    default: return false;
  }
}

}  // namespace tpusim::hw

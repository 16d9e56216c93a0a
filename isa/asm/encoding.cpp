#include "isa/asm/encoding.h"

#include <cstring>
#include <string>

namespace tpusim::isa {

namespace {

struct FieldUse {
  int regs = 0;    // register fields a.. used
  bool imm = false;
  bool imm2 = false;
};

FieldUse field_use(Op op) {
  const OpInfo& info = op_info(op);
  FieldUse u;
  int imms = 0;
  for (const char* s = info.signature; *s; ++s) {
    switch (*s) {
      case 'S': case 'V': case 'M': case 'X': case 'F': ++u.regs; break;
      case 'A': ++u.regs; ++imms; break;
      case 'I': case 'R': case 'L': ++imms; break;
      default: break;
    }
  }
  if (info.flags & kOpOptMask) ++u.regs;
  if (info.flags & kOpOptK) ++imms;
  if (info.flags & kOpOptStride) ++imms;
  u.imm = imms >= 1;
  u.imm2 = imms >= 2;
  return u;
}

// The register fields (0 = a, 1 = b) that hold the op's sync-flag operands, in
// operand order. A flag is 9 bits: the low 8 in its field, bit 8 of the k-th flag
// operand in bit k of field c, which no op with a flag operand uses (docs/isa.md
// section 5): below f255 the same words as before the flags grew.
struct FlagFields {
  int n = 0;
  int field[2] = {0, 0};
};
FlagFields flag_fields(Op op) {
  FlagFields f;
  int r = 0;
  for (const char* s = op_info(op).signature; *s; ++s) {
    if (*s == 'F' && f.n < 2) f.field[f.n++] = r;
    if (std::strchr("SVMXFA", *s)) ++r;
  }
  return f;
}
static_assert(kSyncFlags + 1 <= 1 << 9, "a DMA names flag + 1 in 9 bits");

uint64_t u32(int32_t v) { return static_cast<uint64_t>(static_cast<uint32_t>(v)); }
int32_t s32(uint64_t w) { return static_cast<int32_t>(static_cast<uint32_t>(w & 0xFFFFFFFFu)); }

// chip + 1 is 12 bits: the low 8 at bits 16-23, the high 4 at bits 4-7 (zero, and
// so the same words as before, for chips below 255; docs/isa.md section 5).
uint64_t encode_endpoint(const DmaEndpoint& e) {
  const uint64_t chip1 = static_cast<uint64_t>(static_cast<uint16_t>(e.chip + 1)) & 0xFFF;
  return static_cast<uint64_t>(e.space) | (chip1 >> 8) << 4 | static_cast<uint64_t>(e.reg) << 8 |
         (chip1 & 0xFF) << 16 | static_cast<uint64_t>(static_cast<uint8_t>(e.core + 1)) << 24 |
         u32(e.offset) << 32;
}

[[noreturn]] void bad(size_t word, const std::string& what) {
  throw DecodeError("word " + std::to_string(word) + ": " + what);
}

DmaEndpoint decode_endpoint(uint64_t w, size_t at) {
  if ((w & 0xF) >= static_cast<uint64_t>(kSpaceCount)) bad(at, "bad DMA memory space");
  DmaEndpoint e;
  e.space = static_cast<Space>(w & 0xF);
  e.reg = static_cast<uint8_t>(w >> 8);
  const int chip1 = static_cast<int>((w >> 16) & 0xFF) | static_cast<int>((w >> 4) & 0xF) << 8;
  e.chip = static_cast<int16_t>(chip1 - 1);
  e.core = static_cast<int16_t>(static_cast<int>((w >> 24) & 0xFF) - 1);
  e.offset = s32(w >> 32);
  return e;
}

}  // namespace

size_t encoded_words(const Instr& in) {
  if (in.op == Op::kDma) return 3 + 2 * static_cast<size_t>(in.ndims);
  return (op_info(in.op).flags & kOpLong) ? 2 : 1;
}

void encode_instr(const Instr& in, std::vector<uint64_t>& out) {
  const uint64_t op = static_cast<uint64_t>(in.op);
  if (in.op == Op::kDma) {
    const uint64_t flag1 = static_cast<uint64_t>(in.flag + 1) & 0x1FF, rflag1 = static_cast<uint64_t>(in.rflag + 1) & 0x1FF;
    const uint64_t way = in.way > 0 ? 1 : in.way < 0 ? 2 : 0;
    out.push_back(op | (flag1 & 0xFF) << 8 | (rflag1 & 0xFF) << 16 | static_cast<uint64_t>(in.ndims & 0x3) << 24 |
                  way << 26 | static_cast<uint64_t>(in.tc & 1) << 28 | (flag1 >> 8) << 29 | (rflag1 >> 8) << 30 | u32(in.imm) << 32);
    out.push_back(encode_endpoint(in.dst));
    out.push_back(encode_endpoint(in.src));
    for (int i = 0; i < in.ndims && i < kMaxDmaDims; ++i) {
      out.push_back(static_cast<uint64_t>(in.dims[i].count) | u32(in.dims[i].src_stride) << 32);
      out.push_back(u32(in.dims[i].dst_stride));
    }
    return;
  }
  uint64_t field[3] = {in.a, in.b, in.c};
  const FlagFields fl = flag_fields(in.op);
  for (int k = 0; k < fl.n; ++k) {
    field[2] |= (field[fl.field[k]] >> 8) << k;
    field[fl.field[k]] &= 0xFF;
  }
  out.push_back(op | (field[0] & 0xFF) << 8 | (field[1] & 0xFF) << 16 | (field[2] & 0xFF) << 24 | u32(in.imm) << 32);
  if (op_info(in.op).flags & kOpLong) out.push_back(u32(in.imm2) | static_cast<uint64_t>(in.d) << 32);
}

std::vector<uint64_t> encode(const std::vector<Instr>& code) {
  std::vector<uint64_t> out;
  for (const auto& in : code) encode_instr(in, out);
  return out;
}

std::vector<Instr> decode(const uint64_t* w, size_t n) {
  std::vector<Instr> code;
  size_t i = 0;
  while (i < n) {
    const size_t at = i;
    const uint64_t w0 = w[i++];
    if ((w0 & 0xFF) >= static_cast<uint64_t>(op_count())) bad(at, "unknown opcode " + std::to_string(w0 & 0xFF));
    Instr in;
    in.op = static_cast<Op>(w0 & 0xFF);
    if (in.op == Op::kDma) {
      in.flag = static_cast<int16_t>(static_cast<int>(((w0 >> 8) & 0xFF) | ((w0 >> 29) & 1) << 8) - 1);
      in.rflag = static_cast<int16_t>(static_cast<int>(((w0 >> 16) & 0xFF) | ((w0 >> 30) & 1) << 8) - 1);
      in.ndims = static_cast<uint8_t>((w0 >> 24) & 0x3);
      const uint64_t way = (w0 >> 26) & 0x3;
      if (way == 3) bad(at, "bad DMA way (3)");
      in.way = static_cast<int8_t>(way == 1 ? 1 : way == 2 ? -1 : 0);
      in.tc = static_cast<uint8_t>((w0 >> 28) & 1);
      if ((w0 >> 31) & 1) bad(at, "nonzero reserved bit 31 in a DMA");
      in.imm = s32(w0 >> 32);
      if (n - i < 2 + 2 * static_cast<size_t>(in.ndims)) bad(at, "truncated DMA instruction");
      in.dst = decode_endpoint(w[i], i);
      ++i;
      in.src = decode_endpoint(w[i], i);
      ++i;
      for (int d = 0; d < in.ndims; ++d) {
        in.dims[d].count = static_cast<uint32_t>(w[i] & 0xFFFFFFFFu);
        in.dims[d].src_stride = s32(w[i] >> 32);
        ++i;
        if (w[i] >> 32) bad(i, "nonzero reserved bits in a DMA dimension");
        in.dims[d].dst_stride = s32(w[i]);
        ++i;
      }
      code.push_back(in);
      continue;
    }
    in.a = static_cast<uint8_t>(w0 >> 8);
    in.b = static_cast<uint8_t>(w0 >> 16);
    in.c = static_cast<uint8_t>(w0 >> 24);
    in.imm = s32(w0 >> 32);
    const FlagFields fl = flag_fields(in.op);
    for (int k = 0; k < fl.n; ++k) {
      uint16_t& f = fl.field[k] == 0 ? in.a : in.b;
      f = static_cast<uint16_t>(f | ((in.c >> k) & 1) << 8);
    }
    in.c = static_cast<uint16_t>(in.c >> fl.n);  // with flag operands, what is left must be zero (below)
    const uint32_t flags = op_info(in.op).flags;
    if (flags & kOpLong) {
      if (i >= n) bad(at, "truncated instruction");
      const uint64_t w1 = w[i++];
      in.imm2 = s32(w1);
      in.d = static_cast<uint8_t>(w1 >> 32);
      if (w1 >> 40) bad(at + 1, "nonzero reserved bits");
    }
    const FieldUse u = field_use(in.op);
    const uint16_t regs[4] = {in.a, in.b, in.c, in.d};
    for (int r = u.regs; r < 4; ++r)
      if (regs[r]) bad(at, std::string("nonzero unused register field in ") + op_info(in.op).mnemonic);
    if ((!u.imm && in.imm) || (!u.imm2 && in.imm2))
      bad(at, std::string("nonzero unused immediate in ") + op_info(in.op).mnemonic);
    code.push_back(in);
  }
  return code;
}

}  // namespace tpusim::isa

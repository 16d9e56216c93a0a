#include "isa/asm/instr.h"

#include <cstdio>
#include <set>
#include <string>

namespace tpusim::isa {

namespace {

const OpInfo kOpTable[] = {
#define TPUSIM_X(e, m, s, u, f) {Op::e, m, s, Unit::u, f},
    TPUSIM_OPCODES(TPUSIM_X)
#undef TPUSIM_X
};

std::string where(const CoreProgram& p, size_t i) {
  std::string s = "chip" + std::to_string(p.chip) + ".core" + std::to_string(p.core) + " instruction " +
                  std::to_string(i);
  if (i < p.code.size() && p.code[i].line) s += " (line " + std::to_string(p.code[i].line) + ")";
  return s;
}

std::string check_instr(const Target& t, const CoreProgram& p, size_t i) {
  const Instr& in = p.code[i];
  if (static_cast<int>(in.op) >= op_count()) return where(p, i) + ": unknown opcode";
  const OpInfo& info = op_info(in.op);
  const uint16_t regs[4] = {in.a, in.b, in.c, in.d};
  int r = 0, imms = 0;
  for (const char* s = info.signature; *s; ++s) {
    switch (*s) {
      case 'S':
      case 'A':
        if (regs[r++] >= kScalarRegs) return where(p, i) + ": scalar register out of range";
        if (*s == 'A') ++imms;
        break;
      case 'V':
        if (regs[r++] >= kVectorRegs) return where(p, i) + ": vector register out of range";
        break;
      case 'M':
        if (regs[r++] >= kMaskRegs) return where(p, i) + ": mask register out of range";
        break;
      case 'X':
        if (regs[r++] >= t.mxus_per_core)
          return where(p, i) + ": MXU index " + std::to_string(regs[r - 1]) + " but the target has " +
                 std::to_string(t.mxus_per_core) + " MXU(s) per core";
        break;
      case 'F':
        if (regs[r++] >= kSyncFlags) return where(p, i) + ": sync flag out of range";
        break;
      case 'L':
        if (in.imm < 0 || static_cast<size_t>(in.imm) > p.code.size())
          return where(p, i) + ": branch target outside the program";
        ++imms;
        break;
      default:
        ++imms;
    }
  }
  if ((info.flags & kOpOptMask) && in.c >= kMaskRegs) return where(p, i) + ": mask register out of range";
  // -1: before any `op` marker; markers name graph ops 0 and up.
  if (in.op_id < -1) return where(p, i) + ": op id " + std::to_string(in.op_id) + " is negative";
  switch (in.op) {
    case Op::kOpMark:
      if (in.imm < 0) return where(p, i) + ": op id " + std::to_string(in.imm) + " is negative";
      break;
    case Op::kVxpose:
      if (in.a > kVectorRegs - 16 || in.b > kVectorRegs - 16)
        return where(p, i) + ": vxpose needs 16 consecutive registers (v0..v16 as the first)";
      break;
    case Op::kVmask:
      if (in.imm < 0 || in.imm > kSublanes || in.imm2 < 0 || in.imm2 > kLanes)
        return where(p, i) + ": vmask rows must be 0..8 and lanes 0..128";
      break;
    case Op::kMswap:
      if (in.imm < 0 || static_cast<uint32_t>(in.imm) > t.mxu_rows)
        return where(p, i) + ": mswap k must be 0..rows of the array";
      break;
    case Op::kMmul:
    case Op::kMpush:
    case Op::kMpushT:
      break;
    case Op::kDma: {
      if (in.ndims > kMaxDmaDims) return where(p, i) + ": more than 3 outer DMA dimensions";
      if (in.tc >= kTrafficClasses) return where(p, i) + ": DMA traffic class must be 0 or 1";
      if (in.way < -1 || in.way > 1) return where(p, i) + ": DMA way must be +1, -1 or 0";
      if (in.flag < -1 || in.flag >= kSyncFlags || in.rflag < -1 || in.rflag >= kSyncFlags)
        return where(p, i) + ": DMA flag out of range";
      for (const DmaEndpoint* e : {&in.dst, &in.src}) {
        if (static_cast<int>(e->space) >= kSpaceCount) return where(p, i) + ": bad DMA memory space";
        if (e->reg >= kScalarRegs) return where(p, i) + ": scalar register out of range";
        if (e->chip < -1 || (e->chip >= 0 && static_cast<uint32_t>(e->chip) >= t.chips))
          return where(p, i) + ": DMA names chip " + std::to_string(e->chip) + " but the target has " +
                 std::to_string(t.chips);
        if (e->core < -1 || (e->core >= 0 && static_cast<uint32_t>(e->core) >= t.cores_per_chip))
          return where(p, i) + ": DMA names core " + std::to_string(e->core) + " but the target has " +
                 std::to_string(t.cores_per_chip) + " per chip";
      }
      if (in.imm < 0) return where(p, i) + ": negative DMA byte count";
      break;
    }
    default:
      break;
  }
  return {};
}

}  // namespace

const OpInfo& op_info(Op op) { return kOpTable[static_cast<int>(op)]; }

const char* trap_reason(int64_t code) {
  switch (code) {
    case kTrapIndexOutOfRange: return "an index read at run time is out of range";
    default: return "";
  }
}

const char* space_name(Space s) {
  switch (s) {
    case Space::kHbm: return "hbm";
    case Space::kVmem: return "vmem";
    case Space::kSmem: return "smem";
    case Space::kHost: return "host";
  }
  return "?";
}

const char* dtype_name(Dtype t) {
  switch (t) {
    case Dtype::kF32: return "f32";
    case Dtype::kBf16: return "bf16";
    case Dtype::kI32: return "i32";
  }
  return "?";
}

const char* io_kind_name(IoKind k) {
  switch (k) {
    case IoKind::kInput: return "input";
    case IoKind::kOutput: return "output";
    case IoKind::kConst: return "const";
  }
  return "?";
}

const char* io_spread_name(IoSpread s) {
  switch (s) {
    case IoSpread::kOne: return "one";
    case IoSpread::kSplit: return "split";
    case IoSpread::kCopies: return "copies";
  }
  return "?";
}

std::string place_text(const IoPlace& p) {
  char addr[24];
  std::snprintf(addr, sizeof addr, "0x%llx", static_cast<unsigned long long>(p.addr));
  return std::string(space_name(p.space)) + "@chip" + std::to_string(p.chip) + ".c" + std::to_string(p.core) + ":" + addr;
}

std::vector<IoPlace> IoEntry::places() const {
  std::vector<IoPlace> out{{space, chip, core, addr}};
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

void IoEntry::set_places(const std::vector<IoPlace>& all, IoSpread how) {
  space = all.at(0).space;
  chip = all[0].chip;
  core = all[0].core;
  addr = all[0].addr;
  more.assign(all.begin() + 1, all.end());
  spread = more.empty() ? IoSpread::kOne : how;
}

uint64_t IoEntry::place_bytes() const {
  if (spread != IoSpread::kSplit) return extent_bytes();
  return elements() * dtype_size(dtype) / (more.size() + 1);
}

bool Instr::same_encoding(const Instr& o) const {
  if (op != o.op || a != o.a || b != o.b || c != o.c || d != o.d || imm != o.imm || imm2 != o.imm2) return false;
  if (op != Op::kDma) return true;
  if (!(dst == o.dst) || !(src == o.src) || ndims != o.ndims || flag != o.flag || rflag != o.rflag || tc != o.tc || way != o.way)
    return false;
  for (int i = 0; i < ndims && i < kMaxDmaDims; ++i)
    if (!(dims[i] == o.dims[i])) return false;
  return true;
}

bool Target::operator==(const Target& o) const {
  return chips == o.chips && cores_per_chip == o.cores_per_chip && mxus_per_core == o.mxus_per_core &&
         mxu_rows == o.mxu_rows && mxu_cols == o.mxu_cols && fifo_rows == o.fifo_rows &&
         vmem_bytes == o.vmem_bytes && smem_bytes == o.smem_bytes && hbm_bytes == o.hbm_bytes &&
         host_bytes == o.host_bytes;
}

std::string Target::check() const {
  // A DMA endpoint encodes chip + 1 in 12 bits (docs/isa.md section 5).
  if (chips < 1 || chips > 4095) return "chips must be 1..4095";
  if (cores_per_chip < 1 || cores_per_chip > 254) return "cores per chip must be 1..254";
  if (mxus_per_core < 1 || mxus_per_core > 16) return "MXUs per core must be 1..16";
  if (mxu_rows < 8 || mxu_rows > 128 || mxu_rows % 8) return "mxu_rows must be a multiple of 8 in 8..128";
  if (mxu_cols < 8 || mxu_cols > 128 || mxu_cols % 8) return "mxu_cols must be a multiple of 8 in 8..128";
  if (fifo_rows < 8 || fifo_rows % 8 || fifo_rows > 1u << 16) return "fifo_rows must be a multiple of 8 in 8..65536";
  if (smem_bytes > (1ull << 32) || vmem_bytes > (1ull << 32) || hbm_bytes > (1ull << 40) ||
      host_bytes > (1ull << 40))
    return "memory size too large (vmem/smem <= 4 GiB, hbm/host <= 1 TiB)";
  return {};
}

std::vector<uint64_t> IoEntry::element_offsets() const {
  std::vector<uint64_t> out;
  const size_t rank = shape.size();
  std::vector<int64_t> st(rank);
  if (strides.empty()) {
    int64_t s = static_cast<int64_t>(dtype_size(dtype));
    for (size_t d = rank; d-- > 0;) {
      st[d] = s;
      s *= shape[d];
    }
  } else {
    st = strides;
  }
  uint64_t n = elements();
  out.reserve(n);
  std::vector<int64_t> idx(rank, 0);
  for (uint64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (size_t d = 0; d < rank; ++d) off += idx[d] * st[d];
    out.push_back(static_cast<uint64_t>(off));
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

uint64_t IoEntry::extent_bytes() const {
  if (elements() == 0) return 0;
  if (strides.empty()) return elements() * dtype_size(dtype);
  uint64_t hi = 0;
  for (size_t d = 0; d < shape.size(); ++d) hi += static_cast<uint64_t>(shape[d] - 1) * static_cast<uint64_t>(strides[d]);
  return hi + dtype_size(dtype);
}

std::string check_bundle(const Bundle& b) {
  std::string t = b.target.check();
  if (!t.empty()) return "target: " + t;
  std::set<std::pair<uint32_t, uint32_t>> seen;
  for (const auto& p : b.cores) {
    if (p.chip >= b.target.chips || p.core >= b.target.cores_per_chip)
      return "program for chip" + std::to_string(p.chip) + ".core" + std::to_string(p.core) +
             " outside the target (" + std::to_string(b.target.chips) + " chip(s) x " +
             std::to_string(b.target.cores_per_chip) + " core(s))";
    if (!seen.insert({p.chip, p.core}).second)
      return "two programs for chip" + std::to_string(p.chip) + ".core" + std::to_string(p.core);
    if (p.code.size() > (1u << 30)) return "program too long";
    for (size_t i = 0; i < p.code.size(); ++i) {
      std::string e = check_instr(b.target, p, i);
      if (!e.empty()) return e;
    }
    for (const auto& l : p.labels)
      if (l.second > p.code.size()) return "label '" + l.first + "' points outside the program";
    for (const auto& v : p.vmem_plan) {
      const std::string what = "chip" + std::to_string(p.chip) + ".core" + std::to_string(p.core) +
                               " VMEM plan buffer (op " + std::to_string(v.op_id) + ")";
      if (v.op_id < -1) return what + ": bad op id";
      if (v.bytes == 0) return what + ": empty";
      if (v.addr > b.target.vmem_bytes || v.bytes > b.target.vmem_bytes - v.addr)
        return what + ": does not fit in vmem (" + std::to_string(b.target.vmem_bytes) + " bytes)";
    }
  }
  for (const auto& [id, name] : b.op_names) {
    if (id < 0) return "op name for a negative op id " + std::to_string(id);
    if (name.empty() || name.size() > kMaxOpNameBytes) return "op " + std::to_string(id) + ": name empty or too long";
    for (char ch : name)
      if (ch == '"' || static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
        return "op " + std::to_string(id) + ": name holds a quote or a control character";
  }
  for (const auto& [id, flops] : b.op_flops)
    if (id < 0) return "op FLOPs for a negative op id " + std::to_string(id);
  std::set<std::string> names;
  for (const auto& e : b.io) {
    const std::string what = std::string(io_kind_name(e.kind)) + " '" + e.name + "'";
    if (e.name.empty()) return "unnamed " + std::string(io_kind_name(e.kind));
    if (!names.insert(e.name).second) return what + " defined twice";
    if (static_cast<int>(e.dtype) > 2 || static_cast<int>(e.space) >= kSpaceCount || static_cast<int>(e.kind) > 2)
      return what + ": bad dtype, space or kind";
    if (e.shape.size() > 8) return what + ": more than 8 dimensions";
    uint64_t n = 1;
    for (auto d : e.shape) {
      if (d < 0 || d > (1ll << 40)) return what + ": bad shape";
      n *= static_cast<uint64_t>(d);
      if (n > (1ull << 36)) return what + ": too many elements";
    }
    if (!e.strides.empty()) {
      if (e.strides.size() != e.shape.size()) return what + ": strides and shape differ in rank";
      for (auto s : e.strides)
        if (s < 0 || s > (1ll << 40)) return what + ": bad stride";
    }
    if (static_cast<int>(e.spread) > 2) return what + ": bad spread";
    if (e.spread == IoSpread::kOne && !e.more.empty()) return what + ": further places without split= or copies=";
    if (e.spread != IoSpread::kOne) {
      if (e.more.empty()) return what + ": " + io_spread_name(e.spread) + "= names no further place";
      if (e.more.size() >= (1u << 16)) return what + ": more than 65535 places";
      if (!e.strides.empty()) return what + ": a spread tensor is dense (no strides=)";
      const int64_t parts = static_cast<int64_t>(e.more.size() + 1);
      if (e.spread == IoSpread::kSplit && (e.shape.empty() || e.shape[0] % parts != 0))
        return what + ": split= needs a first dimension divisible by its " + std::to_string(parts) + " places";
    }
    const std::vector<IoPlace> places = e.places();
    for (size_t k = 0; k < places.size(); ++k) {
      const IoPlace& pl = places[k];
      const std::string where = places.size() > 1 ? what + " place " + std::to_string(k) : what;
      if (static_cast<int>(pl.space) >= kSpaceCount) return where + ": bad space";
      if (pl.chip >= b.target.chips || pl.core >= b.target.cores_per_chip) return where + ": placed outside the target";
      uint64_t size = pl.space == Space::kHbm    ? b.target.hbm_bytes
                      : pl.space == Space::kVmem ? b.target.vmem_bytes
                      : pl.space == Space::kSmem ? b.target.smem_bytes
                                                 : b.target.host_bytes;
      if (pl.addr > size || e.place_bytes() > size - pl.addr)
        return where + ": does not fit in " + space_name(pl.space) + " (" + std::to_string(size) + " bytes)";
    }
    if (e.kind == IoKind::kConst && e.data.size() != n * dtype_size(e.dtype))
      return what + ": constant data size does not match its shape";
    if (e.kind != IoKind::kConst && !e.data.empty()) return what + ": only constants carry data";
  }
  return {};
}

}  // namespace tpusim::isa

#include "isa/exec/semantics.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "isa/numerics/bf16.h"
#include "isa/numerics/fp32.h"
#include "isa/numerics/mxu.h"
#include "isa/numerics/vpu.h"

namespace tpusim::exec {

using isa::Instr;
using isa::Op;

namespace {

[[noreturn]] void fault(const std::string& what) { throw Fault(what); }

void check_reg(int r, int limit, const char* what) {
  if (r < 0 || r >= limit) fault(std::string("bad ") + what + " register index " + std::to_string(r));
}

uint32_t alu(Op op, uint32_t a, uint32_t b) {
  const int32_t sa = static_cast<int32_t>(a), sb = static_cast<int32_t>(b);
  switch (op) {
    case Op::kAdd: case Op::kAddI: return a + b;
    case Op::kSub: case Op::kSubI: return a - b;
    case Op::kMul: case Op::kMulI: return a * b;
    case Op::kDiv: case Op::kDivI:
      if (b == 0) fault("division by zero");
      if (sa == INT32_MIN && sb == -1) return a;  // wraps, as two's complement hardware does
      return static_cast<uint32_t>(sa / sb);
    case Op::kRem: case Op::kRemI:
      if (b == 0) fault("division by zero (rem)");
      if (sa == INT32_MIN && sb == -1) return 0;
      return static_cast<uint32_t>(sa % sb);
    case Op::kAnd: case Op::kAndI: return a & b;
    case Op::kOr: case Op::kOrI: return a | b;
    case Op::kXor: case Op::kXorI: return a ^ b;
    case Op::kShl: case Op::kShlI: return a << (b & 31);
    case Op::kShr: case Op::kShrI: return a >> (b & 31);
    case Op::kSra: case Op::kSraI:
      return static_cast<uint32_t>(sa < 0 ? ~(~sa >> (b & 31)) : sa >> (b & 31));
    case Op::kMin: case Op::kMinI: return static_cast<uint32_t>(std::min(sa, sb));
    case Op::kMax: case Op::kMaxI: return static_cast<uint32_t>(std::max(sa, sb));
    default: fault("not an ALU instruction");
  }
}

bool is_alu_reg(Op op) { return op >= Op::kAdd && op <= Op::kMax; }
bool is_alu_imm(Op op) { return op >= Op::kAddI && op <= Op::kMaxI; }

void set_s(CoreState& c, int r, uint32_t v) {
  check_reg(r, isa::kScalarRegs, "scalar");
  if (r != 0) c.s[static_cast<size_t>(r)] = static_cast<int32_t>(v);  // s0 reads 0
}

uint32_t get_s(const CoreState& c, int r) {
  check_reg(r, isa::kScalarRegs, "scalar");
  return static_cast<uint32_t>(c.s[static_cast<size_t>(r)]);
}

VReg& vreg(CoreState& c, int r) {
  check_reg(r, isa::kVectorRegs, "vector");
  return c.v[static_cast<size_t>(r)];
}

const MaskReg& mreg(const CoreState& c, int r) {
  check_reg(r, isa::kMaskRegs, "mask");
  return c.m[static_cast<size_t>(r)];
}

MaskReg& mreg_w(CoreState& c, int r) {
  check_reg(r, isa::kMaskRegs, "mask");
  if (r == 0) fault("m0 is read-only");
  return c.m[static_cast<size_t>(r)];
}

// Elementwise ops read each element before writing it, so vD may alias a source.
template <typename F>
void unary(CoreState& c, const Instr& in, F f) {
  const VReg& src = vreg(c, in.b);
  VReg& d = vreg(c, in.a);
  for (size_t i = 0; i < src.bits.size(); ++i)
    d.bits[i] = num::f32_bits(f(num::f32_from_bits(src.bits[i])));
}

template <typename F>
void binary(CoreState& c, const Instr& in, F f) {
  const VReg& x = vreg(c, in.b);
  const VReg& y = vreg(c, in.c);
  VReg& d = vreg(c, in.a);
  for (size_t i = 0; i < x.bits.size(); ++i)
    d.bits[i] = num::f32_bits(f(num::f32_from_bits(x.bits[i]), num::f32_from_bits(y.bits[i])));
}

// The adds of a vadd (6.25 M of them in a pod-scale all-reduce) in a loop the
// compiler vectorises, also built for AVX2 and picked at load time where the host
// has it: the same IEEE adds and flushes (num::add), so the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
void add_elements(const uint32_t* x, const uint32_t* y, uint32_t* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = num::f32_bits(num::add(num::f32_from_bits(x[i]), num::f32_from_bits(y[i])));
}

template <typename F>
void compare(CoreState& c, const Instr& in, F f) {
  const VReg& x = vreg(c, in.b);
  const VReg& y = vreg(c, in.c);
  MaskReg& d = mreg_w(c, in.a);
  for (size_t i = 0; i < x.bits.size(); ++i)
    d.on[i] = f(num::f32_from_bits(x.bits[i]), num::f32_from_bits(y.bits[i])) ? 1 : 0;
}

void vector_load_store(CoreState& c, const Instr& in) {
  const bool bf16 = in.op == Op::kVldBf16 || in.op == Op::kVstBf16;
  const bool load = in.op == Op::kVld || in.op == Op::kVldBf16;
  const int64_t esize = bf16 ? 2 : 4;
  const int64_t base = effective_address(c, in.b, in.imm);
  const int64_t stride = in.imm2;
  if (base % esize != 0 || stride % esize != 0)
    fault(std::string("misaligned tile: address ") + std::to_string(base) + " / sublane stride " +
          std::to_string(stride) + " not a multiple of " + std::to_string(esize) + " bytes");
  const MaskReg& mask = mreg(c, in.c);
  VReg& r = vreg(c, in.a);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  // A dense fp32 tile under m0 (all lanes) inside VMEM: one 4 KiB copy, the same
  // bytes as row by row (which is what a faulting access still takes).
  constexpr int64_t kTileBytes = kSublanes * kLanes * 4;
  if (!bf16 && in.c == 0 && stride == kLanes * 4 && base >= 0 &&
      static_cast<uint64_t>(base) + kTileBytes <= c.vmem.size()) {
    if (load) c.vmem.read(static_cast<uint64_t>(base), r.bits.data(), kTileBytes);
    else c.vmem.write(static_cast<uint64_t>(base), r.bits.data(), kTileBytes);
    return;
  }
#endif
  uint8_t row[kLanes * 4];
  for (int s = 0; s < kSublanes; ++s) {
    const int64_t addr = base + s * stride;
    // A mask byte is 0 or 1: the row is full when every 8-byte word is all ones
    // and empty when every word is zero (a word at a time: every vld/vst asks).
    uint64_t all_on = ~uint64_t{0}, some_on = 0;
    for (int l = 0; l < kLanes; l += 8) {
      uint64_t w;
      std::memcpy(&w, &mask.on[static_cast<size_t>(s * kLanes + l)], 8);
      all_on &= w;
      some_on |= w;
    }
    const bool full = all_on == 0x0101010101010101ull, any = some_on != 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    // A full fp32 row: VMEM holds each element's bytes least significant first,
    // which on a little-endian host is the register's own layout.
    if (full && !bf16) {
      c.vmem.check(addr, static_cast<uint64_t>(kLanes * 4));
      if (load) c.vmem.read(static_cast<uint64_t>(addr), &r.at(s, 0), static_cast<uint64_t>(kLanes * 4));
      else c.vmem.write(static_cast<uint64_t>(addr), &r.at(s, 0), static_cast<uint64_t>(kLanes * 4));
      continue;
    }
#endif
    if (!any) {
      if (load)
        for (int l = 0; l < kLanes; ++l) r.at(s, l) = 0;
      continue;
    }
    if (full) {
      c.vmem.check(addr, static_cast<uint64_t>(kLanes * esize));
    } else {
      for (int l = 0; l < kLanes; ++l)
        if (mask.at(s, l)) c.vmem.check(addr + l * esize, static_cast<uint64_t>(esize));
    }
    if (load) {
      if (full) c.vmem.read(static_cast<uint64_t>(addr), row, static_cast<uint64_t>(kLanes * esize));
      for (int l = 0; l < kLanes; ++l) {
        if (!mask.at(s, l)) {
          r.at(s, l) = 0;
          continue;
        }
        uint8_t* p = row + l * esize;
        if (!full) c.vmem.read(static_cast<uint64_t>(addr + l * esize), p, static_cast<uint64_t>(esize));
        if (bf16) {
          r.set_f(s, l, num::bf16_to_fp32(static_cast<uint16_t>(p[0] | p[1] << 8)));
        } else {
          r.at(s, l) = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                       static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
        }
      }
    } else {
      for (int l = 0; l < kLanes; ++l) {
        uint32_t v = r.at(s, l);
        if (bf16) v = num::fp32_to_bf16(num::f32_from_bits(v));
        for (int b = 0; b < esize; ++b) row[l * esize + b] = static_cast<uint8_t>(v >> (8 * b));
      }
      if (full) {
        c.vmem.write(static_cast<uint64_t>(addr), row, static_cast<uint64_t>(kLanes * esize));
      } else {
        for (int l = 0; l < kLanes; ++l)
          if (mask.at(s, l))
            c.vmem.write(static_cast<uint64_t>(addr + l * esize), row + l * esize, static_cast<uint64_t>(esize));
      }
    }
  }
}

void reduce(CoreState& c, const Instr& in, num::ReduceOp op, bool lanes) {
  const VReg src = vreg(c, in.b);
  VReg& d = vreg(c, in.a);
  if (lanes) {
    float row[kLanes];
    for (int s = 0; s < kSublanes; ++s) {
      for (int l = 0; l < kLanes; ++l) row[l] = src.f(s, l);
      const float r = num::reduce_lanes(op, row);
      for (int l = 0; l < kLanes; ++l) d.set_f(s, l, r);
    }
  } else {
    float col[kSublanes];
    for (int l = 0; l < kLanes; ++l) {
      for (int s = 0; s < kSublanes; ++s) col[s] = src.f(s, l);
      const float r = num::reduce_sublanes(op, col);
      for (int s = 0; s < kSublanes; ++s) d.set_f(s, l, r);
    }
  }
}

}  // namespace

int32_t fp32_to_int32(float f) {
  f = num::flush(f);
  if (std::isnan(f)) return 0;
  const double r = std::nearbyint(static_cast<double>(f));  // default rounding: to nearest even
  if (r >= 2147483648.0) return INT32_MAX;
  if (r < -2147483648.0) return INT32_MIN;
  return static_cast<int32_t>(r);
}

uint32_t exec_scalar(CoreState& c, const Instr& in, uint32_t pc) {
  const Op op = in.op;
  if (is_alu_reg(op)) {
    set_s(c, in.a, alu(op, get_s(c, in.b), get_s(c, in.c)));
    return pc + 1;
  }
  if (is_alu_imm(op)) {
    set_s(c, in.a, alu(op, get_s(c, in.b), static_cast<uint32_t>(in.imm)));
    return pc + 1;
  }
  switch (op) {
    case Op::kNop: return pc + 1;
    case Op::kTrap: {
      const std::string reason = isa::trap_reason(in.imm);
      fault("trap " + std::to_string(in.imm) + (reason.empty() ? "" : ": " + reason));
    }
    case Op::kLi: set_s(c, in.a, static_cast<uint32_t>(in.imm)); return pc + 1;
    case Op::kFtest: set_s(c, in.a, flag_at_least(c, in.b, in.imm) ? 1u : 0u); return pc + 1;
    case Op::kLd:
    case Op::kSt: {
      const int64_t addr = effective_address(c, in.b, in.imm);
      if (addr % 4 != 0) fault("misaligned SMEM word address " + std::to_string(addr));
      c.smem.check(addr, 4);
      if (op == Op::kLd) set_s(c, in.a, c.smem.read_u32(static_cast<uint64_t>(addr)));
      else c.smem.write_u32(static_cast<uint64_t>(addr), get_s(c, in.a));
      return pc + 1;
    }
    case Op::kBeq: return get_s(c, in.a) == get_s(c, in.b) ? static_cast<uint32_t>(in.imm) : pc + 1;
    case Op::kBne: return get_s(c, in.a) != get_s(c, in.b) ? static_cast<uint32_t>(in.imm) : pc + 1;
    case Op::kBlt:
      return static_cast<int32_t>(get_s(c, in.a)) < static_cast<int32_t>(get_s(c, in.b)) ? static_cast<uint32_t>(in.imm)
                                                                                         : pc + 1;
    case Op::kBge:
      return static_cast<int32_t>(get_s(c, in.a)) >= static_cast<int32_t>(get_s(c, in.b))
                 ? static_cast<uint32_t>(in.imm)
                 : pc + 1;
    case Op::kJmp: return static_cast<uint32_t>(in.imm);
    case Op::kLoop: {
      const uint32_t v = get_s(c, in.a) - 1;
      set_s(c, in.a, v);
      return v != 0 ? static_cast<uint32_t>(in.imm) : pc + 1;
    }
    default: fault(std::string("'") + isa::op_info(op).mnemonic + "' is not a scalar instruction");
  }
}

void exec_vector(CoreState& c, const Instr& in) {
  switch (in.op) {
    case Op::kVld: case Op::kVldBf16: case Op::kVst: case Op::kVstBf16: vector_load_store(c, in); return;
    case Op::kVadd: {
      const VReg& x = vreg(c, in.b);
      const VReg& y = vreg(c, in.c);
      VReg& d = vreg(c, in.a);
      add_elements(x.bits.data(), y.bits.data(), d.bits.data(), d.bits.size());
      return;
    }
    case Op::kVsub: binary(c, in, [](float x, float y) { return num::sub(x, y); }); return;
    case Op::kVmul: binary(c, in, [](float x, float y) { return num::mul(x, y); }); return;
    case Op::kVdiv: binary(c, in, [](float x, float y) { return num::div(x, y); }); return;
    case Op::kVmax: binary(c, in, [](float x, float y) { return num::max(x, y); }); return;
    case Op::kVmin: binary(c, in, [](float x, float y) { return num::min(x, y); }); return;
    case Op::kVneg: unary(c, in, [](float x) { return num::neg(x); }); return;
    case Op::kVabs: unary(c, in, [](float x) { return num::abs(x); }); return;
    case Op::kVsqrt: unary(c, in, [](float x) { return num::sqrt(x); }); return;
    case Op::kVrsqrt: unary(c, in, [](float x) { return num::rsqrt(x); }); return;
    case Op::kVrecip: unary(c, in, [](float x) { return num::recip(x); }); return;
    case Op::kVexp: unary(c, in, [](float x) { return num::exp(x); }); return;
    case Op::kVlog: unary(c, in, [](float x) { return num::log(x); }); return;
    case Op::kVtanh: unary(c, in, [](float x) { return num::tanh(x); }); return;
    case Op::kVerf: unary(c, in, [](float x) { return num::erf(x); }); return;
    case Op::kVmov: {
      const VReg src = vreg(c, in.b);
      vreg(c, in.a) = src;
      return;
    }
    case Op::kVcvtBf16: unary(c, in, [](float x) { return num::round_to_bf16(x); }); return;
    case Op::kVcvtF32S32: {
      const VReg src = vreg(c, in.b);
      VReg& d = vreg(c, in.a);
      // int32 -> fp32 rounds to nearest even (exact below 2^24); never subnormal.
      for (size_t i = 0; i < src.bits.size(); ++i)
        d.bits[i] = num::f32_bits(static_cast<float>(static_cast<int32_t>(src.bits[i])));
      return;
    }
    case Op::kVcvtS32F32: {
      const VReg src = vreg(c, in.b);
      VReg& d = vreg(c, in.a);
      for (size_t i = 0; i < src.bits.size(); ++i)
        d.bits[i] = static_cast<uint32_t>(fp32_to_int32(num::f32_from_bits(src.bits[i])));
      return;
    }
    case Op::kVcmpEq: compare(c, in, [](float x, float y) { return num::cmp_eq(x, y); }); return;
    case Op::kVcmpNe: compare(c, in, [](float x, float y) { return !num::cmp_eq(x, y); }); return;
    case Op::kVcmpLt: compare(c, in, [](float x, float y) { return num::cmp_lt(x, y); }); return;
    case Op::kVcmpLe: compare(c, in, [](float x, float y) { return num::cmp_le(x, y); }); return;
    case Op::kVcmpGt: compare(c, in, [](float x, float y) { return num::cmp_lt(y, x); }); return;
    case Op::kVcmpGe: compare(c, in, [](float x, float y) { return num::cmp_le(y, x); }); return;
    case Op::kVsel: {
      const MaskReg& m = mreg(c, in.b);
      const VReg x = vreg(c, in.c), y = vreg(c, in.d);
      VReg& d = vreg(c, in.a);
      for (size_t i = 0; i < x.bits.size(); ++i) d.bits[i] = m.on[i] ? x.bits[i] : y.bits[i];
      return;
    }
    case Op::kVbcast: vreg(c, in.a).bits.fill(static_cast<uint32_t>(in.imm)); return;
    case Op::kVbcastS: {
      const uint32_t v = get_s(c, in.b);
      vreg(c, in.a).bits.fill(v);
      return;
    }
    case Op::kVmask: {
      if (in.imm < 0 || in.imm > kSublanes || in.imm2 < 0 || in.imm2 > kLanes) fault("vmask rows/lanes out of range");
      MaskReg& m = mreg_w(c, in.a);
      for (int s = 0; s < kSublanes; ++s)
        for (int l = 0; l < kLanes; ++l) m.set(s, l, s < in.imm && l < in.imm2);
      return;
    }
    case Op::kMand: case Op::kMor: {
      const MaskReg x = mreg(c, in.b), y = mreg(c, in.c);
      MaskReg& d = mreg_w(c, in.a);
      for (size_t i = 0; i < x.on.size(); ++i) d.on[i] = in.op == Op::kMand ? (x.on[i] & y.on[i]) : (x.on[i] | y.on[i]);
      return;
    }
    case Op::kMnot: {
      const MaskReg x = mreg(c, in.b);
      MaskReg& d = mreg_w(c, in.a);
      for (size_t i = 0; i < x.on.size(); ++i) d.on[i] = x.on[i] ? 0 : 1;
      return;
    }
    case Op::kVredLaneSum: reduce(c, in, num::ReduceOp::kSum, true); return;
    case Op::kVredLaneMax: reduce(c, in, num::ReduceOp::kMax, true); return;
    case Op::kVredLaneMin: reduce(c, in, num::ReduceOp::kMin, true); return;
    case Op::kVredSubSum: reduce(c, in, num::ReduceOp::kSum, false); return;
    case Op::kVredSubMax: reduce(c, in, num::ReduceOp::kMax, false); return;
    case Op::kVredSubMin: reduce(c, in, num::ReduceOp::kMin, false); return;
    case Op::kVxpose: {
      if (in.a > isa::kVectorRegs - 16 || in.b > isa::kVectorRegs - 16)
        fault("vxpose register block beyond v31");
      // Rows r = 8*i + sublane of v[b + i]; lanes are columns.
      std::vector<uint32_t> tmp(static_cast<size_t>(kLanes * kLanes));
      for (int r = 0; r < kLanes; ++r)
        for (int col = 0; col < kLanes; ++col)
          tmp[static_cast<size_t>(col * kLanes + r)] = c.v[static_cast<size_t>(in.b + r / 8)].at(r % 8, col);
      for (int r = 0; r < kLanes; ++r)
        for (int col = 0; col < kLanes; ++col)
          c.v[static_cast<size_t>(in.a + r / 8)].at(r % 8, col) = tmp[static_cast<size_t>(r * kLanes + col)];
      return;
    }
    default: fault(std::string("'") + isa::op_info(in.op).mnemonic + "' is not a vector instruction");
  }
}

MxuState& mxu_at(CoreState& c, int index) {
  if (index < 0 || static_cast<size_t>(index) >= c.mxus.size())
    fault("bad MXU index " + std::to_string(index) + " (core has " + std::to_string(c.mxus.size()) + ")");
  return c.mxus[static_cast<size_t>(index)];
}

void mxu_push(MxuState& m, const VReg& src, bool transposed) {
  if (!transposed) {
    if (m.staging_rows + kSublanes > m.rows)
      fault("weight staging overflow: more than " + std::to_string(m.rows) + " rows pushed before mswap");
    for (int s = 0; s < kSublanes; ++s)
      for (int j = 0; j < m.cols; ++j)
        m.staging[static_cast<size_t>((m.staging_rows + s) * m.cols + j)] = num::fp32_to_bf16(src.f(s, j));
    m.staging_rows += kSublanes;
  } else {
    if (m.staging_cols + kSublanes > m.cols)
      fault("weight staging overflow: more than " + std::to_string(m.cols) + " columns pushed before mswap");
    for (int s = 0; s < kSublanes; ++s)
      for (int k = 0; k < m.rows; ++k)
        m.staging[static_cast<size_t>(k * m.cols + m.staging_cols + s)] = num::fp32_to_bf16(src.f(s, k));
    m.staging_cols += kSublanes;
  }
}

void mxu_swap(MxuState& m, int k) {
  if (k < 0 || k > m.rows) fault("mswap k out of range");
  m.weights.swap(m.staging);
  m.weights_k = k > 0 ? k : (m.staging_cols > 0 ? m.rows : m.staging_rows);
  std::fill(m.staging.begin(), m.staging.end(), 0);
  m.staging_rows = 0;
  m.staging_cols = 0;
}

MxuResult mxu_compute(const MxuState& m, const VReg& lhs) {
  MxuResult r;
  if (m.weights_k == 0) return r;  // no valid row: every product is +0.0, every sum +0.0
  uint16_t a[kSublanes * kLanes] = {};
  for (int s = 0; s < kSublanes; ++s)
    for (int k = 0; k < m.weights_k; ++k) a[s * m.rows + k] = num::fp32_to_bf16(lhs.f(s, k));
  num::MatmulArgs args;
  args.a = a;
  args.lda = static_cast<size_t>(m.rows);
  args.w = m.weights.data();
  args.ldw = static_cast<size_t>(m.cols);
  args.c = r.v.data();
  args.ldc = kLanes;
  args.m = kSublanes;
  args.k = m.weights_k;
  args.n = m.cols;
  args.rows = m.rows;
  args.accumulate = false;
  num::mxu_matmul(args);
  return r;
}

void mxu_fifo_push(MxuState& m, const MxuResult& r) {
  if (m.fifo_rows_used() + kSublanes > m.fifo_rows)
    fault("result FIFO overflow: " + std::to_string(m.fifo_rows_used()) + " of " + std::to_string(m.fifo_rows) +
          " rows outstanding");
  m.fifo.push_back(r);
}

MxuResult mxu_fifo_pop(MxuState& m) {
  if (m.fifo.empty()) fault("result FIFO underflow: mpop with no mmul result outstanding");
  MxuResult r = m.fifo.front();
  m.fifo.pop_front();
  return r;
}

void mxu_pop_into(MxuState& m, VReg& dst, bool accumulate) {
  const MxuResult r = mxu_fifo_pop(m);
  for (size_t i = 0; i < r.v.size(); ++i)
    dst.bits[i] = accumulate ? num::f32_bits(num::add(num::f32_from_bits(dst.bits[i]), r.v[i])) : num::f32_bits(r.v[i]);
}

void exec_matrix(CoreState& c, const Instr& in) {
  switch (in.op) {
    case Op::kMpush: mxu_push(mxu_at(c, in.a), vreg(c, in.b), false); return;
    case Op::kMpushT: mxu_push(mxu_at(c, in.a), vreg(c, in.b), true); return;
    case Op::kMswap: mxu_swap(mxu_at(c, in.a), in.imm); return;
    case Op::kMmul: {
      MxuState& m = mxu_at(c, in.a);
      if (m.fifo_rows_used() + kSublanes > m.fifo_rows) mxu_fifo_push(m, MxuResult{});  // faults: overflow
      mxu_fifo_push(m, mxu_compute(m, vreg(c, in.b)));
      return;
    }
    case Op::kMpop: mxu_pop_into(mxu_at(c, in.b), vreg(c, in.a), false); return;
    case Op::kMpopAdd: mxu_pop_into(mxu_at(c, in.b), vreg(c, in.a), true); return;
    default: fault(std::string("'") + isa::op_info(in.op).mnemonic + "' is not a matrix instruction");
  }
}

uint64_t DmaPlan::total_bytes() const {
  uint64_t n = bytes;
  for (int d = 0; d < ndims; ++d) n *= dims[d].count;
  return n;
}

std::string DmaPlan::describe() const {
  return std::to_string(total_bytes()) + " bytes " + src->name() + "+" + std::to_string(src_addr) + " -> " +
         dst->name() + "+" + std::to_string(dst_addr);
}

DmaPlan plan_dma(Machine& m, CoreState& issuer, const Instr& in) {
  if (in.op != Op::kDma) fault("not a DMA instruction");
  DmaPlan p;
  auto resolve = [&](const isa::DmaEndpoint& e, uint32_t& chip, uint32_t& core) {
    chip = e.chip >= 0 ? static_cast<uint32_t>(e.chip) : issuer.chip;
    const bool per_core = e.space == isa::Space::kVmem || e.space == isa::Space::kSmem;
    core = e.core >= 0 ? static_cast<uint32_t>(e.core) : (per_core && e.chip < 0 ? issuer.core : 0);
    if (chip >= m.target.chips || core >= m.target.cores_per_chip)
      fault("DMA names chip" + std::to_string(chip) + ".core" + std::to_string(core) + ", outside the target");
    check_reg(e.reg, isa::kScalarRegs, "scalar");
  };
  uint32_t dchip, dcore, schip, score;
  resolve(in.dst, dchip, dcore);
  resolve(in.src, schip, score);
  p.dst = &m.memory(in.dst.space, dchip, dcore);
  p.src = &m.memory(in.src.space, schip, score);
  p.dst_addr = effective_address(issuer, in.dst.reg, in.dst.offset);
  p.src_addr = effective_address(issuer, in.src.reg, in.src.offset);
  if (in.imm < 0) fault("negative DMA byte count");
  p.bytes = static_cast<uint64_t>(in.imm);
  p.ndims = in.ndims;
  if (p.ndims > isa::kMaxDmaDims) fault("more than 3 DMA dimensions");
  for (int d = 0; d < p.ndims; ++d) p.dims[d] = in.dims[d];
  p.flag_core = &issuer;
  p.flag = in.flag;
  p.rflag_core = &m.core(dchip, dcore);
  p.rflag = in.rflag;
  // The touched bytes span from the lowest to the highest corner of the index box.
  if (p.total_bytes() == 0) return p;
  if (p.total_bytes() > (1ull << 34)) fault("DMA larger than 16 GiB");
  int64_t slo = 0, shi = 0, dlo = 0, dhi = 0;
  for (int d = 0; d < p.ndims; ++d) {
    const int64_t n = static_cast<int64_t>(p.dims[d].count) - 1;
    const int64_t so = n * p.dims[d].src_stride, dof = n * p.dims[d].dst_stride;
    (so < 0 ? slo : shi) += so;
    (dof < 0 ? dlo : dhi) += dof;
  }
  p.src->check(p.src_addr + slo, static_cast<uint64_t>(shi - slo) + p.bytes);
  p.dst->check(p.dst_addr + dlo, static_cast<uint64_t>(dhi - dlo) + p.bytes);
  return p;
}

void dma_copy(const DmaPlan& p) {
  if (p.total_bytes() == 0) return;
  uint32_t count[isa::kMaxDmaDims] = {1, 1, 1};
  for (int d = 0; d < p.ndims; ++d) count[d] = p.dims[d].count;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(p.bytes, 1u << 20)));
  for (uint32_t i2 = 0; i2 < count[2]; ++i2)
    for (uint32_t i1 = 0; i1 < count[1]; ++i1)
      for (uint32_t i0 = 0; i0 < count[0]; ++i0) {
        int64_t s = p.src_addr, d = p.dst_addr;
        const uint32_t idx[3] = {i0, i1, i2};
        for (int k = 0; k < p.ndims; ++k) {
          s += static_cast<int64_t>(idx[k]) * p.dims[k].src_stride;
          d += static_cast<int64_t>(idx[k]) * p.dims[k].dst_stride;
        }
        const bool overlap = p.src == p.dst && s < d + static_cast<int64_t>(p.bytes) && d < s + static_cast<int64_t>(p.bytes);
        if (overlap) {
          std::vector<uint8_t> whole(static_cast<size_t>(p.bytes));
          p.src->read(static_cast<uint64_t>(s), whole.data(), p.bytes);
          p.dst->write(static_cast<uint64_t>(d), whole.data(), p.bytes);
          continue;
        }
        for (uint64_t off = 0; off < p.bytes; off += buf.size()) {
          const uint64_t n = std::min<uint64_t>(buf.size(), p.bytes - off);
          p.src->read(static_cast<uint64_t>(s) + off, buf.data(), n);
          p.dst->write(static_cast<uint64_t>(d) + off, buf.data(), n);
        }
      }
}

void dma_signal_issuer(const DmaPlan& p) {
  if (p.flag >= 0) {
    auto& f = p.flag_core->flags[static_cast<size_t>(p.flag)];
    f = static_cast<int32_t>(static_cast<uint32_t>(f) + 1u);
  }
}

void dma_signal_destination(const DmaPlan& p) {
  if (p.rflag >= 0) {
    auto& f = p.rflag_core->flags[static_cast<size_t>(p.rflag)];
    f = static_cast<int32_t>(static_cast<uint32_t>(f) + 1u);
  }
}

bool sync_ready(const CoreState& c, const Instr& in) {
  if (in.op == Op::kWaitAny) return flag_at_least(c, in.a, in.imm) || flag_at_least(c, in.b, in.imm2);
  if (in.op != Op::kWait && in.op != Op::kWaitSub) return true;
  return flag_at_least(c, in.a, in.imm);
}

std::string wait_condition(const CoreState& c, const Instr& in) {
  auto one = [&](int flag, int32_t n) {
    const bool ok = flag >= 0 && flag < isa::kSyncFlags;
    return "f" + std::to_string(flag) + " >= " + std::to_string(n) + " (is " +
           (ok ? std::to_string(c.flags[static_cast<size_t>(flag)]) : std::string("out of range")) + ")";
  };
  return one(in.a, in.imm) + (in.op == Op::kWaitAny ? " or " + one(in.b, in.imm2) : "");
}

bool flag_at_least(const CoreState& c, int flag, int32_t n) {
  check_reg(flag, isa::kSyncFlags, "flag");
  return c.flags[static_cast<size_t>(flag)] >= n;
}

void exec_sync(CoreState& c, const Instr& in) {
  switch (in.op) {
    case Op::kWait: case Op::kWaitAny: case Op::kOpMark: case Op::kBarrier: return;
    case Op::kWaitSub: case Op::kFset: case Op::kFadd: {
      check_reg(in.a, isa::kSyncFlags, "flag");
      auto& f = c.flags[in.a];
      const uint32_t u = static_cast<uint32_t>(f), v = static_cast<uint32_t>(in.imm);
      f = static_cast<int32_t>(in.op == Op::kFset ? v : in.op == Op::kFadd ? u + v : u - v);
      return;
    }
    default: fault(std::string("'") + isa::op_info(in.op).mnemonic + "' is not a sync instruction");  // fork: the scheduler's (interpreter, sequencer)
  }
}

int fork_target(int stream, const bool* runs) {
  if (stream != 0) fault("fork from stream " + std::to_string(stream) + " (only stream 0 forks)");
  for (int s = 1; s < isa::kStreams; ++s)
    if (!runs[s]) return s;
  fault("fork while streams 1.." + std::to_string(isa::kStreams - 1) + " all run");
}

void check_barrier(int stream) {
  if (stream != 0) fault("barrier in stream " + std::to_string(stream) + " (only stream 0 takes part)");
}

}  // namespace tpusim::exec

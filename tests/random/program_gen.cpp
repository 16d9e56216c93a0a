#include "tests/random/program_gen.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

namespace tpusim::randprog {

namespace {

// VMEM layout of every core (bytes). Regions are far apart so no access of one
// region can reach another, whatever stride or tile index the generator picks.
constexpr uint32_t kVmemIn = 0x000000;       // inputs, copied in by the prologue DMAs
constexpr uint32_t kVmemScratch = 0x100000;  // 15 slots, each written by one mid-program DMA
constexpr uint32_t kVmemOut = 0x200000;      // outputs (and the exchange source)
constexpr uint32_t kVmemXch = 0x300000;      // written only by the other core's DMA
constexpr uint32_t kVmemWork = 0x400000;     // free scratch for vst/vld
constexpr uint32_t kSlot = 0x10000;          // 64 KiB per tensor slot
constexpr uint32_t kHbmIn = 0x0000000;
constexpr uint32_t kHbmOut = 0x4000000;
constexpr uint32_t kHbmSlot = 0x100000;
constexpr int kWorkTiles = 16;
constexpr int kFifoEntries = 16;   // default fifo_rows 128 / 8 rows per mmul
constexpr int kStagingPushes = 16; // R = 128 rows / 8 per push

// Flags: DMA completions use f1..f15, mid-program copies f20, the exchange
// f62 (rflag on the receiver) and f63 (flag on the sender); f40..f47 are
// software counters driven by fset/fadd/wait.sub.
constexpr int kScratchFlag = 20;
constexpr int kXchRflag = 62;
constexpr int kXchFlag = 63;

struct Tensor {
  std::string name;
  bool bf16 = false;
  int tiles = 1;   // 8-row tiles of 128 lanes
  int dims = 2;    // shape rank: [8t,128], or [t,8,128]
  int core = 0;    // the core that reads (input) or writes (output) it
  uint32_t vmem = 0;
  uint32_t hbm = 0;
  bool in_vmem = false;  // output placed directly in VMEM (no copy-out DMA)
  int tile_bytes() const { return bf16 ? 2048 : 4096; }
  int row_bytes() const { return bf16 ? 256 : 512; }
  int bytes() const { return tile_bytes() * tiles; }
};

std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

class Generator {
 public:
  Generator(uint64_t seed, const GenOptions& o) : rng_(seed ^ 0x5DEECE66Dull), opt_(o) {}
  Program run();

 private:
  struct Core {
    int id = 0;
    std::vector<std::string> code;
    int fifo[16] = {};         // outstanding mmul results per MXU
    int pushes[16] = {};       // staging pushes since the last mswap
    bool transposed[16] = {};  // kind of the pushes since the last mswap
    int flag_issued[64] = {};
    int flag_consumed[64] = {};
    int soft_flag[8] = {};     // f40..f47 exact values
    // Each mid-program DMA lands in a fresh scratch slot: a vld of an older slot
    // may still be queued when a later DMA is issued, so no slot is written twice.
    bool scratch_in_flight = false;
    int scratch_slots = 0;  // slots [0, scratch_slots - in_flight) are readable
    int labels = 0;
  };

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T>
  const T& one_of(const std::vector<T>& v) { return v[static_cast<size_t>(pick(0, int(v.size()) - 1))]; }
  std::string v() { return "v" + std::to_string(pick(0, 31)); }
  std::string m_any() { return "m" + std::to_string(pick(0, 7)); }
  std::string m_w() { return "m" + std::to_string(pick(1, 7)); }
  std::string s_any() { return "s" + std::to_string(pick(0, 31)); }
  std::string s_free() { return "s" + std::to_string(pick(8, 31)); }
  std::string mxu(int i) { return "mxu" + std::to_string(i); }
  std::string fp_literal();
  std::string label(Core& c) { return "L" + std::to_string(c.id) + "_" + std::to_string(c.labels++); }

  io::NpyArray make_input(const Tensor& t);
  uint32_t special_f32();

  void emit(Core& c, const std::string& s) { c.code.push_back("  " + s); }
  void prologue_dmas(Core& c);
  void wait_all(Core& c, int flag);
  void compute(Core& c, int n, bool allow_mxu_pop = true);
  void one_op(Core& c, bool in_loop);
  void vector_alu(Core& c);
  void scalar_alu(Core& c);
  void vload(Core& c);
  void vstore(Core& c);
  bool matrix(Core& c, bool in_loop);
  void sync_counter(Core& c, bool in_loop);
  void loop(Core& c);
  void skipped_block(Core& c);
  void mid_dma(Core& c);
  void store_outputs(Core& c);
  void copy_out(Core& c);

  std::mt19937_64 rng_;
  GenOptions opt_;
  int cores_ = 1;
  // Logical core 1 is chip1.core0 instead of chip0.core1: inputs and outputs then
  // live in that chip's memories, and the exchange crosses the chip-to-chip link.
  bool across_chips_ = false;
  int chip_of(int id) const { return across_chips_ ? id : 0; }
  int core_of(int id) const { return across_chips_ ? 0 : id; }
  // The HBM endpoint that holds `t`, as core `c` names it.
  std::string hbm_of(const Tensor& t, const Core& c) const {
    return chip_of(t.core) == chip_of(c.id) ? "hbm" : "hbm@chip" + std::to_string(chip_of(t.core));
  }
  std::vector<Tensor> inputs_, outputs_;
  std::vector<Core> core_state_;
};

uint32_t Generator::special_f32() {
  static const uint32_t kSpecial[] = {
      0x00000000u, 0x80000000u,              // +-0
      0x7F800000u, 0xFF800000u,              // +-inf
      0x7FC00000u, 0x7F800001u, 0xFFC12345u, // NaNs, non-canonical payloads too
      0x00000001u, 0x807FFFFFu, 0x00400000u, // subnormals (read as zero)
      0x00800000u, 0x80800000u,              // smallest normals
      0x7F7FFFFFu, 0xFF7FFFFFu,              // largest finite
      0x3F800000u, 0xBF800000u,              // +-1
      0x3F808000u, 0x3F818000u,              // bf16 rounding ties (even / odd)
  };
  return kSpecial[pick(0, int(sizeof kSpecial / sizeof kSpecial[0]) - 1)];
}

io::NpyArray Generator::make_input(const Tensor& t) {
  io::NpyArray a;
  a.dtype = t.bf16 ? io::NpyDtype::kU16 : io::NpyDtype::kF32;
  a.shape = t.dims == 2 ? std::vector<int64_t>{8LL * t.tiles, 128} : std::vector<int64_t>{t.tiles, 8, 128};
  const size_t n = size_t(t.tiles) * 8 * 128;
  a.data.resize(n * (t.bf16 ? 2 : 4));
  // Mostly ordinary values over a few binades, some of the contract's corner cases.
  const double special_p = chance(0.3) ? 0.05 : 0.0;
  const int exp_spread = pick(0, 12);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    if (chance(special_p)) {
      bits = special_f32();
    } else {
      float f = std::ldexp(mant(rng_), pick(-exp_spread, exp_spread));
      std::memcpy(&bits, &f, 4);
    }
    if (t.bf16) {
      // Raw upper halves (no rounding): the file carries bf16 bit patterns.
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(a.data.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(a.data.data() + 4 * i, &bits, 4);
    }
  }
  return a;
}

std::string Generator::fp_literal() {
  static const char* const kLit[] = {"0.0", "-0.0", "1.0", "-1.0", "0.5", "2.0", "3.25", "-7.5", "1e-3",
                                     "65504.0", "1e30", "-1e-30", "inf", "-inf", "nan", "0x7f800001",
                                     "1.00390625", "0x00000001"};
  return kLit[pick(0, int(sizeof kLit / sizeof kLit[0]) - 1)];
}

void Generator::wait_all(Core& c, int flag) {
  const int pending = c.flag_issued[flag] - c.flag_consumed[flag];
  if (pending <= 0) return;
  const std::string f = "f" + std::to_string(flag);
  if (chance(0.5)) {
    emit(c, "wait.sub " + f + ", " + std::to_string(pending));
    c.flag_consumed[flag] = c.flag_issued[flag];
  } else {
    emit(c, "wait " + f + ", " + std::to_string(pending));
  }
}

void Generator::prologue_dmas(Core& c) {
  std::vector<int> flags;
  for (const auto& t : inputs_) {
    if (t.core != c.id && !chance(0.3)) continue;  // a core may also fetch the other core's input
    const int flag = pick(1, 15);
    const std::string f = "f" + std::to_string(flag);
    const std::string dst = "vmem:[s0 + " + hex(t.vmem) + "]";
    const std::string src = hbm_of(t, c) + ":[s0 + " + hex(t.hbm) + "]";
    switch (pick(0, 4)) {
      case 0:
        emit(c, "dma " + dst + ", " + src + ", bytes=" + std::to_string(t.bytes()) + ", flag=" + f);
        c.flag_issued[flag] += 1;
        break;
      case 1:  // row by row: one outer dimension
        emit(c, "dma " + dst + ", " + src + ", bytes=" + std::to_string(t.row_bytes()) + ", dim=" +
                    std::to_string(8 * t.tiles) + ":" + std::to_string(t.row_bytes()) + ":" +
                    std::to_string(t.row_bytes()) + ", flag=" + f);
        c.flag_issued[flag] += 1;
        break;
      case 2: {  // half rows, two outer dimensions, addresses in registers
        const int half = t.row_bytes() / 2;
        emit(c, "li s2, " + hex(t.hbm));
        emit(c, "li s3, " + hex(t.vmem));
        emit(c, "dma vmem:[s3 + 0], " + hbm_of(t, c) + ":[s2 + 0], bytes=" + std::to_string(half) + ", dim=2:" +
                    std::to_string(half) + ":" + std::to_string(half) + ", dim=" + std::to_string(8 * t.tiles) +
                    ":" + std::to_string(t.row_bytes()) + ":" + std::to_string(t.row_bytes()) + ", flag=" + f);
        c.flag_issued[flag] += 1;
        break;
      }
      case 3: {  // tile by tile, each its own DMA on one flag
        for (int i = 0; i < t.tiles; ++i)
          emit(c, "dma vmem:[s0 + " + hex(t.vmem + uint32_t(i * t.tile_bytes())) + "], " + hbm_of(t, c) + ":[s0 + " +
                      hex(t.hbm + uint32_t(i * t.tile_bytes())) + "], bytes=" + std::to_string(t.tile_bytes()) +
                      ", flag=" + f);
        c.flag_issued[flag] += t.tiles;
        break;
      }
      default: {  // rows in reverse order (negative strides)
        const int rows = 8 * t.tiles;
        const uint32_t last = uint32_t((rows - 1) * t.row_bytes());
        emit(c, "dma vmem:[s0 + " + hex(t.vmem + last) + "], " + hbm_of(t, c) + ":[s0 + " + hex(t.hbm + last) +
                    "], bytes=" + std::to_string(t.row_bytes()) + ", dim=" + std::to_string(rows) + ":-" +
                    std::to_string(t.row_bytes()) + ":-" + std::to_string(t.row_bytes()) + ", flag=" + f);
        c.flag_issued[flag] += 1;
        break;
      }
    }
    flags.push_back(flag);
  }
  // Work that touches no input may overlap the transfers.
  for (int i = pick(0, 6); i > 0; --i) chance(0.5) ? scalar_alu(c) : vector_alu(c);
  std::shuffle(flags.begin(), flags.end(), rng_);
  for (int f : flags) wait_all(c, f);
}

void Generator::vector_alu(Core& c) {
  static const std::vector<std::string> kBinary = {"vadd", "vsub", "vmul", "vdiv", "vmax", "vmin"};
  static const std::vector<std::string> kUnary = {"vneg", "vabs", "vsqrt", "vrsqrt", "vrecip", "vexp", "vlog",
                                                  "vtanh", "verf", "vmov", "vcvt.bf16", "vcvt.f32.s32",
                                                  "vcvt.s32.f32"};
  static const std::vector<std::string> kReduce = {"vreduce.lanes.sum", "vreduce.lanes.max", "vreduce.lanes.min",
                                                   "vreduce.sublanes.sum", "vreduce.sublanes.max",
                                                   "vreduce.sublanes.min"};
  static const std::vector<std::string> kCmp = {"vcmp.eq", "vcmp.ne", "vcmp.lt", "vcmp.le", "vcmp.gt", "vcmp.ge"};
  const int k = pick(0, 99);
  if (k < 30) emit(c, one_of(kBinary) + " " + v() + ", " + v() + ", " + v());
  else if (k < 52) emit(c, one_of(kUnary) + " " + v() + ", " + v());
  else if (k < 60) emit(c, one_of(kReduce) + " " + v() + ", " + v());
  else if (k < 68) emit(c, one_of(kCmp) + " " + m_w() + ", " + v() + ", " + v());
  else if (k < 75) emit(c, "vsel " + v() + ", " + m_any() + ", " + v() + ", " + v());
  else if (k < 81) emit(c, "vbcast " + v() + ", " + fp_literal());
  else if (k < 85) emit(c, "vbcast " + v() + ", " + s_any());
  else if (k < 91) emit(c, "vmask " + m_w() + ", " + std::to_string(pick(0, 8)) + ", " + std::to_string(pick(0, 128)));
  else if (k < 96) {
    static const std::vector<std::string> kMaskOps = {"mand", "mor"};
    if (chance(0.7)) emit(c, one_of(kMaskOps) + " " + m_w() + ", " + m_any() + ", " + m_any());
    else emit(c, "mnot " + m_w() + ", " + m_any());
  } else {
    emit(c, "vxpose v" + std::to_string(pick(0, 16)) + ", v" + std::to_string(pick(0, 16)));
  }
}

void Generator::scalar_alu(Core& c) {
  static const std::vector<std::string> kReg = {"add", "sub", "mul", "and", "or", "xor", "shl", "shr", "sra",
                                                "min", "max"};
  static const std::vector<std::string> kImm = {"add", "sub", "mul", "div", "rem", "and", "or", "xor",
                                                "shl", "shr", "sra", "min", "max"};
  const int k = pick(0, 9);
  if (k < 3) {
    emit(c, "li " + s_free() + ", " + std::to_string(pick(-100000, 100000)));
  } else if (k < 6) {
    emit(c, one_of(kReg) + " " + s_free() + ", " + s_any() + ", " + s_any());
  } else if (k < 9) {
    int imm = pick(-40, 40);
    if (imm == 0) imm = 7;  // div/rem by an immediate zero would fault
    emit(c, one_of(kImm) + " " + s_free() + ", " + s_any() + ", " + std::to_string(imm));
  } else {
    const std::string addr = "[s0 + " + std::to_string(4 * pick(0, 4095)) + "]";
    emit(c, (chance(0.5) ? "st " : "ld ") + s_free() + ", " + addr);
  }
}

void Generator::vload(Core& c) {
  // A region whose bytes no DMA is writing right now.
  std::vector<uint32_t> bases;
  for (const auto& t : inputs_) bases.push_back(t.vmem);
  for (const auto& t : outputs_)
    if (t.core == c.id) bases.push_back(t.vmem);
  bases.push_back(kVmemWork + uint32_t(pick(0, kWorkTiles - 1) * 4096));
  const int readable = c.scratch_slots - (c.scratch_in_flight ? 1 : 0);
  if (readable > 0) bases.push_back(kVmemScratch + uint32_t(pick(0, readable - 1)) * kSlot);
  const uint32_t base = one_of(bases) + uint32_t(pick(0, 3) * 2048);
  const bool bf16 = chance(0.3);
  std::string s = std::string(bf16 ? "vld.bf16 " : "vld ") + v() + ", [s0 + " + hex(base) + "]";
  if (chance(0.25)) s += ", stride=" + std::to_string((bf16 ? 2 : 4) * pick(0, 256));
  if (chance(0.2)) s += ", mask=" + m_any();
  emit(c, s);
}

void Generator::vstore(Core& c) {
  const bool bf16 = chance(0.3);
  const uint32_t base = kVmemWork + uint32_t(pick(0, kWorkTiles - 2) * 4096 + 4 * pick(0, 64));
  std::string s = std::string(bf16 ? "vst.bf16 " : "vst ") + v() + ", [s0 + " + hex(base) + "]";
  if (chance(0.25)) s += ", stride=" + std::to_string((bf16 ? 2 : 4) * pick(0, 256));
  if (chance(0.2)) s += ", mask=" + m_any();
  emit(c, s);
}

bool Generator::matrix(Core& c, bool in_loop) {
  const int m = pick(0, opt_.mxus - 1);
  if (in_loop) {
    // A balanced mmul/mpop pair leaves the FIFO as it found it on every iteration.
    if (c.fifo[m] >= kFifoEntries) return false;
    emit(c, "mmul " + mxu(m) + ", " + v());
    emit(c, std::string(chance(0.5) ? "mpop.add " : "mpop ") + v() + ", " + mxu(m));
    return true;
  }
  const int k = pick(0, 99);
  if (k < 30) {
    const bool t = c.pushes[m] > 0 ? c.transposed[m] : chance(0.3);
    if (c.pushes[m] >= kStagingPushes) return false;
    const int n = pick(1, kStagingPushes - c.pushes[m]);
    for (int i = 0; i < n; ++i) emit(c, std::string(t ? "mpush.t " : "mpush ") + mxu(m) + ", " + v());
    c.pushes[m] += n;
    c.transposed[m] = t;
  } else if (k < 45) {
    std::string s = "mswap " + mxu(m);
    if (chance(0.3)) s += ", k=" + std::to_string(pick(1, 128));
    emit(c, s);
    c.pushes[m] = 0;
  } else if (k < 75) {
    if (c.fifo[m] >= kFifoEntries) return false;
    const int n = pick(1, std::min(4, kFifoEntries - c.fifo[m]));
    for (int i = 0; i < n; ++i) emit(c, "mmul " + mxu(m) + ", " + v());
    c.fifo[m] += n;
  } else {
    if (c.fifo[m] == 0) return false;
    const int n = pick(1, c.fifo[m]);
    for (int i = 0; i < n; ++i) emit(c, std::string(chance(0.4) ? "mpop.add " : "mpop ") + v() + ", " + mxu(m));
    c.fifo[m] -= n;
  }
  return true;
}

void Generator::sync_counter(Core& c, bool in_loop) {
  // In a loop body fadd runs more often than it is counted here, so the tracked
  // value is a lower bound: waits stay satisfiable, wait.sub (which could then
  // block forever) is left out.
  const int i = pick(0, 7);
  const std::string f = "f" + std::to_string(40 + i);
  switch (pick(0, in_loop ? 2 : 3)) {
    case 0: {
      const int val = pick(0, 5);
      emit(c, "fset " + f + ", " + std::to_string(val));
      c.soft_flag[i] = val;
      break;
    }
    case 1: {
      const int val = pick(0, 3);
      emit(c, "fadd " + f + ", " + std::to_string(val));
      c.soft_flag[i] += val;
      break;
    }
    case 2:
      emit(c, "wait " + f + ", " + std::to_string(pick(0, c.soft_flag[i])));
      break;
    default: {
      const int val = pick(0, c.soft_flag[i]);
      emit(c, "wait.sub " + f + ", " + std::to_string(val));
      c.soft_flag[i] -= val;
      break;
    }
  }
}

void Generator::loop(Core& c) {
  const std::string l = label(c);
  const int n = pick(1, 4);
  const int body = pick(2, 7);
  if (chance(0.6)) {
    const std::string counter = "s" + std::to_string(pick(4, 7));
    emit(c, "li " + counter + ", " + std::to_string(n));
    c.code.push_back(l + ":");
    for (int i = 0; i < body; ++i) one_op(c, true);
    emit(c, "loop " + counter + ", " + l);
  } else {
    // Counting loop with a compare-and-branch, walking a pointer over the work area.
    emit(c, "li s4, 0");
    emit(c, "li s5, " + std::to_string(n));
    emit(c, "li s1, " + hex(kVmemWork));
    c.code.push_back(l + ":");
    for (int i = 0; i < body; ++i) one_op(c, true);
    emit(c, std::string(chance(0.5) ? "vst " : "vld ") + v() + ", [s1 + 0]");
    emit(c, "add s1, s1, 4096");
    emit(c, "add s4, s4, 1");
    emit(c, "blt s4, s5, " + l);
  }
}

void Generator::skipped_block(Core& c) {
  const std::string l = label(c);
  emit(c, chance(0.5) ? "beq s0, s0, " + l : "jmp " + l);
  // Never executed: even a division by zero here must not fault.
  emit(c, "li s9, 0");
  emit(c, "div s10, s10, s9");
  for (int i = pick(0, 3); i > 0; --i) vector_alu(c);
  c.code.push_back(l + ":");
  if (chance(0.5)) {
    // A branch that is never taken.
    const std::string l2 = label(c);
    emit(c, "bne s0, s0, " + l2);
    vector_alu(c);
    c.code.push_back(l2 + ":");
  }
}

void Generator::mid_dma(Core& c) {
  if (c.scratch_in_flight) {
    wait_all(c, kScratchFlag);
    c.scratch_in_flight = false;
    return;
  }
  if (c.scratch_slots >= 15) return;
  const uint32_t slot = kVmemScratch + uint32_t(c.scratch_slots) * kSlot;
  const Tensor& t = one_of(inputs_);
  const std::string f = "f" + std::to_string(kScratchFlag);
  if (chance(0.5)) {
    // VMEM -> VMEM copy of a fetched input (a source no one writes any more).
    if (t.core != c.id) return;
    emit(c, "dma vmem:[s0 + " + hex(slot) + "], vmem:[s0 + " + hex(t.vmem) + "], bytes=" +
                std::to_string(t.bytes()) + ", flag=" + f);
  } else {
    // A strided gather straight from HBM: every other row.
    emit(c, "dma vmem:[s0 + " + hex(slot) + "], " + hbm_of(t, c) + ":[s0 + " + hex(t.hbm) + "], bytes=" +
                std::to_string(t.row_bytes()) + ", dim=" + std::to_string(4 * t.tiles) + ":" +
                std::to_string(2 * t.row_bytes()) + ":" + std::to_string(t.row_bytes()) + ", flag=" + f);
  }
  c.flag_issued[kScratchFlag] += 1;
  c.scratch_in_flight = true;
  ++c.scratch_slots;
}

void Generator::one_op(Core& c, bool in_loop) {
  for (;;) {
    const int k = pick(0, 99);
    if (k < 30) { vector_alu(c); return; }
    if (k < 42) { scalar_alu(c); return; }
    if (k < 54) { vload(c); return; }
    if (k < 62) { vstore(c); return; }
    if (k < 82) { if (matrix(c, in_loop)) return; continue; }
    if (k < 86) { sync_counter(c, in_loop); return; }
    if (k < 88) { emit(c, "nop"); return; }
    if (k < 90) { emit(c, "op " + std::to_string(pick(0, 50))); return; }
    if (in_loop) continue;
    if (k < 94) { loop(c); return; }
    if (k < 97) { skipped_block(c); return; }
    mid_dma(c);
    return;
  }
}

void Generator::compute(Core& c, int n, bool) {
  for (int i = 0; i < n; ++i) one_op(c, false);
}

void Generator::store_outputs(Core& c) {
  for (const auto& t : outputs_) {
    if (t.core != c.id) continue;
    const std::string op = t.bf16 ? "vst.bf16 " : "vst ";
    if (chance(0.3) && t.tiles > 1) {
      const std::string l = label(c);
      emit(c, "li s1, " + hex(t.vmem));
      emit(c, "li s6, " + std::to_string(t.tiles));
      c.code.push_back(l + ":");
      vector_alu(c);
      emit(c, op + v() + ", [s1 + 0]");
      emit(c, "add s1, s1, " + std::to_string(t.tile_bytes()));
      emit(c, "loop s6, " + l);
    } else {
      for (int i = 0; i < t.tiles; ++i) {
        std::string s = op + v() + ", [s0 + " + hex(t.vmem + uint32_t(i * t.tile_bytes())) + "]";
        if (chance(0.15)) s += ", mask=" + m_any();
        emit(c, s);
        if (chance(0.3)) vector_alu(c);
      }
    }
  }
}

void Generator::copy_out(Core& c) {
  std::vector<int> flags;
  for (const auto& t : outputs_) {
    if (t.core != c.id || t.in_vmem) continue;
    const int flag = pick(1, 15);
    emit(c, "dma hbm:[s0 + " + hex(t.hbm) + "], vmem:[s0 + " + hex(t.vmem) + "], bytes=" +
                std::to_string(t.bytes()) + ", flag=f" + std::to_string(flag));
    c.flag_issued[flag] += 1;
    flags.push_back(flag);
  }
  for (int f : flags) wait_all(c, f);
}

Program Generator::run() {
  cores_ = opt_.max_cores > 1 && chance(0.35) ? 2 : 1;
  across_chips_ = cores_ == 2 && opt_.two_chips && chance(0.5);
  const int n_in = pick(1, 3), n_out = pick(1, 3);
  for (int i = 0; i < n_in; ++i) {
    Tensor t;
    t.name = "x" + std::to_string(i);
    t.bf16 = chance(0.3);
    t.tiles = pick(1, 4);
    t.dims = chance(0.2) ? 3 : 2;
    t.core = pick(0, cores_ - 1);
    t.vmem = kVmemIn + uint32_t(i) * kSlot;
    t.hbm = kHbmIn + uint32_t(i) * kHbmSlot;
    inputs_.push_back(t);
  }
  for (int i = 0; i < n_out; ++i) {
    Tensor t;
    t.name = "y" + std::to_string(i);
    t.bf16 = chance(0.3);
    t.tiles = pick(1, 3);
    t.dims = chance(0.2) ? 3 : 2;
    t.core = i < cores_ ? i : pick(0, cores_ - 1);  // every core produces something
    t.vmem = kVmemOut + uint32_t(i) * kSlot;
    t.hbm = kHbmOut + uint32_t(i) * kHbmSlot;
    t.in_vmem = chance(0.3);
    outputs_.push_back(t);
  }
  const bool exchange = cores_ == 2 && chance(0.7);
  const int barriers = cores_ == 2 ? pick(0, 2) : 0;

  std::ostringstream o;
  o << "# random program (tests/random/program_gen.cpp)\n";
  o << ".target chips=" << (across_chips_ ? 2 : 1) << " cores=" << (across_chips_ ? 1 : cores_)
    << " mxus=" << opt_.mxus << "\n";
  auto place = [&](const char* space, const Tensor& t) {
    return std::string(space) + "@chip" + std::to_string(chip_of(t.core)) + ".c" + std::to_string(core_of(t.core)) +
           ":" + hex(space[0] == 'h' ? t.hbm : t.vmem);
  };
  auto shape = [](const Tensor& t) {
    return t.dims == 2 ? "[" + std::to_string(8 * t.tiles) + ", 128]" : "[" + std::to_string(t.tiles) + ", 8, 128]";
  };
  for (const auto& t : inputs_)
    o << ".input " << t.name << (t.bf16 ? " bf16 " : " f32 ") << shape(t) << " " << place("hbm", t) << "\n";
  for (const auto& t : outputs_) {
    o << ".output " << t.name << (t.bf16 ? " bf16 " : " f32 ") << shape(t) << " ";
    o << place(t.in_vmem ? "vmem" : "hbm", t) << "\n";
  }

  core_state_.resize(size_t(cores_));
  for (int id = 0; id < cores_; ++id) {
    Core& c = core_state_[size_t(id)];
    c.id = id;
    prologue_dmas(c);
    // Barriers split the compute phase into equal numbers of segments per core.
    for (int seg = 0; seg <= barriers; ++seg) {
      compute(c, pick(opt_.min_ops, opt_.max_ops) / (barriers + 1));
      if (seg < barriers) emit(c, "barrier");
    }
    if (c.scratch_in_flight) {
      wait_all(c, kScratchFlag);
      c.scratch_in_flight = false;
    }
    store_outputs(c);
    if (exchange && id == 0) {
      // Send the first output tile to core 1; waited before anything reuses it.
      const Tensor& t = outputs_[0];
      emit(c, std::string(across_chips_ ? "dma vmem@chip1.c0" : "dma vmem@c1") + ":[s0 + " + hex(kVmemXch) +
                  "], vmem:[s0 + " + hex(t.vmem) + "], bytes=" +
                  std::to_string(t.tile_bytes()) + ", rflag=f" + std::to_string(kXchRflag) + ", flag=f" +
                  std::to_string(kXchFlag));
      emit(c, "wait f" + std::to_string(kXchFlag) + ", 1");
    }
    if (exchange && id == 1) {
      emit(c, "wait f" + std::to_string(kXchRflag) + ", 1");
      for (const auto& t : outputs_) {
        if (t.core != 1) continue;
        const std::string reg = v();
        emit(c, std::string(outputs_[0].bf16 ? "vld.bf16 " : "vld ") + reg + ", [s0 + " + hex(kVmemXch) + "]");
        if (chance(0.5)) vector_alu(c);
        emit(c, std::string(t.bf16 ? "vst.bf16 " : "vst ") + reg + ", [s0 + " + hex(t.vmem) + "]");
      }
    }
    // Sometimes drain every result FIFO, sometimes leave results behind at halt.
    if (chance(0.5))
      for (int m = 0; m < opt_.mxus; ++m)
        for (; c.fifo[m] > 0; --c.fifo[m]) emit(c, "mpop " + v() + ", " + mxu(m));
    copy_out(c);
    if (chance(0.8)) emit(c, "halt");  // running off the end halts too
  }
  for (const auto& c : core_state_) {
    o << "\n.core chip" << chip_of(c.id) << ".core" << core_of(c.id) << "\n";
    for (const auto& line : c.code) o << line << "\n";
  }
  Program p;
  p.assembly = o.str();
  p.cores = cores_;
  for (const auto& t : inputs_) p.inputs.emplace(t.name, make_input(t));
  return p;
}

}  // namespace

Program generate(uint64_t seed, const GenOptions& options) { return Generator(seed, options).run(); }

}  // namespace tpusim::randprog

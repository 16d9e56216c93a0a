// The tpusim instruction set: opcodes, the in-memory instruction form, and the
// program bundle (target parameters, per-core instruction streams, I/O table).
// docs/isa.md is the manual; this header is its single source in code. The
// assembler, printer, binary encoder, functional reference and the SystemC model
// all read instructions through these types.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tpusim::isa {

// Which unit of a TensorCore executes an instruction.
enum class Unit : uint8_t { kScalar, kVector, kMatrix, kDma, kSync };

// Option flags of an opcode (what the assembler accepts after the operands and
// whether the binary form carries a second 64-bit word).
enum OpFlags : uint32_t {
  kOpLong = 1u << 0,       // encoded in two words (imm2 and register field d)
  kOpOptStride = 1u << 1,  // stride=BYTES (sublane stride, in imm2)
  kOpOptMask = 1u << 2,    // mask=mN (in register field c)
  kOpOptK = 1u << 3,       // k=ROWS (valid weight rows, in imm)
};

// Operand signature letters: S scalar reg, V vector reg, M mask reg, X MXU index
// (mxuN), F sync flag, I integer immediate, R fp32 immediate, L label, A address
// [sA + imm], D the DMA operand list. Registers fill fields a, b, c, d in order;
// immediates fill imm then imm2; A takes one register field and imm.
#define TPUSIM_OPCODES(X)                                              \
  X(kNop, "nop", "", kScalar, 0)                                       \
  X(kHalt, "halt", "", kScalar, 0)                                     \
  X(kLi, "li", "SI", kScalar, 0)                                       \
  X(kAdd, "add", "SSS", kScalar, 0)                                    \
  X(kSub, "sub", "SSS", kScalar, 0)                                    \
  X(kMul, "mul", "SSS", kScalar, 0)                                    \
  X(kDiv, "div", "SSS", kScalar, 0)                                    \
  X(kRem, "rem", "SSS", kScalar, 0)                                    \
  X(kAnd, "and", "SSS", kScalar, 0)                                    \
  X(kOr, "or", "SSS", kScalar, 0)                                      \
  X(kXor, "xor", "SSS", kScalar, 0)                                    \
  X(kShl, "shl", "SSS", kScalar, 0)                                    \
  X(kShr, "shr", "SSS", kScalar, 0)                                    \
  X(kSra, "sra", "SSS", kScalar, 0)                                    \
  X(kMin, "min", "SSS", kScalar, 0)                                    \
  X(kMax, "max", "SSS", kScalar, 0)                                    \
  X(kAddI, "add", "SSI", kScalar, 0)                                   \
  X(kSubI, "sub", "SSI", kScalar, 0)                                   \
  X(kMulI, "mul", "SSI", kScalar, 0)                                   \
  X(kDivI, "div", "SSI", kScalar, 0)                                   \
  X(kRemI, "rem", "SSI", kScalar, 0)                                   \
  X(kAndI, "and", "SSI", kScalar, 0)                                   \
  X(kOrI, "or", "SSI", kScalar, 0)                                     \
  X(kXorI, "xor", "SSI", kScalar, 0)                                   \
  X(kShlI, "shl", "SSI", kScalar, 0)                                   \
  X(kShrI, "shr", "SSI", kScalar, 0)                                   \
  X(kSraI, "sra", "SSI", kScalar, 0)                                   \
  X(kMinI, "min", "SSI", kScalar, 0)                                   \
  X(kMaxI, "max", "SSI", kScalar, 0)                                   \
  X(kLd, "ld", "SA", kScalar, 0)                                       \
  X(kSt, "st", "SA", kScalar, 0)                                       \
  X(kBeq, "beq", "SSL", kScalar, 0)                                    \
  X(kBne, "bne", "SSL", kScalar, 0)                                    \
  X(kBlt, "blt", "SSL", kScalar, 0)                                    \
  X(kBge, "bge", "SSL", kScalar, 0)                                    \
  X(kJmp, "jmp", "L", kScalar, 0)                                      \
  X(kLoop, "loop", "SL", kScalar, 0)                                   \
  X(kVld, "vld", "VA", kVector, kOpLong | kOpOptStride | kOpOptMask)   \
  X(kVldBf16, "vld.bf16", "VA", kVector, kOpLong | kOpOptStride | kOpOptMask) \
  X(kVst, "vst", "VA", kVector, kOpLong | kOpOptStride | kOpOptMask)   \
  X(kVstBf16, "vst.bf16", "VA", kVector, kOpLong | kOpOptStride | kOpOptMask) \
  X(kVadd, "vadd", "VVV", kVector, 0)                                  \
  X(kVsub, "vsub", "VVV", kVector, 0)                                  \
  X(kVmul, "vmul", "VVV", kVector, 0)                                  \
  X(kVdiv, "vdiv", "VVV", kVector, 0)                                  \
  X(kVmax, "vmax", "VVV", kVector, 0)                                  \
  X(kVmin, "vmin", "VVV", kVector, 0)                                  \
  X(kVneg, "vneg", "VV", kVector, 0)                                   \
  X(kVabs, "vabs", "VV", kVector, 0)                                   \
  X(kVsqrt, "vsqrt", "VV", kVector, 0)                                 \
  X(kVrsqrt, "vrsqrt", "VV", kVector, 0)                               \
  X(kVrecip, "vrecip", "VV", kVector, 0)                               \
  X(kVexp, "vexp", "VV", kVector, 0)                                   \
  X(kVlog, "vlog", "VV", kVector, 0)                                   \
  X(kVtanh, "vtanh", "VV", kVector, 0)                                 \
  X(kVerf, "verf", "VV", kVector, 0)                                   \
  X(kVmov, "vmov", "VV", kVector, 0)                                   \
  X(kVcvtBf16, "vcvt.bf16", "VV", kVector, 0)                          \
  X(kVcvtF32S32, "vcvt.f32.s32", "VV", kVector, 0)                     \
  X(kVcvtS32F32, "vcvt.s32.f32", "VV", kVector, 0)                     \
  X(kVcmpEq, "vcmp.eq", "MVV", kVector, 0)                             \
  X(kVcmpNe, "vcmp.ne", "MVV", kVector, 0)                             \
  X(kVcmpLt, "vcmp.lt", "MVV", kVector, 0)                             \
  X(kVcmpLe, "vcmp.le", "MVV", kVector, 0)                             \
  X(kVcmpGt, "vcmp.gt", "MVV", kVector, 0)                             \
  X(kVcmpGe, "vcmp.ge", "MVV", kVector, 0)                             \
  X(kVsel, "vsel", "VMVV", kVector, kOpLong)                           \
  X(kVbcast, "vbcast", "VR", kVector, 0)                               \
  X(kVbcastS, "vbcast", "VS", kVector, 0)                              \
  X(kVmask, "vmask", "MII", kVector, kOpLong)                          \
  X(kMand, "mand", "MMM", kVector, 0)                                  \
  X(kMor, "mor", "MMM", kVector, 0)                                    \
  X(kMnot, "mnot", "MM", kVector, 0)                                   \
  X(kVredLaneSum, "vreduce.lanes.sum", "VV", kVector, 0)               \
  X(kVredLaneMax, "vreduce.lanes.max", "VV", kVector, 0)               \
  X(kVredLaneMin, "vreduce.lanes.min", "VV", kVector, 0)               \
  X(kVredSubSum, "vreduce.sublanes.sum", "VV", kVector, 0)             \
  X(kVredSubMax, "vreduce.sublanes.max", "VV", kVector, 0)             \
  X(kVredSubMin, "vreduce.sublanes.min", "VV", kVector, 0)             \
  X(kVxpose, "vxpose", "VV", kVector, 0)                               \
  X(kMpush, "mpush", "XV", kMatrix, 0)                                 \
  X(kMpushT, "mpush.t", "XV", kMatrix, 0)                              \
  X(kMswap, "mswap", "X", kMatrix, kOpOptK)                            \
  X(kMmul, "mmul", "XV", kMatrix, 0)                                   \
  X(kMpop, "mpop", "VX", kMatrix, 0)                                   \
  X(kMpopAdd, "mpop.add", "VX", kMatrix, 0)                            \
  X(kDma, "dma", "D", kDma, 0)                                         \
  X(kWait, "wait", "FI", kSync, 0)                                     \
  X(kWaitSub, "wait.sub", "FI", kSync, 0)                              \
  X(kFset, "fset", "FI", kSync, 0)                                     \
  X(kFadd, "fadd", "FI", kSync, 0)                                     \
  X(kBarrier, "barrier", "", kSync, 0)                                 \
  X(kOpMark, "op", "I", kSync, 0)                                      \
  X(kFork, "fork", "L", kSync, 0)                                      \
  X(kTrap, "trap", "I", kScalar, 0)                                    \
  X(kFtest, "ftest", "SFI", kScalar, 0)                                \
  X(kWaitAny, "wait.any", "FIFI", kSync, kOpLong)

enum class Op : uint8_t {
#define TPUSIM_X(e, m, s, u, f) e,
  TPUSIM_OPCODES(TPUSIM_X)
#undef TPUSIM_X
      kCount
};

struct OpInfo {
  Op op;
  const char* mnemonic;
  const char* signature;
  Unit unit;
  uint32_t flags;
};

const OpInfo& op_info(Op op);
inline int op_count() { return static_cast<int>(Op::kCount); }

// `trap CODE` faults its core on purpose: a program's own run-time check (the
// compiled gather's index bounds) that would otherwise surface as some unrelated
// fault. The code names the reason in the fault message (docs/isa.md, "Scalar unit").
enum TrapCode : int64_t { kTrapIndexOutOfRange = 1 };
// What a trap code means, or "" for a code the ISA gives no meaning.
const char* trap_reason(int64_t code);

// Architectural limits fixed by the ISA (not by the target).
inline constexpr int kScalarRegs = 32;
inline constexpr int kVectorRegs = 32;
inline constexpr int kMaskRegs = 8;
// A DMA names a flag in 9 bits as flag + 1 (0: none); f255.. were added for the
// streamed all-reduce's slots (docs/isa.md section 5, docs/codegen.md "Wide slots").
inline constexpr int kSyncFlags = 511;
// Instruction streams per core: stream 0 starts at instruction 0, `fork` starts
// the lowest-numbered idle one of the others (docs/isa.md, "Streams").
inline constexpr int kStreams = 4;
inline constexpr int kSublanes = 8;
inline constexpr int kLanes = 128;
inline constexpr int kMaxDmaDims = 3;
inline constexpr int kTrafficClasses = 2;

enum class Space : uint8_t { kHbm, kVmem, kSmem, kHost };
const char* space_name(Space s);
inline constexpr int kSpaceCount = 4;

// A DMA endpoint: SPACE[@chipN][.cM]:[sR + offset]. chip/core -1 = "not named":
// chip defaults to the issuing chip; core defaults to the issuing core when no chip
// is named and to core 0 of the named chip otherwise.
struct DmaEndpoint {
  Space space = Space::kHbm;
  int16_t chip = -1;
  int16_t core = -1;
  uint8_t reg = 0;
  int32_t offset = 0;
  bool operator==(const DmaEndpoint& o) const {
    return space == o.space && chip == o.chip && core == o.core && reg == o.reg && offset == o.offset;
  }
};

// One outer dimension of a DMA: `count` repetitions, advancing the source and the
// destination address by their strides (bytes, signed).
struct DmaDim {
  uint32_t count = 1;
  int32_t src_stride = 0;
  int32_t dst_stride = 0;
  bool operator==(const DmaDim& o) const {
    return count == o.count && src_stride == o.src_stride && dst_stride == o.dst_stride;
  }
};

struct Instr {
  Op op = Op::kNop;
  // Register fields (meaning per signature), wide enough for a sync flag (9 bits).
  uint16_t a = 0, b = 0, c = 0, d = 0;
  int32_t imm = 0;                     // immediate / fp32 bits / branch target index / DMA bytes
  int32_t imm2 = 0;                    // second immediate (sublane stride, lanes)
  // DMA only.
  DmaEndpoint dst, src;
  uint8_t ndims = 0;
  DmaDim dims[kMaxDmaDims];
  int16_t flag = -1;   // issuing core's flag incremented on completion (-1 none)
  int16_t rflag = -1;  // destination core's flag incremented when the data has landed
  // Traffic class of a transfer over the ICI network (docs/isa.md "Traffic class"):
  // 0 bulk, 1 urgent (its packets go ahead of bulk ones at every inject port and
  // router output, on buffers of their own). No effect on local transfers.
  uint8_t tc = 0;
  // The way round a wrapping dimension when the destination chip is exactly half
  // way round it (docs/isa.md "Way round"): +1 or -1; 0 the default, + from even
  // cores and - from odd ones. A size-2 dimension's two chips are joined by a +
  // and a - link, so a one-core chip needs this to use both.
  int8_t way = 0;
  // Not part of the encoding: where the instruction came from.
  uint32_t line = 0;   // source line in the .s file (0 unknown)
  int32_t op_id = -1;  // graph op id from the latest `op N` marker (-1 none)

  bool same_encoding(const Instr& o) const;  // equal in every encoded field
  bool operator==(const Instr& o) const { return same_encoding(o) && line == o.line && op_id == o.op_id; }
  bool operator!=(const Instr& o) const { return !(*this == o); }
};

// Architecture parameters carried in the bundle.
struct Target {
  uint32_t chips = 1;
  uint32_t cores_per_chip = 1;
  uint32_t mxus_per_core = 1;
  uint32_t mxu_rows = 128;       // R: reduction depth = numerics chunk length
  uint32_t mxu_cols = 128;       // C: output columns
  uint32_t fifo_rows = 128;      // result FIFO depth in fp32 rows (an mmul pushes 8)
  uint64_t vmem_bytes = 16ull << 20;
  uint64_t smem_bytes = 16ull << 10;
  uint64_t hbm_bytes = 8ull << 30;
  uint64_t host_bytes = 1ull << 30;
  bool operator==(const Target& o) const;
  // Empty when the parameters are usable; otherwise what is wrong.
  std::string check() const;
};

// One buffer of a core's VMEM plan: bytes [addr, addr + bytes) of that core's VMEM
// hold live data while the core executes op `op_id` (from the op's first
// instruction to its last, in program order). The compiler records its plan so the
// chip model can report VMEM occupancy (docs/isa.md, "Bundle file"); the hardware
// itself has no allocator and never reads it.
struct VmemBuffer {
  int32_t op_id = -1;
  uint64_t addr = 0;
  uint64_t bytes = 0;
  bool operator==(const VmemBuffer& o) const { return op_id == o.op_id && addr == o.addr && bytes == o.bytes; }
};

struct CoreProgram {
  uint32_t chip = 0, core = 0;
  std::string source;  // file the code came from (for messages)
  std::vector<Instr> code;
  std::vector<std::pair<std::string, uint32_t>> labels;  // name -> instruction index
  std::vector<VmemBuffer> vmem_plan;                      // optional (empty: no plan)
  bool operator==(const CoreProgram& o) const {
    return chip == o.chip && core == o.core && source == o.source && code == o.code && labels == o.labels &&
           vmem_plan == o.vmem_plan;
  }
};

enum class Dtype : uint8_t { kF32, kBf16, kI32 };
const char* dtype_name(Dtype t);
inline size_t dtype_size(Dtype t) { return t == Dtype::kBf16 ? 2 : 4; }

enum class IoKind : uint8_t { kInput, kOutput, kConst };
const char* io_kind_name(IoKind k);

// A further place of a tensor in the machine's memories (IoEntry::more).
struct IoPlace {
  Space space = Space::kHbm;
  uint32_t chip = 0, core = 0;
  uint64_t addr = 0;
  bool operator==(const IoPlace& o) const {
    return space == o.space && chip == o.chip && core == o.core && addr == o.addr;
  }
};
// "hbm@chip1.c0:0x4c3000", as the directives write a place (and messages name one).
std::string place_text(const IoPlace& p);

// How an entry with further places holds its tensor. kSplit: cut along its first
// dimension into equal dense parts, part i at place i (a data-parallel board's
// batch: each replica's rows already in its own chip's memory, as a framework's
// sharded arrays are). kCopies: the whole tensor, dense, in every place (an input
// every replica reads, an output every replica computes alike); an output is read
// from its first place, and exec::copies_disagree says where the others differ.
enum class IoSpread : uint8_t { kOne, kSplit, kCopies };
const char* io_spread_name(IoSpread s);

// A tensor placed in memory. Element (i0, i1, ...) lives at
// addr + sum(i_d * strides[d]); empty strides = dense row-major. With a spread,
// (space, chip, core, addr) is place 0 and `more` the places after it.
struct IoEntry {
  IoKind kind = IoKind::kInput;
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // bytes per dimension; empty = dense
  Space space = Space::kHbm;
  uint32_t chip = 0, core = 0;
  uint64_t addr = 0;
  std::vector<uint8_t> data;  // kConst: the elements, dense row-major, dtype-sized
  IoSpread spread = IoSpread::kOne;
  std::vector<IoPlace> more;  // with a spread: places 1, 2, ...
  bool operator==(const IoEntry& o) const {
    return kind == o.kind && name == o.name && dtype == o.dtype && shape == o.shape && strides == o.strides &&
           space == o.space && chip == o.chip && core == o.core && addr == o.addr && data == o.data &&
           spread == o.spread && more == o.more;
  }
  // Every place, the entry's own first.
  std::vector<IoPlace> places() const;
  // Sets every place, the first as the entry's own; with more than one, `spread`
  // says how they hold the tensor (one place: no spread).
  void set_places(const std::vector<IoPlace>& all, IoSpread spread);
  // Bytes each place holds: a part with kSplit, else the whole tensor's extent.
  uint64_t place_bytes() const;
  uint64_t elements() const {
    uint64_t n = 1;
    for (auto d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
  // Byte offset of every element from addr, in row-major element order.
  std::vector<uint64_t> element_offsets() const;
  // Highest byte touched + 1, relative to addr.
  uint64_t extent_bytes() const;
};

struct Bundle {
  Target target;
  std::vector<CoreProgram> cores;
  std::vector<IoEntry> io;
  // Optional names of the graph ops behind the op ids (`.opname`), for timelines;
  // printable text without '"', at most kMaxOpNameBytes bytes.
  std::map<int32_t, std::string> op_names;
  // Optional model FLOPs of the graph op behind an op id (`.opflops`): 2 per
  // multiply-accumulate of its unpadded operands. The MXU sees only padded tiles
  // (8-row LHS vregs, C result columns), so this is where stats.json's `flops`
  // comes from for the ops that carry it (docs/cli.md).
  std::map<int32_t, uint64_t> op_flops;
  bool operator==(const Bundle& o) const {
    return target == o.target && cores == o.cores && io == o.io && op_names == o.op_names && op_flops == o.op_flops;
  }
};
inline constexpr size_t kMaxOpNameBytes = 256;

// Structural checks shared by the assembler and the bundle loader: register and
// MXU indices, flags, branch targets, core placement, I/O placement. Returns an
// empty string when the bundle is consistent, else the first problem found, named
// by core and instruction index.
std::string check_bundle(const Bundle& b);

}  // namespace tpusim::isa

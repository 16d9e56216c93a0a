// Assembler, printer, binary encoding and bundle file: round trips over every
// trace and over random programs, and one test per error class.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <random>
#include <string>

#include "isa/asm/assembler.h"
#include "isa/asm/encoding.h"
#include "isa/bundle/bundle_file.h"
#include "tests/isa/error_text.h"
#include "isa/io/npy.h"

namespace tpusim::isa {
namespace {

std::vector<std::string> trace_programs() {
  std::vector<std::string> out;
  for (const auto& d : std::filesystem::directory_iterator(TPUSIM_TRACES_DIR))
    if (std::filesystem::exists(d.path() / "prog.s")) out.push_back((d.path() / "prog.s").string());
  std::sort(out.begin(), out.end());
  return out;
}

// Equal up to source lines and file names (which a reprint cannot keep).
void expect_same_program(const Bundle& a, const Bundle& b) {
  ASSERT_TRUE(a.target == b.target);
  ASSERT_TRUE(a.io == b.io);
  ASSERT_EQ(a.cores.size(), b.cores.size());
  for (size_t c = 0; c < a.cores.size(); ++c) {
    ASSERT_EQ(a.cores[c].chip, b.cores[c].chip);
    ASSERT_EQ(a.cores[c].core, b.cores[c].core);
    ASSERT_EQ(a.cores[c].labels, b.cores[c].labels);
    ASSERT_EQ(a.cores[c].code.size(), b.cores[c].code.size());
    for (size_t i = 0; i < a.cores[c].code.size(); ++i) {
      EXPECT_TRUE(a.cores[c].code[i].same_encoding(b.cores[c].code[i]))
          << "core " << c << " instruction " << i << ": " << print_instr(a.cores[c].code[i], a.cores[c]) << " vs "
          << print_instr(b.cores[c].code[i], b.cores[c]);
      EXPECT_EQ(a.cores[c].code[i].op_id, b.cores[c].code[i].op_id);
    }
  }
}

TEST(IsaAsm, TracesRoundTripThroughTextBinaryAndBundle) {
  const auto progs = trace_programs();
  ASSERT_GE(progs.size(), 6u);
  for (const auto& path : progs) {
    SCOPED_TRACE(path);
    const Bundle b = assemble_file(path);
    const std::string text = print_bundle(b);
    const Bundle again = assemble(text, "reprint.s");
    expect_same_program(b, again);
    EXPECT_EQ(print_bundle(again), text);  // printing is a fixed point
    // With pcs: the same bundle back, and instruction i's line says pc i.
    const std::string numbered = print_bundle(b, true);
    expect_same_program(b, assemble(numbered, "numbered.s"));
    for (const auto& p : b.cores)
      for (size_t i = 0; i < p.code.size(); ++i) {
        const std::string line = "  " + print_instr(p.code[i], p) + "  # pc " + std::to_string(i) + "\n";
        EXPECT_NE(numbered.find(line), std::string::npos) << line;
      }
    for (const auto& p : b.cores) {
      const auto words = encode(p.code);
      auto decoded = decode(words.data(), words.size());
      ASSERT_EQ(decoded.size(), p.code.size());
      for (size_t i = 0; i < decoded.size(); ++i) EXPECT_TRUE(decoded[i].same_encoding(p.code[i]));
    }
    const Bundle loaded = parse_bundle(serialize_bundle(b), "mem");
    EXPECT_TRUE(loaded == b);  // including lines, op ids, labels, constants
  }
}

// A random but valid instruction of opcode `op` (unused fields zero, as the
// assembler leaves them).
Instr random_instr(std::mt19937& g, Op op, uint32_t code_size, int mxus) {
  auto u = [&](int n) { return static_cast<int>(g() % static_cast<uint32_t>(n)); };
  auto imm = [&]() { return static_cast<int32_t>(g()); };
  Instr in;
  in.op = op;
  const OpInfo& info = op_info(op);
  if (op == Op::kDma) {
    for (DmaEndpoint* e : {&in.dst, &in.src}) {
      e->space = static_cast<Space>(u(kSpaceCount));
      e->chip = static_cast<int16_t>(u(3) - 1);
      e->core = static_cast<int16_t>(u(3) - 1);
      e->reg = static_cast<uint8_t>(u(32));
      e->offset = imm();
    }
    in.imm = imm() & 0x7FFFFFFF;
    in.ndims = static_cast<uint8_t>(u(4));
    for (int d = 0; d < in.ndims; ++d) in.dims[d] = DmaDim{static_cast<uint32_t>(g()), imm(), imm()};
    in.flag = static_cast<int16_t>(u(isa::kSyncFlags + 1) - 1);
    in.rflag = static_cast<int16_t>(u(isa::kSyncFlags + 1) - 1);
    in.tc = static_cast<uint8_t>(u(isa::kTrafficClasses));
    in.way = static_cast<int8_t>(static_cast<int>(u(3)) - 1);
    return in;
  }
  uint16_t* regs[4] = {&in.a, &in.b, &in.c, &in.d};
  int r = 0, imms = 0;
  auto put = [&](int32_t v) { (imms++ == 0 ? in.imm : in.imm2) = v; };
  for (const char* s = info.signature; *s; ++s) {
    switch (*s) {
      case 'S': case 'A': *regs[r++] = static_cast<uint8_t>(u(32)); if (*s == 'A') put(imm()); break;
      case 'V': *regs[r++] = static_cast<uint8_t>(op == Op::kVxpose ? u(17) : u(32)); break;
      case 'M': *regs[r++] = static_cast<uint8_t>(u(8)); break;
      case 'X': *regs[r++] = static_cast<uint8_t>(u(mxus)); break;
      case 'F': *regs[r++] = static_cast<uint16_t>(u(isa::kSyncFlags)); break;
      case 'L': put(static_cast<int32_t>(g() % (code_size + 1))); break;
      case 'R': {
        uint32_t bits = g();
        put(static_cast<int32_t>(bits));
        break;
      }
      default: put(imm()); break;
    }
  }
  if (info.flags & kOpOptMask) in.c = static_cast<uint8_t>(u(8));
  if (info.flags & kOpOptStride) in.imm2 = imm();
  if (info.flags & kOpOptK) in.imm = u(129);
  if (op == Op::kVmask) {
    in.imm = u(9);
    in.imm2 = u(129);
  }
  if (op == Op::kOpMark) in.imm = static_cast<int32_t>(g() >> 1);  // op ids are 0 and up
  return in;
}

Bundle random_bundle(uint32_t seed) {
  std::mt19937 g(seed);
  Bundle b;
  b.target.chips = 2;
  b.target.cores_per_chip = 2;
  b.target.mxus_per_core = 2;
  for (uint32_t core = 0; core < 2; ++core) {
    CoreProgram p;
    p.chip = core;
    p.core = core;
    const uint32_t n = 1 + g() % 200;
    int32_t op_id = -1;
    for (uint32_t i = 0; i < n; ++i) {
      Instr in = random_instr(g, static_cast<Op>(g() % static_cast<uint32_t>(op_count())), n, 2);
      if (in.op == Op::kOpMark) op_id = in.imm;
      in.op_id = op_id;  // the assembler derives op ids from the markers
      p.code.push_back(in);
    }
    // Every branch target gets a name, as in assembled code.
    std::vector<bool> named(n + 1, false);
    for (const auto& in : p.code)
      if (std::strchr(op_info(in.op).signature, 'L') && !named[static_cast<size_t>(in.imm)]) {
        named[static_cast<size_t>(in.imm)] = true;
      }
    for (uint32_t i = 0; i <= n; ++i)
      if (named[i]) p.labels.push_back({"t" + std::to_string(i), i});
    b.cores.push_back(p);
  }
  IoEntry e;
  e.kind = IoKind::kConst;
  e.name = "k";
  e.dtype = Dtype::kBf16;
  e.shape = {2, 3};
  e.strides = {256, 2};
  e.addr = 0x100;
  for (int i = 0; i < 12; ++i) e.data.push_back(static_cast<uint8_t>(g()));
  b.io.push_back(e);
  return b;
}

TEST(IsaAsm, RandomProgramsRoundTrip) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE(seed);
    const Bundle b = random_bundle(seed);
    ASSERT_EQ(check_bundle(b), "");
    // Binary.
    for (const auto& p : b.cores) {
      const auto words = encode(p.code);
      const auto back = decode(words.data(), words.size());
      ASSERT_EQ(back.size(), p.code.size());
      for (size_t i = 0; i < back.size(); ++i) ASSERT_TRUE(back[i].same_encoding(p.code[i])) << i;
    }
    EXPECT_TRUE(parse_bundle(serialize_bundle(b), "mem") == b);
    // Text.
    const std::string text = print_bundle(b);
    Bundle again;
    try {
      again = assemble(text, "random.s");
    } catch (const AsmError& e) {
      FAIL() << e.what() << "\n" << text;
    }
    expect_same_program(b, again);
  }
}

// ---- assembler errors: one per class, each with file:line:col -----------------

TEST(IsaAsmErrors, EachClassNamesFileLineColumn) {
  struct Case {
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"  frob v1, v2\n", "t.s:1:3: error: unknown instruction 'frob'"},
      {"\n  vadd v1, v2\n", "t.s:2:3: error: 'vadd' takes 3 operand(s), got 2"},
      {"  vadd v1, v2, v40\n", "t.s:1:16: error: vector register 'v40' out of range"},
      {"  add s1, s2, nothing\n", "t.s:1:15: error: undefined symbol 'nothing'"},
      {"  jmp nowhere\n", "t.s:1:7: error: undefined label 'nowhere'"},
      {"x:\nx:\n", "t.s:2:1: error: label 'x' defined twice"},
      {"  li s1, 0x1FFFFFFFF\n", "t.s:1:10: error: immediate does not fit in 32 bits"},
      {"  vld v1, [s1 + 4], stride=\n", "t.s:1:"},
      {"  vld v1, [s1 + 4], colour=3\n", "t.s:1:21: error: unknown option 'colour' for 'vld'"},
      {"  dma vmem:[s0], hbm:[s0]\n", "t.s:1:7: error: dma needs bytes=N"},
      {"  dma dram:[s0], hbm:[s0], bytes=4\n", "t.s:1:7: error: unknown memory space 'dram'"},
      {".target chips=1 cores=1\n.core 3\n", "t.s:2:7: error: chip0.core3 is outside the target"},
      {".target mxu_rows=100\n", "t.s:1:1: error: mxu_rows must be a multiple of 8"},
      {".bogus 1\n", "t.s:1:1: error: unknown directive '.bogus'"},
      {"  li s1, 3 $\n", "t.s:1:12: error: unexpected character '$'"},
      {"  li s1, 3 \x1e\n", "t.s:1:12: error: unexpected character '\\x1e'"},
      {".input x f32 [4] hbm:0\n.input x f32 [4] hbm:64\n", "t.s:2:8: error: 'x' is already defined"},
      {".const k f32 [3] hbm:0 data=[1, 2]\n", "t.s:1:24: error: data has 2 values, shape needs 3"},
      {".const k f32 [3] hbm:0 file=\"missing.npy\"\n", "missing.npy: No such file or directory"},
      {"  mmul mxu1, v0\n", "t.s:1: error: chip0.core0 instruction 0 (line 1): MXU index 1"},
      {".input x f32 [4] vmem:0x1000000\n", "does not fit in vmem"},
      {"  vbcast v1, 1.5.3\n", "t.s:1:"},
      {"  vxpose v0, v20\n", "vxpose needs 16 consecutive registers"},
      {"  wait f511, 1\n", "t.s:1:8: error: sync flag 'f511' out of range"},
      {"  li s1, (3\n", "t.s:1:"},
      {"  dma vmem:[s0], hbm:[s0], bytes=4, tc=2\n", "t.s:1:40: error: expected tc=0 (bulk) or tc=1 (urgent)"},
      {"  dma vmem:[s0], hbm:[s0], bytes=4, way=1\n", "t.s:1:41: error: expected way=+ or way=-"},
      {"  op 3\n  op -2\n", "t.s:2: error: chip0.core0 instruction 1 (line 2): op id -2 is negative"},
  };
  for (const auto& c : cases) {
    const std::string msg = asm_error(c.text);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << "source: " << c.text << "message: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;  // one line
  }
}

// ---- bundle loader errors ----------------------------------------------------

std::vector<uint8_t> small_bundle() {
  return serialize_bundle(assemble(".input x f32 [2] hbm:0\n  li s1, 5\nl:\n  loop s1, l\n  halt\n", "s.s"));
}

TEST(IsaBundleErrors, BadMagic) {
  auto b = small_bundle();
  b[0] = 'X';
  EXPECT_NE(load_error(b).find("b.tpb: not a tpusim bundle (bad magic)"), std::string::npos);
}

TEST(IsaBundleErrors, WrongVersion) {
  auto b = small_bundle();
  b[8] = 99;
  EXPECT_NE(load_error(b).find("bundle format version 99, this tpusim reads versions 1 to 4"), std::string::npos);
}

TEST(IsaBundleErrors, EveryTruncationIsAnError) {
  const auto b = small_bundle();
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string msg = load_error(cut);
    EXPECT_NE(msg, "no error") << n;
    EXPECT_EQ(msg.rfind("b.tpb: ", 0), 0u) << msg;
  }
}

TEST(IsaBundleErrors, InconsistentTables) {
  Bundle b = assemble("  li s1, 5\nl:\n  loop s1, l\n", "s.s");
  b.cores[0].code[1].imm = 50;  // branch beyond the program
  auto msg = load_error(serialize_bundle(b));
  EXPECT_NE(msg.find("inconsistent bundle: chip0.core0 instruction 1 (line 3): branch target outside the program"),
            std::string::npos)
      << msg;
  Bundle c = assemble(".target chips=1 cores=1\n  halt\n", "s.s");
  c.cores[0].core = 5;
  msg = load_error(serialize_bundle(c));
  EXPECT_NE(msg.find("outside the target"), std::string::npos) << msg;
  Bundle d = assemble(".const k f32 [2] hbm:0 data=[1, 2]\n  halt\n", "s.s");
  d.io[0].data.pop_back();
  msg = load_error(serialize_bundle(d));
  EXPECT_NE(msg.find("constant data size does not match its shape"), std::string::npos) << msg;
  // An op id table entry below -1 (the simulator's per-op profile used to size a
  // vector by it and died in the SystemC kernel).
  Bundle e = assemble("  op 2\n  halt\n", "s.s");
  e.cores[0].code[1].op_id = -2147483647 - 1;
  msg = load_error(serialize_bundle(e));
  EXPECT_NE(msg.find("inconsistent bundle: chip0.core0 instruction 1 (line 2): op id -2147483648 is negative"),
            std::string::npos)
      << msg;
}

TEST(IsaBundleErrors, BadEncoding) {
  auto bytes = small_bundle();
  Bundle b = parse_bundle(bytes, "x");
  auto words = encode(b.cores[0].code);
  words[0] |= 0xFFull << 24;  // nonzero unused register field of li
  EXPECT_THROW(decode(words.data(), words.size()), DecodeError);
  words[0] = 0xFE;  // unknown opcode
  EXPECT_THROW(decode(words.data(), words.size()), DecodeError);
  // A DMA's traffic class is bit 28 of its first word; bits 29 and 30 are bit 8 of
  // flag + 1 and rflag + 1; bit 31 is reserved.
  auto dma = encode(assemble("  dma vmem:[s0], hbm:[s0], bytes=4, tc=1\n  halt\n", "d.s").cores[0].code);
  EXPECT_EQ(decode(dma.data(), dma.size())[0].tc, 1);
  dma[0] |= 1ull << 31;
  EXPECT_THROW(decode(dma.data(), dma.size()), DecodeError);
  // The way round is bits 26-27 (0 the default, 1 +, 2 -), above a 2-bit ndims.
  const uint64_t dma_op = static_cast<uint64_t>(Op::kDma);
  for (const auto& [text, way] : {std::pair<const char*, uint64_t>{"way=+", 1}, {"way=-", 2}}) {
    const auto w = encode(assemble(std::string("  dma vmem:[s0], hbm:[s0], bytes=4, dim=2:4:4, ") + text + "\n  halt\n", "d.s").cores[0].code);
    EXPECT_EQ(w[0], dma_op | 1ull << 24 | way << 26 | 4ull << 32) << text;
    const Instr in = decode(w.data(), w.size())[0];
    EXPECT_EQ(in.way, way == 1 ? 1 : -1);
    EXPECT_EQ(in.ndims, 1);
  }
  dma = encode(assemble("  dma vmem:[s0], hbm:[s0], bytes=4\n  halt\n", "d.s").cores[0].code);
  EXPECT_EQ(decode(dma.data(), dma.size())[0].way, 0);
  dma[0] |= 3ull << 26;
  EXPECT_THROW(decode(dma.data(), dma.size()), DecodeError);
}

// Sync flags are 9 bits (f0..f510). Below f255 every word is what it was with 8-bit
// flags, so older bundles load unchanged; bit 8 of a DMA's flag + 1 / rflag + 1 is
// bit 29 / 30 of its first word, and bit 8 of an instruction's k-th flag operand is
// bit k of its field c (bits 24..31), which no op with a flag operand uses.
TEST(IsaBundleErrors, NineBitFlagsKeepTheOldWords) {
  const auto code = [](const std::string& text) { return assemble(text + "  halt\n", "f.s").cores[0].code; };
  const uint64_t dma_op = static_cast<uint64_t>(Op::kDma), wait_op = static_cast<uint64_t>(Op::kWait);
  // 8-bit flags: the words of the old encoding, written out here.
  auto w = encode(code("  dma vmem:[s0], hbm:[s0], bytes=4, flag=f253, rflag=f254, tc=1\n"));
  EXPECT_EQ(w[0], dma_op | 254ull << 8 | 255ull << 16 | 1ull << 28 | 4ull << 32);
  w = encode(code("  wait f254, 7\n"));
  EXPECT_EQ(w[0], wait_op | 254ull << 8 | 7ull << 32);
  // Flags from f255: (flag + 1) = 0x12d for f300, 0x1ff for f510.
  w = encode(code("  dma vmem:[s0], hbm:[s0], bytes=4, flag=f300, rflag=f510\n"));
  EXPECT_EQ(w[0], dma_op | 0x2dull << 8 | 0xffull << 16 | 1ull << 29 | 1ull << 30 | 4ull << 32);
  auto in = decode(w.data(), w.size());
  EXPECT_EQ(in[0].flag, 300);
  EXPECT_EQ(in[0].rflag, 510);
  w = encode(code("  wait f300, 7\n"));
  EXPECT_EQ(w[0], wait_op | 0x2cull << 8 | 1ull << 24 | 7ull << 32);
  EXPECT_EQ(decode(w.data(), w.size())[0].a, 300);
  w[0] |= 1ull << 25;  // a second flag bit where wait has one flag operand
  EXPECT_THROW(decode(w.data(), w.size()), DecodeError);
  // ftest's flag is its second operand (field b), wait.any's are a and b.
  w = encode(code("  ftest s3, f400, 1\n  wait.any f10, 1, f509, 2\n"));
  in = decode(w.data(), w.size());
  EXPECT_EQ(w[0] >> 24 & 0xFF, 1u);
  EXPECT_EQ(in[0].b, 400);
  EXPECT_EQ(w[1] >> 24 & 0xFF, 2u);
  EXPECT_EQ(in[1].a, 10);
  EXPECT_EQ(in[1].b, 509);
}

// ---- .npy --------------------------------------------------------------------

TEST(IsaNpy, ReadsAndWritesNumpysOwnFormat) {
  // Files written by numpy (traces/make_traces.py): parse, serialize, same bytes.
  for (const char* f : {"/softmax/in_x.npy", "/matmul/in_w.npy", "/infeed/expected/n.npy", "/layernorm/gamma.npy"}) {
    const std::string path = std::string(TPUSIM_TRACES_DIR) + f;
    const auto bytes = io::read_file(path);
    const io::NpyArray a = io::parse_npy(bytes, path);
    EXPECT_EQ(io::serialize_npy(a), bytes) << path;
  }
  const io::NpyArray w = io::read_npy(std::string(TPUSIM_TRACES_DIR) + "/matmul/in_w.npy");
  EXPECT_EQ(w.dtype, io::NpyDtype::kU16);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{512, 128}));
}

TEST(IsaNpy, RejectsMalformedFiles) {
  io::NpyArray a;
  a.dtype = io::NpyDtype::kF32;
  a.shape = {3};
  a.data.assign(12, 0);
  const auto bytes = io::serialize_npy(a);
  auto bad = bytes;
  bad[0] = 0;
  EXPECT_THROW(io::parse_npy(bad, "a.npy"), io::NpyError);
  bad = bytes;
  bad.pop_back();
  EXPECT_THROW(io::parse_npy(bad, "a.npy"), io::NpyError);
  bad = bytes;
  const std::string h(bad.begin(), bad.end());
  bad[h.find("<f4") + 1] = 'c';  // complex64
  EXPECT_THROW(io::parse_npy(bad, "a.npy"), io::NpyError);
  bad = bytes;
  bad[h.find("False")] = 'T';
  EXPECT_THROW(io::parse_npy(bad, "a.npy"), io::NpyError);
  EXPECT_THROW(io::read_npy("/nonexistent/x.npy"), io::NpyError);
}

}  // namespace
}  // namespace tpusim::isa

// Per-instruction semantics and the reference scheduler. Expected values come
// from closed forms, exact small-integer arithmetic, IEEE facts (signed zeros,
// NaN), the contract's literal MXU reference, or counting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "isa/asm/assembler.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/race_checker.h"
#include "isa/exec/semantics.h"
#include "isa/exec/tensors.h"
#include "isa/numerics/bf16.h"
#include "isa/numerics/mxu.h"

namespace tpusim::exec {
namespace {

using isa::assemble;

struct Sim {
  isa::Bundle bundle;
  std::unique_ptr<Interpreter> interp;
  RunResult result;
  CoreState& core(uint32_t c = 0) { return interp->machine().core(0, c); }
};

Sim run_program(const std::string& text, uint64_t budget = 1'000'000, bool check_races = false) {
  Sim r;
  r.bundle = assemble(text, "t.s");
  r.interp = std::make_unique<Interpreter>(r.bundle);
  RunOptions o;
  o.max_instructions = budget;
  o.check_races = check_races;
  r.result = r.interp->run(o);
  return r;
}

float bits_f(uint32_t u) { return num::f32_from_bits(u); }

TEST(IsaExecScalar, AluMatchesInt64ClosedForms) {
  std::mt19937 g(5);
  const char* ops[] = {"add", "sub", "mul", "div", "rem", "and", "or", "xor", "shl", "shr", "sra", "min", "max"};
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t a = static_cast<int32_t>(g()), b = static_cast<int32_t>(g() % 2000) - 1000 + (trial == 0 ? 0 : 0);
    if (b == 0) continue;
    for (int form = 0; form < 2; ++form) {
      std::string text = "  li s1, " + std::to_string(a) + "\n  li s2, " + std::to_string(b) + "\n";
      for (int i = 0; i < 13; ++i)
        text += std::string("  ") + ops[i] + " s" + std::to_string(10 + i) + ", s1, " +
                (form ? std::to_string(b) : "s2") + "\n";
      Sim r = run_program(text + "  halt\n");
      ASSERT_TRUE(r.result.ok()) << r.result.message;
      const int64_t A = a, B = b;
      const auto wrap = [](int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))); };
      const uint32_t sh = static_cast<uint32_t>(b) & 31;
      const int32_t expect[13] = {wrap(A + B), wrap(A - B), wrap(A * B), static_cast<int32_t>(A / B),
                                  static_cast<int32_t>(A % B), a & b, a | b, a ^ b,
                                  wrap(static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(a)) << sh)),
                                  static_cast<int32_t>(static_cast<uint32_t>(a) >> sh),
                                  static_cast<int32_t>(std::floor(static_cast<double>(A) / std::pow(2.0, sh))),
                                  std::min(a, b), std::max(a, b)};
      for (int i = 0; i < 13; ++i) EXPECT_EQ(r.core().s[10 + i], expect[i]) << ops[i] << " " << a << ", " << b;
    }
  }
}

TEST(IsaExecScalar, S0ReadsZeroLoopsAndBranches) {
  Sim r = run_program(R"(
  li s0, 55
  li s1, 10
  li s2, 0
l:
  add s2, s2, s1        # 10 + 9 + ... + 1
  loop s1, l
  li s3, -1
  blt s3, s0, neg       # signed compare
  li s4, 111
neg:
  bge s0, s3, ge
  li s5, 222
ge:
  beq s2, s2, eq
  li s6, 333
eq:
  bne s0, s0, never
  st s2, [s0 + 8]
  ld s7, [s0 + 8]
never:
  halt
)");
  ASSERT_TRUE(r.result.ok()) << r.result.message;
  EXPECT_EQ(r.core().s[0], 0);
  EXPECT_EQ(r.core().s[2], 55);
  EXPECT_EQ(r.core().s[4], 0);
  EXPECT_EQ(r.core().s[5], 0);
  EXPECT_EQ(r.core().s[6], 0);
  EXPECT_EQ(r.core().s[7], 55);
}

TEST(IsaExecFaults, NameCoreInstructionLineAndCause) {
  struct Case {
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"  li s1, 0\n  div s2, s1, s1\n", "fault: chip0.core0 instruction 1 (t.s:2, div): division by zero"},
      {"  nop\n  trap 1\n", "fault: chip0.core0 instruction 1 (t.s:2, trap): trap 1: an index read at run time is out of range"},
      {"  trap 77\n  halt\n", "instruction 0 (t.s:1, trap): trap 77"},
      {"  ld s1, [s0 + 3]\n", "misaligned SMEM word address 3"},
      {".target smem=64\n  ld s1, [s0 + 64]\n", "address range [64, 68) outside smem of chip0.core0 (64 bytes)"},
      {"  vld v1, [s0 + 2]\n", "misaligned tile"},
      {".target vmem=4096\n  vld v1, [s0 + 512]\n", "outside vmem of chip0.core0"},
      {"  mpop v1, mxu0\n", "result FIFO underflow"},
      {".target fifo_rows=16\n  mmul mxu0, v0\n  mmul mxu0, v0\n  mmul mxu0, v0\n", "instruction 2 (t.s:4, mmul): result FIFO overflow"},
      {".target mxu_rows=16\n  mpush mxu0, v0\n  mpush mxu0, v0\n  mpush mxu0, v0\n", "weight staging overflow"},
      {"  vmask m0, 1, 1\n", "m0 is read-only"},
      {"  dma vmem:[s0 + 0], hbm:[s0 - 4], bytes=8\n", "address range [-4, 4) outside hbm of chip0"},
  };
  for (const auto& c : cases) {
    Sim r = run_program(c.text);
    EXPECT_EQ(r.result.status, RunResult::Status::kFault) << c.text;
    EXPECT_NE(r.result.message.find(c.expect), std::string::npos) << c.text << " -> " << r.result.message;
  }
}

TEST(IsaExecSched, BudgetStopsInfiniteLoop) {
  Sim r = run_program("l:\n  jmp l\n", 1000);
  EXPECT_EQ(r.result.status, RunResult::Status::kBudget);
  EXPECT_NE(r.result.message.find("likely an infinite loop"), std::string::npos);
  EXPECT_EQ(r.result.instructions, 1000u);
}

TEST(IsaExecSched, DeadlockNamesEveryBlockedCore) {
  Sim r = run_program(".target cores=3\n.core 0\n  wait f3, 2\n.core 1\n  barrier\n.core 2\n  fadd f3, 1\n  halt\n");
  EXPECT_EQ(r.result.status, RunResult::Status::kDeadlock);
  EXPECT_NE(r.result.message.find("chip0.core0 instruction 0 (t.s:3, wait) waits for f3 >= 2 (is 0)"),
            std::string::npos)
      << r.result.message;
  EXPECT_NE(r.result.message.find("chip0.core1 instruction 0 (t.s:5, barrier) waits at barrier (1 of 3"),
            std::string::npos)
      << r.result.message;
}

// wait.any retires on whichever of its two conditions holds; ftest reads one into
// a register (1 or 0) without blocking. Core 0 runs first (round robin), so its
// DMA has landed on core 1's f5 before core 1 runs; f4 stays 0.
TEST(IsaExecSched, WaitAnyTakesWhicheverFlagIsUpAndFtestReadsIt) {
  const char* text = R"(
.target cores=2
.core 0
  dma vmem@c1:[s0 + 0], hbm:[s0 + 0], bytes=4096, rflag=f5
  halt
.core 1
  wait.any f4, 1, f5, 1
  ftest s1, f4, 1
  ftest s2, f5, 1
  ftest s3, f5, 2
  bne s1, s0, four
  vld v0, [s0 + 0]
four:
  halt
)";
  for (bool races : {false, true}) {
    Sim r = run_program(text, 1'000'000, races);
    ASSERT_TRUE(r.result.ok()) << r.result.message;
    EXPECT_EQ(r.core(1).s[1], 0);
    EXPECT_EQ(r.core(1).s[2], 1);
    EXPECT_EQ(r.core(1).s[3], 0);
  }
  // Neither condition (core 1 raises its own f3): a deadlock that names both.
  Sim d = run_program(".target cores=2\n.core 0\n  wait.any f3, 2, f4, 1\n.core 1\n  fadd f3, 1\n  halt\n");
  EXPECT_EQ(d.result.status, RunResult::Status::kDeadlock);
  EXPECT_NE(d.result.message.find("(t.s:3, wait.any) waits for f3 >= 2 (is 0) or f4 >= 1 (is 0)"), std::string::npos)
      << d.result.message;
}

// What a stream learns from wait.any and ftest is the flags it saw high: reading a
// DMA's landing after an ftest of its flag is ordered, after an ftest of another
// flag (or a wait.any that retired on the other one) it is a race.
TEST(IsaExecRaces, WaitAnyAndFtestOrderOnlyWhatTheySaw) {
  const std::string head = ".target cores=2\n.core 0\n  dma vmem@c1:[s0 + 0], hbm:[s0 + 0], bytes=4096, rflag=f5\n"
                           "  halt\n.core 1\n  fadd f6, 1\n";
  const struct {
    const char* body;
    bool race;
  } cases[] = {
      {"  ftest s1, f5, 1\n  beq s1, s0, out\n  vld v0, [s0 + 0]\nout:\n  halt\n", false},
      {"  ftest s1, f6, 1\n  beq s1, s0, out\n  vld v0, [s0 + 0]\nout:\n  halt\n", true},
      {"  wait.any f5, 1, f6, 1\n  vld v0, [s0 + 0]\n  halt\n", false},
      {"  wait.any f6, 1, f7, 1\n  vld v0, [s0 + 0]\n  halt\n", true},
  };
  for (const auto& c : cases) {
    Sim r = run_program(head + c.body, 1'000'000, true);
    if (c.race) {
      EXPECT_EQ(r.result.status, RunResult::Status::kFault) << c.body;
      EXPECT_NE(r.result.message.find("race: reads bytes [0, 4096) of vmem of chip0.core1"), std::string::npos)
          << c.body << r.result.message;
    } else {
      EXPECT_TRUE(r.result.ok()) << c.body << r.result.message;
    }
  }
}

TEST(IsaExecSched, RemoteFlagsBarrierAndWaitSub) {
  // core 1 sends 3 DMAs to core 0's SMEM with rflag; core 0 consumes them with wait.sub.
  Sim r = run_program(R"(
.target cores=2
.core 0
  wait.sub f2, 3
  ld s1, [s0 + 0]
  ld s2, [s0 + 4]
  ld s3, [s0 + 8]
  barrier
  ld s4, [s0 + 12]
  halt
.core 1
  li s1, 7
  st s1, [s0 + 64]
  dma smem@c0:[s0 + 0], smem:[s0 + 64], bytes=4, rflag=f2, flag=f9
  dma smem@c0:[s0 + 4], smem:[s0 + 64], bytes=4, rflag=f2, flag=f9
  dma smem@chip0.c0:[s0 + 8], smem:[s0 + 64], bytes=4, rflag=f2, flag=f9
  barrier
  dma smem@c0:[s0 + 12], smem:[s0 + 64], bytes=4
  halt
)");
  ASSERT_TRUE(r.result.ok()) << r.result.message;
  EXPECT_EQ(r.core(0).s[1] + r.core(0).s[2] + r.core(0).s[3], 21);
  EXPECT_EQ(r.core(0).flags[2], 0);  // wait.sub took all three
  EXPECT_EQ(r.core(1).flags[9], 3);
  EXPECT_EQ(r.core(1).flags[2], 0);  // rflag goes to the destination only
  // Round robin: core 0 blocks first, core 1 runs to its barrier, core 0 passes
  // its barrier last and reads before core 1's fourth DMA.
  EXPECT_EQ(r.core(0).s[4], 0);
}

TEST(IsaExecRaces, CheckerFlagsEachRuleAndAcceptsSynchronisedCode) {
  struct Case {
    const char* text;
    const char* expect;  // nullptr: no race
  };
  const Case cases[] = {
      // reads a DMA's destination before waiting
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=4096, flag=f1\n  vld v0, [s0 + 0]\n  wait f1, 1\n",
       "race: reads bytes [0, 4096) of vmem of chip0.core0 that the DMA at chip0.core0 instruction 0"},
      // overwrites a DMA's source before waiting
      {"  dma hbm:[s0 + 0], vmem:[s0 + 512], bytes=64, flag=f1\n  vst v0, [s0 + 0]\n  wait f1, 1\n",
       "race: overwrites bytes [0, 4096) of vmem"},
      // a second DMA reads the first one's destination
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64, flag=f1\n  dma hbm:[s0 + 64], vmem:[s0 + 32], bytes=8\n",
       "race: reads bytes [32, 40) of vmem"},
      // waiting first is fine; a strided DMA's gaps are inside its bounding range
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64, dim=4:128:128, flag=f1\n  wait.sub f1, 1\n  vld v0, [s0 + 0]\n",
       nullptr},
      // interleaved strided DMAs (two column bands of the same rows) write disjoint bytes
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64, dim=4:64:128, flag=f1\n"
       "  dma vmem:[s0 + 64], hbm:[s0 + 256], bytes=64, dim=4:64:128, flag=f1\n  wait f1, 2\n",
       nullptr},
      // ... but a band shifted half a run into the next one's bytes collides: [128, 160)
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64, dim=4:64:128, flag=f1\n"
       "  dma vmem:[s0 + 96], hbm:[s0 + 256], bytes=64, dim=4:64:128, flag=f1\n  wait f1, 2\n",
       "race: writes bytes [96, 544) of vmem"},
      // a strided vector load between a strided DMA's runs, and one that meets a run
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=256, dim=8:256:1024, flag=f1\n  vld v0, [s0 + 512], stride=1024\n"
       "  wait f1, 1\n",
       nullptr},
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=256, dim=8:256:1024, flag=f1\n  vld v0, [s0 + 7360], stride=-1024\n"
       "  wait f1, 1\n",
       "race: reads bytes [192, 7872) of vmem"},
      // masked-off lanes are not read: a load whose lanes < 64 stop short of a DMA's
      // bytes does not race with it, the same load unmasked or on the other lanes does
      {"  dma vmem:[s0 + 256], hbm:[s0 + 0], bytes=256, flag=f1\n  vmask m1, 8, 64\n"
       "  vld.bf16 v0, [s0 + 128], stride=512, mask=m1\n  wait f1, 1\n",
       nullptr},
      {"  dma vmem:[s0 + 256], hbm:[s0 + 0], bytes=256, flag=f1\n  vld.bf16 v0, [s0 + 128], stride=512\n"
       "  wait f1, 1\n",
       "race: reads bytes [128, 3968) of vmem"},
      {"  dma vmem:[s0 + 256], hbm:[s0 + 0], bytes=256, flag=f1\n  vmask m1, 8, 64\n  mnot m2, m1\n"
       "  vld.bf16 v0, [s0 + 128], stride=512, mask=m2\n  wait f1, 1\n",
       "race: reads bytes [256, 3968) of vmem"},
      // ... and per sublane: only sublane 0 on, a DMA under sublane 1's row is not read
      {"  dma vmem:[s0 + 512], hbm:[s0 + 0], bytes=256, flag=f1\n  vmask m1, 1, 128\n"
       "  vst v0, [s0 + 0], stride=512, mask=m1\n  wait f1, 1\n",
       nullptr},
      {"  dma vmem:[s0 + 256], hbm:[s0 + 0], bytes=256, flag=f1\n  vmask m1, 1, 128\n"
       "  vst v0, [s0 + 0], stride=512, mask=m1\n  wait f1, 1\n",
       "race: writes bytes [0, 512) of vmem"},
      // the receiver's rflag orders its reads; the sender waits before reusing its buffer
      {".target cores=2\n.core 0\n  dma vmem@c1:[s0 + 0], vmem:[s0 + 0], bytes=4096, flag=f1, rflag=f2\n"
       "  wait f1, 1\n  vst v1, [s0 + 0]\n.core 1\n  wait f2, 1\n  vld v0, [s0 + 0]\n",
       nullptr},
      // ... but a third party must not rely on someone else's wait without a barrier
      {".target cores=2\n.core 0\n  dma hbm:[s0 + 0], vmem:[s0 + 0], bytes=64, flag=f1\n  wait f1, 1\n  barrier\n"
       ".core 1\n  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64\n  barrier\n",
       "race: reads bytes [0, 64) of hbm of chip0"},
      {".target cores=2\n.core 0\n  dma hbm:[s0 + 0], vmem:[s0 + 0], bytes=64, flag=f1\n  wait f1, 1\n  barrier\n"
       ".core 1\n  barrier\n  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64\n",
       nullptr},
      // Streams are agents of their own: stream 1 waited for the DMA, but its fadd
      // came first, so stream 0's wait on f2 teaches it nothing (this passed while
      // a core's streams were one agent) ...
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64, flag=f1\n  fork child\n  wait f2, 1\n  vld v0, [s0 + 0]\n"
       "  halt\nchild:\n  fadd f2, 1\n  wait f1, 1\n  halt\n",
       "race: reads bytes [0, 4096) of vmem of chip0.core0 that the DMA at chip0.core0 instruction 0"},
      // ... after its wait, the fadd passes what stream 1 knows to stream 0
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64, flag=f1\n  fork child\n  wait f2, 1\n  vld v0, [s0 + 0]\n"
       "  halt\nchild:\n  wait f1, 1\n  fadd f2, 1\n  halt\n",
       nullptr},
      // ... and a forked stream starts knowing what its parent waited for, not more
      {"  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=64, flag=f1\n  wait f1, 1\n"
       "  dma vmem:[s0 + 4096], hbm:[s0 + 64], bytes=64, flag=f3\n  fork child\n  halt\n"
       "child:\n  vld v0, [s0 + 0]\n  vld v1, [s0 + 4096]\n  halt\n",
       "race: reads bytes [4096, 8192) of vmem of chip0.core0 that the DMA at chip0.core0 instruction 2"},
      // Streams' plain accesses against each other. The reference runs stream 0
      // until it halts, then the child: a tile stream 0 writes after the fork is
      // unordered with the child's read of it ...
      {"  fork child\n  vst v0, [s0 + 0]\n  halt\nchild:\n  vld v1, [s0 + 0]\n  halt\n",
       "race: reads bytes [0, 4096) of vmem of chip0.core0 that stream 0 of this core wrote"},
      // ... as is the child's write of a tile stream 0 read ...
      {"  fork child\n  vld v0, [s0 + 0]\n  halt\nchild:\n  vst v1, [s0 + 0]\n  halt\n",
       "race: writes bytes [0, 4096) of vmem of chip0.core0 that stream 0 of this core read"},
      // ... and a DMA of the child that reads the tile
      {"  fork child\n  vst v0, [s0 + 0]\n  halt\nchild:\n  dma hbm:[s0 + 0], vmem:[s0 + 64], bytes=64, flag=f1\n"
       "  wait f1, 1\n  halt\n",
       "race: reads bytes [64, 128) of vmem of chip0.core0 that stream 0 of this core wrote"},
      // a write before the fork, two reads, other tiles, other SMEM words: no race
      {"  vst v0, [s0 + 0]\n  fork child\n  vld v0, [s0 + 0]\n  vst v0, [s0 + 4096]\n  st s1, [s0 + 0]\n  halt\n"
       "child:\n  vld v1, [s0 + 0]\n  vst v1, [s0 + 8192]\n  st s1, [s0 + 4]\n  halt\n",
       nullptr},
      // a flag released after the write orders it before the waiter's read ...
      {"  fork child\n  vst v0, [s0 + 0]\n  fadd f2, 1\n  halt\nchild:\n  wait f2, 1\n  vld v1, [s0 + 0]\n  halt\n",
       nullptr},
      // ... but not a flag released before it
      {"  fork child\n  fadd f2, 1\n  vst v0, [s0 + 0]\n  halt\nchild:\n  wait f2, 1\n  vld v1, [s0 + 0]\n  halt\n",
       "race: reads bytes [0, 4096) of vmem of chip0.core0 that stream 0 of this core wrote"},
      // a DMA issued after the write orders it for whoever waits on the DMA (the
      // engines start a DMA only after the vld/vst before it)
      {"  fork child\n  vst v0, [s0 + 0]\n  dma hbm:[s0 + 0], smem:[s0 + 0], bytes=4, flag=f1\n  halt\n"
       "child:\n  wait f1, 1\n  vld v1, [s0 + 0]\n  halt\n",
       nullptr},
      // knowledge passes on: stream 1 learns stream 0's write and tells stream 2
      {"  fork a\n  fork b\n  vst v0, [s0 + 0]\n  fadd f2, 1\n  halt\na:\n  wait f2, 1\n  fadd f3, 1\n  halt\n"
       "b:\n  wait f3, 1\n  vst v1, [s0 + 0]\n  halt\n",
       nullptr},
      // ... which it cannot without its own wait first
      {"  fork a\n  fork b\n  vst v0, [s0 + 0]\n  fadd f2, 1\n  halt\na:\n  fadd f3, 1\n  wait f2, 1\n  halt\n"
       "b:\n  wait f3, 1\n  vst v1, [s0 + 0]\n  halt\n",
       "race: writes bytes [0, 4096) of vmem of chip0.core0 that stream 0 of this core wrote"},
  };
  for (const auto& c : cases) {
    Sim r = run_program(c.text, 1000, true);
    if (c.expect == nullptr) {
      EXPECT_TRUE(r.result.ok()) << c.text << " -> " << r.result.message;
    } else {
      EXPECT_EQ(r.result.status, RunResult::Status::kFault) << c.text;
      EXPECT_NE(r.result.message.find(c.expect), std::string::npos) << c.text << " -> " << r.result.message;
    }
    // Without the checker the same programs run (the reference completes DMAs at issue).
    EXPECT_TRUE(run_program(c.text, 1000, false).result.ok()) << c.text;
  }
}

TEST(IsaExecDma, StridedDimsAndReplication) {
  Sim r = run_program(R"(
.target chips=2
.core chip0.core0
  li s1, 0
  li s2, 100
w:
  st s1, [s1 + 0]        # word i of SMEM = 4*i ... use the byte address as data
  add s1, s1, 4
  blt s1, s2, w
  dma hbm:[s0 + 0], smem:[s0 + 0], bytes=100
  # gather words 1,2 of rows 0..2 (row = 5 words = 20 bytes) and repeat twice
  dma hbm@chip1:[s0 + 1000], hbm:[s0 + 4], bytes=8, dim=3:20:8, dim=2:0:24, flag=f1
  wait f1, 1
  halt
)");
  ASSERT_TRUE(r.result.ok()) << r.result.message;
  const Memory& h1 = r.interp->machine().chips[1].hbm;
  const uint32_t expect[12] = {4, 8, 24, 28, 44, 48, 4, 8, 24, 28, 44, 48};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(h1.read_u32(1000 + 4 * static_cast<uint64_t>(i)), expect[i]) << i;
  EXPECT_EQ(h1.read_u32(1048), 0u);
}

// ---- vector unit -----------------------------------------------------------

VReg filled(std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  VReg v;
  for (auto& b : v.bits) b = num::f32_bits(d(g));
  return v;
}

isa::Instr vinstr(isa::Op op, int a, int b = 0, int c = 0, int d = 0) {
  isa::Instr in;
  in.op = op;
  in.a = static_cast<uint8_t>(a);
  in.b = static_cast<uint8_t>(b);
  in.c = static_cast<uint8_t>(c);
  in.d = static_cast<uint8_t>(d);
  return in;
}

TEST(IsaExecVector, ElementwiseIeeeFacts) {
  isa::Target t;
  CoreState c(t, 0, 0);
  // Exactly representable operands: results are exact, so known in closed form.
  for (int i = 0; i < 1024; ++i) {
    c.v[1].bits[static_cast<size_t>(i)] = num::f32_bits(static_cast<float>(i - 512));
    c.v[2].bits[static_cast<size_t>(i)] = num::f32_bits(static_cast<float>((i % 7) + 1) * 0.25f);
  }
  exec_vector(c, vinstr(isa::Op::kVadd, 3, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVmul, 4, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVsub, 5, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVmax, 6, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVneg, 7, 1));
  exec_vector(c, vinstr(isa::Op::kVabs, 8, 1));
  for (int i = 0; i < 1024; ++i) {
    const double x = i - 512, y = ((i % 7) + 1) * 0.25;
    const size_t k = static_cast<size_t>(i);
    EXPECT_EQ(bits_f(c.v[3].bits[k]), x + y);
    EXPECT_EQ(bits_f(c.v[4].bits[k]), x * y);
    EXPECT_EQ(bits_f(c.v[5].bits[k]), x - y);
    EXPECT_EQ(bits_f(c.v[6].bits[k]), std::max(x, y));
    EXPECT_EQ(bits_f(c.v[8].bits[k]), std::fabs(x));
  }
  // Signed zeros and NaN: -0 - (+0) = -0; neg(+0) = -0; max(-0, +0) = +0; NaN canonical.
  c.v[1].bits.fill(0x80000000u);
  c.v[2].bits.fill(0);
  exec_vector(c, vinstr(isa::Op::kVsub, 3, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVneg, 4, 2));
  exec_vector(c, vinstr(isa::Op::kVmax, 5, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVdiv, 6, 2, 2));  // 0/0
  EXPECT_EQ(c.v[3].bits[0], 0x80000000u);
  EXPECT_EQ(c.v[4].bits[0], 0x80000000u);
  EXPECT_EQ(c.v[5].bits[0], 0u);
  EXPECT_EQ(c.v[6].bits[0], 0x7FC00000u);
  // Subnormal inputs read as zero: 2^-140 + 0 = +0 (DAZ), and FTZ of 2^-70 * 2^-70.
  c.v[1].bits.fill(num::f32_bits(std::ldexp(1.0f, -140)));
  exec_vector(c, vinstr(isa::Op::kVadd, 3, 1, 2));
  EXPECT_EQ(c.v[3].bits[5], 0u);
  c.v[1].bits.fill(num::f32_bits(std::ldexp(1.0f, -70)));
  exec_vector(c, vinstr(isa::Op::kVmul, 3, 1, 1));
  EXPECT_EQ(c.v[3].bits[5], 0u);
}

TEST(IsaExecVector, ConversionsCompareSelectMask) {
  isa::Target t;
  CoreState c(t, 0, 0);
  // bf16 rounding: 1 + 2^-8 is a tie -> even (1.0); 1 + 3*2^-8 -> 1 + 2^-6 ... known bit patterns.
  const float in[4] = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -2.5f, 3.4e38f};
  const uint32_t out[4] = {0x3F800000u, 0x3F820000u, 0xC0200000u, 0x7F800000u};  // 3.4e38 rounds past the largest bf16: +Inf
  for (int i = 0; i < 4; ++i) c.v[1].bits[static_cast<size_t>(i)] = num::f32_bits(in[i]);
  exec_vector(c, vinstr(isa::Op::kVcvtBf16, 2, 1));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.v[2].bits[static_cast<size_t>(i)], out[i]) << i;
  // fp32 -> int32: round half to even, saturate, NaN -> 0.
  const float fi[6] = {2.5f, -3.5f, 1e10f, -1e10f, NAN, -0.4f};
  const int32_t ii[6] = {2, -4, INT32_MAX, INT32_MIN, 0, 0};
  for (int i = 0; i < 6; ++i) c.v[1].bits[static_cast<size_t>(i)] = num::f32_bits(fi[i]);
  exec_vector(c, vinstr(isa::Op::kVcvtS32F32, 2, 1));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(static_cast<int32_t>(c.v[2].bits[static_cast<size_t>(i)]), ii[i]) << i;
  c.v[1].bits[0] = static_cast<uint32_t>(16777217);  // 2^24 + 1 -> 2^24 (ties to even)
  exec_vector(c, vinstr(isa::Op::kVcvtF32S32, 2, 1));
  EXPECT_EQ(bits_f(c.v[2].bits[0]), 16777216.0f);
  // Compare + select with NaN: NaN != x is true, every ordered compare false.
  c.v[1].bits.fill(num::f32_bits(1.0f));
  c.v[2].bits.fill(num::f32_bits(2.0f));
  c.v[2].bits[3] = 0x7FC00000u;
  c.v[2].bits[4] = num::f32_bits(1.0f);
  exec_vector(c, vinstr(isa::Op::kVcmpLt, 1, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVcmpNe, 2, 1, 2));
  exec_vector(c, vinstr(isa::Op::kVcmpGe, 3, 1, 2));
  EXPECT_TRUE(c.m[1].on[0]);
  EXPECT_FALSE(c.m[1].on[3]);
  EXPECT_TRUE(c.m[2].on[3]);
  EXPECT_FALSE(c.m[2].on[4]);
  EXPECT_TRUE(c.m[3].on[4]);
  EXPECT_FALSE(c.m[3].on[3]);
  exec_vector(c, vinstr(isa::Op::kVsel, 5, 1, 1, 2));  // lt ? v1 : v2
  EXPECT_EQ(bits_f(c.v[5].bits[0]), 1.0f);
  EXPECT_EQ(c.v[5].bits[3], 0x7FC00000u);
  isa::Instr vm = vinstr(isa::Op::kVmask, 4);
  vm.imm = 3;
  vm.imm2 = 5;
  exec_vector(c, vm);
  int on = 0;
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 128; ++l) {
      on += c.m[4].at(s, l);
      EXPECT_EQ(c.m[4].at(s, l), s < 3 && l < 5);
    }
  EXPECT_EQ(on, 15);
  exec_vector(c, vinstr(isa::Op::kMnot, 5, 4));
  exec_vector(c, vinstr(isa::Op::kMand, 6, 4, 5));
  exec_vector(c, vinstr(isa::Op::kMor, 7, 4, 5));
  EXPECT_FALSE(c.m[6].on[0]);
  EXPECT_TRUE(c.m[7].all());
}

TEST(IsaExecVector, ReductionsBroadcastAndTranspose) {
  isa::Target t;
  CoreState c(t, 0, 0);
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 128; ++l) c.v[1].set_f(s, l, static_cast<float>((s + 1) * l));  // integers: exact sums
  exec_vector(c, vinstr(isa::Op::kVredLaneSum, 2, 1));
  exec_vector(c, vinstr(isa::Op::kVredSubMax, 3, 1));
  exec_vector(c, vinstr(isa::Op::kVredLaneMin, 4, 1));
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 128; ++l) {
      EXPECT_EQ(c.v[2].f(s, l), static_cast<float>((s + 1) * 127 * 128 / 2));
      EXPECT_EQ(c.v[3].f(s, l), static_cast<float>(8 * l));
      EXPECT_EQ(c.v[4].f(s, l), 0.0f);
    }
  // A sum whose order matters: 2^24 + 1 + 1 ... the halving tree pairs lane i with i+64.
  c.v[1].bits.fill(0);
  c.v[1].set_f(0, 0, 16777216.0f);
  c.v[1].set_f(0, 64, 1.0f);
  c.v[1].set_f(0, 1, 1.0f);
  exec_vector(c, vinstr(isa::Op::kVredLaneSum, 2, 1));
  // Tree: (2^24 + 1) rounds to 2^24 at w=64; later (2^24 + 1) again -> 2^24.
  EXPECT_EQ(c.v[2].f(0, 0), 16777216.0f);
  isa::Instr bc = vinstr(isa::Op::kVbcast, 9);
  bc.imm = static_cast<int32_t>(num::f32_bits(-1.5f));
  exec_vector(c, bc);
  EXPECT_EQ(c.v[9].f(7, 127), -1.5f);
  for (int i = 0; i < 16; ++i)
    for (int s = 0; s < 8; ++s)
      for (int l = 0; l < 128; ++l) c.v[static_cast<size_t>(16 + i)].at(s, l) = static_cast<uint32_t>((8 * i + s) * 1000 + l);
  exec_vector(c, vinstr(isa::Op::kVxpose, 0, 16));
  for (int r = 0; r < 128; ++r)
    for (int col = 0; col < 128; ++col)
      ASSERT_EQ(c.v[static_cast<size_t>(r / 8)].at(r % 8, col), static_cast<uint32_t>(col * 1000 + r));
}

TEST(IsaExecVector, LoadStoreMasksStridesAndBf16) {
  Sim r = run_program(R"(
.target vmem=8192
  vbcast v1, 2.5
  vmask m1, 2, 3
  li s1, 4096
  vst v1, [s1 + 0], stride=-512, mask=m1     # rows at 4096 and 3584, lanes 0..2
  vld v2, [s0 + 3584], stride=512
  vbcast v3, 1.00390625                    # 1 + 2^-8: a tie, rounds to 1.0 in bf16
  vst.bf16 v3, [s0 + 0]
  vld.bf16 v4, [s0 + 0]
  vld v5, [s0 + 8000], mask=m0              # would run past the end of VMEM
  halt
)");
  EXPECT_EQ(r.result.status, RunResult::Status::kFault);  // the last vld faults
  EXPECT_NE(r.result.message.find("instruction 8"), std::string::npos) << r.result.message;
  CoreState& c = r.core();
  EXPECT_EQ(c.v[2].f(0, 0), 2.5f);   // row at 3584 (second stored row)
  EXPECT_EQ(c.v[2].f(0, 3), 0.0f);   // lane 3 masked off on store
  EXPECT_EQ(c.v[2].f(1, 2), 2.5f);   // row at 4096 (first stored row), lanes 0..2
  EXPECT_EQ(c.v[2].f(1, 3), 0.0f);
  EXPECT_EQ(c.v[2].f(2, 0), 0.0f);   // rows of m1 beyond 2 were not stored
  EXPECT_EQ(c.v[4].f(5, 77), 1.0f);
  // Masked-off positions are not range checked: a load whose enabled lanes fit works.
  Sim ok = run_program(".target vmem=8192\n  vmask m1, 1, 4\n  vld v5, [s0 + 8176], mask=m1\n  halt\n");
  EXPECT_TRUE(ok.result.ok()) << ok.result.message;
}

TEST(IsaExecVector, MovMinSublaneSumFlagsAndNop) {
  Sim r = run_program(R"(
  vbcast v1, 3.0
  vbcast v2, -0.0
  vmin v3, v1, v2          # -0.0
  vbcast v4, 0.0
  vmin v5, v2, v4          # min(-0, +0) = -0
  vmov v6, v1
  vbcast v7, 0.25
  vreduce.sublanes.sum v8, v7   # 8 x 0.25 = 2
  fset f7, 41
  fadd f7, 1
  nop
  wait.sub f7, 40
  halt
)");
  ASSERT_TRUE(r.result.ok()) << r.result.message;
  CoreState& c = r.core();
  EXPECT_EQ(c.v[3].at(2, 9), 0x80000000u);
  EXPECT_EQ(c.v[5].at(7, 127), 0x80000000u);
  EXPECT_EQ(c.v[6].bits, c.v[1].bits);
  EXPECT_EQ(c.v[8].f(5, 3), 2.0f);
  EXPECT_EQ(c.flags[7], 2);
  EXPECT_EQ(r.result.instructions, 13u);
}

// ---- matrix unit -----------------------------------------------------------

TEST(IsaExecMatrix, MmulMatchesContractReferenceIncludingChunks) {
  // K = 200 > R = 64 (4 chunks, the last short), N = 48 < 128: compare the
  // program's result with the contract's literal reference on the whole matmul.
  const int R = 64, C = 48, K = 200, M = 8;
  std::mt19937 g(11);
  std::uniform_real_distribution<float> d(-2, 2);
  isa::Target t;
  t.mxu_rows = R;
  t.mxu_cols = C;
  CoreState c(t, 0, 0);
  std::vector<float> a(M * K), w(K * C);
  for (auto& x : a) x = d(g);
  for (auto& x : w) x = d(g);
  MxuState& m = c.mxus[0];
  VReg acc;
  for (int chunk = 0; chunk * R < K; ++chunk) {
    const int rows = std::min(R, K - chunk * R);
    for (int k0 = 0; k0 < rows; k0 += 8) {
      VReg v;
      for (int s = 0; s < 8; ++s)
        for (int j = 0; j < C; ++j) v.set_f(s, j, k0 + s < rows ? w[static_cast<size_t>((chunk * R + k0 + s) * C + j)] : 0.0f);
      mxu_push(m, v, false);
    }
    mxu_swap(m, rows);
    VReg lhs = filled(g, 1e30f, 1e31f);  // lanes >= rows hold junk that must not matter
    for (int s = 0; s < 8; ++s) {
      for (int k = 0; k < rows; ++k) lhs.set_f(s, k, a[static_cast<size_t>(s * K + chunk * R + k)]);
      for (int k = rows; k < 128; ++k) lhs.at(s, k) = 0x7FC00000u;  // even NaN
    }
    mxu_fifo_push(m, mxu_compute(m, lhs));
    mxu_pop_into(m, acc, chunk > 0);
  }
  std::vector<uint16_t> ab(M * K), wb(K * C);
  for (size_t i = 0; i < ab.size(); ++i) ab[i] = num::fp32_to_bf16(a[i]);
  for (size_t i = 0; i < wb.size(); ++i) wb[i] = num::fp32_to_bf16(w[i]);
  std::vector<float> ref(M * C);
  num::MatmulArgs args;
  args.a = ab.data();
  args.lda = K;
  args.w = wb.data();
  args.ldw = C;
  args.c = ref.data();
  args.ldc = C;
  args.m = M;
  args.k = K;
  args.n = C;
  args.rows = R;
  num::mxu_matmul_reference(args);
  for (int s = 0; s < 8; ++s) {
    for (int j = 0; j < C; ++j)
      ASSERT_EQ(acc.at(s, j), num::f32_bits(ref[static_cast<size_t>(s * C + j)])) << s << "," << j;
    for (int j = C; j < 128; ++j) ASSERT_EQ(acc.at(s, j), 0u);
  }
}

TEST(IsaExecMatrix, TransposedPushEqualsRowPush) {
  isa::Target t;
  CoreState c(t, 0, 0);
  std::mt19937 g(3);
  // W[k][n]: push rows with mpush into mxu 0 and, transposed (column n = sublane),
  // with mpush.t into a second state; results must agree.
  std::vector<VReg> wt(16);
  for (auto& v : wt) v = filled(g, -1, 1);  // wt[i] sublane s = column 8i+s, lane k
  MxuState a(128, 128, 64), b(128, 128, 64);
  for (int i = 0; i < 16; ++i) {
    VReg rows;
    for (int s = 0; s < 8; ++s)
      for (int n = 0; n < 128; ++n) rows.at(s, n) = wt[static_cast<size_t>(n / 8)].at(n % 8, 8 * i + s);
    mxu_push(a, rows, false);
    mxu_push(b, wt[static_cast<size_t>(i)], true);
  }
  mxu_swap(a, 0);
  mxu_swap(b, 0);
  EXPECT_EQ(a.weights, b.weights);
  const VReg lhs = filled(g, -1, 1);
  EXPECT_EQ(mxu_compute(a, lhs).v, mxu_compute(b, lhs).v);
}

TEST(IsaExecMatrix, ProgramLevelIdentityMatmul) {
  // W = identity (8 rows pushed): y = bf16(x) for the first 8 lanes, +0.0 elsewhere;
  // with mpop.add the popped rows add onto vd.
  Sim r = run_program(R"(
  vmask m1, 8, 128
  li s1, 0
  li s2, 8
  li s3, 0x3f800000
  vbcast v9, s3            # 1.0 everywhere
  # v0 = identity rows 0..7: lane s of sublane s is 1.0
  vbcast v0, 0.0
  vst v0, [s0 + 0]
  li s4, 0
e:
  st s3, [s0 + 0]          # SMEM scratch unused; build identity through VMEM instead
  mul s5, s4, 516          # sublane s, lane s: byte 512*s + 4*s
  dma vmem:[s5 + 0], smem:[s0 + 0], bytes=4
  add s4, s4, 1
  blt s4, s2, e
  vld v0, [s0 + 0]
  mpush mxu0, v0
  mswap mxu0
  vbcast v1, 1.00390625    # rounds to 1.0 on entry to the MXU
  mmul mxu0, v1
  mmul mxu0, v1
  mpop v2, mxu0
  vbcast v3, 0.5
  mpop.add v3, mxu0
  halt
)");
  ASSERT_TRUE(r.result.ok()) << r.result.message;
  CoreState& c = r.core();
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 128; ++l) {
      EXPECT_EQ(c.v[2].f(s, l), l < 8 ? 1.0f : 0.0f) << s << "," << l;
      EXPECT_EQ(c.v[3].f(s, l), l < 8 ? 1.5f : 0.5f);
    }
}

TEST(IsaExecTensors, LayoutStridesAndNpyConversion) {
  isa::Bundle b = assemble(".input x bf16 [2, 3] vmem:64 strides=[256, 2]\n  halt\n", "t.s");
  Machine m(b.target);
  io::NpyArray a;
  a.dtype = io::NpyDtype::kF32;
  a.shape = {2, 3};
  const float vals[6] = {1, 2, 3, 4, 5, 1.00390625f};
  a.data.resize(24);
  std::memcpy(a.data.data(), vals, 24);
  const auto dense = tensor_from_npy(a, b.io[0]);
  write_tensor(m, b.io[0], dense);
  const Memory& v = m.core(0, 0).vmem;
  uint8_t two[2];
  v.read(64 + 256 + 4, two, 2);  // element [1][2]
  EXPECT_EQ(two[0] | two[1] << 8, 0x3F80);  // 1 + 2^-8 rounded to bf16 1.0
  v.read(64 + 2, two, 2);
  EXPECT_EQ(two[0] | two[1] << 8, 0x4000);  // 2.0
  const auto back = tensor_to_npy(b.io[0], read_tensor(m, b.io[0]), false);
  EXPECT_EQ(back.dtype, io::NpyDtype::kF32);
  float f[6];
  std::memcpy(f, back.data.data(), 24);
  EXPECT_EQ(f[4], 5.0f);
  EXPECT_EQ(f[5], 1.0f);
  a.shape = {3, 2};
  EXPECT_THROW(tensor_from_npy(a, b.io[0]), std::runtime_error);
}

// numpy's default integers (int64) feed an i32 input, each value narrowed, or an
// error naming the first that does not fit; a float file still does not.
TEST(IsaExecTensors, Int64FilesNarrowToInt32Inputs) {
  isa::Bundle b = assemble(".input i i32 [3] vmem:0\n  halt\n", "t.s");
  io::NpyArray a;
  a.dtype = io::NpyDtype::kI64;
  a.shape = {3};
  const int64_t vals[3] = {-5, 2147483647, -2147483648LL};
  a.data.resize(sizeof vals);
  std::memcpy(a.data.data(), vals, sizeof vals);
  const auto dense = tensor_from_npy(a, b.io[0]);
  ASSERT_EQ(dense.size(), 12u);
  int32_t got[3];
  std::memcpy(got, dense.data(), 12);
  EXPECT_EQ(got[0], -5);
  EXPECT_EQ(got[1], INT32_MAX);
  EXPECT_EQ(got[2], INT32_MIN);
  const int64_t big = 2147483648LL;
  std::memcpy(a.data.data() + 8, &big, 8);
  try {
    tensor_from_npy(a, b.io[0]);
    ADD_FAILURE() << "2^31 narrowed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("int64 value 2147483648 at flat index 1 does not fit"), std::string::npos)
        << e.what();
  }
  a.dtype = io::NpyDtype::kF64;
  EXPECT_THROW(tensor_from_npy(a, b.io[0]), std::runtime_error);
}

}  // namespace
}  // namespace tpusim::exec

// The race checker's byte-exact overlap against the byte sets themselves, over
// random strided patterns (negative, zero and overlapping strides included).
TEST(IsaExecRaces, BytePatternOverlapMatchesByteSets) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto random_pattern = [&](std::set<int64_t>& bytes) {
    const int nd = pick(0, 3);
    int64_t count[3] = {}, stride[3] = {};
    for (int d = 0; d < nd; ++d) {
      count[d] = pick(1, 4);
      stride[d] = pick(-40, 40);
    }
    const int64_t base = pick(0, 200), run = pick(1, 12);
    for (int64_t i = 0; i < (nd > 0 ? count[0] : 1); ++i)
      for (int64_t j = 0; j < (nd > 1 ? count[1] : 1); ++j)
        for (int64_t k = 0; k < (nd > 2 ? count[2] : 1); ++k)
          for (int64_t b = 0; b < run; ++b) bytes.insert(base + i * stride[0] + j * stride[1] + k * stride[2] + b);
    return tpusim::exec::BytePattern::strided(base, run, nd, count, stride);
  };
  int overlapping = 0;
  for (int t = 0; t < 20000; ++t) {
    std::set<int64_t> a_bytes, b_bytes;
    const auto a = random_pattern(a_bytes), b = random_pattern(b_bytes);
    bool expect = false;
    for (int64_t x : a_bytes) expect = expect || b_bytes.count(x) > 0;
    ASSERT_EQ(a.overlaps(b), expect) << t;
    ASSERT_EQ(b.overlaps(a), expect) << t;
    ASSERT_EQ(a.lo, *a_bytes.begin()) << t;
    ASSERT_EQ(a.hi, *a_bytes.rbegin() + 1) << t;
    overlapping += expect;
  }
  // Both answers occur often enough for the sweep to mean something.
  EXPECT_GT(overlapping, 2000);
  EXPECT_LT(overlapping, 18000);
}

// The race checker against the rule written the plain way (every DMA a record
// with, per agent, whether that agent observed it; a DMA inherits the records its
// issuer had observed; a barrier spreads each record someone observed to all; a
// forked stream starts with its parent's records; a wait on a flag takes the
// records a sibling stream had observed at its last fadd/fset of it; a record is
// forgotten once every running agent observed it; every access scans all
// records), over random event sequences on 5 cores (2 of 3 streams): the same faults with the
// same messages, and the same DMAs remembered after each event. The checker's
// indexes (by memory, by waited flag, per-agent logs shared by prefix) must not
// change an answer.
namespace {

struct RaceEventCounts {
  int faults = 0, waits_that_forgot = 0, sibling_syncs = 0, forks = 0, halts_that_forgot = 0;
};

RaceEventCounts check_races_against_plain_rule(size_t kCores, size_t streams) {
  using tpusim::exec::BytePattern;
  using tpusim::exec::DmaPlan;
  using tpusim::exec::Fault;
  using tpusim::exec::Memory;
  using tpusim::exec::RaceChecker;
  struct Plain {
    struct Rec {
      uint64_t id;
      const Memory *src, *dst;
      BytePattern src_bytes, dst_bytes;
      size_t issuer, dest;  // issuer: an agent; dest: a core
      int flag, rflag;
      std::vector<bool> observed;  // per agent
      std::vector<uint64_t> inherited;
      std::string where;
    };
    size_t streams, agents;
    std::vector<bool> running;
    uint64_t next = 0;
    std::vector<Rec> recs;
    std::map<std::pair<size_t, int>, std::map<size_t, std::set<uint64_t>>> released;  // (core, flag) -> agent -> ids
    std::string access(size_t who, const Memory* mem, const BytePattern& b, bool write) const {
      for (const Rec& r : recs) {
        if (r.observed[who]) continue;
        if (r.dst == mem && b.overlaps(r.dst_bytes)) return (write ? "w " : "r ") + r.where;
        if (write && r.src == mem && b.overlaps(r.src_bytes)) return "o " + r.where;
      }
      return "";
    }
    void issue(size_t who, const DmaPlan& p, size_t dest, const std::string& where) {
      Rec r{next++, p.src, p.dst, BytePattern::dma_src(p), BytePattern::dma_dst(p), who, dest, p.flag, p.rflag,
            std::vector<bool>(agents, false), {}, where};
      for (const Rec& o : recs)
        if (o.observed[who]) r.inherited.push_back(o.id);
      recs.push_back(r);
    }
    void observe(size_t who, Rec& r) {
      if (r.observed[who]) return;
      r.observed[who] = true;
      for (uint64_t id : r.inherited)
        for (Rec& o : recs)
          if (o.id == id) o.observed[who] = true;
    }
    void collect() {
      recs.erase(std::remove_if(recs.begin(), recs.end(),
                                [&](const Rec& r) {
                                  for (size_t a = 0; a < agents; ++a)
                                    if (running[a] && !r.observed[a]) return false;
                                  return true;
                                }),
                 recs.end());
    }
    // Returns whether a sibling's release taught `who` a record it did not know.
    bool wait(size_t who, int flag) {
      const size_t core = who / streams;
      for (Rec& r : recs)
        if ((r.issuer / streams == core && r.flag == flag) || (r.dest == core && r.rflag == flag)) observe(who, r);
      bool learnt = false;
      for (const auto& [agent, ids] : released[{core, flag}])
        if (agent != who)
          for (Rec& r : recs)
            if (ids.count(r.id) && !r.observed[who]) r.observed[who] = learnt = true;
      collect();
      return learnt;
    }
    void release(size_t who, int flag) {
      std::set<uint64_t>& ids = released[{who / streams, flag}][who];
      ids.clear();
      for (const Rec& r : recs)
        if (r.observed[who]) ids.insert(r.id);
    }
    void fork(size_t parent, size_t child) {
      running[child] = true;
      for (Rec& r : recs)
        if (r.observed[parent]) r.observed[child] = true;
    }
    void halt(size_t who) {
      running[who] = false;
      collect();
    }
    void barrier() {
      for (Rec& r : recs)
        if (std::find(r.observed.begin(), r.observed.end(), true) != r.observed.end())
          std::fill(r.observed.begin(), r.observed.end(), true);
      released.clear();
      collect();
    }
  };
  const size_t agents = kCores * streams;
  std::vector<std::unique_ptr<Memory>> mems;
  for (int m = 0; m < 4; ++m) mems.push_back(std::make_unique<Memory>("m" + std::to_string(m), 4096));
  RaceEventCounts n;
  for (unsigned seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    auto bytes = [&](int64_t& base, int64_t count[1], int64_t stride[1]) {
      base = pick(0, 15) * 16;
      count[0] = pick(1, 3);
      stride[0] = pick(1, 4) * 16;
      return static_cast<int64_t>(pick(1, 4) * 8);
    };
    RaceChecker rc(kCores, streams);
    Plain plain{streams, agents, std::vector<bool>(agents, false), 0, {}, {}};
    for (size_t c = 0; c < kCores; ++c) plain.running[c * streams] = true;
    for (int e = 0; e < 600; ++e) {
      std::vector<size_t> running;
      for (size_t a = 0; a < agents; ++a)
        if (plain.running[a]) running.push_back(a);
      const size_t who = running[static_cast<size_t>(pick(0, static_cast<int>(running.size()) - 1))];
      const int kind = pick(0, 99);
      if (kind < 35) {
        int64_t base, count[1], stride[1];
        const int64_t run = bytes(base, count, stride);
        const BytePattern b = BytePattern::strided(base, run, pick(0, 1), count, stride);
        const Memory* mem = mems[static_cast<size_t>(pick(0, 3))].get();
        const bool write = pick(0, 1) == 1;
        const std::string expect = plain.access(who, mem, b, write);
        std::string got;
        try {
          rc.access(who, mem, b, write);
        } catch (const Fault& f) {
          got = f.what();
        }
        EXPECT_EQ(got.empty(), expect.empty()) << "seed " << seed << " event " << e << ": " << got;
        if (got.empty() != expect.empty()) return n;
        if (!expect.empty()) {
          ++n.faults;
          // The same DMA named, and the same kind of race.
          const std::string kind_word = expect[0] == 'w' ? "race: writes" : expect[0] == 'r' ? "race: reads" : "race: overwrites";
          EXPECT_EQ(got.rfind(kind_word, 0), 0u) << got;
          EXPECT_NE(got.find("the DMA at " + expect.substr(2) + " "), std::string::npos) << got << " / " << expect;
        }
      } else if (kind < 60) {
        DmaPlan p;
        int64_t base, count[1], stride[1];
        p.bytes = static_cast<uint64_t>(bytes(base, count, stride));
        p.dst_addr = base;
        p.src_addr = pick(0, 255) * 8;
        p.ndims = pick(0, 1);
        p.dims[0].count = static_cast<uint32_t>(count[0]);
        p.dims[0].src_stride = static_cast<int32_t>(stride[0]);
        p.dims[0].dst_stride = static_cast<int32_t>(stride[0]);
        p.src = mems[static_cast<size_t>(pick(0, 3))].get();
        p.dst = mems[static_cast<size_t>(pick(0, 3))].get();
        p.flag = pick(-1, 2);
        p.rflag = pick(-1, 2);
        const size_t dest =
            p.rflag < 0 || pick(0, 5) == 0 ? RaceChecker::kNoCore : static_cast<size_t>(pick(0, static_cast<int>(kCores) - 1));
        const std::string where = "dma" + std::to_string(e);
        rc.dma_issued(who, p, dest, where);
        plain.issue(who, p, dest, where);
      } else if (kind < (streams > 1 ? 88 : 98)) {
        const int flag = pick(0, 2);
        const size_t before = plain.recs.size();
        rc.wait_satisfied(who, flag);
        n.sibling_syncs += plain.wait(who, flag);
        n.waits_that_forgot += plain.recs.size() < before;
      } else if (kind < 98) {  // streams > 1: a stream's own events
        const size_t core = who / streams, stream = who % streams;
        if (kind < 93) {
          const int flag = pick(0, 2);
          rc.flag_released(who, flag);
          plain.release(who, flag);
        } else if (stream == 0) {  // only stream 0 forks: the lowest idle stream
          for (size_t s = 1; s < streams; ++s)
            if (!plain.running[core * streams + s]) {
              rc.stream_forked(who, core * streams + s);
              plain.fork(who, core * streams + s);
              ++n.forks;
              break;
            }
        } else {
          const size_t before = plain.recs.size();
          rc.stream_halted(who);
          plain.halt(who);
          n.halts_that_forgot += plain.recs.size() < before;
        }
      } else {
        rc.barrier_released();
        plain.barrier();
      }
      EXPECT_EQ(rc.live_records(), plain.recs.size()) << "seed " << seed << " event " << e;
      if (rc.live_records() != plain.recs.size()) return n;
    }
  }
  return n;
}

}  // namespace

TEST(IsaExecRaces, CheckerMatchesThePlainRuleOnRandomEvents) {
  const RaceEventCounts n = check_races_against_plain_rule(5, 1);
  // Both outcomes, and knowledge reaching every core, happen often.
  EXPECT_GT(n.faults, 1000);
  EXPECT_LT(n.faults, 7000);
  EXPECT_GT(n.waits_that_forgot, 50);
  std::printf("%d faults, %d waits that let the checker forget a DMA\n", n.faults, n.waits_that_forgot);
}

// The same with three streams a core: a stream knows only what it waited for, was
// forked with, or took from a sibling's fadd/fset (the checker once took a core's
// streams as one agent, so one stream's wait let another touch the bytes).
TEST(IsaExecRaces, StreamsAreAgentsOfTheirOwn) {
  const RaceEventCounts n = check_races_against_plain_rule(2, 3);
  EXPECT_GT(n.faults, 1000);
  EXPECT_GT(n.waits_that_forgot, 200);
  EXPECT_GT(n.sibling_syncs, 25);
  EXPECT_GT(n.forks, 200);
  EXPECT_GT(n.halts_that_forgot, 20);
  std::printf("%d faults, %d waits that let the checker forget a DMA, %d waits taught by a sibling, %d forks, "
              "%d halts that let it forget one\n",
              n.faults, n.waits_that_forgot, n.sibling_syncs, n.forks, n.halts_that_forgot);
}

// Streams' plain accesses against the happens-before graph written out: every
// event of a stream follows its previous one; a fork precedes the child's next
// event; a stream's latest fadd of a flag precedes a sibling's later wait on it;
// a DMA (after its issuer's earlier events) precedes every wait on its flag. An
// access races when an earlier access of another stream to the same bytes, one of
// the two a write, is not among its ancestors. Random events on one core of three
// streams, each seed until its first race (a run ends at a fault): the checker,
// which keeps only stamps and per-stream counts, must fault exactly there.
TEST(IsaExecRaces, SiblingAccessesMatchTheHappensBeforeGraph) {
  using tpusim::exec::BytePattern;
  using tpusim::exec::DmaPlan;
  using tpusim::exec::Fault;
  using tpusim::exec::Memory;
  using tpusim::exec::RaceChecker;
  constexpr size_t kStreams = 3;
  constexpr int64_t kGrain = 256;  // the checker's VMEM grain: accesses are whole grains
  Memory vmem("vmem", 1 << 20), hbm("hbm", 1 << 20);
  int races = 0, ordered = 0, dma_orders = 0, forks = 0;
  for (unsigned seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    RaceChecker rc(1, kStreams);
    struct Event {
      std::vector<size_t> preds;
      int64_t lo = 0, hi = 0;  // an access's bytes, else empty
      bool write = false;
      size_t stream = 0;
    };
    std::vector<Event> ev;
    std::vector<long> last(kStreams, -1);          // each stream's latest event
    std::vector<bool> running(kStreams, false);
    running[0] = true;
    std::map<std::pair<size_t, int>, size_t> released;  // (stream, flag) -> its latest fadd
    std::vector<std::pair<int, size_t>> dmas;             // (flag, event)
    auto add = [&](size_t s, Event e) {
      e.stream = s;
      if (last[s] >= 0) e.preds.push_back(static_cast<size_t>(last[s]));
      ev.push_back(e);
      last[s] = static_cast<long>(ev.size() - 1);
      return ev.size() - 1;
    };
    // Whether earlier event x conflicts with access e: another stream's access to
    // some of the same bytes, one of the two a write.
    auto conflicts = [&](size_t x, size_t e) {
      return ev[x].hi > ev[x].lo && ev[x].stream != ev[e].stream && (ev[x].write || ev[e].write) &&
             ev[x].lo < ev[e].hi && ev[e].lo < ev[x].hi;
    };
    // Whether the new access `e` (already added) races with an earlier one.
    auto graph_race = [&](size_t e) {
      std::vector<bool> anc(ev.size(), false);
      std::vector<size_t> todo(ev[e].preds);
      while (!todo.empty()) {
        const size_t x = todo.back();
        todo.pop_back();
        if (anc[x]) continue;
        anc[x] = true;
        todo.insert(todo.end(), ev[x].preds.begin(), ev[x].preds.end());
      }
      for (size_t x = 0; x < e; ++x)
        if (conflicts(x, e) && !anc[x]) return true;
      return false;
    };
    bool raced = false;
    for (int step = 0; step < 200 && !raced; ++step) {
      std::vector<size_t> run;
      for (size_t s = 0; s < kStreams; ++s)
        if (running[s]) run.push_back(s);
      const size_t who = run[static_cast<size_t>(pick(0, static_cast<int>(run.size()) - 1))];
      const int kind = pick(0, 99);
      if (kind < 40) {  // vld/vst, or a DMA's end in the core's memory
        Event e;
        e.lo = pick(0, 63) * kGrain;
        e.hi = e.lo + pick(1, 3) * kGrain;
        e.write = pick(0, 3) == 0;
        const bool dma = kind >= 28;
        const size_t id = add(who, e);
        const bool expect = graph_race(id);
        bool got = false;
        try {
          rc.sibling_access(who, &vmem, BytePattern::contiguous(e.lo, e.hi), e.write);
        } catch (const Fault& f) {
          got = true;
          EXPECT_EQ(std::string(f.what()).rfind(e.write ? "race: writes" : "race: reads", 0), 0u) << f.what();
        }
        ASSERT_EQ(got, expect) << "seed " << seed << " step " << step;
        raced = got;
        // An access a sibling's conflicting one was ordered before (no race).
        for (size_t x = 0; x < id && !raced; ++x)
          if (conflicts(x, id)) {
            ++ordered;
            break;
          }
        if (dma && !raced) {  // the DMA that touched it, after its access
          DmaPlan p;
          p.bytes = static_cast<uint64_t>(e.hi - e.lo);
          p.src = e.write ? &hbm : &vmem;
          p.dst = e.write ? &vmem : &hbm;
          p.src_addr = e.write ? 0 : e.lo;
          p.dst_addr = e.write ? e.lo : 0;
          p.flag = pick(0, 2);
          rc.dma_issued(who, p, RaceChecker::kNoCore, "dma");
          dmas.push_back({p.flag, add(who, Event{})});
        }
      } else if (kind < 68) {  // wait on a flag: the siblings' latest fadd of it, the DMAs raising it
        const int flag = pick(0, 2);
        Event w;
        for (size_t s = 0; s < kStreams; ++s)
          if (s != who && released.count({s, flag})) w.preds.push_back(released[{s, flag}]);
        for (const auto& [f, d] : dmas)
          if (f == flag && ev[d].stream != who) {
            w.preds.push_back(d);
            ++dma_orders;
          }
        rc.wait_satisfied(who, flag);
        add(who, w);
      } else if (kind < 85) {
        const int flag = pick(0, 2);
        rc.flag_released(who, flag);
        released[{who, flag}] = add(who, Event{});
      } else if (kind < 93) {  // stream 0 forks the lowest idle stream
        if (who != 0) continue;
        for (size_t s = 1; s < kStreams; ++s)
          if (!running[s]) {
            rc.stream_forked(0, s);
            const size_t f = add(0, Event{});
            Event start;
            start.preds.push_back(f);
            add(s, start);
            running[s] = true;
            ++forks;
            break;
          }
      } else if (who != 0) {
        rc.stream_halted(who);
        running[who] = false;
      }
    }
    races += raced;
  }
  // Both answers are common, and DMAs order many waits.
  EXPECT_GT(races, 200);
  EXPECT_GT(ordered, 500);
  EXPECT_GT(dma_orders, 1000);
  EXPECT_GT(forks, 300);
  std::printf("%d races, %d conflicting accesses ordered by the graph; %d DMA orderings, %d forks\n", races, ordered,
              dma_orders, forks);
}

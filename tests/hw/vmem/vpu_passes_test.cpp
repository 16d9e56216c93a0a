// A multi-pass tile access holds the banks of each pass in that pass's cycle: a
// DMA beat landing on one of them (beats have priority) delays the rest of the
// access by a cycle. Driven by hand: a Vpu on a 16 x 256 B bank layout, a vld
// whose 8 rows of 512 B lie 4096 B apart (all in banks 0 and 1: 8 passes), and DMA claims
// injected before the VPU's tick of chosen cycles, as the core's tick order does.
#include <gtest/gtest.h>

#include <set>

#include "hw/core/reg_use.h"
#include "hw/vpu/vpu.h"
#include "isa/asm/assembler.h"

namespace {

using namespace tpusim;

// A core's VPU on 16 banks of 256 B, driven by hand, with `body`'s first `n`
// instructions in its queue (reserved in the scoreboard in program order).
struct Rig {
  Rig(const std::string& body, size_t n)
      : b(isa::assemble(".target chips=1 cores=1 mxus=1\n.core chip0.core0\n" + body + "  halt\n", "p.s")),
        m(b.target) {
    env.machine = &m;
    env.state = &m.core(0, 0);
    env.prog = &b.cores[0];
    env.name = "chip0.core0";
    for (size_t k = 0; k < n; ++k) {
      hw::Issued it;
      it.in = &b.cores[0].code[k];
      it.seq = k;
      it.use = hw::reg_use(*it.in);
      env.scoreboard.reserve(it.use, it.seq);
      vpu.push(std::move(it));
    }
  }
  isa::Bundle b;
  exec::Machine m;
  hw::CoreEnv env;
  hw::VmemBanks banks{16, 256};
  hw::Vpu vpu{env, banks, hw::VpuParams{}, 16};
};

// The cycle the vld retires (its register written), with a DMA beat claiming
// `dma_mask` in each cycle of `dma_cycles`.
uint64_t retire_cycle(const std::set<uint64_t>& dma_cycles, uint64_t dma_mask) {
  Rig r("  vld v1, [s0 + 0], stride=4096\n", 1);
  hw::VmemBanks& banks = r.banks;
  hw::Vpu& vpu = r.vpu;
  for (uint64_t c = 0; c < 100; ++c) {
    banks.begin_cycle(c);
    if (dma_cycles.count(c)) banks.claim_dma(dma_mask);
    vpu.tick(c);
    EXPECT_TRUE(r.env.fault.empty()) << r.env.fault;
    if (vpu.idle()) return c;
  }
  return ~0ull;
}

TEST(VpuPasses, EightPassLoadRetiresAfterEightCyclesWithoutDma) {
  EXPECT_EQ(retire_cycle({}, 0), 8u);  // dispatch at 0, passes 0..7, written at 8
}

TEST(VpuPasses, BeatsOnTheAccessBankDelayLaterPassesOneCycleEach) {
  // Cycles 3 and 4 hit passes 3 and then (delayed) 3 again; cycle 9 hits pass 7.
  EXPECT_EQ(retire_cycle({3, 4, 9}, 1u << 0), 11u);
}

TEST(VpuPasses, BeatsOnOtherBanksCostNothing) { EXPECT_EQ(retire_cycle({1, 2, 3, 4, 5, 6, 7}, 0xFFFCu), 8u); }

TEST(VpuPasses, ABeatInTheDispatchCycleDelaysTheFirstPass) {
  EXPECT_EQ(retire_cycle({0}, 1u << 0), 9u);  // waits at the queue head (bank conflict), then 8 passes
}

// VMEM accesses retire in program order. A vst whose 8 rows lie 4224 B apart
// (row r covers offsets 128 r .. 128 r + 511: 5 passes over banks 0-5) and DMA
// beats on the odd banks in cycles 1-10 hold its passes 1-4, each needing bank 3,
// until cycle 11. The vld.bf16 after it, rows 512 B apart on the even banks, can
// dispatch in cycle 1 and is done in cycle 2, but its row 0 reads the vst's row 0:
// it must wait for the vst and read what it stored.
TEST(VpuPasses, ALoadAfterAHeldStoreReadsWhatItStored) {
  Rig r("  vst v1, [s0 + 0], stride=4224\n  vld.bf16 v2, [s0 + 0], stride=512\n", 2);
  hw::CoreEnv& env = r.env;
  for (size_t i = 0; i < env.state->v[1].bits.size(); ++i) env.state->v[1].bits[i] = 0x3f800000u + uint32_t(i);
  uint64_t c = 0;
  for (; c < 100 && !r.vpu.idle(); ++c) {
    r.banks.begin_cycle(c);
    if (c >= 1 && c <= 10) r.banks.claim_dma(0xAAAAu);
    r.vpu.tick(c);
    ASSERT_TRUE(env.fault.empty()) << env.fault;
  }
  // What the vld reads from the final VMEM (nothing else writes it).
  const exec::VReg loaded = env.state->v[2];
  exec::exec_vector(*env.state, r.b.cores[0].code[1]);
  EXPECT_EQ(env.state->v[2].bits, loaded.bits);
  EXPECT_EQ(loaded.bits[1], 0x3f800000u);  // lane 1: the high half of the vst's first word
  EXPECT_GE(c, 12u);              // the vst's last pass is in cycle 11
}

}  // namespace

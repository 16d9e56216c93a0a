// The TensorCore computes mmul values late and in batches (hw/core/matrix_queue.cpp):
// at the first mpop that needs them, every uncomputed result on the same weights in
// one kernel call. These tests hold that to the functional reference, which computes
// each mmul alone at issue, on the cases batching could get wrong: results on two
// weight sets in the FIFO at once, an LHS register overwritten right after the mmul
// that read it, k < R and k = 0 weights, mpop.add, a result never popped; and the
// branch-free bf16 rounding of the LHS against num::fp32_to_bf16.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "hw/config/params.h"
#include "hw/core/matrix_queue.h"
#include "hw/system/system.h"
#include "isa/asm/assembler.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/tensors.h"
#include "isa/numerics/bf16.h"

namespace {

using namespace tpusim;

TEST(LhsToBf16, MatchesTheContractsRoundingOnEveryExponentAndRoundingCase) {
  // Every sign/exponent/upper-mantissa pattern with the low halves where rounding
  // decides (ties to even either way, just below and above a tie) plus random ones.
  std::mt19937 rng(7);
  std::vector<uint32_t> low = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  for (int i = 0; i < 4; ++i) low.push_back(rng() & 0xFFFF);
  std::vector<uint32_t> src;
  src.reserve(size_t{1} << 16);
  for (uint32_t lo : low) {
    src.clear();
    for (uint32_t hi = 0; hi < (1u << 16); ++hi) src.push_back(hi << 16 | lo);
    std::vector<uint16_t> got(src.size());
    hw::fp32_bits_to_bf16(src.data(), got.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i)
      ASSERT_EQ(got[i], num::fp32_to_bf16(num::f32_from_bits(src[i]))) << std::hex << "fp32 0x" << src[i];
  }
}

// mxu0: weights A (16 rows, k = 16), three mmuls, then mswap to weights B with
// k = 5 while A's results are still in the FIFO, two mmuls on B; v1 is
// overwritten right after each mmul that reads it. mxu1: mswap with nothing
// pushed (k = 0, every result +0.0). Results come back with mpop and mpop.add,
// and one mmul on mxu1 is never popped.
const char* kProgram = R"(.target chips=1 cores=1 mxus=2
.input x f32 [64, 128] vmem:0x0
.output y f32 [56, 128] vmem:0x40000
.core chip0.core0
  vld v0, [s0 + 0]
  vld v2, [s0 + 4096]
  mpush mxu0, v0
  mpush mxu0, v2
  mswap mxu0
  vld v3, [s0 + 8192]
  vld v4, [s0 + 12288]
  mpush mxu0, v3
  mpush mxu0, v4
  vld v1, [s0 + 16384]
  mmul mxu0, v1
  vld v1, [s0 + 20480]
  mmul mxu0, v1
  vadd v1, v1, v1
  mmul mxu0, v1
  mswap mxu0, k=5
  vld v1, [s0 + 24576]
  mmul mxu0, v1
  vld v1, [s0 + 28672]
  mmul mxu0, v1
  vbcast v1, 0.0
  mswap mxu1
  mmul mxu1, v2
  mmul mxu1, v3
  mpop v10, mxu0
  mpop v11, mxu0
  mpop v12, mxu0
  mpop v13, mxu0
  vld v14, [s0 + 0]
  mpop.add v14, mxu0
  mpop v15, mxu1
  li s1, 262144
  vst v10, [s1 + 0]
  vst v11, [s1 + 4096]
  vst v12, [s1 + 8192]
  vst v13, [s1 + 12288]
  vst v14, [s1 + 16384]
  vst v15, [s1 + 20480]
  vst v1, [s1 + 24576]
  halt
)";

void run_against_reference(hw::Mode mode) {
  const isa::Bundle bundle = isa::assemble(kProgram, "lazy_mmul.s");
  const config::Params preset = config::load_preset("v4");
  hw::System sys(preset, bundle);
  exec::Interpreter ref(bundle);
  for (const auto& e : bundle.io) {
    if (e.kind != isa::IoKind::kInput) continue;
    const std::vector<uint8_t> x = exec::random_tensor(e, 3);
    exec::write_tensor(sys.machine(), e, x);
    exec::write_tensor(ref.machine(), e, x);
  }
  ASSERT_TRUE(ref.run().ok());
  hw::RunOptions opt;
  opt.mode = mode;
  const hw::RunResult r = sys.run(opt);
  ASSERT_FALSE(r.faulted) << r.fault;
  for (const auto& e : bundle.io) {
    if (e.kind != isa::IoKind::kOutput) continue;
    const std::vector<uint8_t> want = exec::read_tensor(ref.machine(), e);
    const std::vector<uint8_t> got = exec::read_tensor(sys.machine(), e);
    ASSERT_EQ(got.size(), want.size());
    size_t nonzero = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "output byte " << i << " (row " << i / 512 << ")";
      nonzero += want[i] != 0;
    }
    EXPECT_GT(nonzero, want.size() / 2);  // the products are not all zero
  }
}

// One System per process (SystemC elaborates once): one test per mode.
TEST(LazyMmul, FastModeEqualsTheReference) { run_against_reference(hw::Mode::kFast); }
TEST(LazyMmul, DetailedModeEqualsTheReference) { run_against_reference(hw::Mode::kDetailed); }

}  // namespace

namespace {

// The bundle's FIFO depth may not exceed the preset's: one line naming both.
TEST(FifoDepth, ABundleWithADeeperResultFifoThanThePresetIsRefused) {
  const isa::Bundle bundle =
      isa::assemble(".target chips=1 cores=1 mxus=1 fifo_rows=512\n.core chip0.core0\n  halt\n", "deep_fifo.s");
  const config::Params preset = config::load_preset("v4");  // 32 vregs = 256 rows
  try {
    hw::System sys(preset, bundle);
    FAIL() << "accepted a 512-row FIFO on a 256-row preset";
  } catch (const hw::SystemError& e) {
    EXPECT_NE(std::string(e.what()).find("result FIFO of 512 rows, the preset's MXUs hold 256"), std::string::npos)
        << e.what();
  }
  const isa::Bundle fits =
      isa::assemble(".target chips=1 cores=1 mxus=1 fifo_rows=256\n.core chip0.core0\n  halt\n", "fifo.s");
  EXPECT_NO_THROW(hw::System(preset, fits));
}

}  // namespace

// Pod-scale chip ids: a DMA endpoint names chips up to 4094 (chip + 1 in 12 bits,
// docs/isa.md section 5), and bundles whose chips are all below 255 encode to the
// same words as before the field was widened.
#include <gtest/gtest.h>

#include <string>

#include "isa/asm/assembler.h"
#include "isa/asm/encoding.h"
#include "isa/bundle/bundle_file.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/tensors.h"

namespace tpusim::isa {
namespace {

// The endpoint word as docs/isa.md section 5 spells it.
uint64_t doc_endpoint(int space, int reg, int chip, int core, int32_t offset) {
  const uint64_t chip1 = static_cast<uint64_t>(chip + 1), core1 = static_cast<uint64_t>(core + 1);
  return static_cast<uint64_t>(space) | (chip1 >> 8) << 4 | static_cast<uint64_t>(reg) << 8 | (chip1 & 0xFF) << 16 |
         core1 << 24 | static_cast<uint64_t>(static_cast<uint32_t>(offset)) << 32;
}

// The layout before the widening: chip + 1 in bits 16-23, bits 4-7 zero.
uint64_t old_endpoint(int space, int reg, int chip, int core, int32_t offset) {
  return static_cast<uint64_t>(space) | static_cast<uint64_t>(reg) << 8 |
         static_cast<uint64_t>(static_cast<uint8_t>(chip + 1)) << 16 |
         static_cast<uint64_t>(static_cast<uint8_t>(core + 1)) << 24 |
         static_cast<uint64_t>(static_cast<uint32_t>(offset)) << 32;
}

TEST(IsaChips, EndpointWordsFollowTheDocumentedLayout) {
  const Bundle b = assemble(
      ".target chips=4095 cores=2\n"
      "  dma vmem@chip4094.c1:[s3 + 16], hbm@chip254:[s0 + 0], bytes=64\n"
      "  dma vmem@chip255:[s0 + 0], vmem@chip7.c1:[s2 + 0x100], bytes=64\n"
      "  dma vmem@chip300.c0:[s0 + 4], vmem:[s0 + 0], bytes=64\n",
      "t.s");
  const auto w = encode(b.cores[0].code);
  ASSERT_EQ(w.size(), 9u);
  EXPECT_EQ(w[1], doc_endpoint(1, 3, 4094, 1, 16));
  EXPECT_EQ(w[2], doc_endpoint(0, 0, 254, -1, 0));
  EXPECT_EQ(w[4], doc_endpoint(1, 0, 255, -1, 0));
  EXPECT_EQ(w[5], doc_endpoint(1, 2, 7, 1, 0x100));
  EXPECT_EQ(w[7], doc_endpoint(1, 0, 300, 0, 4));
  EXPECT_EQ(w[8], doc_endpoint(1, 0, -1, -1, 0));
  // Below chip 255 the words are those of the old layout, so old bundles read the same.
  EXPECT_EQ(w[2], old_endpoint(0, 0, 254, -1, 0));
  EXPECT_EQ(w[5], old_endpoint(1, 2, 7, 1, 0x100));
  EXPECT_EQ(w[8], old_endpoint(1, 0, -1, -1, 0));
  const auto back = decode(w.data(), w.size());
  EXPECT_EQ(encode(back), w);
  EXPECT_EQ(back[0].dst.chip, 4094);
  EXPECT_EQ(back[2].dst.chip, 300);
}

TEST(IsaChips, BundleOf512CoresRoundTrips) {
  // A v2-16x16 slice: 256 chips x 2 cores, every core with a program.
  std::string s = ".target chips=256 cores=2 vmem=64K\n";
  for (int c = 0; c < 256; ++c)
    for (int k = 0; k < 2; ++k)
      s += ".core chip" + std::to_string(c) + ".core" + std::to_string(k) + "\n  dma vmem@chip" +
           std::to_string((c + 1) % 256) + ".c" + std::to_string(k) + ":[s0 + 4096], vmem:[s0 + 0], bytes=4096\n";
  const Bundle b = assemble(s, "slice.s");
  ASSERT_EQ(b.cores.size(), 512u);
  const Bundle c = parse_bundle(serialize_bundle(b), "slice.tpb");
  EXPECT_TRUE(c.cores == b.cores);
  EXPECT_TRUE(c.target == b.target);
  const Bundle d = assemble(print_bundle(c), "reprint.s");
  ASSERT_EQ(d.cores.size(), 512u);
  for (size_t i = 0; i < d.cores.size(); ++i) {
    EXPECT_EQ(d.cores[i].chip, b.cores[i].chip);
    EXPECT_EQ(encode(d.cores[i].code), encode(b.cores[i].code)) << i;
  }
}

TEST(IsaChips, ReferenceMovesDataToChipsPast254) {
  // chip0 pushes a tile to chip300, which forwards it to chip259; each waits on its rflag.
  const Bundle b = assemble(
      ".target chips=301 cores=1 vmem=64K\n"
      ".input x f32 [1024] vmem@chip0.c0:0\n"
      ".output y f32 [1024] vmem@chip259.c0:0x2000\n"
      ".core chip0.core0\n"
      "  dma vmem@chip300:[s0 + 0x1000], vmem:[s0 + 0], bytes=4096, rflag=f1\n"
      ".core chip300.core0\n"
      "  wait f1, 1\n"
      "  dma vmem@chip259:[s0 + 0x2000], vmem:[s0 + 0x1000], bytes=4096, rflag=f2\n"
      ".core chip259.core0\n"
      "  wait f2, 1\n",
      "fwd.s");
  const Bundle c = parse_bundle(serialize_bundle(b), "fwd.tpb");
  exec::Interpreter ref(c);
  std::vector<uint8_t> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i * 7 + 3);
  exec::write_tensor(ref.machine(), c.io[0], x);
  const auto r = ref.run();
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(exec::read_tensor(ref.machine(), c.io[1]), x);
}

TEST(IsaChips, LimitsAreCheckedWithOneLineErrors) {
  const auto error_of = [](const std::string& text) {
    try {
      assemble(text, "t.s");
    } catch (const AsmError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(".target chips=4096\n  halt\n").find("chips must be 1..4095"), std::string::npos);
  EXPECT_EQ(error_of(".target chips=4095\n  halt\n"), "no error");
  EXPECT_NE(error_of(".target chips=4095\n  dma vmem@chip4095:[s0 + 0], vmem:[s0 + 0], bytes=4\n")
                .find("DMA names chip 4095 but the target has 4095"),
            std::string::npos);
  EXPECT_NE(error_of("  dma vmem@chip10000:[s0 + 0], vmem:[s0 + 0], bytes=4\n").find("bad target"),
            std::string::npos);
  // A word whose 12-bit chip field names a chip outside the target is rejected by the loader.
  Bundle b = assemble(".target chips=300\n  dma vmem@chip299:[s0 + 0], vmem:[s0 + 0], bytes=4\n", "t.s");
  b.target.chips = 299;
  std::string msg;
  try {
    parse_bundle(serialize_bundle(b), "t.tpb");
  } catch (const BundleError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("DMA names chip 299 but the target has 299"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tpusim::isa

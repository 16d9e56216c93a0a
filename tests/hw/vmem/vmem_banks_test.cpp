// VMEM bank geometry against hand-counted granule maps.
#include <gtest/gtest.h>

#include "hw/vmem/vmem_banks.h"

namespace {

using tpusim::hw::VmemBanks;

TEST(VmemBanks, DenseTileIsOnePassOverEveryBank) {
  VmemBanks b(16, 256);
  const auto t = b.tile(0, 8, 512, 512);  // 8 rows x 512 B, contiguous: 16 granules
  EXPECT_EQ(t.cycles, 1);
  EXPECT_EQ(t.first_mask, 0xFFFFu);
}

TEST(VmemBanks, RowsOneBankRoundApartConflict) {
  VmemBanks b(16, 256);
  // 4096 B = 16 granules: every row starts in bank 2 (base 512) and touches banks 2 and 3.
  const auto t = b.tile(512, 8, 4096, 512);
  EXPECT_EQ(t.cycles, 8);
  EXPECT_EQ(t.first_mask, 0b1100u);
}

TEST(VmemBanks, BroadcastReadsOneRowOnce) {
  VmemBanks b(16, 256);
  const auto t = b.tile(0, 8, 0, 512);
  EXPECT_EQ(t.cycles, 1);
  EXPECT_EQ(t.first_mask, 0b11u);
}

TEST(VmemBanks, Bf16RowsHalfAsWide) {
  VmemBanks b(16, 256);
  // 8 rows x 256 B, 1024 B apart: rows in banks 0, 4, 8, 12, 0, ... -> 2 passes.
  const auto t = b.tile(0, 8, 1024, 256);
  EXPECT_EQ(t.cycles, 2);
  EXPECT_EQ(t.first_mask, 0x1111u);
}

TEST(VmemBanks, DmaClaimBlocksOnlyItsBanksForOneCycle) {
  VmemBanks b(16, 256);
  b.begin_cycle(5);
  b.claim_dma(b.banks_of(256, 512));  // banks 1 and 2
  EXPECT_FALSE(b.free(0b10u));
  EXPECT_TRUE(b.free(0b1u | 0b1000u));
  b.begin_cycle(6);
  EXPECT_TRUE(b.free(0xFFFFu));
}

TEST(VmemBanks, RangeWrapsAroundTheBanks) {
  VmemBanks b(16, 256);
  EXPECT_EQ(b.banks_of(15 * 256, 512), (1u << 15) | 1u);
  EXPECT_EQ(b.banks_of(0, 16 * 256 * 2), 0xFFFFu);
  EXPECT_EQ(b.banks_of(100, 0), 0u);
}

}  // namespace

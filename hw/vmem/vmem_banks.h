// VMEM's banks as a timing model (the bytes live in exec::CoreState::vmem). VMEM is
// interleaved over `banks` banks in `bank_bytes` granules; each bank moves one
// granule per cycle. vld/vst and the DMA engines share the banks: DMA beats claim
// their banks first in a cycle (their timing is set by the memory behind them), and
// a tile access that needs a claimed bank waits a cycle (a bank conflict).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tpusim::hw {

class VmemBanks {
 public:
  VmemBanks(int banks, int bank_bytes);

  int banks() const { return banks_; }
  // Bank mask of a contiguous byte range (one pass).
  uint64_t banks_of(uint64_t addr, uint64_t bytes) const;
  // A tile access of `rows` rows of `row_bytes` each, `stride` bytes apart:
  // the banks its first cycle uses, and the cycles it needs (the most granules
  // any one bank must move; distinct granules only, so a broadcast is one pass).
  struct TileAccess {
    uint64_t first_mask = 0;
    int cycles = 1;
    std::array<uint16_t, 64> granules{};  // per bank: pass p uses the banks with more than p
    uint64_t pass_mask(int p) const {
      uint64_t m = 0;
      for (size_t b = 0; b < granules.size(); ++b)
        if (granules[b] > p) m |= 1ull << b;
      return m;
    }
  };
  TileAccess tile(int64_t base, int rows, int64_t stride, int row_bytes) const;

  // Per-cycle arbitration.
  void begin_cycle(uint64_t cycle);
  bool free(uint64_t mask) const { return (claimed_ & mask) == 0; }
  void claim_dma(uint64_t mask);
  void claim_vpu(uint64_t mask);

 private:
  int banks_;
  int bank_bytes_;
  uint64_t cycle_ = ~0ull;
  uint64_t claimed_ = 0;
  mutable std::vector<int64_t> granules_;  // scratch of tile()
};

}  // namespace tpusim::hw

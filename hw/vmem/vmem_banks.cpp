#include "hw/vmem/vmem_banks.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

namespace tpusim::hw {

VmemBanks::VmemBanks(int banks, int bank_bytes) : banks_(banks), bank_bytes_(bank_bytes) {
  if (banks < 1 || banks > 64) throw std::invalid_argument("core.vmem.banks must be 1..64, got " + std::to_string(banks));
  if (bank_bytes < 4) throw std::invalid_argument("core.vmem.bank_bytes_per_cycle must be >= 4");
}

uint64_t VmemBanks::banks_of(uint64_t addr, uint64_t bytes) const {
  if (bytes == 0) return 0;
  const uint64_t first = addr / static_cast<uint64_t>(bank_bytes_);
  const uint64_t last = (addr + bytes - 1) / static_cast<uint64_t>(bank_bytes_);
  if (last - first + 1 >= static_cast<uint64_t>(banks_)) return banks_ == 64 ? ~0ull : (1ull << banks_) - 1;
  uint64_t m = 0;
  for (uint64_t g = first; g <= last; ++g) m |= 1ull << (g % static_cast<uint64_t>(banks_));
  return m;
}

VmemBanks::TileAccess VmemBanks::tile(int64_t base, int rows, int64_t stride, int row_bytes) const {
  // Every vld/vst comes through here: a sorted scratch list instead of a set and a
  // map, so the common access allocates nothing.
  std::array<int, 64> per_bank{};
  TileAccess t;
  t.cycles = 1;
  if (stride == row_bytes && base >= 0 && rows > 0) {
    // A dense tile: its granules are consecutive and distinct, no sort needed.
    const int64_t first = base / bank_bytes_, last = (base + rows * stride - 1) / bank_bytes_;
    int b = static_cast<int>(first % banks_);  // then stepped, not divided, per granule
    for (int64_t g = first; g <= last; ++g) {
      const int n = ++per_bank[static_cast<size_t>(b)];
      t.cycles = std::max(t.cycles, n);
      if (n == 1) t.first_mask |= 1ull << b;
      if (++b == banks_) b = 0;
    }
    for (size_t b = 0; b < per_bank.size(); ++b) t.granules[b] = static_cast<uint16_t>(per_bank[b]);
    return t;
  }
  granules_.clear();
  for (int r = 0; r < rows; ++r) {
    const int64_t a = base + r * stride;
    if (a < 0) continue;  // the semantics fault on it; timing does not matter
    for (int64_t g = a / bank_bytes_; g <= (a + row_bytes - 1) / bank_bytes_; ++g) granules_.push_back(g);
  }
  std::sort(granules_.begin(), granules_.end());
  granules_.erase(std::unique(granules_.begin(), granules_.end()), granules_.end());
  for (int64_t g : granules_) {
    const int b = static_cast<int>(g % banks_);
    const int n = ++per_bank[static_cast<size_t>(b)];
    t.cycles = std::max(t.cycles, n);
    if (n == 1) t.first_mask |= 1ull << b;
  }
  for (size_t b = 0; b < per_bank.size(); ++b) t.granules[b] = static_cast<uint16_t>(per_bank[b]);
  return t;
}

void VmemBanks::begin_cycle(uint64_t cycle) {
  if (cycle != cycle_) {
    cycle_ = cycle;
    claimed_ = 0;
  }
}

void VmemBanks::claim_dma(uint64_t mask) { claimed_ |= mask; }
void VmemBanks::claim_vpu(uint64_t mask) { claimed_ |= mask; }

}  // namespace tpusim::hw

// dma_gather_sparse + dma_scatter(DmaPayload) (the board's remote transfers) against
// the dense dma_gather + dma_scatter and the reference's exec::dma_copy: random
// strided descriptors whose runs cross 64 KiB pages, a source with written and
// never-written pages (the zeros the sparse payload leaves out), a destination
// whose written pages must be overwritten by those zeros and whose never-written
// pages must stay unallocated.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "hw/dma/dma_engines.h"

namespace {

using tpusim::exec::DmaPlan;
using tpusim::exec::Memory;

constexpr uint64_t kPage = Memory::kPageBytes;
constexpr uint64_t kSize = 8 * kPage;

std::vector<uint8_t> dump(const Memory& m) {
  std::vector<uint8_t> v(static_cast<size_t>(m.size()));
  m.read(0, v.data(), v.size());
  return v;
}

// Writes random bytes into the pages whose bit is set in `pages`.
void fill_pages(Memory& m, unsigned pages, std::mt19937& rng) {
  std::vector<uint8_t> page(kPage);
  for (uint64_t p = 0; p < kSize / kPage; ++p)
    if (pages >> p & 1) {
      for (auto& x : page) x = uint8_t(rng() | 1);  // nonzero: the page is allocated
      m.write(p * kPage, page.data(), kPage);
    }
}

TEST(DmaGatherSparse, EqualsTheDenseGatherAndTheReferenceCopy) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    Memory src("src", kSize), ref("ref", kSize), dense("dense", kSize), sparse("sparse", kSize);
    fill_pages(src, unsigned(rng()) & 0xff, rng);
    const unsigned dst_pages = unsigned(rng()) & 0xff;
    std::mt19937 same(rng());
    for (Memory* m : {&ref, &dense, &sparse}) {
      std::mt19937 r = same;
      fill_pages(*m, dst_pages, r);
    }
    DmaPlan p;
    p.src = &src;
    p.bytes = 1 + rng() % (3 * kPage / 2);  // up to 1.5 pages per run
    p.ndims = int(rng() % 3);
    for (int d = 0; d < p.ndims; ++d) {
      p.dims[d].count = 1 + rng() % 3;
      p.dims[d].src_stride = int32_t(rng() % 40000) - 10000;
      p.dims[d].dst_stride = int32_t(rng() % 40000) - 10000;  // overlapping runs: the later one wins
    }
    p.src_addr = 3 * kPage + rng() % kPage;
    p.dst_addr = 3 * kPage + rng() % kPage;
    p.dst = &ref;
    tpusim::exec::dma_copy(p);
    p.dst = &dense;
    tpusim::hw::dma_scatter(p, tpusim::hw::dma_gather(p));
    const tpusim::hw::DmaPayload payload = tpusim::hw::dma_gather_sparse(p);
    ASSERT_EQ(payload.total, p.total_bytes());
    uint64_t held = 0;
    for (const auto& s : payload.spans) held += s.second;
    ASSERT_EQ(held, payload.data.size());
    p.dst = &sparse;
    tpusim::hw::dma_scatter(p, payload);
    ASSERT_EQ(dump(ref), dump(sparse)) << "trial " << trial << ": " << p.describe();
    ASSERT_EQ(dump(dense), dump(sparse)) << "trial " << trial;
    EXPECT_EQ(dense.allocated_bytes(), sparse.allocated_bytes()) << "trial " << trial;
  }
}

TEST(DmaGatherSparse, NeverWrittenSourceHoldsNoBytes) {
  Memory src("src", kSize), dst("dst", kSize);
  DmaPlan p;
  p.src = &src;
  p.dst = &dst;
  p.bytes = 5 * kPage;
  const tpusim::hw::DmaPayload payload = tpusim::hw::dma_gather_sparse(p);
  EXPECT_EQ(payload.total, 5 * kPage);
  EXPECT_TRUE(payload.spans.empty());
  EXPECT_TRUE(payload.data.empty());
  tpusim::hw::dma_scatter(p, payload);
  EXPECT_EQ(dst.allocated_bytes(), 0u);
}

}  // namespace

// dma_gather + dma_scatter (a remote transfer: read when it leaves, written when
// it lands) against the functional reference's exec::dma_copy, for random strided
// descriptors of up to 3 outer dimensions, positive, zero and negative strides,
// between two memories (a remote transfer never has both ends in one memory).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "hw/dma/dma_engines.h"

namespace {

using tpusim::exec::DmaPlan;
using tpusim::exec::Memory;

std::vector<uint8_t> dump(const Memory& m) {
  std::vector<uint8_t> v(static_cast<size_t>(m.size()));
  m.read(0, v.data(), v.size());
  return v;
}

TEST(DmaGather, GatherThenScatterEqualsTheReferenceCopy) {
  std::mt19937 rng(7);
  const uint64_t kSize = 1 << 16;
  for (int trial = 0; trial < 300; ++trial) {
    Memory src("src", kSize), a("a", kSize), b("b", kSize);
    std::vector<uint8_t> fill(kSize);
    for (auto& x : fill) x = uint8_t(rng());
    src.write(0, fill.data(), kSize);
    for (auto& x : fill) x = uint8_t(rng());
    a.write(0, fill.data(), kSize);  // the destination's old bytes, kept where not written
    b.write(0, fill.data(), kSize);
    DmaPlan p;
    p.src = &src;
    p.bytes = 1 + rng() % 64;
    p.ndims = int(rng() % 4);
    for (int d = 0; d < p.ndims; ++d) {
      p.dims[d].count = 1 + rng() % 4;
      p.dims[d].src_stride = int32_t(rng() % 301) - 100;
      p.dims[d].dst_stride = int32_t(rng() % 301) - 100;  // overlapping runs: the later one wins
    }
    p.src_addr = 20000 + rng() % 1000;
    p.dst_addr = 20000 + rng() % 1000;
    p.dst = &a;
    tpusim::exec::dma_copy(p);
    const std::vector<uint8_t> bytes = tpusim::hw::dma_gather(p);
    ASSERT_EQ(bytes.size(), p.total_bytes());
    p.dst = &b;
    tpusim::hw::dma_scatter(p, bytes);
    ASSERT_EQ(dump(a), dump(b)) << "trial " << trial << ": " << p.describe();
  }
}

TEST(DmaGather, SourceChangesAfterDepartureDoNotReachTheDestination) {
  Memory src("src", 4096), dst("dst", 4096);
  const std::vector<uint8_t> before(256, 0x11), after(256, 0x22);
  src.write(0, before.data(), 256);
  DmaPlan p;
  p.src = &src;
  p.dst = &dst;
  p.bytes = 256;
  const std::vector<uint8_t> in_flight = tpusim::hw::dma_gather(p);
  src.write(0, after.data(), 256);
  tpusim::hw::dma_scatter(p, in_flight);
  std::vector<uint8_t> got(256);
  dst.read(0, got.data(), 256);
  EXPECT_EQ(got, before);
}

}  // namespace

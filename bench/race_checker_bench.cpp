// Cost of `tpusim ref --check-races` on many cores (docs/performance.md, "Race
// checker"): a ring all-reduce's pattern with no barrier, so every DMA stays
// remembered until the knowledge of it has gone round the ring. Each step every
// core loads a piece from its HBM, pushes a piece into the next core's VMEM slot
// (rflag there), waits for its own landing and its loads, reads the landed piece
// and writes a sum. Reported: DMAs checked per second, and how many the checker
// still remembers at the end (it grows with cores x steps until a core has heard
// of a DMA from every other).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "isa/exec/race_checker.h"

using namespace tpusim;

static void BM_RingAllReduce(benchmark::State& state) {
  const size_t cores = static_cast<size_t>(state.range(0));
  const int steps = static_cast<int>(state.range(1));
  constexpr int64_t kPiece = 4096, kSlots = 4;
  constexpr int kLand = 1, kLoad = 2, kSend = 3;
  std::vector<std::unique_ptr<exec::Memory>> vmem, hbm;
  for (size_t c = 0; c < cores; ++c) {
    vmem.push_back(std::make_unique<exec::Memory>("vmem" + std::to_string(c), 1 << 20));
    hbm.push_back(std::make_unique<exec::Memory>("hbm" + std::to_string(c), 1 << 24));
  }
  auto dma = [](exec::Memory* dst, int64_t dst_addr, exec::Memory* src, int64_t src_addr, int flag, int rflag) {
    exec::DmaPlan p;
    p.dst = dst;
    p.src = src;
    p.dst_addr = dst_addr;
    p.src_addr = src_addr;
    p.bytes = kPiece;
    p.flag = flag;
    p.rflag = rflag;
    return p;
  };
  uint64_t dmas = 0;
  size_t remembered = 0;
  for (auto _ : state) {
    exec::RaceChecker rc(cores);
    for (int s = 0; s < steps; ++s) {
      const int64_t slot = (s % kSlots) * kPiece, sum = (kSlots + s % kSlots) * kPiece, load = 2 * kSlots * kPiece;
      for (size_t c = 0; c < cores; ++c) {
        const size_t next = (c + 1) % cores;
        const auto ld = dma(vmem[c].get(), load, hbm[c].get(), s * kPiece, kLoad, -1);
        rc.access(c, ld.src, exec::BytePattern::dma_src(ld), false);
        rc.access(c, ld.dst, exec::BytePattern::dma_dst(ld), true);
        rc.dma_issued(c, ld, exec::RaceChecker::kNoCore, "load");
        const auto push = dma(vmem[next].get(), slot, vmem[c].get(), sum, kSend, kLand);
        rc.access(c, push.src, exec::BytePattern::dma_src(push), false);
        rc.access(c, push.dst, exec::BytePattern::dma_dst(push), true);
        rc.dma_issued(c, push, next, "push");
      }
      for (size_t c = 0; c < cores; ++c) {
        rc.wait_satisfied(c, kLand);
        rc.wait_satisfied(c, kLoad);
        rc.wait_satisfied(c, kSend);
        rc.access(c, vmem[c].get(), exec::BytePattern::contiguous(slot, slot + kPiece), false);
        rc.access(c, vmem[c].get(), exec::BytePattern::contiguous(2 * kSlots * kPiece, (2 * kSlots + 1) * kPiece), false);
        rc.access(c, vmem[c].get(), exec::BytePattern::contiguous(sum, sum + kPiece), true);
      }
    }
    dmas += 2 * cores * static_cast<uint64_t>(steps);
    remembered = rc.live_records();
  }
  state.counters["dmas_per_s"] = benchmark::Counter(double(dmas), benchmark::Counter::kIsRate);
  state.counters["remembered"] = double(remembered);
}
BENCHMARK(BM_RingAllReduce)
    ->Args({8, 64})
    ->Args({32, 64})
    ->Args({128, 64})
    ->Args({512, 64})
    ->Args({128, 256})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();

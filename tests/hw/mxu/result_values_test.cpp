// The fast models' result FIFO values (hw/mxu/result_values.h) against the
// contract computed one mmul at a time by the scalar reference, as the ISA's
// reference does at issue: random streams of swaps (k = 0, partial k, full),
// mmuls, pops and writes (plain and mpop.add), on several array shapes, with the
// simulation thread alone and with worker threads. Batching and threads must not
// change a bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <random>
#include <stdexcept>
#include <vector>

#include "hw/mxu/result_values.h"
#include "isa/numerics/bf16.h"
#include "isa/numerics/mxu.h"

namespace tpusim::hw::mxu {
namespace {

constexpr int kLanes = 128;
constexpr size_t kVreg = 8 * kLanes;

uint32_t random_fp32(std::mt19937_64& rng) {
  const uint64_t r = rng();
  switch (r % 16) {
    case 0: return 0x7FC00000u | static_cast<uint32_t>(r >> 40 & 0x3FFFFF);  // NaN payloads
    case 1: return static_cast<uint32_t>(r >> 32 & 0x807FFFFF);              // subnormals, zeros
    case 2: return (r & 0x100 ? 0xFF800000u : 0x7F800000u);                  // Inf
    case 3: return 0x7F7FFFFFu ^ static_cast<uint32_t>(r >> 40 & 0x8000FFFF);  // rounds to Inf or max
    default:  // magnitudes 2^-10 .. 2^10, low half varied (round to nearest even is exercised)
      return static_cast<uint32_t>((r & 0x80000000u) | ((117 + (r >> 8) % 21) << 23) | (r >> 32 & 0x7FFFFF));
  }
}

// One mmul as the ISA reference computes it at issue (isa/exec mxu_compute).
std::vector<uint32_t> reference_mmul(const std::vector<uint16_t>& w, int k, int rows, int cols,
                                     const std::vector<uint32_t>& lhs) {
  std::vector<float> out(kVreg, 0.0f);
  if (k > 0) {
    std::vector<uint16_t> a(static_cast<size_t>(8 * rows), 0);
    for (int s = 0; s < 8; ++s)
      for (int kk = 0; kk < k; ++kk) a[s * rows + kk] = num::fp32_to_bf16(num::f32_from_bits(lhs[s * kLanes + kk]));
    num::MatmulArgs p;
    p.a = a.data();
    p.lda = static_cast<size_t>(rows);
    p.w = w.data();
    p.ldw = static_cast<size_t>(cols);
    p.c = out.data();
    p.ldc = kLanes;
    p.m = 8;
    p.k = k;
    p.n = cols;
    p.rows = rows;
    num::mxu_matmul_reference(p);
  }
  std::vector<uint32_t> bits(kVreg);
  for (size_t i = 0; i < kVreg; ++i) bits[i] = num::f32_bits(out[i]);
  return bits;
}

struct Shape {
  int rows, cols, fifo_vregs;
};

void random_stream(int threads, const Shape& sh, uint64_t seed, int steps) {
  set_matmul_threads(threads);
  std::mt19937_64 rng(seed);
  ResultFifoValues values(sh.rows, sh.cols, sh.fifo_vregs);
  std::vector<uint16_t> w(static_cast<size_t>(sh.rows) * sh.cols, 0);
  int k = 0;
  std::deque<std::vector<uint32_t>> fifo, popped;  // expected values
  int mmuls = 0, writes = 0;
  for (int step = 0; step < steps; ++step) {
    const uint64_t op = rng() % 100;
    if (op < 6) {  // mswap: k = 0 sometimes, partial, full
      for (auto& x : w) x = num::fp32_to_bf16(num::f32_from_bits(random_fp32(rng)));
      const uint64_t r = rng() % 4;
      k = r == 0 ? 0 : r == 1 ? static_cast<int>(1 + rng() % sh.rows) : sh.rows;
      values.swap_weights(w.data(), k);
    } else if (op < 50) {
      if (fifo.size() >= static_cast<size_t>(sh.fifo_vregs)) continue;
      std::vector<uint32_t> lhs(kVreg);
      for (auto& x : lhs) x = random_fp32(rng);
      values.mmul(lhs.data());
      fifo.push_back(reference_mmul(w, k, sh.rows, sh.cols, lhs));
      ++mmuls;
    } else if (op < 75) {
      if (fifo.empty()) continue;
      values.pop();
      popped.push_back(std::move(fifo.front()));
      fifo.pop_front();
    } else {
      if (popped.empty()) continue;
      std::vector<uint32_t> dst(kVreg);
      for (auto& x : dst) x = random_fp32(rng);
      const bool acc = rng() % 3 == 0;
      std::vector<uint32_t> want = popped.front();
      if (acc)
        for (size_t i = 0; i < kVreg; ++i)
          want[i] = num::f32_bits(num::add(num::f32_from_bits(dst[i]), num::f32_from_bits(want[i])));
      values.write_popped(dst.data(), acc);
      popped.pop_front();
      ++writes;
      for (size_t i = 0; i < kVreg; ++i)
        ASSERT_EQ(dst[i], want[i]) << "threads " << threads << " R=" << sh.rows << " C=" << sh.cols << " step "
                                   << step << " write " << writes << " element " << i << " acc " << acc;
    }
    ASSERT_EQ(values.size(), fifo.size());
  }
  EXPECT_GT(mmuls, steps / 8);
  EXPECT_GT(writes, steps / 10);
  // Destroyed with results still in flight (batches possibly on a worker).
}

TEST(ResultFifoValues, EqualsReferenceAlone) {
  for (const Shape& sh : {Shape{128, 128, 16}, Shape{32, 24, 4}, Shape{8, 8, 1}})
    random_stream(1, sh, 11 + static_cast<uint64_t>(sh.rows), 1200);
}

TEST(ResultFifoValues, EqualsReferenceWithWorkers) {
  for (const Shape& sh : {Shape{128, 128, 16}, Shape{32, 24, 4}, Shape{8, 8, 1}})
    for (int threads : {2, 3}) random_stream(threads, sh, 23 + static_cast<uint64_t>(sh.rows * threads), 1200);
  set_matmul_threads(1);
}

// mmul, pop, write in lockstep: every batch is used up while it is still the one
// new mmuls join, which must then start a new batch.
TEST(ResultFifoValues, LockstepMmulPopWrite) {
  for (int threads : {1, 2}) {
    set_matmul_threads(threads);
    std::mt19937_64 rng(5 + static_cast<uint64_t>(threads));
    std::vector<uint16_t> w(128 * 128);
    for (auto& x : w) x = num::fp32_to_bf16(num::f32_from_bits(random_fp32(rng)));
    ResultFifoValues values(128, 128, 32);
    values.swap_weights(w.data(), 128);
    for (int i = 0; i < 200; ++i) {
      std::vector<uint32_t> lhs(kVreg), dst(kVreg);
      for (auto& x : lhs) x = random_fp32(rng);
      values.mmul(lhs.data());
      values.pop();
      values.write_popped(dst.data(), false);
      ASSERT_EQ(dst, reference_mmul(w, 128, 128, 128, lhs)) << "threads " << threads << " mmul " << i;
      ASSERT_EQ(values.size(), 0u);
    }
  }
  set_matmul_threads(1);
}

TEST(ResultFifoValues, RejectsBadArguments) {
  EXPECT_THROW(set_matmul_threads(0), std::invalid_argument);
  EXPECT_THROW(ResultFifoValues(256, 128, 16), std::invalid_argument);  // R beyond the lanes
  ResultFifoValues v(8, 8, 1);
  EXPECT_THROW(v.pop(), std::logic_error);
  uint32_t dst[kVreg];
  EXPECT_THROW(v.write_popped(dst, false), std::logic_error);
}

}  // namespace
}  // namespace tpusim::hw::mxu

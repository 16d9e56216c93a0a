// The placeholder model: a request leaves the pipe bytes/bandwidth after it enters
// (behind earlier ones) and completes latency_ps later; completions in (time, id)
// order; max_outstanding is the back-pressure.
#include "hw/mem/simple_memory.h"

#include <gtest/gtest.h>

namespace tpusim::mem {
namespace {

TEST(SimpleMemory, LatencyPlusQueuedTransfer) {
  SimpleMemory m({/*latency_ps=*/1000, /*bytes_per_s=*/1e12, /*max_outstanding=*/2});  // 1 B/ps
  MemRequest a{1, 0, 4096, false, 0}, b{2, 0, 1024, true, 0}, c{3, 0, 64, false, 0};
  ASSERT_TRUE(m.try_enqueue(a, 0));     // pipe 0..4096, done 5096
  ASSERT_TRUE(m.try_enqueue(b, 100));   // pipe 4096..5120, done 6120
  EXPECT_FALSE(m.try_enqueue(c, 200));  // two outstanding
  EXPECT_EQ(m.next_event_ps(), 5096u);
  m.advance_to(5095);
  MemCompletion out;
  EXPECT_FALSE(m.pop_completion(out));
  m.advance_to(6120);
  ASSERT_TRUE(m.pop_completion(out));
  EXPECT_EQ(out.id, 1u);
  EXPECT_EQ(out.done_ps, 5096u);
  ASSERT_TRUE(m.pop_completion(out));
  EXPECT_EQ(out.done_ps, 6120u);
  EXPECT_EQ(m.next_event_ps(), kNever);
  EXPECT_TRUE(m.try_enqueue(c, 7000));  // idle pipe: 7000 + 64 + 1000
  m.advance_to(10000);
  ASSERT_TRUE(m.pop_completion(out));
  EXPECT_EQ(out.done_ps, 8064u);
  EXPECT_THROW(m.advance_to(0), std::logic_error);
}

TEST(SimpleMemory, CompletionsComeOutByTimeNotIdAndBadInputThrows) {
  SimpleMemory m({500, 1e15, 8});
  ASSERT_TRUE(m.try_enqueue({9, 0, 1, false, 0}, 0));  // 1 B: 0.001 ps, rounded up to 1; done 501
  ASSERT_TRUE(m.try_enqueue({4, 0, 1, false, 0}, 0));  // behind it in the pipe: done 502
  m.advance_to(1000);
  MemCompletion out;
  ASSERT_TRUE(m.pop_completion(out));
  EXPECT_EQ(out.id, 9u);
  EXPECT_EQ(out.done_ps, 501u);
  ASSERT_TRUE(m.pop_completion(out));
  EXPECT_EQ(out.id, 4u);
  EXPECT_THROW(m.try_enqueue({1, 0, 0, false, 0}, 1000), std::invalid_argument);
  EXPECT_THROW(SimpleMemory({1, 0.0, 1}), std::invalid_argument);
}

// Bytes/s carried by 200,000 requests of 512 B offered as fast as the memory
// takes them, from the first completion to the last.
double carried(const SimpleMemoryConfig& cfg) {
  SimpleMemory m(cfg);
  const uint64_t n = 200000;
  uint64_t t = 0, sent = 0, id = 0, first_done = 0, last_done = 0;
  MemCompletion c;
  while (sent < n) {
    while (sent < n && m.try_enqueue({++id, 0, 512, false, 0}, t)) ++sent;
    t = m.next_event_ps();
    m.advance_to(t);
    while (m.pop_completion(c)) (first_done == 0 ? first_done : last_done) = c.done_ps;
  }
  while (m.next_event_ps() != kNever) {
    m.advance_to(m.next_event_ps());
    while (m.pop_completion(c)) last_done = c.done_ps;
  }
  return double((n - 1) * 512) / (double(last_done - first_done) * 1e-12);
}

// Requests of 512 B kept coming as fast as the memory takes them: the bytes it
// carries per second are sustained_bytes_per_s, the pipe's rate where enough are
// in flight to cover the latency, and max_outstanding x 512 B per (latency + a
// request's pipe time) where not: 256 x 512 B per 100.05 ns is 1.31e12 B/s, so
// a pipe set to ~10 TB/s carries that (as the "12 TB/s" runs of
// docs/validation.md before session 50 did). 1.024e13 B/s makes a request's pipe
// time a whole 50 ps; the rate is measured from the first completion to the last.
TEST(SimpleMemory, SustainedRateIsThePipeOrLittlesLawWhicheverIsLower) {
  const SimpleMemoryConfig v4_pipe{100000, 1.2e12, 256}, fast_pipe{100000, 1.024e13, 256}, deep{100000, 1.024e13, 4096};
  EXPECT_DOUBLE_EQ(v4_pipe.sustained_bytes_per_s(512), 1.2e12);
  EXPECT_NEAR(fast_pipe.sustained_bytes_per_s(512), 256 * 512 / (100e-9 + 512 / 1.024e13), 1e3);
  EXPECT_NEAR(fast_pipe.sustained_bytes_per_s(512), 1.31e12, 0.01e12);
  EXPECT_DOUBLE_EQ(deep.sustained_bytes_per_s(512), 1.024e13);
  for (const SimpleMemoryConfig& cfg : {v4_pipe, fast_pipe, deep})
    EXPECT_NEAR(carried(cfg) / cfg.sustained_bytes_per_s(512), 1.0, 0.002) << cfg.bytes_per_s << " " << cfg.max_outstanding;
}

// outstanding_for_peak is the fewest requests in flight that carry bytes_per_s
// (Little's law: 1.024e13 B/s x 100 ns / 512 B = 2000 in the pipe's latency, plus
// the one in the pipe), and peak_pipe, a preset's memory without an HBM timing
// table, takes at least that many: it carries its rate where 256 would stop at
// 1.31e12 B/s, and stays at 256 for a rate that many cover.
TEST(SimpleMemory, PeakPipeHasEnoughInFlightToCarryItsRate) {
  SimpleMemoryConfig fast{100000, 1.024e13, 1};
  EXPECT_EQ(fast.outstanding_for_peak(512), 2001u);
  fast.max_outstanding = 2001;
  EXPECT_DOUBLE_EQ(fast.sustained_bytes_per_s(512), 1.024e13);
  fast.max_outstanding = 2000;
  EXPECT_LT(fast.sustained_bytes_per_s(512), 1.024e13);
  const SimpleMemoryConfig pipe = SimpleMemoryConfig::peak_pipe(1.024e13, 512),
                           v4 = SimpleMemoryConfig::peak_pipe(1.2e12, 512);
  EXPECT_EQ(pipe.max_outstanding, 2001u);
  EXPECT_EQ(pipe.latency_ps, 100000u);
  EXPECT_NEAR(carried(pipe) / 1.024e13, 1.0, 0.002);
  EXPECT_EQ(v4.max_outstanding, 256u);
  EXPECT_NEAR(carried(v4) / 1.2e12, 1.0, 0.002);
}

}  // namespace
}  // namespace tpusim::mem

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

}  // namespace
}  // namespace tpusim::mem

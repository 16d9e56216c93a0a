// The values of one MXU's result FIFO in the fast models (the TensorCore's
// MatrixQueue): the timing core (mxu_core.h) decides when each row lands; this
// decides what it holds. An mmul's rows are not computed when it issues but in
// batches (all mmuls in a row on the same weights, up to a limit), against the
// weights packed once per mswap, by the simulation thread or by a worker thread:
// every row is the contract's chunk sum of its own LHS row and the weights it saw,
// so the values do not depend on the batching, on which thread ran a batch, or
// when (docs/mxu.md, "Result values").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "isa/numerics/mxu.h"

namespace tpusim::hw::mxu {

// Threads that compute MXU results in this process: 1 (the default) = only the
// simulation thread; n > 1 adds n - 1 workers shared by every MXU of every core.
// Set before a run starts (tpusim run --threads). Values and stats are the same
// for every n.
void set_matmul_threads(int n);
int matmul_threads();

class ResultFifoValues {
 public:
  // R x C array, a FIFO of fifo_vregs results; LHS vregs are 8 x lanes fp32,
  // results 8 x lanes (lanes >= C: +0.0).
  ResultFifoValues(int rows, int cols, int fifo_vregs, int lanes = 128);
  ~ResultFifoValues();
  ResultFifoValues(const ResultFifoValues&) = delete;
  ResultFifoValues& operator=(const ResultFifoValues&) = delete;

  // mswap: w is R x C bf16 (row stride C), rows [0, k) valid; later mmuls use it.
  void swap_weights(const uint16_t* w, int k);
  // mmul: lhs is the LHS vreg's 8 x lanes fp32 bit patterns at issue.
  void mmul(const uint32_t* lhs);
  // Results in the FIFO (entered, not popped).
  size_t size() const { return in_fifo_; }
  // mpop at issue: the oldest result leaves the FIFO; its value is written later.
  void pop();
  // The oldest popped, unwritten result into dst (8 x lanes fp32 bit patterns):
  // copied, or added element-wise with the contract's add (mpop.add).
  void write_popped(uint32_t* dst, bool accumulate);

  struct Batch;

 private:
  void close_open_batch();
  std::shared_ptr<Batch> new_batch();

  int rows_, cols_, lanes_;
  size_t vreg_;  // 8 * lanes
  std::shared_ptr<const num::MxuPackedWeights> weights_;
  std::deque<std::shared_ptr<Batch>> batches_;  // oldest first; the back one may be open
  bool open_ = false;
  size_t written_ = 0;  // results of batches_.front() already written
  size_t popped_ = 0;   // popped, not written
  size_t in_fifo_ = 0;
  size_t fifo_vregs_ = 1;
  size_t batch_limit_ = 1;  // mmuls per batch
  std::vector<std::shared_ptr<Batch>> spare_;
  std::vector<float> scratch_;  // a result computed again while a worker has it
};

}  // namespace tpusim::hw::mxu

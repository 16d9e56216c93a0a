#include "hw/mxu/result_values.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TPUSIM_CPU_RELAX() _mm_pause()
#else
#define TPUSIM_CPU_RELAX() ((void)0)
#endif

namespace tpusim::hw::mxu {

struct ResultFifoValues::Batch {
  std::shared_ptr<const num::MxuPackedWeights> w;
  std::vector<float> lhs;  // count vregs of rounded LHS, row stride lanes
  std::vector<float> out;  // count vregs of results
  size_t count = 0;
  int cols = 0, lanes = 0;
  // 0: not started, 1: being computed, 2: done. Whoever moves it 0 -> 1 computes
  // it (a worker, or the simulation thread when it needs the values first).
  std::atomic<int> state{0};

  bool claim() {
    int expected = 0;
    return state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel);
  }
  void run() {
    const size_t n = count * 8 * static_cast<size_t>(lanes);
    if (out.size() < n) out.resize(n);
    if (cols < lanes) std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n), 0.0f);
    num::mxu_matmul_packed(*w, lhs.data(), static_cast<size_t>(lanes), out.data(), static_cast<size_t>(lanes),
                           static_cast<int>(count) * 8, false);
    state.store(2, std::memory_order_release);
  }
  void wait_done() {
    for (int spins = 0; state.load(std::memory_order_acquire) != 2; ++spins) {
      if (spins < 4096) TPUSIM_CPU_RELAX();
      else std::this_thread::yield();  // the worker may have lost its core on a loaded host
    }
  }
};

namespace {

// The worker threads, shared by every MXU of the process. A worker spins a little
// before it sleeps: in an MXU-bound run batches come every few microseconds, and a
// futex wake-up per batch would cost the simulation thread more than the batch.
class Workers {
 public:
  static Workers& get() {
    static Workers w;
    return w;
  }
  ~Workers() { stop(); }

  void configure(int threads) {
    stop();
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = false;
    for (int i = 1; i < threads; ++i) threads_.emplace_back([this] { loop(); });
    count_.store(threads, std::memory_order_relaxed);
  }
  int threads() const { return count_.load(std::memory_order_relaxed); }

  void submit(std::shared_ptr<ResultFifoValues::Batch> b) {
    bool wake;
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(b));
      queued_.fetch_add(1, std::memory_order_release);
      wake = sleeping_ > 0;
    }
    if (wake) cv_.notify_one();
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    count_.store(1, std::memory_order_relaxed);
  }

  void loop() {
    using Clock = std::chrono::steady_clock;
    for (;;) {
      const auto spin_until = Clock::now() + std::chrono::microseconds(200);
      for (int i = 0; queued_.load(std::memory_order_acquire) == 0; ++i) {
        TPUSIM_CPU_RELAX();
        if (i % 64 == 63 && Clock::now() > spin_until) break;
      }
      std::shared_ptr<ResultFifoValues::Batch> b;
      {
        std::unique_lock<std::mutex> lk(mu_);
        ++sleeping_;
        cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
        --sleeping_;
        if (queue_.empty()) return;  // stopping
        b = std::move(queue_.front());
        queue_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      // Claimed before the reference is dropped: the owner frees a batch only once
      // it is done, and recycles it only when it holds the last reference.
      if (b->claim()) {
        ResultFifoValues::Batch* raw = b.get();
        b.reset();
        raw->run();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ResultFifoValues::Batch>> queue_;
  std::atomic<size_t> queued_{0};
  std::atomic<int> count_{1};
  int sleeping_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

void set_matmul_threads(int n) {
  if (n < 1 || n > 256) throw std::invalid_argument("MXU matmul threads must be 1..256, got " + std::to_string(n));
  Workers::get().configure(n);
}

int matmul_threads() { return Workers::get().threads(); }

ResultFifoValues::ResultFifoValues(int rows, int cols, int fifo_vregs, int lanes)
    : rows_(rows), cols_(cols), lanes_(lanes), vreg_(8 * static_cast<size_t>(lanes)) {
  if (rows < 1 || rows > lanes || cols < 1 || cols > lanes)
    throw std::invalid_argument("MXU result values: array " + std::to_string(rows) + " x " + std::to_string(cols) +
                                " does not fit " + std::to_string(lanes) + " lanes");
  // Alone, a batch waits until its values are needed (or its weights are swapped
  // out): the kernel runs as fast at 8 rows as at 128 on packed weights. With
  // workers, a batch is handed over once it holds an eighth of the FIFO, so a
  // worker computes it while the simulation runs the cycles before its first mpop.
  batch_limit_ = matmul_threads() > 1 ? static_cast<size_t>(std::max(1, fifo_vregs / 8)) : ~size_t{0};
  std::vector<uint16_t> none(static_cast<size_t>(rows) * static_cast<size_t>(cols), 0);
  swap_weights(none.data(), 0);
}

ResultFifoValues::~ResultFifoValues() {
  for (auto& b : batches_)
    if (!b->claim()) b->wait_done();  // a worker still has it: wait before its operands go
}

void ResultFifoValues::swap_weights(const uint16_t* w, int k) {
  close_open_batch();
  auto packed = std::make_shared<num::MxuPackedWeights>();
  packed->pack(w, static_cast<size_t>(cols_), k, cols_, rows_);
  weights_ = std::move(packed);
}

std::shared_ptr<ResultFifoValues::Batch> ResultFifoValues::new_batch() {
  std::shared_ptr<Batch> b;
  if (!spare_.empty()) {
    b = std::move(spare_.back());
    spare_.pop_back();
  } else {
    b = std::make_shared<Batch>();
  }
  b->w = weights_;
  b->count = 0;
  b->cols = cols_;
  b->lanes = lanes_;
  b->state.store(0, std::memory_order_relaxed);
  return b;
}

void ResultFifoValues::close_open_batch() {
  if (!open_) return;
  open_ = false;
  if (matmul_threads() > 1) Workers::get().submit(batches_.back());
}

void ResultFifoValues::mmul(const uint32_t* lhs) {
  if (!open_ || batches_.back()->w != weights_) {
    close_open_batch();
    batches_.push_back(new_batch());
    open_ = true;
  }
  Batch& b = *batches_.back();
  if (b.lhs.size() < (b.count + 1) * vreg_) b.lhs.resize((b.count + 1) * vreg_);
  num::mxu_round_lhs(lhs, &b.lhs[b.count * vreg_], vreg_);
  ++b.count;
  ++in_fifo_;
  if (b.count >= batch_limit_) close_open_batch();  // to a worker now, not at the next mmul
}

void ResultFifoValues::pop() {
  if (in_fifo_ == 0) throw std::logic_error("MXU result values: pop of an empty FIFO");
  --in_fifo_;
  ++popped_;
}

void ResultFifoValues::write_popped(uint32_t* dst, bool accumulate) {
  if (popped_ == 0) throw std::logic_error("MXU result values: write with nothing popped");
  if (open_ && batches_.size() == 1) close_open_batch();  // its values are needed now
  Batch& b = *batches_.front();
  if (b.claim()) b.run();
  else b.wait_done();
  const float* r = b.out.data() + written_ * vreg_;
  if (!accumulate) {
    std::memcpy(dst, r, vreg_ * sizeof(float));
  } else {
    for (size_t i = 0; i < vreg_; ++i) dst[i] = num::f32_bits(num::add(num::f32_from_bits(dst[i]), r[i]));
  }
  --popped_;
  if (++written_ == b.count) {
    written_ = 0;
    // Kept for reuse only when nobody else (a worker's queue) still holds it.
    if (batches_.front().use_count() == 1 && spare_.size() < 8) spare_.push_back(std::move(batches_.front()));
    batches_.pop_front();
  }
}

}  // namespace tpusim::hw::mxu

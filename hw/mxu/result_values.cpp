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
  std::vector<float> lhs;  // up to `capacity` vregs of rounded LHS, row stride lanes
  std::vector<float> out;  // their results
  size_t count = 0;
  int cols = 0, lanes = 0;
  // Per mmul: 0 not started, 1 a worker computes it, 2 done, 3 the simulation
  // thread computes it. Whoever moves it from 0 computes it into `out`; the
  // simulation thread never waits for a worker: finding an mmul under way on one,
  // it computes its own copy (the same bits) instead.
  std::unique_ptr<std::atomic<int>[]> state;
  size_t capacity = 0;

  void reset(size_t cap, size_t vreg) {
    if (capacity < cap) {
      state.reset(new std::atomic<int>[cap]);
      capacity = cap;
      lhs.resize(cap * vreg);
      out.resize(cap * vreg);
    }
    for (size_t i = 0; i < capacity; ++i) state[i].store(0, std::memory_order_relaxed);
    count = 0;
  }
  bool claim(size_t i, int who) {
    int expected = 0;
    return state[i].compare_exchange_strong(expected, who, std::memory_order_acq_rel);
  }
  void compute(size_t i, float* dst) const {
    const size_t vreg = 8 * static_cast<size_t>(lanes);
    if (cols < lanes) std::fill(dst, dst + vreg, 0.0f);
    num::mxu_matmul_packed(*w, &lhs[i * vreg], static_cast<size_t>(lanes), dst, static_cast<size_t>(lanes), 8, false);
  }
  // Last mmul first: the simulation thread needs the first one first, so the two
  // rarely meet on one mmul.
  void run_on_worker() {
    const size_t vreg = 8 * static_cast<size_t>(lanes);
    for (size_t i = count; i-- > 0;)
      if (claim(i, 1)) {
        compute(i, &out[i * vreg]);
        state[i].store(2, std::memory_order_release);
      }
  }
};

namespace {

// The worker threads, shared by every MXU of the process. A worker spins (200 us)
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

  // Called by the simulation thread only. It never blocks on the queue's lock: a
  // worker that lost its core while holding it would stall the simulation, so the
  // batch waits here until the next hand-over finds the lock free (or is computed
  // by the simulation thread when it needs it).
  void submit(std::shared_ptr<ResultFifoValues::Batch> b) {
    held_.push_back(std::move(b));
    std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
    if (!lk.owns_lock()) return;
    for (auto& h : held_) queue_.push_back(std::move(h));
    queued_.fetch_add(held_.size(), std::memory_order_release);
    held_.clear();
    const bool wake = sleeping_ > 0;
    lk.unlock();
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
    held_.clear();
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
      // The reference is held while computing: the owner recycles a batch only
      // when it holds the last one.
      b->run_on_worker();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ResultFifoValues::Batch>> queue_;
  std::vector<std::shared_ptr<ResultFifoValues::Batch>> held_;  // simulation thread only
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
  // Alone, a batch waits until its values are needed (the kernel runs as fast at
  // 8 rows as at 128 on packed weights). With workers, a batch is handed over once
  // it holds an eighth of the FIFO, so a worker computes it while the simulation
  // runs the cycles before its first mpop.
  fifo_vregs_ = static_cast<size_t>(std::max(1, fifo_vregs));
  batch_limit_ = matmul_threads() > 1 ? static_cast<size_t>(std::max(1, fifo_vregs / 8)) : fifo_vregs_;
  scratch_.resize(vreg_);
  std::vector<uint16_t> none(static_cast<size_t>(rows) * static_cast<size_t>(cols), 0);
  swap_weights(none.data(), 0);
}

ResultFifoValues::~ResultFifoValues() = default;  // a worker holds its own reference to a batch

void ResultFifoValues::swap_weights(const uint16_t* w, int k) {
  close_open_batch();
  auto packed = std::make_shared<num::MxuPackedWeights>();
  packed->pack(w, static_cast<size_t>(cols_), k, cols_, rows_);
  weights_ = std::move(packed);
}

std::shared_ptr<ResultFifoValues::Batch> ResultFifoValues::new_batch() {
  std::shared_ptr<Batch> b;
  // A used batch is reused once nobody else (a worker or its queue) holds it.
  for (size_t i = 0; i < spare_.size(); ++i)
    if (spare_[i].use_count() == 1) {
      b = std::move(spare_[i]);
      spare_[i] = std::move(spare_.back());
      spare_.pop_back();
      break;
    }
  if (!b) b = std::make_shared<Batch>();
  b->w = weights_;
  b->cols = cols_;
  b->lanes = lanes_;
  b->reset(batch_limit_, vreg_);
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
  Batch& b = *batches_.front();
  const float* r = &b.out[written_ * vreg_];
  bool written = false;
  if (b.state[written_].load(std::memory_order_acquire) != 2) {
    if (b.claim(written_, 3)) {
      // Nobody reads this result again: a plain mpop's goes straight into its
      // register (the fp32 values' bit patterns), not through a copy.
      written = !accumulate;
      b.compute(written_, written ? reinterpret_cast<float*>(dst) : &b.out[written_ * vreg_]);
      b.state[written_].store(2, std::memory_order_relaxed);
    } else if (b.state[written_].load(std::memory_order_acquire) != 2) {
      b.compute(written_, scratch_.data());  // under way on a worker: not waited for
      r = scratch_.data();
    }
  }
  if (!written && !accumulate) {
    std::memcpy(dst, r, vreg_ * sizeof(float));
  } else if (accumulate) {
    for (size_t i = 0; i < vreg_; ++i) dst[i] = num::f32_bits(num::add(num::f32_from_bits(dst[i]), r[i]));
  }
  --popped_;
  if (++written_ == b.count) {
    written_ = 0;
    if (open_ && batches_.size() == 1) open_ = false;  // the next mmul starts a new batch
    if (spare_.size() < 64) spare_.push_back(std::move(batches_.front()));
    batches_.pop_front();
  }
}

}  // namespace tpusim::hw::mxu

// The fast MXU kernel (every code path this CPU runs), the scalar reference, and
// Eigen's float32 GEMM built with the project's flags (baseline x86-64: SSE2, no
// FMA), single thread, in FLOP/s (2*M*N*K per matmul) of CPU time: the machine is
// shared, and CPU time does not count the time slices other processes take. Eigen built for
// AVX-512 + FMA is in numerics_eigen_native_bench (a separate program so that
// Eigen's templates are never compiled for two ISAs in one binary).
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <cstdint>
#include <random>
#include <vector>

#include "isa/numerics/mxu.h"
#include "isa/numerics/mxu_paths.h"

namespace {

using namespace tpusim::num;

struct Operands {
  int m, k, n;
  std::vector<uint16_t> a, w;
  std::vector<float> c;
  Operands(int m_, int k_, int n_) : m(m_), k(k_), n(n_), a(size_t(m_) * k_), w(size_t(k_) * n_), c(size_t(m_) * n_) {
    std::mt19937 rng(1);
    for (auto& v : a) v = static_cast<uint16_t>((rng() & 0x8000) | ((120 + rng() % 14) << 7) | (rng() & 0x7F));
    for (auto& v : w) v = static_cast<uint16_t>((rng() & 0x8000) | ((120 + rng() % 14) << 7) | (rng() & 0x7F));
  }
  MatmulArgs args() {
    MatmulArgs p;
    p.a = a.data();
    p.lda = k;
    p.w = w.data();
    p.ldw = n;
    p.c = c.data();
    p.ldc = n;
    p.m = m;
    p.k = k;
    p.n = n;
    p.rows = 128;
    return p;
  }
};

void set_flops(benchmark::State& state, int m, int k, int n) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * m * k * n, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
}

void BM_MxuFast(benchmark::State& state, MxuPath path) {
  if (!mxu_path_supported(path)) {
    state.SkipWithError("code path not supported on this CPU");
    return;
  }
  const int m = int(state.range(0)), k = int(state.range(1)), n = int(state.range(2));
  Operands ops(m, k, n);
  MatmulArgs p = ops.args();
  for (auto _ : state) {
    mxu_matmul_with(path, p);
    benchmark::DoNotOptimize(ops.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, m, k, n);
}

// Weights packed once outside the loop, A already as fp32 operands: what the
// fast MXU model runs per batch of mmuls between two weight swaps.
void BM_MxuPacked(benchmark::State& state, MxuPath path) {
  if (!mxu_path_supported(path)) {
    state.SkipWithError("code path not supported on this CPU");
    return;
  }
  const int m = int(state.range(0)), k = int(state.range(1)), n = int(state.range(2));
  Operands ops(m, k, n);
  MxuPackedWeights w;
  mxu_pack_weights_with(path, w, ops.w.data(), size_t(n), k, n, 128);
  std::vector<float> a(ops.a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_fp32(ops.a[i]);
  for (auto _ : state) {
    mxu_matmul_packed(w, a.data(), size_t(k), ops.c.data(), size_t(n), m, false);
    benchmark::DoNotOptimize(ops.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, m, k, n);
}

void BM_MxuReference(benchmark::State& state) {
  const int m = int(state.range(0)), k = int(state.range(1)), n = int(state.range(2));
  Operands ops(m, k, n);
  MatmulArgs p = ops.args();
  for (auto _ : state) {
    mxu_matmul_reference(p);
    benchmark::DoNotOptimize(ops.c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, m, k, n);
}

void BM_EigenGemmBaselineIsa(benchmark::State& state) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int m = int(state.range(0)), k = int(state.range(1)), n = int(state.range(2));
  Mat a = Mat::Random(m, k), w = Mat::Random(k, n), c(m, n);
  for (auto _ : state) {
    c.noalias() = a * w;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, m, k, n);
}

// MxKxN of the issue: 128^3, 1024^3, 4096x1024x1024.
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({128, 128, 128})->Args({1024, 1024, 1024})->Args({4096, 1024, 1024});
  b->ArgNames({"M", "K", "N"})->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_MxuFast, avx512, MxuPath::kAvx512)->Apply(shapes);
BENCHMARK_CAPTURE(BM_MxuFast, avx2, MxuPath::kAvx2)->Apply(shapes);
BENCHMARK_CAPTURE(BM_MxuFast, portable, MxuPath::kPortable)->Apply(shapes);
// The MXU model's calls: 8 (one mmul) to 128 (a batch of 16) rows against 128 x 128 weights.
void mxu_batches(benchmark::internal::Benchmark* b) {
  b->Args({8, 128, 128})->Args({64, 128, 128})->Args({128, 128, 128})->Args({1024, 1024, 1024});
  b->ArgNames({"M", "K", "N"})->Unit(benchmark::kMicrosecond);
}
BENCHMARK_CAPTURE(BM_MxuFast, avx512, MxuPath::kAvx512)->Args({8, 128, 128})->Args({64, 128, 128})
    ->ArgNames({"M", "K", "N"})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MxuPacked, avx512, MxuPath::kAvx512)->Apply(mxu_batches);
BENCHMARK_CAPTURE(BM_MxuPacked, avx2, MxuPath::kAvx2)->Apply(mxu_batches);
BENCHMARK(BM_EigenGemmBaselineIsa)->Apply(shapes);
// The scalar reference takes seconds per 1024^3 matmul: one iteration per run.
BENCHMARK(BM_MxuReference)->Args({128, 128, 128})->ArgNames({"M", "K", "N"})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MxuReference)
    ->Args({1024, 1024, 1024})
    ->Args({4096, 1024, 1024})
    ->ArgNames({"M", "K", "N"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace

BENCHMARK_MAIN();

// Eigen's float32 GEMM compiled for AVX-512 + FMA (the strongest Eigen this
// machine runs), single thread: the yardstick for the fast MXU kernel. Benchmarks
// are registered at run time, after main has checked the CPU.
#include <benchmark/benchmark.h>

#include <Eigen/Core>

namespace {

void BM_EigenGemmAvx512Fma(benchmark::State& state) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int m = int(state.range(0)), k = int(state.range(1)), n = int(state.range(2));
  Mat a = Mat::Random(m, k), w = Mat::Random(k, n), c(m, n);
  for (auto _ : state) {
    c.noalias() = a * w;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * m * k * n, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
}

}  // namespace

int register_eigen_native_benchmarks() {
  benchmark::RegisterBenchmark("BM_EigenGemmAvx512Fma", BM_EigenGemmAvx512Fma)
      ->Args({128, 128, 128})
      ->Args({1024, 1024, 1024})
      ->Args({4096, 1024, 1024})
      ->ArgNames({"M", "K", "N"})
      ->Unit(benchmark::kMillisecond);
  return 0;
}

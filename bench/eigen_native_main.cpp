// Entry point of numerics_eigen_native_bench, compiled for the baseline ISA so
// that it can refuse to run (instead of crashing) on a CPU without AVX-512/FMA.
#include <benchmark/benchmark.h>

#include <cstdio>

int register_eigen_native_benchmarks();  // eigen_native_gemm.cpp (AVX-512 + FMA)

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("fma")) {
    std::printf("numerics_eigen_native_bench: this CPU lacks AVX-512F/FMA; nothing to run\n");
    return 0;
  }
  register_eigen_native_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// `tpusim demo`: the README's main job. Until the chip model exists it runs a
// bf16 matmul through the numerics core and checks the fast kernel against the
// scalar reference, printing a summary.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "isa/numerics/mxu.h"
#include "sim/commands.h"

namespace tpusim::cli {

namespace {

int run_demo(int size) {
  const int m = size, k = size, n = size;
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> a(size_t(m) * k), w(size_t(k) * n);
  for (auto& x : a) x = num::fp32_to_bf16(dist(rng));
  for (auto& x : w) x = num::fp32_to_bf16(dist(rng));
  std::vector<float> c_ref(size_t(m) * n), c_fast(size_t(m) * n);
  num::MatmulArgs args{a.data(), size_t(k), w.data(), size_t(n), c_ref.data(), size_t(n), m, k, n};

  auto t0 = std::chrono::steady_clock::now();
  num::mxu_matmul_reference(args);
  auto t1 = std::chrono::steady_clock::now();
  args.c = c_fast.data();
  num::mxu_matmul(args);
  auto t2 = std::chrono::steady_clock::now();

  size_t mismatches = 0;
  for (size_t i = 0; i < c_ref.size(); ++i)
    mismatches += num::f32_bits(c_ref[i]) != num::f32_bits(c_fast[i]);
  double macs = double(m) * k * n;
  double ref_s = std::chrono::duration<double>(t1 - t0).count();
  double fast_s = std::chrono::duration<double>(t2 - t1).count();
  fmt::print("tpusim demo: bf16 matmul {}x{}x{} (R=128 chunks, fp32 accumulate)\n", m, k, n);
  fmt::print("  scalar reference : {:8.3f} ms  {:8.1f} M MAC/s\n", ref_s * 1e3, macs / ref_s / 1e6);
  fmt::print("  fast kernel ({}): {:8.3f} ms  {:8.1f} M MAC/s\n", num::mxu_matmul_isa(), fast_s * 1e3,
             macs / fast_s / 1e6);
  fmt::print("  bit mismatches   : {} of {}\n", mismatches, c_ref.size());
  return mismatches == 0 ? kExitOk : kExitProgramFault;
}

}  // namespace

void add_demo_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("demo", "Run the bundled default job and print its report");
  auto size = std::make_shared<int>(256);
  cmd->add_option("--size", *size, "Square matmul size")->check(CLI::Range(1, 4096));
  cmd->callback([size, &exit_code] { exit_code = run_demo(*size); });
}

}  // namespace tpusim::cli

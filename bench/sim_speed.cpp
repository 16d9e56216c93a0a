// Simulation speed of `tpusim run`: simulated core-cycles per host second in fast
// and detailed mode on an MXU-bound GEMM loop and on a DMA-latency-bound loop (one
// small HBM->VMEM transfer in flight at a time), plus the simulated MACs per host
// second of the GEMM. Drives the real binary, as a user does, and reads cycles,
// flops and host.wall_seconds (simulation only) from stats.json. The fast-mode
// GEMMs run once with the simulation thread alone and once with --threads (a
// worker computing MXU results beside it; the same cycles and values).
//   sim_speed [--tpusim PATH] [--preset v4] [--scale 1.0] [--mxus N] [--threads 2]
// Pod scale (docs/ici.md, "Scale"): --pod N runs instead the torus all-reduce of N
// fp32 per chip on every chip of --pod-preset (v2-16x16: 256 chips) in fast mode,
// as `ici_program PRESET torus N --pod` writes it, and prints the run's cycles,
// CPU, wall, max RSS and the load average around it (--threads: the run's, chip
// groups on threads); --pod 25000000 is the 100 MB acceptance run:
//   sim_speed --pod 25000000
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hw/config/params.h"
#include "hw/ici/collective_program.h"
#include "hw/ici/collectives.h"
#include "hw/ici/topology.h"
#include "sim/run/stats.h"

namespace {

namespace fs = std::filesystem;

// Every MXU of one core streams LHS vregs against full 128-row weights, software
// pipelined: each MXU's queue alternates mpop (vreg i) and mmul (vreg i + 16), so
// its LHS port and its result port are both busy every cycle. Pops lag the mmuls
// by 16 vregs = 128 cycles, more than the first-result latency (83/101 cycles on
// v4), and 16 vregs outstanding is the bundle's default FIFO (fifo_rows=128).
// The earlier form of this loop (8 mmuls, then their 8 mpops, per MXU) reached
// only 40% utilization: each mpop waited out the whole latency and, the queue
// being in order, held the next mmuls behind it. With 4 MXUs the sequencer issues
// 8 instructions per 8 cycles, so it is as busy as the MXUs (one instruction per
// cycle); the loop is unrolled 16 deep to keep the branch at 1 in 129 issue slots.
std::string gemm_program(int mxus, int iterations) {
  std::string s = ".target chips=1 cores=1 mxus=" + std::to_string(mxus) + "\n";
  s += ".output y f32 [8, 128] vmem:0x0\n.core chip0.core0\n";
  s += "  vbcast v0, 0.5\n  vbcast v1, 1.25\n";
  const auto mxu = [](int m) { return "mxu" + std::to_string(m); };
  for (int m = 0; m < mxus; ++m) {
    for (int i = 0; i < 16; ++i) s += "  mpush " + mxu(m) + ", v0\n";
    s += "  mswap " + mxu(m) + "\n";
  }
  constexpr int kLag = 16;  // vregs in flight per MXU before its first mpop
  int pops = 0;
  const auto pop = [&](int m) { return "  mpop v" + std::to_string(8 + pops++ % 16) + ", " + mxu(m) + "\n"; };
  for (int j = 0; j < kLag; ++j)
    for (int m = 0; m < mxus; ++m) s += "  mmul " + mxu(m) + ", v1\n";
  s += "  li s4, " + std::to_string(iterations) + "\nloop:\n";
  for (int j = 0; j < 16; ++j)
    for (int m = 0; m < mxus; ++m) s += pop(m) + "  mmul " + mxu(m) + ", v1\n";
  s += "  loop s4, loop\n";
  for (int j = 0; j < kLag; ++j)
    for (int m = 0; m < mxus; ++m) s += pop(m);
  s += "  vst v8, [s0 + 0]\n  halt\n";
  return s;
}

// One 4 KiB HBM->VMEM transfer at a time, each waited before the next: the run
// is the DMA latency times the iteration count, and the simulator has almost
// nothing to do between the events.
std::string dma_program(int iterations) {
  return ".target chips=1 cores=1 mxus=1\n.input x f32 [8, 128] hbm:0x0\n.output y f32 [8, 128] vmem:0x0\n"
         ".core chip0.core0\n  li s4, " +
         std::to_string(iterations) +
         "\nloop:\n  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=4096, flag=f1\n  wait.sub f1, 1\n  loop s4, loop\n"
         "  halt\n";
}

struct Measured {
  uint64_t cycles = 0;
  uint64_t flops = 0;
  double wall = 0;
  double cpu = 0;  // user + system CPU seconds of the run process, start to exit
  double user = 0;
  double process_wall = 0;  // the whole run command, bundle loading and outputs included
};

// CPU time of finished child processes: on a shared, loaded host the wall time
// of a run includes time it waited for a core; its CPU time does not.
double children_cpu_seconds(bool user_only = false) {
  rusage u{};
  ::getrusage(RUSAGE_CHILDREN, &u);
  if (user_only) return double(u.ru_utime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// `extra`: more `tpusim run` options (preset overrides).
Measured run(const std::string& tpusim, const std::string& dir, const std::string& name, const std::string& text,
             const std::string& preset, const std::string& mode, int threads, const std::string& extra = "") {
  const std::string src = dir + "/" + name + ".s", bundle = dir + "/" + name + ".tpu", out = dir + "/" + name + "_" + mode;
  std::ofstream(src) << text;
  std::string cmd = tpusim + " asm " + src + " -o " + bundle + " >/dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("assembling " + src + " failed");
  cmd = "SYSTEMC_DISABLE_COPYRIGHT_MESSAGE=1 " + tpusim + " run " + bundle + " --preset " + preset + " --mode " +
        mode + " --threads " + std::to_string(threads) + extra + " --random-inputs 1 -q --out " + out;
  const double cpu0 = children_cpu_seconds(), user0 = children_cpu_seconds(true);
  const auto t0 = std::chrono::steady_clock::now();
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("'" + cmd + "' failed");
  const double process_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = children_cpu_seconds() - cpu0, user = children_cpu_seconds(true) - user0;
  const auto s = tpusim::run::read_stats(out + "/stats.json");
  return {s["cycles"].get<uint64_t>(), s["flops"].get<uint64_t>(), s["host"]["wall_seconds"].get<double>(), cpu, user,
          process_wall};
}

std::string load_average() {
  double l[3] = {0, 0, 0};
  if (::getloadavg(l, 3) != 3) return "?";
  return fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]);
}

// The pod-scale all-reduce, one run: what docs/ici.md "Scale" reports.
int pod_run(const std::string& tpusim, const std::string& preset_name, int64_t elements, int threads) {
  try {
    const tpusim::config::Params preset = tpusim::config::load_preset(preset_name);
    const auto topo = tpusim::ici::Topology::from_params(preset);
    const auto sched = tpusim::ici::make_schedule(tpusim::ici::CollectiveKind::kAllReduce,
                                                  tpusim::ici::Algorithm::kTorus, topo, elements);
    tpusim::ici::ProgramOptions po;  // as ici_program --pod
    po.unroll = 8;
    po.io_tiles = std::min<int64_t>(16, elements / 1024);
    po.allow_ragged = true;
    po.vmem_bytes = std::max<int64_t>(int64_t(16) << 20, (elements * 4 * 9 / 4 + (1 << 20)) >> 20 << 20);
    po.cores_per_chip = static_cast<int>(preset.get_int("cores_per_chip"));
    po.extra_target = " vmem=" + std::to_string(po.vmem_bytes);
    const std::string dir = (fs::temp_directory_path() / ("tpusim_sim_speed_pod_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir);
    // Removed however the run ends: a failed run must not leave its bundle behind.
    struct RemoveDir {
      std::string path;
      ~RemoveDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
      }
    } remove_dir{dir};
    const std::string load_before = load_average();
    // The program keeps its buffers in VMEM, bigger than a chip's: the run's preset
    // must hold the bundle's memories (tpusim run refuses a target it does not fit).
    const Measured m = run(tpusim, dir, "pod", tpusim::ici::collective_program(sched, po), preset_name, "fast", threads,
                           " --set core.vmem.bytes=" + std::to_string(po.vmem_bytes));
    const std::string load_after = load_average();
    rusage u{};
    ::getrusage(RUSAGE_CHILDREN, &u);  // the largest child: the run (the assembler is smaller)
    fmt::print("pod all-reduce (torus), preset {}, {} chips, {} fp32 = {} bytes per chip, fast mode, --threads {}\n\n",
               preset_name, topo.chips(), elements, elements * 4, threads);
    fmt::print("| simulated cycles | user CPU s | CPU s (user + sys) | wall s (run command) | wall s (simulation) | "
               "max RSS GB | load average before / after |\n|---:|---:|---:|---:|---:|---:|---|\n");
    fmt::print("| {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {} / {} |\n", m.cycles, m.user, m.cpu,
               m.process_wall, m.wall, double(u.ru_maxrss) / 1048576.0, load_before, load_after);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "sim_speed: error: --pod: {}\n", e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Simulation speed of tpusim run (fast and detailed mode)"};
  std::string tpusim = TPUSIM_BIN, preset = "v4";
  double scale = 1.0;
  int mxus = 0, threads = 2;
  app.add_option("--tpusim", tpusim, "The tpusim binary");
  app.add_option("--preset", preset, "Chip preset");
  app.add_option("--mxus", mxus, "MXUs the GEMM uses (default: min(4, the preset's MXUs per core))")
      ->check(CLI::Range(1, 16));
  app.add_option("--threads", threads, "tpusim run --threads of the extra fast-mode GEMM rows (1: no such rows)")
      ->check(CLI::Range(1, 64));
  app.add_option("--scale", scale, "Multiply every iteration count")->check(CLI::Range(0.001, 1000.0));
  int64_t pod_elements = 0;
  std::string pod_preset = "v2-16x16";
  app.add_option("--pod", pod_elements, "Instead: the pod-scale torus all-reduce of N fp32 per chip (docs/ici.md Scale)")
      ->check(CLI::Range(int64_t(1024), int64_t(1) << 32));
  app.add_option("--pod-preset", pod_preset, "Preset of --pod");
  CLI11_PARSE(app, argc, argv);
  if (pod_elements) return pod_run(tpusim, pod_preset, pod_elements, threads);
  int preset_mxus = 0;
  try {
    preset_mxus = int(tpusim::config::load_preset(preset).get_int("core.mxu.count"));
  } catch (const std::exception& e) {
    fmt::print(stderr, "sim_speed: error: preset {}: {}\n", preset, e.what());
    return 2;
  }
  if (mxus == 0) mxus = std::min(4, preset_mxus);
  if (mxus > preset_mxus) {
    fmt::print(stderr, "sim_speed: error: --mxus {} but preset {} has {} MXUs per core\n", mxus, preset, preset_mxus);
    return 2;
  }

  const std::string dir = (fs::temp_directory_path() / ("tpusim_sim_speed_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  struct Case {
    std::string workload;
    const char* mode;
    int mxus;  // MXUs the program keeps busy (utilization is over these)
    std::string text;
    int threads = 1;
  };
  // Detailed mode ticks every unit every cycle: a tenth of the work keeps it short.
  // One GEMM iteration is 16 mmuls per MXU, 128 cycles.
  const int gemm_fast = int(20000 * scale), gemm_detailed = int(2000 * scale);
  const int dma_fast = int(4000 * scale), dma_detailed = int(400 * scale);
  const std::string gemm = "MXU-bound GEMM (" + std::to_string(mxus) + " MXU" + (mxus > 1 ? "s)" : ")");
  std::vector<Case> cases = {
      {gemm, "fast", mxus, gemm_program(mxus, std::max(1, gemm_fast))},
      {"DMA-latency-bound", "fast", 0, dma_program(std::max(1, dma_fast))},
      {gemm, "detailed", mxus, gemm_program(mxus, std::max(1, gemm_detailed))},
      {"DMA-latency-bound", "detailed", 0, dma_program(std::max(1, dma_detailed))},
  };
  // One MXU: the arithmetic per simulated cycle is a quarter of the 4-MXU GEMM's,
  // so this row shows the control path's speed where the kernel does not bound it.
  if (mxus != 1) {
    cases.insert(cases.begin() + 1, Case{"MXU-bound GEMM (1 MXU)", "fast", 1, gemm_program(1, std::max(1, gemm_fast))});
    cases.push_back(Case{"MXU-bound GEMM (1 MXU)", "detailed", 1, gemm_program(1, std::max(1, gemm_detailed))});
  }
  if (threads > 1) {  // after the one-thread rows: the same GEMMs with workers computing the MXU results
    std::vector<Case> extra;
    for (const Case& c : cases)
      if (c.mxus > 0 && std::string(c.mode) == "fast") {
        extra.push_back(c);
        extra.back().threads = threads;
      }
    cases.insert(cases.begin() + 1 + (mxus != 1), extra.begin(), extra.end());
  }
  fmt::print("tpusim run speed, preset {}, one TensorCore\n\n", preset);
  fmt::print("| workload | mode | threads | simulated cycles | host wall s | core-cycles/s (wall) | CPU s (whole "
             "process) | core-cycles/CPU-s | simulated MAC/s (wall) | MXU util |\n");
  fmt::print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  int rc = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    try {
      const Measured m = run(tpusim, dir, "case" + std::to_string(i), c.text, preset, c.mode, c.threads);
      const double cps = m.wall > 0 ? double(m.cycles) / m.wall : 0;
      const double macs = m.wall > 0 ? double(m.flops) / 2 / m.wall : 0;
      const double peak_macs_per_cycle = 128.0 * 128.0 * c.mxus;
      const double util = m.cycles ? double(m.flops) / 2 / (peak_macs_per_cycle * double(m.cycles)) : 0;
      const double cpu_cps = m.cpu > 0 ? double(m.cycles) / m.cpu : 0;
      fmt::print("| {} | {} | {} | {} | {:.3f} | {:.3g} | {:.3f} | {:.3g} | {} | {} |\n", c.workload, c.mode, c.threads, m.cycles,
                 m.wall, cps, m.cpu, cpu_cps,
                 m.flops ? fmt::format("{:.3g}", macs) : std::string("-"),
                 m.flops ? fmt::format("{:.1f}%", util * 100) : std::string("-"));
    } catch (const std::exception& e) {
      fmt::print("| {} | {} | {} | error: {} | | | | | | |\n", c.workload, c.mode, c.threads, e.what());
      rc = 1;
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}

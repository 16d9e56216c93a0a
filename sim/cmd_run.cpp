// `tpusim run BUNDLE --preset NAME ...`: runs a bundle on the SystemC chip model
// and leaves DIR/<output>.npy, DIR/stats.json and a short report (shared/spec/cli.md).
// stats.json is written last, so its presence marks a complete run; a failed run
// removes a stale one rather than leave a previous run's record looking current.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <systemc>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hw/config/params.h"
#include "hw/core/op_profile.h"
#include "hw/config/peaks.h"
#include "hw/mem/memory_factory.h"
#include "hw/mxu/result_values.h"
#include "hw/system/system.h"
#include "hw/timeline/timeline.h"
#include "isa/bundle/bundle_file.h"
#include "isa/exec/tensors.h"
#include "isa/io/npy.h"
#include "sim/commands.h"
#include "sim/run/profile.h"
#include "sim/run/report.h"
#include "sim/run/stats.h"
#include "sim/run/tensor_io.h"

namespace tpusim::cli {

namespace {

struct RunArgs {
  std::string bundle;
  std::string preset;
  std::string mode = "fast";
  std::vector<std::string> inputs;
  std::optional<uint64_t> random_seed;
  std::string out = "tpusim-out";
  std::string timeline;
  std::string critical_path;
  std::string wave;
  std::vector<std::string> wave_scopes;
  std::vector<std::string> timeline_scopes;
  uint64_t timeline_begin = 0;
  uint64_t timeline_end = UINT64_MAX;
  uint64_t wave_begin = 0;
  uint64_t wave_end = UINT64_MAX;
  std::vector<std::string> sets;
  uint64_t max_cycles = 0;
  bool raw_bf16 = false;
  bool quiet = false;
  int threads = 1;
};

int fail(int code, const std::string& message) {
  print_error("tpusim run: error: " + message);
  return code;
}

// A progress line on stderr for runs longer than about two seconds, redrawn in
// place and erased when the run ends. Only on a terminal: logs and tests never
// see it.
class Progress {
 public:
  Progress() {
    if (!::isatty(STDERR_FILENO)) return;
    thread_ = std::thread([this] { loop(); });
  }
  ~Progress() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  void loop() {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    if (wake_.wait_for(lock, std::chrono::seconds(2), [this] { return done_; })) return;
    bool drawn = false;
    do {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const uint64_t c = hw::OpProfile::progress_cycle.load(std::memory_order_relaxed);
      std::fprintf(stderr, "\r\033[Ktpusim run: %.0f s, at cycle %llu (%.3g cycles/s)", s,
                   static_cast<unsigned long long>(c), s > 0 ? double(c) / s : 0.0);
      std::fflush(stderr);
      drawn = true;
    } while (!wake_.wait_for(lock, std::chrono::milliseconds(500), [this] { return done_; }));
    if (drawn) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
    }
  }
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
};

// The critical path on the timeline: each segment a slice named by its cause on a
// "coreK.critical path" track of its chip, and an arrow where the path moves to
// another core, so Perfetto shows the chain hopping from chip to chip.
void critical_path_slices(const nlohmann::json& path, timeline::Timeline& tl) {
  std::map<std::string, timeline::TrackId> tracks;
  const nlohmann::json* prev = nullptr;
  timeline::TrackId prev_track = 0;
  for (const auto& s : path.at("segments")) {
    const std::string core = s.at("core").get<std::string>();
    auto it = tracks.find(core);
    if (it == tracks.end()) {
      const size_t dot = core.find('.');
      it = tracks.emplace(core, tl.track(core.substr(0, dot), core.substr(dot + 1) + ".critical path")).first;
    }
    const uint64_t begin = s.at("begin").get<uint64_t>(), end = s.at("end").get<uint64_t>();
    std::vector<std::pair<std::string, std::string>> args = {{"op", std::to_string(s.at("op").get<int>())}};
    if (s.contains("pc")) args.emplace_back("pc", std::to_string(s["pc"].get<int64_t>()));  // the DMA or wait
    tl.slice(it->second, s.at("cause").get<std::string>(), begin, end, args);
    if (prev && (*prev)["core"] != s["core"])
      tl.flow(prev_track, (*prev)["end"].get<uint64_t>() - 1, it->second, begin, "critical path");
    prev = &s;
    prev_track = it->second;
  }
}

int run_run(const RunArgs& a) {
  config::Params preset;
  isa::Bundle bundle;
  std::map<std::string, std::vector<uint8_t>> inputs;
  double clock_hz = 0;
  const std::string stats_path = a.out + "/stats.json";
  // Everything that can be wrong with the command line or its files is found
  // before the simulation starts.
  try {
    preset = config::load_preset(a.preset, a.sets);
    bundle = isa::read_bundle(a.bundle);
    inputs = run::bind_inputs(bundle, a.bundle, a.inputs, a.random_seed);
    run::prepare_out_dir(a.out);
    if (!a.timeline.empty()) run::check_writable_file(a.timeline, "--timeline");
    if (a.timeline_begin > a.timeline_end)
      throw std::invalid_argument(fmt::format("--timeline-begin {} is after --timeline-end {}", a.timeline_begin,
                                              a.timeline_end));
    if (!a.wave.empty()) run::check_writable_file(a.wave, "--wave");
    hw::mxu::set_matmul_threads(a.threads);
    clock_hz = preset.get_double("clock_hz");
  } catch (const std::exception& e) {
    return fail(kExitBadInput, e.what());
  }
  std::error_code ec;
  std::filesystem::remove(stats_path, ec);

  std::unique_ptr<timeline::Timeline> tl;
  if (!a.timeline.empty()) {
    timeline::Options topt;
    topt.clock_hz = clock_hz;
    topt.window_begin_cycle = a.timeline_begin;
    topt.window_end_cycle = a.timeline_end;
    topt.processes = a.timeline_scopes;
    tl = std::make_unique<timeline::Timeline>(topt);
  }
  hw::RunOptions ropt;
  ropt.mode = a.mode == "detailed" ? hw::Mode::kDetailed : hw::Mode::kFast;
  ropt.wave_path = a.wave;
  ropt.wave_scopes = a.wave_scopes;
  ropt.wave_begin = a.wave_begin;
  ropt.wave_end = a.wave_end;
  ropt.timeline = tl.get();
  ropt.max_cycles = a.max_cycles;
  ropt.critical_path = !a.critical_path.empty();

  // SystemC's informational notes (e.g. the VCD timescale) would land in the
  // middle of the report on stdout; warnings and errors still show.
  sc_core::sc_report_handler::set_actions(sc_core::SC_INFO, sc_core::SC_DO_NOTHING);
  std::unique_ptr<hw::System> system;
  try {
    system = std::make_unique<hw::System>(preset, bundle);
    for (const auto& e : bundle.io)
      if (e.kind == isa::IoKind::kInput) exec::write_tensor(system->machine(), e, inputs.at(e.name));
  } catch (const std::exception& e) {
    // The preset cannot host the bundle (too few cores, memory too small, ...).
    return fail(kExitBadInput, e.what());
  }
  // An HBM pipe whose requests in flight cannot cover its latency runs below the
  // bytes_per_s asked for; say so, as a bandwidth sweep would otherwise flatten.
  try {
    const std::string memory_note = mem::simple_memory_note(
        preset.node("hbm"), preset.source(), static_cast<uint32_t>(preset.get_int("core.dma.chunk_bytes")));
    if (!memory_note.empty()) std::fprintf(stderr, "tpusim run: note: %s\n", memory_note.c_str());
  } catch (const std::exception& e) {
    return fail(kExitBadInput, e.what());  // a malformed hbm.simple section
  }
  // Wall time covers the simulation only: loading and output writing are not
  // what a cycles-per-second figure should measure.
  const auto t0 = std::chrono::steady_clock::now();
  hw::RunResult result;
  Progress progress;
  try {
    result = system->run(ropt);
  } catch (const config::ConfigError& e) {
    // Units read their parameters when the chip is built, inside run(): a preset
    // whose values contradict each other is still bad input, not a program fault.
    progress.stop();
    return fail(kExitBadInput, e.what());
  } catch (const std::exception& e) {
    progress.stop();
    return fail(kExitProgramFault, e.what());
  }
  progress.stop();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result.faulted) return fail(kExitProgramFault, a.bundle + ": " + result.fault);

  run::RunFigures f;
  f.preset = preset.get_string("name");
  f.mode = a.mode;
  f.clock_hz = clock_hz;
  f.cycles = result.cycles;
  f.peak_flops_per_s = config::peak_figures(preset).flops_per_s;
  f.hbm_bytes_read = result.hbm_bytes_read;
  f.hbm_bytes_written = result.hbm_bytes_written;
  f.hbm_peak_bytes_per_s = config::peak_figures(preset).hbm_bytes_per_s;
  f.wall_seconds = wall;
  f.units = result.units;
  f.vmem = run::vmem_use(bundle, f.units);  // reads the profile records fold_profiles removes
  if (tl) {
    run::vmem_counters(bundle, *tl);
    if (!result.critical_path.is_null()) critical_path_slices(result.critical_path, *tl);
    // Op slices say which graph node they belong to when the bundle names its ops.
    std::map<std::string, std::string> names;
    for (const auto& [id, name] : bundle.op_names) names["op " + std::to_string(id)] = "op " + std::to_string(id) + ": " + name;
    tl->rename_slices(std::move(names));
  }
  const nlohmann::json profile = run::fold_profiles(f.units, result.cycles, bundle.op_names, bundle.op_flops);
  f.ops = profile["ops"];
  // The ops' FLOPs: the model's where the bundle says (the MXU counts padded
  // tiles), else the MXUs' own count, which result.flops is.
  f.flops = 0;
  for (const auto& op : f.ops) f.flops += op["flops"].get<uint64_t>();
  f.time_by_cause = profile["time_by_cause"];
  // The summary without its segments, which go to the --critical-path file only
  // (not copied: a pod's path has tens of thousands).
  for (const auto& [key, value] : result.critical_path.items())
    if (key != "segments") f.critical_path[key] = value;
  const auto stats = run::make_stats(f);
  // Before any file is written, so a broken promise leaves no output behind.
  for (const auto& e : bundle.io)
    if (e.kind == isa::IoKind::kOutput) {
      const std::string bad = exec::copies_disagree(system->machine(), e);
      if (!bad.empty()) return fail(kExitProgramFault, a.bundle + ": " + bad);
    }
  try {
    for (const auto& e : bundle.io)
      if (e.kind == isa::IoKind::kOutput) run::write_output(a.out, e, exec::read_tensor(system->machine(), e), a.raw_bf16);
    if (tl) tl->write(a.timeline);
    if (!result.critical_path.is_null()) {
      const std::string text = result.critical_path.dump(1) + "\n";
      io::write_file_atomic(a.critical_path, text);
    }
    run::write_stats(stats_path, stats);
  } catch (const std::exception& e) {
    return fail(kExitBadInput, e.what());
  }
  if (!a.quiet) fmt::print("{}", run::format_report(stats));
  return kExitOk;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "Run a bundle on the cycle-level chip model");
  auto a = std::make_shared<RunArgs>();
  cmd->add_option("bundle", a->bundle, "Program bundle (.tpb) from `tpusim asm` or `tpusim compile`")->required();
  cmd->add_option("--preset", a->preset, "Chip or board preset (e.g. v3, v4-8) or a preset YAML file")->required();
  cmd->add_option("--mode", a->mode, "fast (event-driven) or detailed (clocked); identical results")
      ->check(CLI::IsMember({"fast", "detailed"}));
  cmd->add_option("--input", a->inputs, "NAME=FILE.npy for an input of the bundle (repeatable)");
  cmd->add_option("--random-inputs", a->random_seed, "Fill inputs not given with --input from SEED");
  cmd->add_option("--out", a->out, "Output directory for <output>.npy and stats.json")->capture_default_str();
  cmd->add_option("--timeline", a->timeline, "Write a Perfetto/Chrome trace-event JSON timeline");
  cmd->add_option("--timeline-scope", a->timeline_scopes,
                  "Glob on the timeline's processes to keep, e.g. chip0 (repeatable; default all)");
  cmd->add_option("--timeline-begin", a->timeline_begin, "First cycle of the timeline window");
  cmd->add_option("--timeline-end", a->timeline_end, "Last cycle of the timeline window");
  cmd->add_option("--critical-path", a->critical_path,
                  "Walk the run's critical path: its segments to this JSON file, its causes into stats.json and the "
                  "report");
  cmd->add_option("--wave", a->wave, "Write a waveform (.vcd or .fst)");
  cmd->add_option("--wave-scope", a->wave_scopes, "Glob on hierarchical names to trace (repeatable; default all)");
  cmd->add_option("--wave-begin", a->wave_begin, "First cycle of the waveform window");
  cmd->add_option("--wave-end", a->wave_end, "Last cycle of the waveform window");
  cmd->add_option("--set", a->sets, "Override a preset parameter, KEY=VALUE (repeatable)");
  cmd->add_option("--max-cycles", a->max_cycles, "Fault when the run passes this many cycles (0 = no limit)");
  cmd->add_option("--threads", a->threads,
                  "Threads computing MXU results (N - 1 workers beside the simulation); same results for every N")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_flag("--raw-bf16", a->raw_bf16, "Write bf16 outputs as uint16 bit patterns instead of float32");
  cmd->add_flag("-q,--quiet", a->quiet, "Do not print the report");
  cmd->callback([a, &exit_code] { exit_code = run_run(*a); });
}

}  // namespace tpusim::cli

// libsystemc.so defines main() and references sc_main(). tpusim's own main()
// takes precedence over the library's, so this is never called; it exists only so
// the executable links once the chip model brings SystemC in. The run command
// drives the kernel directly (one elaboration per process).
extern "C" int sc_main(int, char**) { return 0; }

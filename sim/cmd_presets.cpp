// `tpusim presets [NAME] [--set KEY=VALUE]...`: lists the chip and board presets,
// or shows one preset's derived peaks and every parameter after overrides, so an
// architect can check what a sweep point really configures before running it.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <memory>
#include <string>
#include <vector>

#include "hw/config/params.h"
#include "hw/config/peaks.h"
#include "hw/host/host_link.h"
#include "hw/mxu/mxu_params.h"
#include "sim/commands.h"

namespace tpusim::cli {

namespace {

// "single", or the topology and its dims ("torus3d 4x4x4"): what a sweep over boards
// changes, next to the per-chip figures that stay.
std::string topology_label(const config::Params& p) {
  const std::string kind = p.get_string("system.topology");
  if (kind == "single") return kind;
  std::string dims;
  for (int64_t d : p.get_int_list("system.dims")) dims += (dims.empty() ? "" : "x") + std::to_string(d);
  return kind + " " + dims;
}

void print_summary_line(const std::string& name) {
  const auto p = config::load_preset(name);
  const auto f = config::peak_figures(p);
  fmt::print("  {:<9} {:>3} chip(s) x {} core(s)  {:>8.1f} TFLOPS  HBM {:>7.0f} GB/s  {:<14} ICI {} x {:>2.0f} GB/s  "
             "host {:>2.0f} GB/s  ({})\n",
             name, f.chips, p.get_int("cores_per_chip"), f.flops_per_s / 1e12, f.hbm_bytes_per_s / 1e9,
             topology_label(p), p.get_int("ici.links"), p.get_double("ici.link_bytes_per_s") / 1e9,
             f.host_bytes_per_s / 1e9, p.source());
}

int run_presets(const std::string& name, const std::vector<std::string>& sets, bool dump) {
  if (name.empty()) {
    fmt::print("presets in {} (ICI: links per chip x GB/s a link and direction; host: PCIe per chip):\n",
               config::configs_dir());
    for (const auto& n : config::preset_names()) print_summary_line(n);
    return kExitOk;
  }
  const auto p = config::load_preset(name, sets);
  const auto f = config::peak_figures(p);
  // The nominal PCIe rate beside the one transfers are timed at (host.hbm_to_host),
  // so a sweep sees which key moves the infeed. Read (and checked) before printing.
  const hw::HostParams host = hw::HostParams::from_config(p);
  // Peaks of an array the MXU cannot be (rows or cols past a vreg's 128 lanes)
  // would be a what-if no run can follow: refuse it here, as `tpusim run` does.
  hw::mxu::MxuParams::all_from_config(p);
  fmt::print("preset {} ({})\n", p.get_string("name"), p.source());
  fmt::print("  chips x cores/chip : {} x {} ({} TensorCores)\n", f.chips, p.get_int("cores_per_chip"), f.cores);
  fmt::print("  clock              : {:.0f} MHz\n", p.get_double("clock_hz") / 1e6);
  fmt::print("  MXUs per core      : {} of {}x{}\n", p.get_int("core.mxu.count"), p.get_int("core.mxu.rows"),
             p.get_int("core.mxu.cols"));
  fmt::print("  peak bf16          : {:.1f} TFLOPS\n", f.flops_per_s / 1e12);
  fmt::print("  HBM bandwidth      : {:.0f} GB/s\n", f.hbm_bytes_per_s / 1e9);
  fmt::print("  ICI per chip       : {} links, {:.0f} GB/s per direction\n", p.get_int("ici.links"),
             f.ici_bytes_per_s / 1e9);
  if (host.cycles_per_kib > 0)
    fmt::print("  host link per chip : {:.0f} GB/s nominal, {:.1f} GB/s timed (host.hbm_to_host)\n",
               f.host_bytes_per_s / 1e9, 1024.0 / host.cycles_per_kib * host.clock_hz / 1e9);
  else
    fmt::print("  host link per chip : {:.0f} GB/s nominal, no serialisation timed (host.hbm_to_host)\n",
               f.host_bytes_per_s / 1e9);
  if (dump) fmt::print("\n{}\n", p.dump());
  return kExitOk;
}

}  // namespace

void add_presets_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("presets", "List the chip and board presets, or show one with its derived peaks");
  struct Options {
    std::string name;
    std::vector<std::string> sets;
    bool dump = false;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("name", opt->name, "Preset name (e.g. v3, v3-8) or a path to a preset YAML file");
  cmd->add_option("--set", opt->sets, "Override a parameter, KEY=VALUE (repeatable)");
  cmd->add_flag("--params", opt->dump, "Also print every parameter after overrides");
  cmd->callback([opt, &exit_code] { exit_code = run_presets(opt->name, opt->sets, opt->dump); });
}

}  // namespace tpusim::cli

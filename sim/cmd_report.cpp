// `tpusim report DIR/stats.json`: reprints a finished run's report, so results kept
// from a sweep can be read without rerunning them.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "sim/commands.h"
#include "sim/run/report.h"
#include "sim/run/stats.h"

namespace tpusim::cli {

namespace {

int run_report(const std::string& path) {
  try {
    const auto stats = run::read_stats(path);
    fmt::print("{}", run::format_report(stats));
    return kExitOk;
  } catch (const std::exception& e) {
    print_error(std::string("tpusim report: error: ") + e.what());
    return kExitBadInput;
  }
}

}  // namespace

void add_report_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("report", "Print the report of a finished run from its stats.json");
  auto path = std::make_shared<std::string>();
  cmd->add_option("stats", *path, "DIR/stats.json written by `tpusim run`")->required();
  cmd->callback([path, &exit_code] { exit_code = run_report(*path); });
}

}  // namespace tpusim::cli

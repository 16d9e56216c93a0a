// tpusim: one executable, git-style subcommands (shared/spec/cli.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "sim/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tpusim: a cycle-level TPU-class chip simulator"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tpusim 0.1.0");
  int exit_code = tpusim::cli::kExitOk;
  tpusim::cli::add_asm_command(app, exit_code);
  tpusim::cli::add_disasm_command(app, exit_code);
  tpusim::cli::add_ref_command(app, exit_code);
  tpusim::cli::add_diff_command(app, exit_code);
  tpusim::cli::add_presets_command(app, exit_code);
  tpusim::cli::add_report_command(app, exit_code);
  tpusim::cli::add_run_command(app, exit_code);
  tpusim::cli::add_compile_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : tpusim::cli::kExitBadInput;
  } catch (const std::exception& e) {
    tpusim::cli::print_error(std::string("tpusim: error: ") + e.what());
    return tpusim::cli::kExitBadInput;
  }
  return exit_code;
}

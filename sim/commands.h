// Each tpusim subcommand lives in its own cmd_*.cpp and registers itself here.
#pragma once

namespace CLI {
class App;
}

namespace tpusim::cli {

// Exit codes of shared/spec/cli.md.
inline constexpr int kExitOk = 0;
inline constexpr int kExitProgramFault = 1;
inline constexpr int kExitBadInput = 2;

void add_demo_command(CLI::App& app, int& exit_code);
void add_asm_command(CLI::App& app, int& exit_code);
void add_disasm_command(CLI::App& app, int& exit_code);
void add_ref_command(CLI::App& app, int& exit_code);
void add_diff_command(CLI::App& app, int& exit_code);
void add_presets_command(CLI::App& app, int& exit_code);
void add_report_command(CLI::App& app, int& exit_code);
void add_run_command(CLI::App& app, int& exit_code);

}  // namespace tpusim::cli

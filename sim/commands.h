// Each tpusim subcommand lives in its own cmd_*.cpp and registers itself here.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/io/printable.h"
#include "sim/replica_options.h"

namespace CLI {
class App;
}

namespace tpusim::cli {

// Runs step() and returns its result. An `Error` it throws (the compiler's errors
// from a graph already loaded name its node, not the file) is rethrown as one
// line with the model file in front.
template <class Error, class Step>
auto naming_file(const std::string& file, Step&& step) {
  try {
    return step();
  } catch (const Error& e) {
    throw std::runtime_error(file + ": " + e.what());
  }
}

// Every command's error: one line on stderr, control bytes of the input it names
// (a path, a key, a file's text) shown as \xNN so none can split or end the line.
inline void print_error(const std::string& line) { std::fprintf(stderr, "%s\n", io::one_line(line).c_str()); }

// Exit codes of shared/spec/cli.md.
inline constexpr int kExitOk = 0;
inline constexpr int kExitProgramFault = 1;
inline constexpr int kExitBadInput = 2;

void add_asm_command(CLI::App& app, int& exit_code);
void add_disasm_command(CLI::App& app, int& exit_code);
void add_ref_command(CLI::App& app, int& exit_code);
void add_diff_command(CLI::App& app, int& exit_code);
void add_presets_command(CLI::App& app, int& exit_code);
void add_report_command(CLI::App& app, int& exit_code);
void add_run_command(CLI::App& app, int& exit_code);
void add_compile_command(CLI::App& app, int& exit_code);

// `tpusim ref MODEL`: the graph reference on an .onnx file or graph IR text.
struct ModelRefArgs {
  std::string model;
  std::vector<std::string> inputs;  // NAME=FILE.npy
  int64_t seed = -1;                // --random-inputs; -1 = none
  std::string out = "tpusim-out";
  std::string precision = "default";
  // A preset gives the reference its MXU rows (the matmul's chunk length) and,
  // with replicas, the board whose collective schedule fixes the add order.
  std::string preset;
  std::vector<std::string> sets;
  ReplicaOptions rep;
};
bool is_model_path(const std::string& path);
int run_model_reference(const ModelRefArgs& args);

}  // namespace tpusim::cli

// `tpusim asm FILE.s -o BUNDLE`: text assembly to a bundle file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "isa/asm/assembler.h"
#include "isa/bundle/bundle_file.h"
#include "sim/commands.h"

namespace tpusim::cli {

void add_asm_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("asm", "Assemble a .s file into a bundle");
  struct Options {
    std::string input, output;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("file", opt->input, "Assembly source (.s)")->required();
  cmd->add_option("-o,--output", opt->output, "Bundle file to write")->required();
  cmd->callback([opt, &exit_code]() {
    try {
      const isa::Bundle b = isa::assemble_file(opt->input);
      isa::write_bundle(opt->output, b);
      exit_code = kExitOk;
    } catch (const std::exception& e) {
      print_error(e.what());
      exit_code = kExitBadInput;
    }
  });
}

}  // namespace tpusim::cli

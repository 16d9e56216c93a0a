// `tpusim disasm BUNDLE`: a bundle as canonical assembly text (which assembles
// back to the same bundle).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "isa/asm/assembler.h"
#include "isa/bundle/bundle_file.h"
#include "sim/commands.h"

namespace tpusim::cli {

void add_disasm_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("disasm", "Print a bundle as assembly text");
  auto path = std::make_shared<std::string>();
  cmd->add_option("bundle", *path, "Bundle file")->required();
  cmd->callback([path, &exit_code]() {
    try {
      const isa::Bundle b = isa::read_bundle(*path);
      const std::string text = isa::print_bundle(b);
      std::fwrite(text.data(), 1, text.size(), stdout);
      exit_code = kExitOk;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tpusim disasm: %s\n", e.what());
      exit_code = kExitBadInput;
    }
  });
}

}  // namespace tpusim::cli

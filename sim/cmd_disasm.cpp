// `tpusim disasm BUNDLE [--pc]`: a bundle as canonical assembly text (which
// assembles back to the same bundle), each instruction's index as a comment with --pc.
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
  auto pcs = std::make_shared<bool>(false);
  cmd->add_option("bundle", *path, "Bundle file")->required();
  cmd->add_flag("--pc", *pcs,
                "End each instruction with '# pc N', its index in the core's program (as faults and "
                "--critical-path name it)");
  cmd->callback([path, pcs, &exit_code]() {
    try {
      const isa::Bundle b = isa::read_bundle(*path);
      const std::string text = isa::print_bundle(b, *pcs);
      std::fwrite(text.data(), 1, text.size(), stdout);
      exit_code = kExitOk;
    } catch (const std::exception& e) {
      print_error(std::string("tpusim disasm: ") + e.what());
      exit_code = kExitBadInput;
    }
  });
}

}  // namespace tpusim::cli

// `tpusim ref BUNDLE|MODEL [--input NAME=FILE.npy]... [--out DIR] [--random-inputs SEED] [--check-races]`:
// runs the functional reference (isa/exec) and writes each output as DIR/NAME.npy.
// A model takes `--preset NAME [--set KEY=VALUE]... [--replicas N ...]` as `tpusim
// compile` does, for the graph reference of that bundle.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "isa/bundle/bundle_file.h"
#include "isa/exec/interpreter.h"
#include "isa/exec/tensors.h"
#include "isa/io/npy.h"
#include "sim/run/tensor_io.h"
#include "sim/commands.h"

namespace tpusim::cli {

namespace {

struct RefOptions {
  std::string bundle;
  std::vector<std::string> inputs;
  std::string out = "tpusim-out";
  int64_t seed = -1;
  bool raw_bf16 = false;
  bool check_races = false;
  uint64_t max_instructions = exec::RunOptions{}.max_instructions;
  std::string precision = "default";
  std::string preset;             // a model's only
  std::vector<std::string> sets;  // a model's only
  ReplicaOptions rep;             // a model's only
};

int run_ref(const RefOptions& o) {
  if (is_model_path(o.bundle)) {
    ModelRefArgs m;
    m.model = o.bundle;
    m.inputs = o.inputs;
    m.seed = o.seed;
    m.out = o.out;
    m.precision = o.precision;
    m.preset = o.preset;
    m.sets = o.sets;
    m.rep = o.rep;
    return run_model_reference(m);
  }
  const ReplicaOptions none;
  if (!o.preset.empty() || !o.sets.empty() || o.rep.replicas != none.replicas || !o.rep.batched.empty() ||
      o.rep.collective != none.collective || o.rep.block_lag != none.block_lag || o.rep.block_bytes != none.block_bytes) {
    // A bundle already holds its board, array shape and replicas.
    print_error("tpusim ref: error: " + o.bundle +
                ": --preset, --set and the replica options apply to a model; a bundle carries its own");
    return kExitBadInput;
  }
  isa::Bundle b;
  std::map<std::string, std::vector<uint8_t>> data;
  try {
    b = isa::read_bundle(o.bundle);
    // The same binding `tpusim run` uses, so both accept exactly the same inputs.
    data = run::bind_inputs(b, o.bundle, o.inputs,
                            o.seed >= 0 ? std::optional<uint64_t>(static_cast<uint64_t>(o.seed)) : std::nullopt);
  } catch (const std::exception& e) {
    print_error(std::string("tpusim ref: error: ") + e.what());
    return kExitBadInput;
  }
  exec::Interpreter interp(b);
  try {
    for (const auto& e : b.io)
      if (e.kind == isa::IoKind::kInput) exec::write_tensor(interp.machine(), e, data[e.name]);
  } catch (const std::exception& e) {
    print_error(std::string("tpusim ref: error: placing inputs: ") + e.what());
    return kExitBadInput;
  }
  exec::RunOptions ro;
  ro.max_instructions = o.max_instructions;
  ro.check_races = o.check_races;
  const exec::RunResult r = interp.run(ro);
  if (!r.ok()) {
    print_error("tpusim ref: " + o.bundle + ": " + r.message);
    return kExitProgramFault;
  }
  for (const auto& e : b.io)
    if (e.kind == isa::IoKind::kOutput) {
      const std::string bad = exec::copies_disagree(interp.machine(), e);
      if (!bad.empty()) {
        print_error("tpusim ref: " + o.bundle + ": " + bad);
        return kExitProgramFault;
      }
    }
  try {
    std::filesystem::create_directories(o.out);
    for (const auto& e : b.io) {
      if (e.kind != isa::IoKind::kOutput) continue;
      io::write_npy(o.out + "/" + e.name + ".npy",
                    exec::tensor_to_npy(e, exec::read_tensor(interp.machine(), e), o.raw_bf16));
    }
  } catch (const std::exception& e) {
    print_error(std::string("tpusim ref: error: writing outputs: ") + e.what());
    return kExitBadInput;
  }
  std::fprintf(stderr, "tpusim ref: %llu instructions, outputs in %s\n",
               static_cast<unsigned long long>(r.instructions), o.out.c_str());
  return kExitOk;
}

}  // namespace

void add_ref_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("ref", "Run a bundle on the functional reference, or a model on the graph reference");
  auto opt = std::make_shared<RefOptions>();
  cmd->add_option("bundle", opt->bundle, "Bundle file, or a model (.onnx or graph IR text) for the graph reference")
      ->required();
  cmd->add_option("--precision", opt->precision, "Precision policy of a model's graph reference: default or bf16");
  cmd->add_option("--preset", opt->preset,
                  "A model's chip preset: its MXU rows set the matmuls' chunk length, its board the replicas' "
                  "all_reduce add order (as `tpusim compile` with the same options)");
  cmd->add_option("--set", opt->sets, "Override a preset parameter, KEY=VALUE (repeatable), as for `tpusim compile`");
  add_replica_options(cmd, opt->rep);
  cmd->add_option("--input", opt->inputs, "NAME=FILE.npy (repeatable)");
  cmd->add_option("--out", opt->out, "Output directory (default ./tpusim-out)");
  cmd->add_option("--random-inputs", opt->seed, "Fill inputs not given with deterministic random values")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--raw-bf16", opt->raw_bf16, "Write bf16 outputs as uint16 bit patterns");
  cmd->add_flag("--check-races", opt->check_races,
                "Fault when a core touches a DMA's bytes before waiting on its completion flag");
  cmd->add_option("--max-instructions", opt->max_instructions,
                  "Instruction budget over all cores (a run that exceeds it faults as a likely infinite loop)");
  cmd->callback([opt, &exit_code]() { exit_code = run_ref(*opt); });
}

}  // namespace tpusim::cli

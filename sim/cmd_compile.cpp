// `tpusim compile MODEL --preset NAME -o BUNDLE [--batch N] [--precision default|bf16]
// [--cores N] [--replicas N [--batched NAME,..] [--collective auto|ring|bidir-ring|torus|hierarchical]] [--infeed]
// [--set KEY=VALUE]...`:
// a model (.onnx or graph IR text) lowered to a program bundle for the preset's
// TensorCores (compiler/lower, docs/codegen.md; replicas: its "Replicas" section).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <new>
#include <string>

#include "compiler/compiler.h"
#include "compiler/lower/lower.h"
#include "compiler/train/train.h"
#include "hw/config/params.h"
#include "hw/mxu/mxu_params.h"
#include "isa/bundle/bundle_file.h"
#include "isa/io/npy.h"
#include "sim/commands.h"
#include "sim/replica_options.h"

namespace tpusim::cli {

namespace {

// The architectural parameters a bundle carries, from the preset's core.
isa::Target target_from_preset(const config::Params& p) {
  isa::Target t;
  t.chips = 1;
  t.cores_per_chip = 1;
  t.mxus_per_core = static_cast<uint32_t>(p.get_int("core.mxu.count"));
  t.mxu_rows = static_cast<uint32_t>(p.get_int("core.mxu.rows"));
  t.mxu_cols = static_cast<uint32_t>(p.get_int("core.mxu.cols"));
  t.fifo_rows = static_cast<uint32_t>(p.get_int("core.mxu.result_fifo_vregs") * 8);
  t.vmem_bytes = static_cast<uint64_t>(p.get_int("core.vmem.bytes"));
  t.smem_bytes = static_cast<uint64_t>(p.get_int("core.smem.bytes"));
  t.hbm_bytes = static_cast<uint64_t>(p.get_int("hbm.bytes"));
  return t;
}

}  // namespace

void add_compile_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("compile", "Compile a model (.onnx or graph IR) into a bundle for a preset");
  struct Options {
    std::string model, preset, output, precision = "default";
    int64_t batch = 0;
    int cores = 1;
    ReplicaOptions rep;
    int all_reduce_streams = 0;
    int urgent = 0;
    int arrival_order = 0;
    int inner_split = 0;
    int64_t stream_from = 0;
    int onchip_when_needed = 1;
    int deferred_sends = 1;
    int half_pieces = 1;
    std::vector<std::string> sets;  // --set KEY=VALUE, as `tpusim run` takes them
    std::string train, loss = "xent", emit_graph;  // training step (docs/training.md)
    bool infeed = false;
    bool explain = false;
  };
  auto opt = std::make_shared<Options>();
  cmd->add_option("model", opt->model, "Model: .onnx or graph IR text")->required();
  cmd->add_option("--preset", opt->preset, "Chip preset (tpusim presets)")->required();
  cmd->add_option("-o,--output", opt->output, "Bundle file to write")->required();
  // The bundle is built for the preset's MXU shape, memories and board, so a
  // what-if array size has to reach the compiler too, not only `tpusim run`.
  cmd->add_option("--set", opt->sets,
                  "Override a preset parameter, KEY=VALUE (repeatable), as for `tpusim run`; give the run the same");
  cmd->add_option("--batch", opt->batch, "Batch size (must equal the model's for now)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--precision", opt->precision, "Precision policy: default | bf16");
  cmd->add_option("--cores", opt->cores,
                  "TensorCores of the chip that share each node's work; on a board, more than one chip's "
                  "cores means that many data-parallel replicas");
  add_replica_options(cmd, opt->rep);
  cmd->add_option("--all-reduce-streams", opt->all_reduce_streams,
                  "Instruction streams of a blocked all-reduce: 1, 2 or 3 (as many slot pools, each pool's blocks "
                  "in its own stream; docs/codegen.md \"Two streams\"), or 0 = 2 where the chips form a 3-D torus, "
                  "3 for the hierarchical algorithm on a 2-D one (else 1 where no such plan is found), else 1")
      ->check(CLI::Range(0, 3));
  cmd->add_option("--onchip-when-needed", opt->onchip_when_needed,
                  "With three slot pools, send a piece of a block's on-chip reduce-scatter only once the sender "
                  "is done with the steps before its use (on, the default), or as soon as a slot frees (off; "
                  "docs/codegen.md \"On-chip pieces when needed\")")
      ->transform(CLI::CheckedTransformer(std::map<std::string, int>{{"on", 1}, {"off", 0}}));
  cmd->add_option("--deferred-sends", opt->deferred_sends,
                  "A streamed all-reduce's consume whose one fused send goes on a stream credits its source and goes "
                  "on, the send waiting for its slot later (on, the default), or waits for that slot first (off; "
                  "docs/codegen.md \"Deferred sends\")")
      ->transform(CLI::CheckedTransformer(std::map<std::string, int>{{"on", 1}, {"off", 0}}));
  cmd->add_option("--half-pieces", opt->half_pieces,
                  "A hierarchical all-reduce that runs whole (one slice, one block) also plans on pieces of half its "
                  "largest and keeps the plan its ordering run finishes first (on, the default), or takes the first "
                  "plan's pieces (off; docs/codegen.md \"Half pieces\")")
      ->transform(CLI::CheckedTransformer(std::map<std::string, int>{{"on", 1}, {"off", 0}}));
  cmd->add_option("--urgent", opt->urgent,
                  "A streamed all-reduce's inner-dimension sends, credits and entry tokens as urgent ICI traffic "
                  "(tc=1, docs/codegen.md \"Urgent messages\"): on, off, or auto = credits and entry tokens on "
                  "every board, the inner-dimension sends too where the chips form a 3-D torus")
      ->transform(CLI::CheckedTransformer(std::map<std::string, int>{{"auto", 0}, {"on", 1}, {"off", 2}}));
  cmd->add_option("--arrival-order", opt->arrival_order,
                  "A streamed all-reduce on 2 or 3 streams lets a consume whose data came first go before those "
                  "ahead of it (docs/codegen.md \"Arrival order\"): off (program order, the default), on, or "
                  "check (one that is ready always first, so the reference takes those paths)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, int>{{"off", 0}, {"on", 1}, {"check", 2}}));
  cmd->add_option("--inner-split", opt->inner_split,
                  "A streamed all-reduce cuts each inner-step message (a chunk at most half the widest "
                  "chip-to-chip one) into up to this many pieces of at least 16 KiB, so the next hop starts after the first "
                  "(docs/codegen.md \"Inner pieces\"); 1 keeps one piece; 0 (the default): 4 where the chips "
                  "form a 3-D torus, else 1")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--stream-from", opt->stream_from,
                  "A ring, bidirectional-ring or torus all-reduce streams once a step's widest chip-to-chip chunk "
                  "holds this many fp32 elements, else takes the step-ordered lowering (docs/codegen.md "
                  "\"When the others stream\"); 0 (the default): where a move stays on a chip, half a piece (32 Ki) "
                  "for the bidirectional ring and a quarter (16 Ki) for the torus algorithm, else 1 (always)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--train", opt->train,
                  "Compile one training step instead: sgd:lr=X[,momentum=Y] (docs/training.md)");
  cmd->add_option("--loss", opt->loss, "Training loss: xent (one-hot labels) | xent-index | mse");
  cmd->add_flag("--infeed", opt->infeed,
                "Inputs start in host memory: the step begins by feeding them over each chip's PCIe link "
                "(docs/training.md, \"Inputs from the host\")");
  cmd->add_flag("--explain", opt->explain,
                "Say how each all_reduce was lowered: its schedule (blocks or slices and their lag), streamed fused, "
                "unfused or step-ordered, slot pools, slots and piece size, and the ordering run's cycle estimate "
                "(docs/codegen.md \"Boards and replicas\"); the bundle is the same");
  cmd->add_option("--emit-graph", opt->emit_graph, "Also write the compiled graph (e.g. the training step) as IR text");
  cmd->callback([opt, &exit_code]() {
    try {
      const auto policy = num::parse_precision_policy(opt->precision);
      if (!policy) throw std::runtime_error("--precision: '" + opt->precision + "' is not default or bf16");
      const config::Params preset = config::load_preset(opt->preset, opt->sets);
      // A shape the MXU cannot take is the preset's fault: say so, naming it, before
      // the model is read (the target check would blame the model).
      hw::mxu::MxuParams::all_from_config(preset);
      const int per_chip = static_cast<int>(preset.get_int("cores_per_chip"));
      const int board_chips = static_cast<int>(preset.get_int("system.chips"));
      if (opt->cores > per_chip && board_chips > 1 && opt->rep.replicas == 1) {
        opt->rep.replicas = opt->cores;  // the cores of several chips: data parallel
        opt->cores = 1;
      }
      if (opt->cores < 1 || opt->cores > per_chip)
        throw std::runtime_error("--cores " + std::to_string(opt->cores) + ": the preset has " +
                                 std::to_string(preset.get_int("cores_per_chip")) + " cores per chip");
      compiler::Graph g = compiler::load_model(opt->model);
      if (opt->batch > 0) {
        for (const auto& in : g.inputs)
          if (in.type.shape.empty() || in.type.shape[0] != opt->batch)
            throw std::runtime_error(opt->model + ": --batch " + std::to_string(opt->batch) + ": input '" + in.name +
                                     "' has shape " + compiler::shape_str(in.type.shape) +
                                     " (re-batching a model is not implemented yet)");
      }
      if (!opt->train.empty()) {
        compiler::TrainOptions to;
        compiler::parse_train_spec(opt->train, opt->loss, &to);
        to.replicas = opt->rep.replicas;
        g = naming_file<compiler::CompileError>(opt->model, [&] { return compiler::build_training_graph(g, to); });
      }
      if (!opt->emit_graph.empty()) {
        // Whole or not at all, like the bundle: a full disk leaves no half a graph.
        io::write_file_atomic(opt->emit_graph, compiler::print_graph(g));
      }
      compiler::LowerOptions lo;
      lo.target = target_from_preset(preset);
      lo.policy = *policy;
      lo.cores = opt->cores;
      lo.replicas = replica_spec(preset, opt->rep);
      lo.all_reduce_streams = opt->all_reduce_streams;
      lo.urgent_sends = opt->urgent;
      lo.arrival_order = opt->arrival_order;
      lo.inner_split = opt->inner_split;
      lo.stream_from_elems = opt->stream_from;
      lo.onchip_when_needed = opt->onchip_when_needed != 0;
      lo.deferred_sends = opt->deferred_sends != 0;
      lo.half_pieces = opt->half_pieces != 0;
      lo.inputs_from_host = opt->infeed;
      lo.explain_collectives = opt->explain;
      if (opt->rep.replicas > 1) lo.target.chips = static_cast<uint32_t>(board_chips);
      const compiler::LowerResult r =
          naming_file<compiler::CompileError>(opt->model, [&] { return compiler::lower_graph(g, lo); });
      for (const std::string& note : r.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
      isa::write_bundle(opt->output, r.bundle);
      size_t n = 0;
      for (const auto& c : r.bundle.cores) n += c.code.size();
      std::printf("%s: %zu instructions, %zu I/O entries -> %s\n", opt->model.c_str(), n, r.bundle.io.size(),
                  opt->output.c_str());
      exit_code = kExitOk;
    } catch (const std::bad_alloc&) {
      print_error(opt->model + ": out of host memory while compiling");
      exit_code = kExitBadInput;
    } catch (const std::exception& e) {
      print_error(e.what());
      exit_code = kExitBadInput;
    }
  });
}

}  // namespace tpusim::cli

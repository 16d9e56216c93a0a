// Lowering a graph to a TensorCore program bundle (docs/codegen.md): every tensor
// gets a dense row-major home in HBM (inputs, outputs, constants as bundle .const
// entries, intermediates as scratch), and every node becomes straight-line code
// that streams tiles through VMEM, computing with the exact num:: sequence of its
// recipe in docs/compiler.md, so the bundle on `tpusim ref` equals the graph
// reference bit for bit. Every instruction carries its node's id (`op N`).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/ref/replicas.h"
#include "isa/asm/instr.h"
#include "isa/numerics/precision.h"

namespace tpusim::compiler {

struct LowerOptions {
  isa::Target target;  // from the preset: MXU count and R x C, VMEM size, ...
  // Data parallelism (docs/codegen.md "Boards and replicas"): replicas.replicas > 1 lowers the
  // per-replica graph once per replica, onto the cores of the board's chips.
  ReplicaSpec replicas;
  // Set by that driver for each replica's program: its index, its HBM base, and the
  // size of every replica's region (one layout, at core * region on its chip).
  int replica = 0;
  int64_t hbm_base = 0;
  int64_t replica_region = 0;
  num::PrecisionPolicy policy = num::PrecisionPolicy::kDefault;
  // TensorCores of chip 0 that share each node's work (independent row/tile groups
  // round robin, a barrier after every node); all tensors stay in the chip's HBM.
  int cores = 1;
  // Host infeed (docs/training.md "Inputs from the host"): the graph's inputs are
  // in host memory, and the step begins by feeding them over the chip's PCIe link
  // into their HBM homes; with replicas, one infeed per chip of its replicas' slices.
  bool inputs_from_host = false;
  // Run the fuse-elementwise pass and apply its groups (matmul/conv epilogues,
  // elementwise chains in one VMEM pass); false lowers every node on its own.
  bool fuse = true;
  // Give node results and per-node scratch their HBM back after their last reader
  // (docs/codegen.md "HBM plan"); false places every tensor once, as a bump
  // allocator would (to measure what reuse saves).
  bool reuse_hbm = true;
  // The streamed all-reduce (docs/codegen.md "Collectives"), in fp32 elements.
  // A piece of 256 KiB keeps a DMA's fixed costs (HBM latency, the engine it
  // holds) well under its transfer time even on chip, and K pieces in flight cover
  // a link's credit round trip. From a slice's worth per replica the schedule runs
  // on slices of about that size, each a few steps behind the one before, so the
  // next slice's reduce-scatter overlaps this one's gathers. Tests set both small
  // to reach those code paths with buffers the race checker gets through quickly.
  int64_t stream_piece_elems = 64 * 1024;
  int64_t stream_slice_elems = 1 << 20;
  // A non-hierarchical fp32 all_reduce streams once a step's widest chip-to-chip
  // chunk holds this many elements, and below that takes the step-ordered lowering
  // (docs/codegen.md "When the others stream"); 0 the default: where a move
  // stays on a chip, half a piece for the bidirectional ring and a quarter for the
  // torus algorithm on 2 or more dimensions, else 1 (every size). Tests set it
  // high to reach the step-ordered lowering.
  int64_t stream_from_elems = 0;
  // Instruction streams of a blocked streamed all-reduce (docs/codegen.md "Two
  // streams"): 2 or 3 plans with as many slot pools only and runs each pool's
  // blocks in its own stream (fork); 1, one program order; 0, the default: 2
  // where the chips form a 3-D torus, 3 for the hierarchical algorithm on a 2-D
  // one (where no plan with three pools is found, one), else 1.
  int all_reduce_streams = 0;
  // With three slot pools, a piece of a block's on-chip reduce-scatter is sent only
  // once the sender is done with the steps before its use (docs/codegen.md "On-chip
  // pieces when needed"); false sends it as soon as a slot frees, for comparison.
  bool onchip_when_needed = true;
  // A streamed all-reduce's consume whose one fused send goes on a stream credits
  // its source and goes on, its send an event of its own once the receiver's slot
  // is free (docs/codegen.md "Deferred sends"); false: the consume waits for that
  // slot first, for comparison.
  bool deferred_sends = true;
  // A hierarchical all-reduce that runs whole (one slice, one block), larger than
  // a piece, also plans on pieces of half its largest and keeps the plan the
  // ordering run finishes first (docs/codegen.md "Half pieces"); false: the first
  // plan's pieces only, for comparison.
  bool half_pieces = true;
  // The streamed all-reduce's inner-dimension sends, credits and entry tokens as
  // urgent ICI traffic (tc=1; docs/codegen.md "Urgent messages"): 1 on, 2 off
  // (everything bulk), 0 the default: credits and entry tokens on every board,
  // the inner-dimension sends only where the chips form a 3-D torus.
  int urgent_sends = 0;
  // The streamed all-reduce's consumes in arrival order (docs/codegen.md
  // "Arrival order"): with 2 or 3 streams, an event among the next 3 whose waits
  // all hold may go before a consume whose landing has not come (wait.any and
  // ftest). 0 off (program order; the default: measured, it gains nothing, and
  // costs instructions), 1 on, 2 a ready later one always first (a check: the
  // functional reference, where transfers land at once, then takes the early
  // paths the chip model takes only when landings come out of order).
  int arrival_order = 0;
  // The streamed all-reduce's inner-step messages (a chunk at most half the widest
  // chip-to-chip one) cut into up to this many pieces of at least 16 KiB
  // (docs/codegen.md "Inner pieces"): 1 one piece, as a wide step's; 0 the
  // default, 4 where the chips form a 3-D torus, else 1.
  int inner_split = 0;
  // The streamed all-reduce's late sends, a final value sent to the chip's other
  // core from VMEM as it lands or is made (docs/codegen.md "Final copies to the
  // other core"): 0 the default, in the slot streams where that plan does not
  // stall, else outside them, else none; 1 outside the streams (else none). Tests
  // set 1 to reach that path with small buffers.
  int late_sends = 0;
  // Add a note (LowerResult::notes) per all_reduce saying how it was lowered: the
  // schedule (algorithm, topology, blocks or slices and their lag), streamed
  // fused or unfused or step-ordered, the slot pools, slots and piece size, and
  // the ordering run's estimate (`tpusim compile --explain`). Only the notes
  // change, never the bundle.
  bool explain_collectives = false;
};

struct LowerResult {
  isa::Bundle bundle;
  std::string assembly;  // the program text that was assembled (without constants' data)
  int64_t hbm_end = 0;   // end of the HBM placement (chip 0's, for replicas): the peak of the plan
  int64_t hbm_unplanned = 0;  // what the same placements take without reuse (one replica's, for replicas)
  // What the lowering could not do as asked and did instead (an option it fell
  // back from), and with LowerOptions::explain_collectives how each collective
  // was lowered, once each; `tpusim compile` prints them as "note: ...".
  std::vector<std::string> notes;
  // The fusion the lowering applied (compiler/lower/fusion.cpp), member or feeder id
  // -> root id: the graph's marks less any it refused. The op names follow it.
  std::map<int, int> fused;
  // Streamed all_reduce ops (by op id) whose entry tokens are lines tagged
  // kEntryTokenTag, and the lowest VMEM byte their peers land pieces in (the
  // slots, at the top of VMEM): lower_replicated sends the tokens early, where no
  // op between them and the all_reduce touches those bytes.
  std::map<int, int64_t> entry_token_slots;
};
// The comment that tags an entry token's line in a replica's program text.
inline constexpr const char* kEntryTokenTag = "# entry token";

// Throws CompileError naming the node for an op (or operand kind) the lowering
// does not handle yet, or a graph that does not fit the target's memories.
LowerResult lower_graph(const Graph& graph, const LowerOptions& options);
// lower_graph with options.replicas.replicas > 1 (compiler/lower/replicate.cpp).
LowerResult lower_replicated(const Graph& graph, const LowerOptions& options);

}  // namespace tpusim::compiler

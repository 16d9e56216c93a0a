// The VMEM plan a lowered bundle carries (isa::VmemBuffer; docs/cli.md "VMEM
// occupancy"): what each op keeps in each core's VMEM, for the chip model's
// occupancy counter and stats. Every lowering lays its VMEM out statically per op
// (all VMEM addresses are [s0 + imm]) and nothing stays in VMEM from one op to the
// next (every tensor's home is HBM), so an op's buffers are the VMEM byte ranges
// its own instructions address, live for the op's span.
#pragma once

#include <map>

#include "compiler/ir/graph.h"
#include "isa/asm/instr.h"

namespace tpusim::compiler {

// Replaces each core's vmem_plan with the merged bounding byte ranges of the VMEM
// accesses of each op's instructions (vld/vst tiles, both ends of DMAs that touch
// this core's VMEM). Throws CompileError for a VMEM access through a base register
// other than s0 (its address is not known at compile time).
void record_vmem_plan(isa::Bundle& bundle);

// Names each op id of the bundle's code after its graph node, "matmul %h", with the
// elementwise nodes the lowering fused into it (`fused`: member or feeder id -> root
// id, LowerResult::fused) appended in graph order ("matmul %h +relu"), so timelines
// can say which node a slice belongs to. A node whose mark the lowering refused runs
// as an op of its own and is named there only (the marks alone named it twice).
// Characters a name may not hold (a quote, a control character) become '_'. Names
// the bundle already has for ids that are not graph nodes (lower_replicated's
// scatter and gather) are kept.
void record_op_names(isa::Bundle& bundle, const Graph& graph, const std::map<int, int>& fused);

// The model FLOPs of each op id of the bundle's code whose node runs on the MXUs
// (matmul, conv2d): 2 per multiply-accumulate of its unpadded operands, over all
// replicas and cores. The MXU itself only sees padded tiles (8-row LHS vregs, C
// result columns, a depthwise conv's one column of 128), so stats.json's `flops`
// and MXU utilization take these (docs/cli.md), as a profiler counts an HLO's.
void record_op_flops(isa::Bundle& bundle, const Graph& graph);

}  // namespace tpusim::compiler

// The per-op profile and the time-by-cause breakdown of stats.json, folded from the
// per-core records the chip model leaves in units["chipX.coreY.profile"]
// (hw/core/op_profile.h). One function, so `tpusim run`, tests and benches build
// the same keys.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "hw/timeline/timeline.h"
#include "isa/asm/instr.h"

namespace tpusim::run {

// Removes every "*.profile" record from `units` and returns
//   {"ops": [...], "time_by_cause": {"chip0.core0": {...}}}
// "ops" (sorted by id, "unmarked" first): per graph op over all cores
//   id, name, cycles (the longest core's), core_cycles (sum over cores), cores,
//   flops (the bundle's op FLOPs where it has them, else mxu_flops), mxu_flops
//   (2 per MAC the MXUs ran, padding included), hbm_bytes, vector_ops, instructions, mxu_busy_cycles,
//   vpu_busy_cycles, dma_busy_cycles, stall_cycles {compute, hbm, infeed, sync}.
// "time_by_cause": per core, cycles spent computing, waiting on HBM, on infeed,
//   on sync/ICI and idle; they sum to `run_cycles`. Infeed waits are the larger of
//   the profile's (waits on flags of host DMAs) and the sequencer's
//   "stall_infeed_cycles" counter (hw/host's model), the excess taken from sync.
// With `node_names` (the bundle's op names, docs/cli.md) an op also gets "node",
// the graph node it was lowered from; with `op_flops` (the bundle's, isa::Bundle)
// an op's flops are its model FLOPs, counted once however many cores ran it.
nlohmann::json fold_profiles(nlohmann::json& units, uint64_t run_cycles,
                             const std::map<int32_t, std::string>& node_names = {},
                             const std::map<int32_t, uint64_t>& op_flops = {});

// VMEM occupancy from the bundle's VMEM plans (isa::VmemBuffer, docs/cli.md "VMEM
// occupancy"): while a core executes op N, the bytes of the union of N's buffers in
// its plan are in use. Returns, per core with a program,
//   {"capacity_bytes": the target's VMEM, "peak_bytes_in_use": the largest
//    occupancy of an op the core executed (only when the core has a plan)}.
// Reads the "*.profile" records of `units`: call it before fold_profiles.
nlohmann::json vmem_use(const isa::Bundle& bundle, const nlohmann::json& units);

// Adds a "chipX.coreN.vmem bytes in use" counter to `tl` for each core with a plan:
// at the start of each op slice of its sequencer track, that op's occupancy, and 0
// where the last slice ends (the program is done). Call after the run.
void vmem_counters(const isa::Bundle& bundle, timeline::Timeline& tl);

}  // namespace tpusim::run

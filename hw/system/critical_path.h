// The critical path of a run: the chain of transfers, waits and barriers that set
// its length, walked back from the core that finished last through the records
// of hw/core/path_log.h (docs/cli.md "The critical path").
//
// From a cycle t on a core's instruction stream the walk looks for the latest
// *binding* event at or before t: a wait whose flag rose after the stream reached
// it (the stream stalled for it), or a barrier this core did not arrive at last.
// The core's own time since that event is its cause "issue" (less the stretches
// its sequencer stalled on a full unit queue or a barrier's drain). A wait's flag
// was last raised by a DMA: its transfer (engine start to the raise) takes that
// DMA's path (hbm, core_to_core, ici, host), its queue wait (issue to engine
// start) dma_queue, and the walk goes on at the DMA's issue on its issuer. A
// barrier goes on at the arrival of the core that arrived last; a forked
// stream's start at the fork on stream 0. The segments tile [0, the run's end].
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "hw/core/path_log.h"

namespace tpusim::hw {

// `ends`: per core, in PathLogs order, the cycle after its last activity (0 for a
// core without a program). Returns {"cycles", "ends_on", "by_cause", "by_op",
// "dma_hops", "barrier_hops", "segments"} (docs/cli.md "Critical path").
nlohmann::json walk_critical_path(const PathLogs& logs, const std::vector<uint64_t>& ends);

}  // namespace tpusim::hw

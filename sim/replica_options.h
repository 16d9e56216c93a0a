// The data-parallel options `tpusim compile` and `tpusim ref MODEL` share. A
// replicated model's reference has to see the compiled bundle's ReplicaSpec: the
// board, the algorithm and its blocks fix every all_reduce's add order
// (docs/codegen.md "Boards and replicas").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ref/replicas.h"
#include "hw/config/params.h"

namespace CLI {
class App;
}

namespace tpusim::cli {

struct ReplicaOptions {
  int replicas = 1;
  std::vector<std::string> batched;
  std::string collective = "auto";
  int block_lag = 0;
  int64_t block_bytes = 0;
};

// --replicas, --batched, --collective, --block-lag and --block-bytes.
void add_replica_options(CLI::App* cmd, ReplicaOptions& o);

// The spec of those options on the preset's board.
compiler::ReplicaSpec replica_spec(const config::Params& preset, const ReplicaOptions& o);

}  // namespace tpusim::cli

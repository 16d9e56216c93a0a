#include "sim/replica_options.h"

#include <CLI/CLI.hpp>

#include <algorithm>

#include "hw/ici/topology.h"

namespace tpusim::cli {

void add_replica_options(CLI::App* cmd, ReplicaOptions& o) {
  cmd->add_option("--replicas", o.replicas,
                  "Data-parallel replicas over the cores of the board's chips (the batch split along axis 0)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--batched", o.batched, "Inputs split over the replicas (default: every input)")->delimiter(',');
  cmd->add_option("--collective", o.collective, "all_reduce algorithm: auto | ring | bidir-ring | torus | hierarchical");
  cmd->add_option("--block-lag", o.block_lag,
                  "Steps between the starts of a blocked all-reduce's blocks (docs/codegen.md \"Blocks\"); "
                  "0 = half a block's steps")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--block-bytes", o.block_bytes,
                  "Per-replica bytes of fp32 in each block of a blocked all-reduce (docs/codegen.md \"Blocks\"); "
                  "0 = 8 MiB for the hierarchical algorithm, 4 MiB for the torus one; at most 256 blocks; "
                  "on a 3-D chip torus more than half a block runs as two")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
}

compiler::ReplicaSpec replica_spec(const config::Params& preset, const ReplicaOptions& o) {
  compiler::ReplicaSpec s;
  s.replicas = o.replicas;
  s.cores_per_chip = static_cast<int>(preset.get_int("cores_per_chip"));
  s.board = ici::Topology::from_params(preset);
  s.algorithm = o.collective;
  s.block_lag = o.block_lag;
  if (o.block_bytes > 0) s.block_elems = s.torus_block_elems = std::max<int64_t>(1, o.block_bytes / 4);
  s.batched = o.batched;
  return s;
}

}  // namespace tpusim::cli

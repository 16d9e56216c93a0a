// Data parallelism (docs/codegen.md "Boards and replicas"), shared by the graph reference and
// the lowering so both see the same per-replica graph and the same collective
// schedule, hence the same add order: SPMD replication of one graph over the
// TensorCores of a board, each replica on its slice of the global batch.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/ref/evaluate.h"
#include "hw/ici/collectives.h"

namespace tpusim::compiler {

struct ReplicaSpec {
  int replicas = 1;
  // Replica r runs on chip r / cores_per_chip, core r % cores_per_chip: the cores
  // of chip 0 first, then chip 1, ...
  int cores_per_chip = 1;
  ici::Topology board;               // the preset's chips (system.topology, system.dims)
  std::string algorithm = "auto";    // auto | ring | bidir-ring | torus | hierarchical
  std::vector<std::string> batched;  // inputs split along axis 0; empty = every input
  // The hierarchical all-reduce on 16 chips or more runs buffers above this many
  // elements per replica on contiguous blocks of at most this many (all_reduce_blocks).
  int64_t block_elems = int64_t{2} << 20;
  // The torus algorithm on a chip torus of at most 2 dimensions runs buffers above
  // this many elements per replica on contiguous blocks of at most this many: a
  // block's first step then fits a fused plan's slots (all_reduce_blocks).
  int64_t torus_block_elems = int64_t{1} << 20;
  // Steps between the starts of consecutive blocks; 0 = ceil(T / 2), T one block's
  // steps; at most T (then the blocks run one after the other). Only the timing
  // depends on it: every element is added in its block's order whatever the lag.
  int block_lag = 0;
};

inline int replica_chip(const ReplicaSpec& s, int r) { return s.replicas <= s.cores_per_chip ? 0 : r / s.cores_per_chip; }
inline int replica_core(const ReplicaSpec& s, int r) { return s.replicas <= s.cores_per_chip ? r : r % s.cores_per_chip; }
int chips_used(const ReplicaSpec& s);

// Throws CompileError when the replicas do not fit the board.
void check_replicas(const ReplicaSpec& s);

// The topology a collective over the replicas runs on: dimension 0 the cores of a
// chip, then the board's dimensions that the used chips span (a prefix of them, or
// a ring of the used chips); size-1 dimensions dropped. Its chip id is the replica
// index.
ici::Topology replica_topology(const ReplicaSpec& s);
// Why replica_topology is less than the board's shape, or empty: more than 3
// dimensions (v4-4x4x4's 2x4x4x4 becomes a ring of 128), or used chips that are
// not a box of the board; with where the hierarchical algorithm runs instead when
// it applies.
std::string replica_topology_note(const ReplicaSpec& s);
// The used chips alone (replica_topology of one replica per chip): the topology the
// hierarchical algorithm's chip-level part runs on, participant 2 x chip + core =
// the replica index.
ici::Topology chip_topology(const ReplicaSpec& s);
// The algorithm an all_reduce of `elements` uses (docs/codegen.md "Collectives").
ici::Algorithm choose_algorithm(const ReplicaSpec& s, int64_t elements);
ici::Schedule all_reduce_schedule(const ReplicaSpec& s, int64_t elements);
// The same, kept for the next call with the same spec and size: each replica's
// lowering asks for the schedule its plan was made on (make_schedule per replica
// was an eighth of a 512-replica compile).
std::shared_ptr<const ici::Schedule> shared_all_reduce_schedule(const ReplicaSpec& s, int64_t elements);
// Where the contiguous blocks of an all-reduce of `elements` per replica start
// (docs/codegen.md "Blocks"): ceil(elements / block_elems) blocks, cut on whole
// tiles, for the hierarchical algorithm on a chip topology of 16 chips or more
// (and two where a 3-D chip torus has more than half a block);
// ceil(elements / torus_block_elems) for the torus algorithm on a chip torus of at
// most 2 dimensions; else one block, {0}. all_reduce_schedule runs each block's
// own schedule, block b + 1's steps block_lag (default ceil(T / 2), T: one
// block's steps) after block b's, so every element is added in the order of its
// block's schedule.
// More blocks than kMaxAllReduceBlocks throw CompileError.
constexpr int64_t kMaxAllReduceBlocks = 256;
std::vector<int64_t> all_reduce_blocks(const ReplicaSpec& s, int64_t elements);

// Every replica's all_reduce result: the schedule run with num::add(received,
// local) on fp32 values (bf16 operands are exact in fp32; the caller rounds the
// result to the output dtype once).
std::vector<std::vector<float>> all_reduce_values(const ReplicaSpec& s, const std::vector<std::vector<float>>& x);

// all_gather, reduce_scatter, all_to_all (see graph.h) on the replicas' values:
// reduce_scatter's sum is the left fold in replica order, x_0 + x_1 + ... + x_{R-1}.
std::vector<std::vector<float>> direct_collective_values(OpKind op, const std::vector<std::vector<float>>& x);

struct ReplicaGraph {
  Graph graph;                           // the per-replica graph (types re-inferred)
  std::set<std::string> batched_inputs;  // split along axis 0
  std::set<std::string> batched_outputs; // replicas' results concatenated along axis 0
};
// The per-replica graph of a (policy-applied, verified) global graph: batched
// inputs' leading dimension divided by the replica count, a reshape whose target
// leads with the old batch follows it, every type re-inferred. An output whose type
// changed is batched (it must lead with the batch); the others are taken from
// replica 0. Throws CompileError naming the input or node that does not split.
ReplicaGraph replica_graph(const Graph& global, const ReplicaSpec& s);

HostTensor batch_slice(const HostTensor& t, int r, int replicas);
HostTensor batch_concat(const std::vector<HostTensor>& parts);

}  // namespace tpusim::compiler

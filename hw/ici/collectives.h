// Collective algorithms as schedules: which chunk of the per-chip buffer moves
// from which chip to which in which step, and whether the receiver adds it to its
// own copy or overwrites it. The compiler lowers a schedule to DMA plus vector
// adds; collective_sim.h runs it on the network model. The add order of every
// all-reduce and reduce-scatter is fixed by the schedule and documented in
// docs/ici.md ("Add order"), so a lowered program is bit-exact against the
// reference that folds in the same order.
//
// Semantics of a step: every move of step s reads its source chunk as it was at
// the end of step s-1; a reducing move stores  received + local  (the incoming
// partial sum on the left), a copying move stores  received. No two moves of a
// step write the same element of the same chip (checked by execute()).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hw/ici/topology.h"

namespace tpusim::ici {

enum class CollectiveKind { kAllReduce, kReduceScatter, kAllGather, kAllToAll };
enum class Algorithm { kRing, kBidirectionalRing, kTorus, kHierarchical };

CollectiveKind parse_collective(const std::string& s);  // all-reduce | reduce-scatter | all-gather | all-to-all
Algorithm parse_algorithm(const std::string& s);        // ring | bidir-ring | torus | hierarchical
std::string to_string(CollectiveKind k);
std::string to_string(Algorithm a);

struct Chunk {  // elements [offset, offset + elems) of a chip's buffer
  int64_t offset = 0;
  int64_t elems = 0;
};

struct Move {
  int src = 0, dst = 0;              // chips
  int src_chunk = 0, dst_chunk = 0;  // indices into Schedule::chunks (same length)
  bool reduce = false;
  int direction = +1;  // ring direction, the tie-break for the network route
};

struct Schedule {
  std::string name;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  Algorithm algorithm = Algorithm::kRing;
  Topology topology;
  int chips = 0;
  int64_t elements = 0;  // per-chip buffer length
  std::vector<Chunk> chunks;
  std::vector<std::vector<Move>> steps;
  // All-gather: the (chip, chunk) pairs each chip contributes; other elements
  // start unset. Reduce-scatter: the (chip, chunk) pairs that hold the result.
  // All-reduce and all-to-all: every element of every chip is input and result.
  std::vector<std::pair<int, int>> inputs;
  std::vector<std::pair<int, int>> results;
  size_t moves() const;
};

// Builds the schedule of `kind` with `algorithm` on `topology` for a buffer of
// `elements` per chip. Ring and bidirectional ring run on topology.ring_order();
// torus reduces one dimension after the other with bidirectional rings, the data
// split into 2 x D groups of which group (j, dir) takes the dimensions in the
// order j, j+1, .., so all 2D ports of a chip are busy at once. All-to-all is
// direct (step k: chip i sends its block for chip i+k); `algorithm` is ignored.
//
// hierarchical (cores_per_chip == 2; every other algorithm takes 1): the
// participants are the 2 cores of every chip of `topology`, participant
// 2 x chip + core. An on-chip reduce-scatter between the two cores (core c keeps
// half c), then core c runs the torus algorithm's D groups of one direction (core 0
// the + groups, core 1 the - groups) over the chips on its half, then the reverse
// all-gathers and an on-chip all-gather. The two cores of a chip then never share a
// link direction, and the chip-level part is exactly the torus algorithm on the
// chip topology (a size-2 dimension's + and - links each carry one core's groups).
// Throws IciError on a bad request (all-to-all needs elements % chips == 0).
Schedule make_schedule(CollectiveKind kind, Algorithm algorithm, const Topology& topology, int64_t elements,
                       int cores_per_chip = 1);

// Runs a schedule on per-chip buffers of any value type: `state[chip][element]`
// (elements() long each). `unset` marks elements a chip has no value for (only
// all-gather inputs start with some); reading one is an error. `add(received,
// local)` is the reducing store. Throws IciError naming the step and move on any
// inconsistency (two writers, unset read, out of range).
template <typename T, typename Add>
void execute(const Schedule& s, std::vector<std::vector<T>>& state, const T& unset, Add add);

// Alpha-beta closed form of the collective on its topology, in cycles, for a
// per-chip buffer of `bytes`: alpha the fixed cost of one neighbour message,
// beta cycles per byte of one link direction. From the algorithm's structure,
// not from the generated schedule:
//   ring       2(p-1)(alpha + beta n/p)          (all-reduce; RS or AG alone: half)
//   bidir ring 2(p-1)(alpha + beta n/(2p))
//   torus      2 sum_h (k_h - 1)(alpha + beta n/(G k_1..k_h)),  G = 2 x D groups,
//              the slowest dimension order of the D parts.
//   hierarchical  the torus form on the chip topology + 2 on-chip steps,
//              2 (alpha_onchip + beta_onchip n/2)  (RS or AG alone: half of both).
double closed_form_cycles(CollectiveKind kind, Algorithm algorithm, const Topology& topology, double bytes,
                          double alpha_cycles, double beta_cycles_per_byte, double onchip_alpha_cycles = 0,
                          double onchip_beta_cycles_per_byte = 0);

// ---- implementation of the template ----
template <typename T, typename Add>
void execute(const Schedule& s, std::vector<std::vector<T>>& state, const T& unset, Add add) {
  auto fail = [&](size_t step, size_t m, const std::string& what) {
    throw IciError(s.name + ": step " + std::to_string(step) + " move " + std::to_string(m) + ": " + what);
  };
  if (int(state.size()) != s.chips) throw IciError(s.name + ": state has the wrong number of chips");
  for (const auto& b : state)
    if (int64_t(b.size()) != s.elements) throw IciError(s.name + ": state buffer has the wrong length");
  struct Write {
    int chip;
    int64_t elem;
    T value;
  };
  std::vector<Write> writes;
  std::vector<std::vector<char>> written(size_t(s.chips));
  for (size_t st = 0; st < s.steps.size(); ++st) {
    writes.clear();
    for (size_t mi = 0; mi < s.steps[st].size(); ++mi) {
      const Move& m = s.steps[st][mi];
      if (m.src < 0 || m.src >= s.chips || m.dst < 0 || m.dst >= s.chips) fail(st, mi, "chip out of range");
      if (m.src_chunk < 0 || m.src_chunk >= int(s.chunks.size()) || m.dst_chunk < 0 ||
          m.dst_chunk >= int(s.chunks.size()))
        fail(st, mi, "chunk out of range");
      const Chunk& a = s.chunks[size_t(m.src_chunk)];
      const Chunk& b = s.chunks[size_t(m.dst_chunk)];
      if (a.elems != b.elems) fail(st, mi, "source and destination chunks differ in length");
      for (int64_t e = 0; e < a.elems; ++e) {
        const T& v = state[size_t(m.src)][size_t(a.offset + e)];
        if (v == unset) fail(st, mi, "chip " + std::to_string(m.src) + " sends an element it does not hold");
        const T& local = state[size_t(m.dst)][size_t(b.offset + e)];
        if (m.reduce && local == unset) fail(st, mi, "reduce into an unset element");
        writes.push_back({m.dst, b.offset + e, m.reduce ? add(v, local) : v});
      }
    }
    for (auto& w : written) w.assign(size_t(s.elements), 0);
    for (const Write& w : writes) {
      char& f = written[size_t(w.chip)][size_t(w.elem)];
      if (f) throw IciError(s.name + ": step " + std::to_string(st) + ": two moves write element " +
                            std::to_string(w.elem) + " of chip " + std::to_string(w.chip));
      f = 1;
      state[size_t(w.chip)][size_t(w.elem)] = w.value;
    }
  }
}

}  // namespace tpusim::ici

// Collectives between the replicas of a data-parallel bundle (docs/codegen.md
// "Collectives"): the schedule of compiler/ref/replicas.h, whose add order the
// graph reference folds in, lowered to DMAs into the receiving replica's VMEM or
// HBM plus vector adds; and the direct all_gather / reduce_scatter / all_to_all.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <set>
#include <tuple>

#include "compiler/lower/emitter.h"
#include "compiler/ref/replicas.h"

namespace tpusim::compiler::lowering {

namespace {
// The collectives' own flags, apart from the node lowerings' (f1..f17) and the
// replicated driver's (f61, f63): sends count on the issuer (f58), landings on the
// receiver (per source and step, see lower_all_reduce; f59 for the direct ones, but
// f20.. by group of source chips for an all_gather over several cores a chip, and
// f60 for its blocks passed on between the cores of a chip),
// entry tokens on the sender (the direct ones' on the receiver, f510).
constexpr const char* kSendFlag = "f58";
constexpr int kFirstLandFlag = 20, kLandFlags = 32;   // f20..f51
constexpr int kFirstReadyFlag = 52, kReadyFlags = 6;  // f52..f57
constexpr int kDirectLandFlag = 59;     // the direct collectives' blocks
constexpr int kDirectForwardFlag = 60;  // a direct all_gather's blocks passed on within a chip
// HBM mode's VMEM pieces of a combine: up to 256 tiles of 8 x 128 fp32 each for the
// received and the local values.
constexpr int64_t kMaxPieceTiles = 256;
// One event of a replica's collective program: its sends of a step to one peer, or
// its combines of what one peer sent in a step.
struct PlanEvent {
  bool send;
  size_t step;
  int peer;
};
// Beyond this many events over all replicas the dataflow estimate below is not
// made and the step order is used, as it is when the estimate's order would need
// more landing flags. A bidirectional ring of v4-4x4x4's 128 replicas has 130,048
// events, of 512 replicas (v2-16x16) 2.1 M (38 s to compile at 4 KiB, 2.3 GB; it
// ran 1.63x faster than in the step order). The limit was 20,000 while the run
// scanned every event per event taken, 150,000 while it scanned a replica's events
// per event taken and compared every pair of a replica's events to find their
// order (sessions 40, 41).
constexpr size_t kMaxPlanEvents = 4000000;
// HBM mode's double buffers: loads of piece i on kLoadFlag + i%2, its write-back on
// kStoreFlag + i%2 (the emitter's per-flag running counts, shared with matrix.cpp).
constexpr int kLoadFlag = 2, kStoreFlag = 6;
// The streamed all-reduce's instruction streams (Streams in lower_all_reduce), each
// stream's flags: its operand loads (3 from `load`), scratch stores, sends (-1:
// stream 0's, f58, coll_sent_ its count; else counts the emitter keeps, like the
// node lowerings' own) and the gate it raises for the next block's stream (the
// streams after 0 also report their end to stream 0 there).
struct StreamFlags {
  int load, store, send, gate;
};
constexpr StreamFlags kStreamFlagSets[] = {{kLoadFlag, kStoreFlag, -1, 0}, {10, 14, 18, 19}, {7, 13, 15, 17}};
constexpr int kMaxAllReduceStreams = static_cast<int>(sizeof(kStreamFlagSets) / sizeof(kStreamFlagSets[0]));
static_assert(kMaxAllReduceStreams <= isa::kStreams);

// ---- Streamed lowering (fp32, every algorithm): docs/codegen.md
// "Collectives". The buffer is cut at every chunk boundary of the schedule (and
// every piece, LowerOptions::stream_piece_elems) into atoms, and each move's atoms
// are merged again into pieces of at most that size, so sender and receiver cut a
// move alike.
// Each ordered pair of replicas that exchanges data is a stream of pieces, numbered
// in the order the sender sends them. Piece m of a stream lands in the receiver's
// slot m % K (a reducing move: VMEM; a copying one: straight into y in HBM) and
// raises the receiver's landing flag for that slot; the receiver, once it has used
// piece m, sends a 4-byte credit to the sender's credit flag for that slot when
// piece m + K follows, and the sender sends piece m only after the credit of piece
// m - K (credit 0 is the entry token). So the uses of a slot and its flags are
// sequential, a landing count names the piece whatever the delivery order, and the
// receiver may use different slots' pieces in any order.
// The streams' landing flags (sources x K) and credit flags (destinations x K): f64..f191
// (f255..f509 with wide slots, below).
// The send buffers' own DMAs (stores to y, second sends): f192..f254, one flag per
// buffer while there are as many flags (63: v4-4x4x4's 4 x 16 buffers share one
// pair), never a landing or credit flag, so a wait there counts only this core's
// DMAs (an entry token may land on a credit flag while its receiver is still in
// its previous node).
constexpr int kSendBufFirstFlag = 192, kSendBufFlags = 63;
constexpr int kStreamFirstFlag = 64, kStreamFlags = kSendBufFirstFlag - kStreamFirstFlag;

// Inner-step pieces (LowerOptions::inner_split): by default an inner chunk goes as
// up to 4 pieces, on a k = 4 torus dimension the next step's chunks, of at least
// 16 KiB (or a quarter of a piece, for tests' small pieces): below that a message
// costs its latency, not its bytes, and splitting v4-4x4x4's 22 KB third-dimension
// messages as well lost the two-pool plan at 16 MiB.
constexpr int kInnerSplit = 4;
constexpr int64_t kMinInnerPieceElems = 4096;

// Slots per stream with two pools: 16 (8 a pool, twice the 4 pieces a first torus
// step of a slice sends on a stream), fewer if the flags run out.
int pooled_slots(int64_t most) { return static_cast<int>(std::min<int64_t>(16, kStreamFlags / (2 * most))); }

// Wide slots (docs/codegen.md "Wide slots"): where the pooled try stalls with fewer
// than 8 slots a pool (three pools share the 16 above: 5 each), one more try with 8
// a pool, the streams' flags then in f255..f509, which only this lowering's landings
// and credits use (so an early entry token there is as harmless as in f64..f191).
// v2-4x4 at 9-11 and 17 MiB: three pools of 5 stalled, and the two pools of 8 then
// taken ran 9-15% longer than three of 8 (docs/validation.md "Session 53").
// The last flag, f510, is the direct collectives' entry tokens' (lower_direct_collective).
constexpr int kDirectEntryFlag = isa::kSyncFlags - 1;
constexpr int kWideStreamFirstFlag = kSendBufFirstFlag + kSendBufFlags, kWideStreamFlags = kDirectEntryFlag - kWideStreamFirstFlag;
constexpr int kSlotsAPool = 8;
int wide_slots(int64_t most, int pools) {
  return static_cast<int>(std::min<int64_t>(kSlotsAPool * pools, kWideStreamFlags / (2 * most)));
}

// The widest chunk a move of the schedule carries between chips (the
// hierarchical schedule's on-chip moves, between replicas 2c and 2c + 1, left out).
int64_t widest_chip_chunk(const ici::Schedule& sch) {
  const bool hier = sch.algorithm == ici::Algorithm::kHierarchical;
  int64_t widest = 0;
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step)
      if (!(hier && m.src / 2 == m.dst / 2)) widest = std::max(widest, sch.chunks[static_cast<size_t>(m.src_chunk)].elems);
  return widest;
}

// The chip j steps along dimension d of `topo` from `chip` (j < 0: back), round
// the ring.
int chip_along(const ici::Topology& topo, int chip, size_t d, int j) {
  std::vector<int> c = topo.coords(chip);
  const int ring = topo.dims()[d];
  c[d] = ((c[d] + j) % ring + ring) % ring;
  return topo.chip_at(c);
}

// All_gather's bytes a link direction carries on average, in blocks of one
// replica: every core sends its index's blocks to the core of that index on each
// other chip, by the board's routes (dimension order), and the block-hops are
// spread over every link direction of the board. `phased`: dimension by
// dimension (lower_direct_collective), phase p along dimension p only, each
// message what the chip holds by then (the blocks of the chips that differ from
// it only in the earlier dimensions); else straight to every chip. The busiest
// link carries as much either way on a ring of 4 or more (the last phase's
// messages are as many blocks on its dimension's links as the direct exchange
// puts on each), but the direct exchange's many routes of several hops queue
// behind each other: v4-4x4x4, 64 KiB blocks, 46% over the busiest link's
// time against 13% by dimensions (docs/codegen.md "All_gather by dimensions").
double all_gather_link_blocks(const ici::Topology& topo, int C, bool phased) {
  int64_t block_hops = 0, links = 0;
  const std::vector<int>& dims = topo.dims();
  for (int src = 0; src < topo.chips(); ++src) {
    for (int port = 0; port < 2 * topo.num_dims(); ++port) links += topo.neighbour(src, port) >= 0;
    if (!phased) {
      for (int dst = 0; dst < topo.chips(); ++dst) block_hops += C * topo.hops(src, dst);
      continue;
    }
    int64_t held = 1;
    for (size_t p = 0; p < dims.size(); ++p) {
      for (int j = 1; j < dims[p]; ++j) block_hops += C * held * topo.hops(src, chip_along(topo, src, p, j));
      held *= dims[p];
    }
  }
  return links > 0 ? static_cast<double>(block_hops) / static_cast<double>(links) : 0.0;
}

// Whether a move of the schedule stays on a chip, between its cores.
bool moves_on_chip(const ReplicaSpec& s, const ici::Schedule& sch) {
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step)
      if (replica_chip(s, m.src) == replica_chip(s, m.dst)) return true;
  return false;
}

// The most replicas one replica of the schedule sends to or receives from.
int64_t most_peers(const ici::Schedule& sch) {
  std::map<int, std::set<int>> to, from;
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step) {
      to[m.src].insert(m.dst);
      from[m.dst].insert(m.src);
    }
  size_t most = 1;
  for (const auto& [r, v] : to) most = std::max(most, v.size());
  for (const auto& [r, v] : from) most = std::max(most, v.size());
  return static_cast<int64_t>(most);
}
// Each replica's sources and destinations in the schedule, in order of first
// appearance (the order their flags are handed out in).
void peers_of(const ici::Schedule& sch, std::vector<std::vector<int>>& sources, std::vector<std::vector<int>>& dests) {
  sources.assign(static_cast<size_t>(sch.chips), {});
  dests.assign(static_cast<size_t>(sch.chips), {});
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step) {
      auto& v = sources[static_cast<size_t>(m.dst)];
      if (std::find(v.begin(), v.end(), m.src) == v.end()) v.push_back(m.src);
      auto& d = dests[static_cast<size_t>(m.src)];
      if (std::find(d.begin(), d.end(), m.dst) == d.end()) d.push_back(m.dst);
    }
}
constexpr int kStreamLoads = 4;    // local operands fetched ahead, on flags kLoadFlag..+3 (f2..f5)
constexpr int kStreamScratch = 4;  // sums only stored, on flags kStoreFlag..+3 (f6..f9)
// With two streams (docs/codegen.md "Two streams") each stream has 3 + 1 of those
// pieces, both streams' in the one stream's 8, as one pool (StreamRes::pooled).
constexpr int kTwoStreamLoads = 3, kTwoStreamScratch = 1;
static_assert(2 * (kTwoStreamLoads + kTwoStreamScratch) <= kStreamLoads + kStreamScratch);

// Pieces of VMEM the streams take: the operand loads, the scratch sums, then K
// receive slots per source and K send buffers per destination (in that order).
int64_t stream_vmem_pieces(int64_t sources, int64_t dests, int K) {
  return kStreamLoads + kStreamScratch + (sources + dests) * K;
}

struct StreamEvent {
  bool send;          // a send from HBM (x or y), else the use (consume) of a landing
  size_t step, move;  // the move of the schedule
  int atom, atom_end; // the piece: atoms [atom, atom_end)
  // consume only: the sends (step, move) of this replica that go straight from the
  // VMEM result of this consume (a reducing move) or from y right after the landing
  // (a copying move).
  std::vector<std::pair<size_t, size_t>> fused;
  std::vector<std::pair<int, int>> store;  // runs of atoms whose sum is read again: stored to y
  bool local_from_x = false;  // a reducing consume: the local operand is still x
  bool from_x = false;        // a send: the value is still x
  bool defer_first = false;   // a consume: its first fused send is a deferred send event of its own
  // A deferring consume whose send buffer was last sent from by an undeferred send
  // (counted on the send flag): the credit of its own piece's slot frees the buffer.
  bool credit_frees_buffer = false;
  bool deferred = false;      // a send: a consume's deferred fused send, from that consume's send buffer
};

struct StreamPlan {
  int64_t piece = 0;
  std::vector<std::pair<int64_t, int64_t>> atoms;                   // [lo, hi) elements
  std::vector<std::vector<std::vector<int>>> move_atoms;            // [step][move]
  // [step][move]: the move's pieces, runs of its atoms of at most a piece
  // (a move's chunk is cut at every chunk boundary of the schedule into atoms, and
  // its consecutive atoms merged again, so deep phases' small chunks do not cut the
  // first phases' transfers into many small messages).
  std::vector<std::vector<std::vector<std::pair<int, int>>>> move_pieces;
  std::vector<std::vector<StreamEvent>> prog;                       // per replica
  std::vector<std::vector<int>> sources, dests;                     // per replica, first appearance
  // (src, dst) -> its pieces (step, move, first atom) in the order sent
  std::map<std::pair<int, int>, std::vector<std::tuple<size_t, size_t, int>>> stream;
  std::map<std::tuple<int, size_t, size_t, int>, int64_t> index;  // (src, step, move, first atom) -> m in its stream
  // (src, dst) -> per piece m: its slot and how many pieces used that slot before it
  std::map<std::pair<int, int>, std::vector<std::pair<int, int64_t>>> slot_use;
  int K = 0, most = 0;
  int stream_first = kStreamFirstFlag;  // the streams' first landing flag: f64, or f255 with wide slots
  int pools = 1;           // slot pools: a piece of pool p takes slots [p K / pools, (p + 1) K / pools)
  std::vector<std::vector<int64_t>> gates;  // block_start_gates, as planned with
  ici::Schedule sched;     // the schedule planned: the collective's, or its slices
  int64_t max_piece = 0;  // elements of the largest piece, whole tiles: the size of a slot
  // Elements of the widest chunk a move carries between chips: a step whose chunk is
  // at most half of it is an inner (latency-bound) step, for its pieces and its class.
  int64_t widest = 0;
  int64_t makespan = 0;   // the ordering run's estimate of the collective's cycles
  // Why no fused try planned, when this plan sends every sum through y (for the
  // compile note), else empty.
  std::string unfused_why;
  // LateSends::kOutside: the late sends (step, move, first atom), each a DMA into
  // the other core's y outside the slot streams, counted on `outside_flag` there.
  std::set<std::tuple<size_t, size_t, int>> outside;
  int outside_flag = -1;
  bool is_outside(size_t step, size_t move, int atom) const { return outside.count({step, move, atom}) > 0; }
};

// Late fused sends (plan_stream): a final value that lands as a copy and goes to
// the chip's other core in the on-chip all-gather is sent from its VMEM copy as it
// lands instead of being read back from y then. kInStream: as a piece of the on-chip
// slot stream, so the consume waits for that piece's slot. kOutside: outside the
// streams (it lands in y and frees no slot): no slot, credit or consume, one
// counting flag the receiver waits for at the op's end. On v3-8 the on-chip stream's
// slots hold the next slices' reduce-scatter pieces (sent from x as soon as a slot
// frees), whose consumes wait for the stream to the next chip, which still has the
// copy's send on to go: in-stream late sends stall the ordering run there.
enum class LateSends { kNone, kInStream, kOutside };

// Plans every replica's program. Returns an empty message, or why the schedule
// does not stream (then the caller lowers it the other way).
std::string plan_stream(const ici::Schedule& sch, const std::vector<std::vector<int>>& move_pool, int pools, StreamPlan& sp,
                        bool fuse, LateSends late, int64_t piece, const std::vector<std::vector<int64_t>>& move_gate,
                        int inner_split, bool onchip_when_needed, bool defer_sends, bool wide) {
  const size_t P = static_cast<size_t>(sch.chips), T = sch.steps.size();
  auto pool_of = [&](size_t t, size_t k) { return move_pool.empty() ? 0 : move_pool[t][k]; };
  // The hierarchical schedule numbers a chip's two cores' replicas 2c, 2c + 1.
  const bool hier = sch.algorithm == ici::Algorithm::kHierarchical;
  auto on_chip = [&](int x, int y) { return hier && x / 2 == y / 2; };
  if (move_pool.empty()) pools = 1;
  sp.pools = pools;
  sp.piece = piece;
  std::vector<int64_t> cuts{0, sch.elements};
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step)
      for (int c : {m.src_chunk, m.dst_chunk}) {
        const ici::Chunk& k = sch.chunks[static_cast<size_t>(c)];
        cuts.push_back(k.offset);
        cuts.push_back(k.offset + k.elems);
      }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  // Inner steps (a chunk at most half the widest chip-to-chip chunk: the torus
  // schedule's deeper dimensions) are a chain of small messages, each paying its
  // whole transfer before the next hop can start. With inner_split > 1 such a chunk
  // goes as up to inner_split pieces of at least kMinInnerPieceElems, so the next
  // hop starts after the first: the atoms inside it are cut that fine.
  sp.widest = widest_chip_chunk(sch);
  const int64_t widest = sp.widest;
  auto inner_cap = [&](int64_t elems) {
    if (inner_split <= 1 || 2 * elems > widest) return sp.piece;
    const int64_t n = std::clamp<int64_t>(elems / std::min(kMinInnerPieceElems, sp.piece / 4), 1, inner_split);
    return std::min(sp.piece, (elems + n - 1) / n);
  };
  std::vector<int64_t> seg_step(cuts.size(), sp.piece);
  if (inner_split > 1) {
    std::set<int> seen;
    for (const auto& step : sch.steps)
      for (const ici::Move& m : step)
        if (seen.insert(m.src_chunk).second) {
          const ici::Chunk& c = sch.chunks[static_cast<size_t>(m.src_chunk)];
          const int64_t cap = inner_cap(c.elems);
          if (cap >= sp.piece) continue;
          for (size_t i = static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), c.offset) - cuts.begin());
               i + 1 < cuts.size() && cuts[i] < c.offset + c.elems; ++i)
            seg_step[i] = std::min(seg_step[i], cap);
        }
  }
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    for (int64_t lo = cuts[i]; lo < cuts[i + 1]; lo += seg_step[i])
      sp.atoms.emplace_back(lo, std::min(cuts[i + 1], lo + seg_step[i]));
  auto atoms_of = [&](const ici::Chunk& c) {
    std::vector<int> v;
    auto it = std::lower_bound(sp.atoms.begin(), sp.atoms.end(), std::make_pair(c.offset, int64_t(INT64_MIN)));
    for (; it != sp.atoms.end() && it->second <= c.offset + c.elems; ++it) v.push_back(static_cast<int>(it - sp.atoms.begin()));
    return v;
  };
  sp.move_atoms.resize(T);
  sp.move_pieces.resize(T);
  // A piece does not run over a boundary of the next step's chunks once it holds a
  // quarter of a piece (64 KiB by default), so the sums a step makes are cut as the next step sends them and
  // can go straight from VMEM (fused); a piece across such a boundary is stored to y
  // and read back to send (v4-4x4x4, 16 MiB: 319,849 -> 272,083 cycles with the
  // order below). Smaller pieces stay merged: there a message costs its latency,
  // not its bytes (cut at every boundary, v4-4x4x4 1 KiB took 49,484 cycles, not 39,672).
  const int64_t min_cut = piece / 4;
  std::vector<std::set<int64_t>> next_cuts(T);
  for (size_t t = 0; t + 1 < T; ++t)
    for (const ici::Move& m : sch.steps[t + 1]) {
      const ici::Chunk& k = sch.chunks[static_cast<size_t>(m.src_chunk)];
      next_cuts[t].insert(k.offset);
      next_cuts[t].insert(k.offset + k.elems);
    }
  // The piece that last wrote each atom on each replica, (replica, atom) -> (step,
  // move, piece): the final on-chip all-gather cuts its pieces as they were written,
  // so a final value that lands as a copy can go to the other core from its VMEM
  // copy as it lands (late fused sends, below) instead of from y after the torus
  // all-gather (v4-4x4x4 16 MiB: 2 of 64 pieces a core went that way). Every
  // block's, not only the schedule's last step: the on-chip copies are the final
  // all-gathers' (v4-4x4x4 32 MiB, four blocks: 3.15 MB a core no longer read
  // back from y; the cycles move within a change of order, 315,683 -> 314,591).
  std::map<std::pair<int, int>, std::tuple<size_t, size_t, size_t>> last_piece;
  for (size_t t = 0; t < T; ++t)
    for (size_t k = 0; k < sch.steps[t].size(); ++k) {
      const ici::Move& m = sch.steps[t][k];
      if (m.src_chunk != m.dst_chunk) return "a move between different chunks";
      sp.move_atoms[t].push_back(atoms_of(sch.chunks[static_cast<size_t>(m.src_chunk)]));
      const bool final_copy = hier && !m.reduce && on_chip(m.src, m.dst);
      const std::tuple<size_t, size_t, size_t> none{SIZE_MAX, 0, 0};
      auto prev_writer = none;
      std::vector<std::pair<int, int>> pieces;
      const int64_t cap = inner_cap(sch.chunks[static_cast<size_t>(m.src_chunk)].elems);
      for (int a : sp.move_atoms[t].back()) {
        const auto& at = sp.atoms[static_cast<size_t>(a)];
        const int64_t start = pieces.empty() ? 0 : sp.atoms[static_cast<size_t>(pieces.back().first)].first;
        auto writer = none;
        if (final_copy)
          if (auto w = last_piece.find({m.src, a}); w != last_piece.end()) writer = w->second;
        // A move of at most a piece goes as one message from y, and copies stay
        // merged below piece / 64 (4 KiB by default): cut as written, v3-8 1 KiB
        // (copies of 64-128 B) took 12,019 cycles instead of 10,739 and 64 KiB
        // 12,344 instead of 11,275; the floor of the next step's cuts (a quarter
        // piece) would merge v4-4x4x4's copies up to 16 MiB (~43 KB each).
        const bool by_writer = final_copy && writer != none && sch.chunks[static_cast<size_t>(m.src_chunk)].elems > sp.piece;
        const bool cut_here = by_writer ? writer != prev_writer : next_cuts[t].count(at.first) > 0;
        const bool merge =
            at.second - start <= cap && !(cut_here && at.first - start >= (by_writer ? sp.piece / 64 : min_cut));
        if (!pieces.empty() && merge)
          pieces.back().second = a + 1;
        else
          pieces.emplace_back(a, a + 1);
        prev_writer = writer;
      }
      for (size_t p = 0; p < pieces.size(); ++p)
        for (int a = pieces[p].first; a < pieces[p].second; ++a) last_piece[{m.dst, a}] = {t, k, p};
      sp.move_pieces[t].push_back(pieces);
    }
  // A move's pieces go (and are taken) in the order their receiver next uses them:
  // by the step of that use, then the piece's place in the move of that use, then
  // that move. So the on-chip reduce-scatter of a half feeds the first piece of
  // every torus group before the second of any, and the groups' rings start
  // together instead of each after the groups whose chunks lie before its own
  // (v2-4x4, 16 MiB: 207,196 -> 179,690 cycles). Within a step no element is
  // written twice, so the add order is the schedule's whatever the piece order.
  // With the on-chip pieces when needed (below), the receiver's next use of each
  // piece of an on-chip move, from the same uses: (step, move, first atom) -> the
  // earliest later step using any of its atoms (T: none).
  const bool when_needed = onchip_when_needed && hier && pools >= 3;
  std::map<std::tuple<size_t, size_t, int>, size_t> onchip_next_use;
  {
    // (replica, atom) -> its uses (step, piece index in the move, move), steps ascending
    std::map<std::pair<int, int>, std::vector<std::tuple<size_t, size_t, size_t>>> uses;
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < sch.steps[t].size(); ++k)
        for (size_t p = 0; p < sp.move_pieces[t][k].size(); ++p)
          for (int a = sp.move_pieces[t][k][p].first; a < sp.move_pieces[t][k][p].second; ++a)
            for (int end : {sch.steps[t][k].src, sch.steps[t][k].dst}) uses[{end, a}].emplace_back(t, p, k);
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < sch.steps[t].size(); ++k) {
        const int d = sch.steps[t][k].dst;
        auto& pieces = sp.move_pieces[t][k];
        std::vector<std::pair<std::tuple<size_t, size_t, size_t>, std::pair<int, int>>> keyed;
        for (const auto& pc : pieces) {
          const auto& u = uses[{d, pc.first}];
          // the first use in a later step (the entries of one step are in move order)
          auto it = std::find_if(u.begin(), u.end(), [&](const auto& x) { return std::get<0>(x) > t; });
          keyed.emplace_back(it == u.end() ? std::make_tuple(T, size_t(0), size_t(0)) : *it, pc);
          if (!when_needed || !on_chip(sch.steps[t][k].src, d)) continue;
          // for the pacing, the earliest later use of any of the piece's atoms
          size_t& next = onchip_next_use[{t, k, pc.first}] = T;
          for (int a = pc.first; a < pc.second; ++a)
            for (const auto& x : uses[{d, a}])
              if (std::get<0>(x) > t) {
                next = std::min(next, std::get<0>(x));
                break;
              }
        }
        std::stable_sort(keyed.begin(), keyed.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
        for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = keyed[i].second;
      }
  }
  for (const auto& step : sp.move_pieces)
    for (const auto& pieces : step)
      for (const auto& [a0, a1] : pieces)
        sp.max_piece = std::max(sp.max_piece, sp.atoms[static_cast<size_t>(a1 - 1)].second - sp.atoms[static_cast<size_t>(a0)].first);
  sp.max_piece = align_up(sp.max_piece, kTileElems);
  peers_of(sch, sp.sources, sp.dests);
  const int64_t most = most_peers(sch);
  if (most > 6) return "a replica exchanges with more than 6 others";
  // One pool: 6 slots a stream, 4 with 4 peers (38 flags' worth, the budget these
  // plans were tuned with before the streams' flags moved to f64..).
  sp.K = wide ? wide_slots(most, pools) : pools > 1 ? pooled_slots(most) : std::min<int>(6, 38 / (2 * static_cast<int>(most)));
  sp.stream_first = wide ? kWideStreamFirstFlag : kStreamFirstFlag;
  sp.most = static_cast<int>(most);
  if (sp.K / pools < 1) return "fewer slots per stream than pools";
  const int Kp = sp.K / pools;
  // The ordering run below decides whether a pool's slots hold a ring's pieces of
  // two consecutive steps (else its consumes all wait for a slot downstream), for
  // every algorithm and pool count: a count of a step's pieces against half a pool's
  // slots would reject plans the run takes (the torus algorithm's 4 MiB blocks on
  // v3-8, three pools of 5 slots on v4-4x4x4) and, for the hierarchical algorithm's
  // two pools, rejected none it would not (docs/codegen.md "Two slot pools").
  // Per replica and atom, what happens to it in step order: writes[r][a] = steps
  // with (move, reduce) that write it; sends likewise.
  const size_t A = sp.atoms.size();
  sp.prog.assign(P, {});
  struct Cand {
    StreamEvent e;
    // Per atom of the piece: this replica's consumes of it before the event's step,
    // and (a consume) its sends of it up to the step.
    std::vector<int> need_writes, need_sends;
    size_t piece_id = 0;  // piece_of(step, move, atom): a consume's landing
    // A send that waits until the replica has done its events of steps (e.step,
    // when_done] (on-chip pieces when needed, below); -1: none.
    int64_t when_done = -1;
  };
  // On-chip pieces when needed (docs/codegen.md "On-chip pieces when needed"): with
  // three slot pools (three blocks in flight, the kept-sum VMEM a third each), a
  // piece of the on-chip reduce-scatter that its receiver next uses in step u > t + 1
  // is sent from x only once the sender has done its events of the steps before u.
  // Sent as soon as a slot frees, a block's whole reduce-scatter ran ahead at the
  // HBM's pace: its sums overflowed the kept-sum VMEM into y and back (5.0 n of HBM
  // a chip on v2-4x4 64 MiB against the 4 n floor) while the links waited.
  // Step u: onchip_next_use (above).
  std::vector<std::vector<Cand>> cands(P);
  for (size_t r = 0; r < P; ++r) {
    // (step -> list of (move, reduce)) per atom, built sparsely.
    std::vector<std::vector<std::tuple<size_t, size_t, bool>>> acc(A);  // (step, move, is_send) in step order
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < sch.steps[t].size(); ++k) {
        const ici::Move& m = sch.steps[t][k];
        if (m.dst == static_cast<int>(r))
          for (int a : sp.move_atoms[t][k]) acc[static_cast<size_t>(a)].emplace_back(t, k, false);
        if (m.src == static_cast<int>(r))
          for (int a : sp.move_atoms[t][k]) acc[static_cast<size_t>(a)].emplace_back(t, k, true);
      }
    // A send move (t, k) goes fused when every atom of it is written by this
    // replica's consume in step t - 1 and no other send of that step takes the atom.
    std::map<std::pair<size_t, size_t>, bool> fused_move;
    std::map<std::pair<size_t, int>, int> sends_of_atom;  // (step, atom) -> count
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < sch.steps[t].size(); ++k)
        if (sch.steps[t][k].src == static_cast<int>(r))
          for (int a : sp.move_atoms[t][k]) ++sends_of_atom[{t, a}];
    for (size_t t = 1; t < T; ++t) {
      std::set<std::pair<int, int>> consumed;  // the pieces this replica takes in step t - 1
      for (size_t k = 0; k < sch.steps[t - 1].size(); ++k)
        if (sch.steps[t - 1][k].dst == static_cast<int>(r))
          for (const auto& pc : sp.move_pieces[t - 1][k]) consumed.insert(pc);
      for (size_t k = 0; k < sch.steps[t].size(); ++k) {
        if (sch.steps[t][k].src != static_cast<int>(r)) continue;
        bool ok = !sp.move_pieces[t][k].empty();
        for (const auto& pc : sp.move_pieces[t][k]) ok = ok && consumed.count(pc);
        for (int a : sp.move_atoms[t][k]) ok = ok && sends_of_atom[{t, a}] == 1;
        fused_move[{t, k}] = ok && fuse;
      }
    }
    // A final value that lands as a copy and goes to this chip's other core only in
    // a later step (the on-chip all-gather) is sent from the VMEM copy as it lands
    // (late fused) instead of being read back from y then: (copy consume step, move,
    // first atom) -> its late sends (step, move); those send pieces are no events.
    std::map<std::tuple<size_t, size_t, int>, std::vector<std::pair<size_t, size_t>>> late_of;
    std::set<std::tuple<size_t, size_t, int>> late_send;
    for (size_t t = 0; t < T && fuse && late != LateSends::kNone && hier; ++t)
      for (size_t k = 0; k < sch.steps[t].size(); ++k) {
        const ici::Move& m = sch.steps[t][k];
        if (m.src != static_cast<int>(r) || !on_chip(m.src, m.dst) || fused_move[{t, k}]) continue;
        for (const auto& [a0, a1] : sp.move_pieces[t][k]) {
          // the last write of every atom: one copying consume of exactly this piece,
          // before step t, and no consume after it
          std::optional<std::pair<size_t, size_t>> w;
          bool ok = true;
          for (int a = a0; a < a1 && ok; ++a) {
            std::optional<std::pair<size_t, size_t>> last;
            for (const auto& [st, mv, is_send] : acc[static_cast<size_t>(a)])
              if (!is_send) last = std::make_pair(st, mv);
            ok = last && last->first < t && (!w || *w == *last);
            w = last;
          }
          // (a sum's, too, when outside the streams: one more DMA from its VMEM result)
          if (!ok || (sch.steps[w->first][w->second].reduce && late != LateSends::kOutside)) continue;
          const auto& src_pieces = sp.move_pieces[w->first][w->second];
          if (std::find(src_pieces.begin(), src_pieces.end(), std::make_pair(a0, a1)) == src_pieces.end()) continue;
          late_of[{w->first, w->second, a0}].emplace_back(t, k);
          late_send.emplace(t, k, a0);
        }
      }
    // Candidates in the preferred order (step; its sends from HBM, then its consumes,
    // piece position round robin over the moves); the ordering run below picks from
    // the first kWindow of them.
    auto& cand = cands[r];
    for (size_t t = 0; t < T; ++t) {
      std::vector<size_t> out, in;
      for (size_t k = 0; k < sch.steps[t].size(); ++k) {
        if (sch.steps[t][k].src == static_cast<int>(r) && !fused_move[{t, k}]) out.push_back(k);
        if (sch.steps[t][k].dst == static_cast<int>(r)) in.push_back(k);
      }
      for (int pass = 0; pass < 2; ++pass)
        for (size_t p = 0;; ++p) {
          bool any = false;
          for (size_t k : pass == 0 ? out : in) {
            if (p >= sp.move_pieces[t][k].size()) continue;
            any = true;
            const auto [a0, a1] = sp.move_pieces[t][k][p];
            if (pass == 0 && late_send.count({t, k, a0})) continue;
            Cand c;
            c.e = StreamEvent{pass == 0, t, k, a0, a1, {}, {}, true, true};
            int xs = 0;
            for (int a = a0; a < a1; ++a) {
              int w = 0, sd = 0;
              for (const auto& [st, mv, is_send] : acc[static_cast<size_t>(a)]) {
                if (!is_send && st < t) ++w;
                if (pass == 1 && is_send && st <= t) ++sd;
              }
              c.need_writes.push_back(w);
              c.need_sends.push_back(sd);
              xs += w == 0;
            }
            // A piece is read from x or from y as a whole.
            if (xs != 0 && xs != a1 - a0) return "a piece partly written before its step";
            c.e.local_from_x = c.e.from_x = xs != 0;
            if (when_needed && pass == 0 && c.e.from_x && on_chip(static_cast<int>(r), sch.steps[t][k].dst)) {
              const size_t u = onchip_next_use.at({t, k, a0});
              if (u < T && u - 1 > t) c.when_done = static_cast<int64_t>(u - 1);
            }
            if (pass == 1) {
              const bool reduce = sch.steps[t][k].reduce;
              for (const auto& [st, mv, is_send] : acc[static_cast<size_t>(a0)])
                if (st == t + 1 && is_send && fused_move[{st, mv}]) c.e.fused.emplace_back(st, mv);
              // (after the sends on, so a consume's first fused send is a stream's
              // when it has one: that send's slot names the send buffer)
              if (auto ls = late_of.find({t, k, a0}); ls != late_of.end())
                for (const auto& [t2, k2] : ls->second) {
                  c.e.fused.emplace_back(t2, k2);
                  if (late == LateSends::kOutside) sp.outside.emplace(t2, k2, a0);
                }
              for (int a = a0; a < a1 && reduce; ++a) {
                // The next use of the value decides: a read (a send from y, an add
                // into it) needs it stored; a copy landing over it does not.
                bool store = true;  // the final value, if nothing follows
                for (const auto& [st, mv, is_send] : acc[static_cast<size_t>(a)]) {
                  if (st <= t || (is_send && st == t + 1 && fused_move[{st, mv}])) continue;
                  store = is_send || sch.steps[st][mv].reduce;
                  break;
                }
                if (!store) continue;
                if (!c.e.store.empty() && c.e.store.back().second == a)
                  c.e.store.back().second = a + 1;
                else
                  c.e.store.emplace_back(a, a + 1);
              }
            }
            cand.push_back(c);
          }
          if (!any) break;
        }
    }
  }
  // An outside late send's receiver has nothing to do for it until the op's end.
  if (!sp.outside.empty()) {
    sp.outside_flag = sp.stream_first + 2 * sp.most * sp.K;
    if (sp.outside_flag >= (wide ? isa::kSyncFlags : kSendBufFirstFlag)) return "no flag left for the late sends outside the streams";
    for (size_t r = 0; r < P; ++r)
      cands[r].erase(std::remove_if(cands[r].begin(), cands[r].end(),
                                    [&](const Cand& c) { return !c.e.send && sp.is_outside(c.e.step, c.e.move, c.e.atom); }),
                     cands[r].end());
  }
  // Stream lengths (pieces per ordered pair), fixed by the schedule.
  std::map<std::pair<int, int>, int64_t> len;
  for (size_t t = 0; t < T; ++t)
    for (size_t k = 0; k < sch.steps[t].size(); ++k)
      for (const auto& pc : sp.move_pieces[t][k])
        len[{sch.steps[t][k].src, sch.steps[t][k].dst}] += !sp.is_outside(t, k, pc.first);
  // Every replica's program order: a run of all replicas in which the event that can
  // start first (of any replica, among its next kWindow candidates) goes next; an
  // event can start when its data is there (its landing sent, its own earlier writes
  // and reads of the atom done) and its sends have a free slot (the receiver used the
  // atom K earlier on that slot). A program order taken from such a run only ever
  // waits for what comes earlier in the run, so the programs cannot deadlock; the
  // run stalling means this schedule does not stream with K slots. A window of 32
  // left a chip's last on-chip all-gather sends (the schedule's last step, at the
  // end of every replica's list) until the torus all-gather was over, a tail bound
  // by HBM (v2-4x4 16 MiB: 180,898 cycles; 171,031 with 256).
  constexpr size_t kWindow = 256;
  // The run's bookkeeping is indexed densely (a map lookup per check was most of a
  // v4-4x4x4 compile): each stream (ordered pair that exchanges pieces) has an id,
  // and each piece of the schedule (a move's piece, by its first atom) one.
  std::vector<int> stream_of(P * P, -1);
  int streams = 0;
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step)
      if (int& id = stream_of[static_cast<size_t>(m.src) * P + static_cast<size_t>(m.dst)]; id < 0) id = streams++;
  auto sid = [&](int src, int dst) {
    return static_cast<size_t>(stream_of[static_cast<size_t>(src) * P + static_cast<size_t>(dst)]);
  };
  std::vector<int64_t> sent(static_cast<size_t>(streams), 0);
  std::vector<std::vector<int>> writes_done(P, std::vector<int>(A, 0)), sends_done(P, std::vector<int>(A, 0));
  std::vector<size_t> first(P, 0);
  std::vector<std::vector<char>> done(P);
  size_t left = 0;
  for (size_t r = 0; r < P; ++r) {
    done[r].assign(cands[r].size(), 0);
    left += cands[r].size();
  }
  // A pool's pieces of a stream take its slots in turn: the c-th goes to slot
  // pool * Kp + c % Kp, which is free once the receiver used the slot's previous
  // piece (the uses of a slot are sequential; the receiver may use different
  // slots' pieces in any order).
  const size_t Pl = static_cast<size_t>(pools), Ks = static_cast<size_t>(sp.K);
  std::vector<int64_t> pool_sent(static_cast<size_t>(streams) * Pl, 0);     // [stream][pool]: pieces sent
  std::vector<int64_t> last_in_slot(static_cast<size_t>(streams) * Ks, -1);  // [stream][slot]: its latest piece m
  std::vector<std::vector<char>> used(static_cast<size_t>(streams));        // per stream and piece m: the receiver used it
  auto next_slot = [&](int src, int dst, int pool) {
    const int64_t c = pool_sent[sid(src, dst) * Pl + static_cast<size_t>(pool)];
    return std::make_pair(pool * Kp + static_cast<int>(c % Kp), c / Kp);
  };
  auto slot_prev = [&](int src, int dst, int pool) -> int64_t {
    return last_in_slot[sid(src, dst) * Ks + static_cast<size_t>(next_slot(src, dst, pool).first)];
  };
  // Pieces still to send per stream, pool and step: a stream sends a pool's steps in
  // order, so a later step's pieces never fill the slots an earlier step's piece needs.
  std::vector<std::map<size_t, int64_t>> to_send(static_cast<size_t>(streams) * Pl);  // [stream][pool]
  // piece_of(t, k, a): the id of move k of step t's piece that starts at atom a.
  std::vector<std::vector<size_t>> piece_base(T);
  size_t pieces = 0;
  for (size_t t = 0; t < T; ++t)
    for (size_t k = 0; k < sch.steps[t].size(); ++k) {
      piece_base[t].push_back(pieces);
      pieces += sp.move_pieces[t][k].size();
      for (const auto& pc : sp.move_pieces[t][k])
        if (!sp.is_outside(t, k, pc.first))
          ++to_send[sid(sch.steps[t][k].src, sch.steps[t][k].dst) * Pl + static_cast<size_t>(pool_of(t, k))][t];
    }
  auto piece_of = [&](size_t t, size_t k, int a) {
    const auto& v = sp.move_pieces[t][k];
    size_t i = 0;
    while (v[i].first != a) ++i;
    return piece_base[t][k] + i;
  };
  for (size_t r = 0; r < P; ++r)
    for (Cand& c : cands[r])
      if (!c.e.send) c.piece_id = piece_of(c.e.step, c.e.move, c.e.atom);
  // Piece prev of stream st (-1: none) used by its receiver: its slot is free again.
  auto slot_freed = [&](size_t st, int64_t prev) { return prev < 0 || used[st][static_cast<size_t>(prev)]; };
  auto slot_free = [&](int src, int dst, size_t t, int pool) {
    const auto& pend = to_send[sid(src, dst) * Pl + static_cast<size_t>(pool)];
    if (!pend.empty() && pend.begin()->first < t) return false;
    return slot_freed(sid(src, dst), slot_prev(src, dst, pool));
  };
  // The run is timed with a rough cost model (the preset-independent v4 fit of a
  // neighbour message, 64 B/cycle on a link, 512 on chip, an add 4 cycles per tile)
  // so the order it leaves is the order the landings are expected in; the replica
  // and event that can start first go next. Only the order depends on the model.
  std::vector<int64_t> clock(P, 0);
  std::vector<int64_t> land_at(pieces, -1);  // per piece, when it lands (-1: not sent yet)
  std::vector<std::vector<int64_t>> credit_at(static_cast<size_t>(streams));  // per stream: when piece m's slot is free again
  std::vector<int64_t> link_free(static_cast<size_t>(streams), 0);
  std::vector<std::vector<int64_t>> write_at(P, std::vector<int64_t>(A, 0)), stored_at(P, std::vector<int64_t>(A, 0));
  auto bytes_of = [&](int a0, int a1) {
    return (sp.atoms[static_cast<size_t>(a1 - 1)].second - sp.atoms[static_cast<size_t>(a0)].first) * 4;
  };
  // When piece prev's credit is back at its sender (0: no piece, or not used yet).
  auto credit_time = [&](size_t st, int64_t prev) -> int64_t {
    if (prev < 0) return 0;
    const auto& c = credit_at[st];
    return static_cast<size_t>(prev) < c.size() ? c[static_cast<size_t>(prev)] : 0;
  };
  auto slot_time = [&](int src, int dst, int pool) { return credit_time(sid(src, dst), slot_prev(src, dst, pool)); };
  // Deferred sends (docs/codegen.md "Deferred sends"): a consume whose one fused
  // send goes on a stream makes its sum in that send's buffer, credits its source
  // and is done; the send is an event of its own, taken once the receiver's slot
  // is free. A piece's send is reserved (its place m in the stream, so its slot and
  // buffer) when its consume is taken and timed when the send is.
  // Per stream and piece m: the piece before it in its slot (-1: none), when its
  // send is through the link (-1: not yet), whether it is a deferred send.
  std::vector<std::vector<int64_t>> prev_in_slot(static_cast<size_t>(streams)), send_end(static_cast<size_t>(streams));
  std::vector<std::vector<char>> deferred_piece(static_cast<size_t>(streams));
  struct Deferred {
    StreamEvent e;
    int64_t ready, m;
  };
  std::vector<std::vector<Deferred>> deferred(P);
  size_t deferred_left = 0;
  // A piece's place in its stream (its slot, so the receiver's landing flag and
  // the sender's buffer), and the bookkeeping of a send taken.
  auto reserve = [&](int src, size_t t, size_t k, int a, int a_end) -> int64_t {
    const int dst = sch.steps[t][k].dst, pool = pool_of(t, k);
    auto& v = sp.stream[{src, dst}];
    const int64_t m = static_cast<int64_t>(v.size());
    sp.index[{src, t, k, a}] = m;
    v.emplace_back(t, k, a);
    const auto slot = next_slot(src, dst, pool);
    sp.slot_use[{src, dst}].push_back(slot);
    const size_t st = sid(src, dst);
    prev_in_slot[st].push_back(last_in_slot[st * Ks + static_cast<size_t>(slot.first)]);
    deferred_piece[st].push_back(0);
    send_end[st].push_back(-1);
    last_in_slot[st * Ks + static_cast<size_t>(slot.first)] = m;
    ++pool_sent[st * Pl + static_cast<size_t>(pool)];
    used[st].push_back(0);
    ++sent[st];
    auto& pend = to_send[st * Pl + static_cast<size_t>(pool)];
    if (--pend[t] == 0) pend.erase(t);
    for (int b = a; b < a_end; ++b) ++sends_done[static_cast<size_t>(src)][static_cast<size_t>(b)];
    return m;
  };
  // A reserved piece's send at `at`: the link's time and the landing's.
  auto time_send = [&](int src, int dst, int64_t m, size_t t, size_t k, int a, int a_end, int64_t at) {
    const size_t st = sid(src, dst);
    const bool oc = on_chip(src, dst);
    int64_t& lf = link_free[st];
    lf = std::max(lf, at + (oc ? 414 : 1243)) + bytes_of(a, a_end) / (oc ? 512 : 64);
    land_at[piece_of(t, k, a)] = lf + (oc ? 0 : 698);
    send_end[st][static_cast<size_t>(m)] = lf;
  };
  auto do_send = [&](int src, size_t t, size_t k, int a, int a_end, int64_t at) {
    const int dst = sch.steps[t][k].dst;
    if (sp.is_outside(t, k, a)) {  // outside the streams: only the link's time
      for (int b = a; b < a_end; ++b) ++sends_done[static_cast<size_t>(src)][static_cast<size_t>(b)];
      int64_t& lf = link_free[sid(src, dst)];
      lf = std::max(lf, at + 414) + bytes_of(a, a_end) / 512;
      return;
    }
    const int64_t m = reserve(src, t, k, a, a_end);
    time_send(src, dst, m, t, k, a, a_end, at);
  };
  // move_gate[t][k] >= 0: the move's events wait until the replica has done all its
  // events of steps up to that one (lowest[r]: its first step with events left).
  std::vector<std::vector<int64_t>> step_left(P, std::vector<int64_t>(T, 0));
  std::vector<size_t> lowest(P, 0);
  for (size_t r = 0; r < P; ++r)
    for (const Cand& c : cands[r]) ++step_left[r][c.e.step];
  auto advance_lowest = [&](size_t r) {
    while (lowest[r] < T && step_left[r][lowest[r]] == 0) ++lowest[r];
  };
  for (size_t r = 0; r < P; ++r) advance_lowest(r);
  // A reducing consume whose one fused send is a stream's, with nothing to store
  // (so its send buffer's flag counts only sends): its send is deferred.
  auto deferrable = [&](const Cand& c) {
    const StreamEvent& e = c.e;
    return defer_sends && !e.send && e.fused.size() == 1 && e.store.empty() && sch.steps[e.step][e.move].reduce &&
           !sp.is_outside(e.fused.front().first, e.fused.front().second, e.atom);
  };
  // When a candidate of replica r could start, or -1 if it cannot yet.
  auto start_of = [&](size_t r, const Cand& c) -> int64_t {
    const StreamEvent& e = c.e;
    if (!move_gate.empty() && move_gate[e.step][e.move] >= static_cast<int64_t>(lowest[r])) return -1;
    for (int64_t q = static_cast<int64_t>(e.step) + 1; q <= c.when_done; ++q)
      if (step_left[r][static_cast<size_t>(q)] > 0) return -1;
    const ici::Move& mv = sch.steps[e.step][e.move];
    int64_t t = clock[r], stored = 0;
    for (int b = e.atom; b < e.atom_end; ++b) {
      const size_t a = static_cast<size_t>(b), i = static_cast<size_t>(b - e.atom);
      if (writes_done[r][a] < c.need_writes[i] || (!e.send && sends_done[r][a] < c.need_sends[i])) return -1;
      t = std::max(t, write_at[r][a]);
      stored = std::max(stored, stored_at[r][a]);
    }
    if (e.send) {
      const int pool = pool_of(e.step, e.move);
      if (!slot_free(static_cast<int>(r), mv.dst, e.step, pool)) return -1;
      return std::max({t, e.from_x ? int64_t(0) : stored, slot_time(static_cast<int>(r), mv.dst, pool)});
    }
    const int64_t landed = land_at[c.piece_id];
    if (landed < 0) return -1;
    t = std::max(t, landed);
    if (deferrable(c)) {
      // No wait for the receiver's slot, only for the reservation's order (a
      // pool's steps in order) and the send buffer: the slot's previous piece
      // sent (a deferred send taken) and through the link.
      const auto [t2, k2] = e.fused.front();
      const int d = sch.steps[t2][k2].dst, pool = pool_of(t2, k2);
      const auto& pend = to_send[sid(static_cast<int>(r), d) * Pl + static_cast<size_t>(pool)];
      if (!pend.empty() && pend.begin()->first < t2) return -1;
      const int64_t prev = slot_prev(static_cast<int>(r), d, pool);
      const size_t st = sid(static_cast<int>(r), d);
      if (prev >= 0 && !deferred_piece[st][static_cast<size_t>(prev)]) {
        // The buffer's last send counted on the send flag: the program waits for
        // the credit that frees the slot, as an undeferred consume does.
        if (!slot_freed(st, prev)) return -1;
        return std::max(t, credit_time(st, prev));
      }
      if (prev >= 0) {
        const int64_t done_at = send_end[st][static_cast<size_t>(prev)];
        if (done_at < 0) return -1;
        t = std::max(t, done_at);
      }
      return t;
    }
    for (const auto& [t2, k2] : e.fused) {
      if (sp.is_outside(t2, k2, e.atom)) continue;
      const int d = sch.steps[t2][k2].dst, pool = pool_of(t2, k2);
      if (!slot_free(static_cast<int>(r), d, t2, pool)) return -1;
      t = std::max(t, slot_time(static_cast<int>(r), d, pool));
    }
    return t;
  };
  auto take = [&](size_t r, const Cand& c, int64_t at) {
    const StreamEvent& e = c.e;
    const ici::Move& mv = sch.steps[e.step][e.move];
    if (e.send) {
      do_send(static_cast<int>(r), e.step, e.move, e.atom, e.atom_end, at);
      clock[r] = at + 8;
    } else {
      const int64_t m = sp.index.at({mv.src, e.step, e.move, e.atom});
      used[sid(mv.src, static_cast<int>(r))][static_cast<size_t>(m)] = 1;
      const int64_t end = at + 16 + (mv.reduce ? 4 : 0) * ((bytes_of(e.atom, e.atom_end) / 4 + kTileElems - 1) / kTileElems);
      auto& cr = credit_at[sid(mv.src, static_cast<int>(r))];
      if (cr.size() <= static_cast<size_t>(m)) cr.resize(static_cast<size_t>(m) + 1, 0);
      cr[static_cast<size_t>(m)] = end + (on_chip(mv.src, static_cast<int>(r)) ? 414 : 1941);
      for (int b = e.atom; b < e.atom_end; ++b) {
        ++writes_done[r][static_cast<size_t>(b)];
        write_at[r][static_cast<size_t>(b)] = end;
      }
      for (const auto& [b0, b1] : e.store)
        for (int b = b0; b < b1; ++b) stored_at[r][static_cast<size_t>(b)] = end + 700;
      if (deferrable(c)) {
        const auto [t2, k2] = e.fused.front();
        const size_t st = sid(static_cast<int>(r), sch.steps[t2][k2].dst);
        const int64_t m2 = reserve(static_cast<int>(r), t2, k2, e.atom, e.atom_end);
        deferred_piece[st][static_cast<size_t>(m2)] = 1;
        const int64_t prev = prev_in_slot[st][static_cast<size_t>(m2)];
        StreamEvent ds{true, t2, k2, e.atom, e.atom_end, {}, {}, false, false};
        ds.deferred = true;
        deferred[r].push_back(Deferred{ds, end, m2});
        ++deferred_left;
        StreamEvent ce = e;
        ce.defer_first = true;
        ce.credit_frees_buffer = prev >= 0 && !deferred_piece[st][static_cast<size_t>(prev)];
        sp.prog[r].push_back(ce);
        clock[r] = end;
        --step_left[r][e.step];
        advance_lowest(r);
        return;
      }
      for (const auto& [t2, k2] : e.fused) do_send(static_cast<int>(r), t2, k2, e.atom, e.atom_end, end);
      clock[r] = end;
    }
    sp.prog[r].push_back(e);
    --step_left[r][e.step];
    advance_lowest(r);
  };
  // Each replica's earliest startable candidate in its window, kept in a set by
  // start; an event changes only its replica's and its peers' candidates.
  std::vector<std::pair<int64_t, size_t>> best(P, {-1, 0});
  std::set<std::pair<int64_t, size_t>> ready;
  auto refresh = [&](size_t r, bool wide) {
    if (best[r].first >= 0) ready.erase({best[r].first, r});
    best[r] = {-1, 0};
    while (first[r] < cands[r].size() && done[r][first[r]]) ++first[r];
    for (size_t i = first[r], seen = 0; i < cands[r].size() && (wide || seen < kWindow); ++i) {
      if (done[r][i]) continue;
      ++seen;
      const int64_t t = start_of(r, cands[r][i]);
      if (t >= 0 && (best[r].first < 0 || t < best[r].first)) best[r] = {t, i};
    }
    // The deferred sends waiting for their slots (best[r].second past the window:
    // deferred[r][second - cands[r].size()]).
    for (size_t i = 0; i < deferred[r].size(); ++i) {
      const Deferred& x = deferred[r][i];
      const int d = sch.steps[x.e.step][x.e.move].dst;
      const size_t st = sid(static_cast<int>(r), d);
      const int64_t prev = prev_in_slot[st][static_cast<size_t>(x.m)];
      if (!slot_freed(st, prev)) continue;
      const int64_t t = std::max({clock[r], x.ready, credit_time(st, prev)});
      // first on a tie: the link waits for it
      if (best[r].first < 0 || t <= best[r].first) best[r] = {t, cands[r].size() + i};
    }
    if (best[r].first >= 0) ready.insert({best[r].first, r});
  };
  for (size_t r = 0; r < P; ++r) refresh(r, false);
  while (left > 0 || deferred_left > 0) {
    bool progress = false;
    // A short window first (the run costs events x window); the whole list only
    // when nothing in the windows can go.
    for (int pass = 0; pass < 2 && !progress; ++pass) {
      if (pass == 1)
        for (size_t r = 0; r < P; ++r) refresh(r, true);
      if (ready.empty()) continue;
      const size_t br = ready.begin()->second;
      const auto [at, bi] = best[br];
      progress = true;
      if (bi >= cands[br].size()) {  // a deferred send
        const Deferred x = deferred[br][bi - cands[br].size()];
        deferred[br].erase(deferred[br].begin() + static_cast<std::ptrdiff_t>(bi - cands[br].size()));
        --deferred_left;
        const int d = sch.steps[x.e.step][x.e.move].dst;
        time_send(static_cast<int>(br), d, x.m, x.e.step, x.e.move, x.e.atom, x.e.atom_end, at);
        sp.prog[br].push_back(x.e);
        clock[br] = at + 8;
      } else {
        take(br, cands[br][bi], at);
        done[br][bi] = 1;
        --left;
      }
      refresh(br, false);
      for (int q : sp.sources[br]) refresh(static_cast<size_t>(q), false);
      for (int q : sp.dests[br]) refresh(static_cast<size_t>(q), false);
    }
    if (!progress) return "the streamed programs would stall with " + std::to_string(sp.K) + " slots per stream";
  }
  sp.makespan = *std::max_element(clock.begin(), clock.end());
  for (const auto& [key, n] : len)
    if (const int64_t got = sent[sid(key.first, key.second)]; got != n)
      return "internal: a stream sent " + std::to_string(got) + " of " + std::to_string(n) + " atoms";
  return "";
}

// From slice_elems (LowerOptions::stream_slice_elems) per replica the streamed
// programs run the schedule on slices: every segment between two chunk boundaries
// of the schedule is cut into S parts, slice j is part j of every segment and takes
// the schedule's moves of the segments' parts j. So every element goes through the
// same moves as in the schedule (the add order is the schedule's). Slice j's step t
// is step j * lag + t of the result, so slice j + 1's reduce-scatter runs while
// slice j gathers. Without slices a block of a big buffer has many more pieces than
// a stream has slots, sends straight from the VMEM sums would stall the ordering
// run, and every sum is sent from y instead.
constexpr size_t kStreamSliceLag = 2;

// The block (all_reduce_blocks' starts) a move of a blocked schedule belongs to.
int64_t block_of(const ici::Schedule& sch, const std::vector<int64_t>& blocks, const ici::Move& m) {
  const int64_t at = sch.chunks[static_cast<size_t>(m.src_chunk)].offset;
  return static_cast<int64_t>(std::upper_bound(blocks.begin(), blocks.end(), at) - blocks.begin()) - 1;
}

ici::Schedule slice_schedule(const ici::Schedule& sch, int64_t slice_elems, int64_t piece, int pools,
                             std::vector<std::vector<int>>& move_pool, const std::vector<int64_t>& blocks) {
  move_pool.clear();
  if (blocks.size() > 1) {
    // Contiguous blocks (all_reduce_blocks), already staggered by the schedule:
    // with pools, block b takes pool b % pools.
    if (pools > 1)
      for (const auto& step : sch.steps) {
        move_pool.emplace_back();
        for (const ici::Move& m : step) move_pool.back().push_back(static_cast<int>(block_of(sch, blocks, m) % pools));
      }
    return sch;
  }
  std::vector<int64_t> cuts{0, sch.elements};
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step)
      for (int c : {m.src_chunk, m.dst_chunk}) {
        if (m.src_chunk != m.dst_chunk) return sch;  // plan_stream says why it does not stream
        const ici::Chunk& k = sch.chunks[static_cast<size_t>(c)];
        cuts.push_back(k.offset);
        cuts.push_back(k.offset + k.elems);
      }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  int64_t shortest = sch.elements, longest = 0;  // segments between two cuts
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    shortest = std::min(shortest, cuts[i + 1] - cuts[i]);
    longest = std::max(longest, cuts[i + 1] - cuts[i]);
  }
  // The fewest slices whose parts are at most a piece, so a part is one message
  // (and, with pools, a pool's slots can hold twice a step's pieces). Parts of at
  // least a piece, as before session 52, sent a part just over a piece as a piece
  // and a sliver, whose extra messages stalled the one-pool plan: v3-8 9 / 13 / 17
  // MiB took the two-pool one, 86,392 / 118,856 / 141,435 cycles, against 65,780 /
  // 86,794 / 113,733 (docs/codegen.md "Streamed lowering"). One pool takes parts
  // of at most 3/4 of a piece, and no more slices than 3/4 of slice_elems makes:
  // with parts of a whole piece every hop waits for all of one while the next
  // slice's steps overlap it anyway (v3-8 8 / 16 / 32 / 64 MiB: 58,685 / 103,118 /
  // 185,092 / 350,929 cycles on 2 / 4 / 8 / 16 slices, 55,100 / 96,481 / 180,371 /
  // 347,373 on 3 / 6 / 11 / 22). Parts of half a piece lost again at 16 MiB
  // (103,029 on 8 slices): a part's fixed costs no longer hide.
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t S = ceil_div(sch.elements, slice_elems) < 2 ? 1
                    : pools > 1 ? ceil_div(longest, piece)
                                : std::min(ceil_div(sch.elements * 4, slice_elems * 3), ceil_div(shortest * 4, piece * 3));
  if (S < 2) return sch;
  ici::Schedule out = sch;
  out.name = sch.name + "|slices=" + std::to_string(S);
  out.chunks.clear();
  // part_chunk[i][j]: the chunk of segment i's part j (tile-aligned within the segment)
  std::vector<std::vector<int>> part_chunk(cuts.size() - 1);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const int64_t len = cuts[i + 1] - cuts[i];
    for (int64_t j = 0; j < S; ++j) {
      const int64_t lo = j == 0 ? 0 : len * j / S / kTileElems * kTileElems;
      const int64_t hi = j + 1 == S ? len : len * (j + 1) / S / kTileElems * kTileElems;
      part_chunk[i].push_back(static_cast<int>(out.chunks.size()));
      out.chunks.push_back(ici::Chunk{cuts[i] + lo, hi - lo});
    }
  }
  const size_t T = sch.steps.size();
  const size_t lag = pools > 1 ? (T + static_cast<size_t>(pools) - 1) / static_cast<size_t>(pools) : kStreamSliceLag;
  out.name += "|lag=" + std::to_string(lag);
  out.steps.assign(static_cast<size_t>(S - 1) * lag + T, {});
  move_pool.assign(out.steps.size(), {});
  for (int64_t j = 0; j < S; ++j)
    for (size_t t = 0; t < T; ++t)
      for (const ici::Move& m : sch.steps[t]) {
        const ici::Chunk& c = sch.chunks[static_cast<size_t>(m.src_chunk)];
        const size_t i0 = static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), c.offset) - cuts.begin());
        for (size_t i = i0; i + 1 < cuts.size() && cuts[i + 1] <= c.offset + c.elems; ++i) {
          const int pc = part_chunk[i][static_cast<size_t>(j)];
          if (out.chunks[static_cast<size_t>(pc)].elems == 0) continue;
          ici::Move p = m;
          p.src_chunk = p.dst_chunk = pc;
          out.steps[static_cast<size_t>(j) * lag + t].push_back(p);
          move_pool[static_cast<size_t>(j) * lag + t].push_back(static_cast<int>(j % pools));
        }
      }
  out.inputs.clear();
  out.results.clear();
  return out;
}
}  // namespace

// Blocks: block b + 1's first step (its on-chip reduce-scatter) waits, in the
// ordering run and so in every program, until the replica has done its events of
// the steps up to block b's reduce-scatter over the first torus dimension (steps
// 0..kmin-1, kmin the smallest torus dimension). Left to the greedy run, blocks b
// and b + 1 started together (b + 2 waits for b's last step in their pool's
// slots), so each pair did its link-bound steps at the same time and its
// latency-bound ones (the small deep-dimension steps) at the same time: the links
// idled ~40% (v4-4x4x4 64 MiB, ~106 K cycles a block against 66.6 K of link time).
// v4-4x4x4 32 MiB: 407,597 cycles ungated; gated after block b's steps 0 / 0..1 /
// 0..2 / 0..3 (this) / 0..6: 377,845 / 382,015 / 378,854 / 384,874 / 405,315 (only
// 0..3 measured at 64 MiB too). Per move, the step plan_stream's gate waits for, or
// -1; empty for an unblocked schedule.
std::vector<std::vector<int64_t>> block_start_gates(const ici::Schedule& sch, const std::vector<int64_t>& blocks,
                                                    int kmin) {
  std::vector<std::vector<int64_t>> gate;
  if (blocks.size() <= 1) return gate;
  int64_t lag = -1;  // block 1's first step
  for (size_t t = 0; t < sch.steps.size() && lag < 0; ++t)
    for (const ici::Move& m : sch.steps[t])
      if (block_of(sch, blocks, m) == 1) lag = static_cast<int64_t>(t);
  for (size_t t = 0; t < sch.steps.size(); ++t) {
    gate.emplace_back();
    for (const ici::Move& m : sch.steps[t]) {
      const int64_t b = block_of(sch, blocks, m);
      gate.back().push_back(b >= 1 && static_cast<int64_t>(t) == b * lag ? (b - 1) * lag + kmin - 1 : -1);
    }
  }
  return gate;
}

// all_reduce(x): with one replica the identity; otherwise every replica holds an
// fp32 work buffer W and runs the schedule's steps: the chunks it sends go by DMA
// into receive slots of the destination replica (rflag there), and each move it
// receives is combined after the landing: W[chunk] = received + W[chunk] (vadd,
// received on the left, as the schedule's add order says) or W[chunk] = received.
// Receive slots are distinct per (step, move), at the same offsets in every
// replica, so no slot is reused within the collective. Every replica first tells
// each replica that sends to it that it has entered the collective (a 4-byte token
// DMA, its rflag on the sender), and a sender waits for that before its first send.
//
// VMEM mode (W and the slots fit the core's VMEM): W and the slots live in VMEM,
// sends are staged copies, one DMA per (step, destination), VMEM to the
// neighbour's VMEM, and a combine is vld/vadd/vst, with masked stores for a chunk's
// ragged last tile. HBM mode (larger buffers): W and the slots are HBM scratch of
// this node, one DMA per move, combines stream double-buffered pieces of up to 256
// tiles through VMEM. docs/codegen.md "Collectives" has the whole story.
void Emitter::lower_all_reduce(const Node& n) {
  const ReplicaSpec& s = opt_.replicas;
  if (s.replicas <= 1) {
    lower_copy(n);
    return;
  }
  const Placed X = t_.at(n.inputs[0]);
  const Placed Y = t_.at(n.output);
  const int64_t E = num_elements(n.type.shape);
  const bool f32 = n.type.dtype == DType::kF32;
  std::shared_ptr<const ici::Schedule> kept;  // the same for every replica's lowering
  std::vector<int64_t> blocks;
  try {
    kept = shared_all_reduce_schedule(s, E);
    blocks = all_reduce_blocks(s, E);
  } catch (const CompileError& e) {
    fail(n, e.what());  // too many blocks for the buffer: name the node
  }
  const ici::Schedule& sch = *kept;
  // A note (LowerResult::notes) about this all_reduce, named as the user wrote it.
  auto op_note = [&](const std::string& what) {
    note_once("all_reduce %" + n.output + " (op " + std::to_string(n.id) + "): " + what);
  };
  // The torus algorithm runs on the replica topology; where that is a ring, it is
  // a bidirectional ring of 2(R - 1) steps, not the torus asked for.
  if (sch.algorithm == ici::Algorithm::kTorus)
    if (const std::string why = replica_topology_note(s); !why.empty())
      op_note("the torus algorithm runs on " + replica_topology(s).name() + ": " + why);
  const int me = opt_.replica;
  const int64_t tile_bytes = kTileElems * 4;
  const int64_t kPieceElems =
      std::max<int64_t>(1, std::min<int64_t>(kMaxPieceTiles, static_cast<int64_t>(opt_.target.vmem_bytes) / (4 * tile_bytes))) *
      kTileElems;

  // The hierarchical algorithm always streams in fp32, and so do the others, but
  // for the bidirectional ring and the torus algorithm where a move stays on a
  // chip: those from a widest chunk of half or a quarter of a piece
  // (LowerOptions::stream_from_elems).
  // The step-ordered lowering below takes a chunk whole (land in y, load, add,
  // store, send), so nothing overlaps within a step: v3-8 16 MiB, bidir-ring
  // 379,839 cycles (1.81x its closed form) step-ordered against 202,130 (0.96x)
  // streamed. With the entry tokens sent early (replicate.cpp) small ones gain
  // too (docs/codegen.md "When the others stream", op cycles): v5e-8 torus 512
  // KiB 38,366 -> 27,947, v3-8 ring 1 KiB 19,623 -> 17,714. Over two-core chips
  // the step-ordered bidirectional ring and torus algorithm send a peer one
  // message a step, one peer on chip, and win: v3-8 torus 16 KiB 12,513 against
  // 15,293 streamed. They do so up to half a piece a chunk for the bidirectional
  // ring (v4-8 1.5 MiB 37,150 against 40,279), but only up to a quarter for the
  // torus algorithm, whose widest chunk is the first of several dimensions' steps
  // (v4-8 768 KiB 20,577 against 18,283; a quarter piece is also where a piece
  // ends at the next step's chunks, so its sum goes on from VMEM).
  int64_t stream_from = opt_.stream_from_elems;
  if (stream_from <= 0) {
    const bool torus = sch.algorithm == ici::Algorithm::kTorus && replica_topology(s).num_dims() >= 2;
    const bool two_way = sch.algorithm == ici::Algorithm::kBidirectionalRing || sch.algorithm == ici::Algorithm::kTorus;
    stream_from = !two_way || !moves_on_chip(s, sch) ? 1 : opt_.stream_piece_elems / (torus ? 4 : 2);
  }
  if (f32 && (sch.algorithm == ici::Algorithm::kHierarchical || widest_chip_chunk(sch) >= stream_from)) {
    const int64_t piece = opt_.stream_piece_elems;
    // Three tries, the first that plans wins (docs/codegen.md "Streamed lowering"):
    // 1. sums sent straight from VMEM (fused), slices two steps apart sharing each
    //    stream's slots;
    // 2. fused, slices ceil(T / 2) steps apart in two slot pools (odd and even
    //    slices), so the slices of one pool never overlap: where the first stalls
    //    (a ring's slots all holding landings whose sums wait for a slot downstream,
    //    v2-4x4 from 32 MiB), this one does not while a pool has at least twice a
    //    stream's pieces of one step, so slots are 16 per stream and pieces as
    //    large as the VMEM then allows;
    // 3. every sum through y (unfused), sliced as in 1 or not, whichever the ordering
    //    run expects to finish first.
    // A blocked schedule (all_reduce_blocks, 16 chips or more) is already staggered:
    // its blocks stand for the slices, block b in pool b % 2 in try 2.
    // Instruction streams (docs/codegen.md "Two streams", "Three streams"):
    // LowerOptions::all_reduce_streams, or by default two where the chips form a
    // 3-D torus (a core forwards three rings; v4-4x4x4 32 / 64 MiB 384,874 / 783,331
    // -> 368,140 / 742,241 cycles; three pools do not plan there) and three for the
    // hierarchical algorithm on a 2-D one, whose kept-sum VMEM in thirds holds
    // enough only with the on-chip pieces when needed (plan_stream): v2-4x4 64 MiB
    // 521,630 cycles on one stream, 526,194 on three without them, 463,398 with.
    int torus_dims = 0, kmin = INT32_MAX;  // the chip torus's dimensions of 2 or more, the smallest of them
    const ici::Topology chips = chip_topology(s);
    for (int d : chips.dims())
      if (d > 1) {
        ++torus_dims;
        kmin = std::min(kmin, d);
      }
    // Three only for blocks (without them every plan below is one stream's); where
    // no plan with three pools is found by default, the one-stream plans below.
    const bool hier = sch.algorithm == ici::Algorithm::kHierarchical;
    const int streams = std::min(kMaxAllReduceStreams, opt_.all_reduce_streams > 0 ? opt_.all_reduce_streams
                                                       : torus_dims >= 3                              ? 2
                                                       : torus_dims == 2 && hier && blocks.size() > 1 ? 3
                                                                                                      : 1);
    // docs/codegen.md "Inner pieces": by default where the chips form a 3-D torus,
    // whose two inner dimensions make 12 of a block's 18 torus steps latency-bound.
    const int inner_split = opt_.inner_split > 0 ? opt_.inner_split : torus_dims >= 3 ? kInnerSplit : 1;
    // What the lowering did instead of the streams asked for (LowerResult::notes).
    auto streams_note = [&](const std::string& why) {
      if (opt_.all_reduce_streams < 2 || blocks.size() < 2) return;
      op_note(std::to_string(streams) + " instruction streams asked for, but " + why +
              "; lowered on one (docs/codegen.md \"Three streams\")");
    };
    static std::mutex stream_mutex;
    static std::map<std::string, std::shared_ptr<const StreamPlan>> stream_cache;
    const std::string key = sch.name + "|" + std::to_string(E) + "|" + std::to_string(piece) + "|" +
                            std::to_string(opt_.stream_slice_elems) + "|" + std::to_string(opt_.target.vmem_bytes) +
                            (streams >= 2 ? "|streams=" + std::to_string(streams) : "") +
                            (inner_split > 1 ? "|inner=" + std::to_string(inner_split) : "") +
                            (opt_.late_sends != 0 ? "|late=" + std::to_string(opt_.late_sends) : "") +
                            (opt_.onchip_when_needed ? "" : "|onchip-asap") + (opt_.deferred_sends ? "" : "|undeferred") +
                            (opt_.half_pieces ? "" : "|whole-pieces");
    std::shared_ptr<const StreamPlan> plan;
    {
      std::lock_guard<std::mutex> lock(stream_mutex);
      auto it = stream_cache.find(key);
      if (it != stream_cache.end()) plan = it->second;
    }
    if (!plan) {
      const std::vector<std::vector<int64_t>> block_gate =
          kmin == INT32_MAX ? std::vector<std::vector<int64_t>>{} : block_start_gates(sch, blocks, kmin);
      // slice_elems: LowerOptions::stream_slice_elems, or E for the whole buffer.
      std::vector<std::string> fused_whys;  // each fused try's reason not to plan, once each
      auto attempt = [&](int pools, int64_t pc, bool fuse, LateSends late, int64_t slice_elems,
                         bool wide = false) -> std::shared_ptr<StreamPlan> {
        auto fresh = std::make_shared<StreamPlan>();
        std::vector<std::vector<int>> move_pool;
        fresh->sched = slice_schedule(sch, slice_elems, pc, pools, move_pool, blocks);
        if (pools > 1 && move_pool.empty()) return nullptr;  // not sliced: the same as try 1
        const std::string why = plan_stream(fresh->sched, move_pool, pools, *fresh, fuse, late, pc, block_gate, inner_split,
                                            opt_.onchip_when_needed, opt_.deferred_sends, wide);
        if (!why.empty()) {
          const std::string tried =
              (pools > 1 ? std::to_string(pools) + " slot pools" + (wide ? " of wide slots: " : ": ") : "one slot pool: ") + why;
          if (fuse && std::find(fused_whys.begin(), fused_whys.end(), tried) == fused_whys.end()) fused_whys.push_back(tried);
          return nullptr;
        }
        fresh->gates = block_gate;
        return fresh;
      };
      const int64_t sliced = opt_.stream_slice_elems, no_slices = sch.elements;  // ceil(E / E) = 1 slice
      // Each fused try with the late fused sends in the streams, else outside them
      // (LateSends), else without.
      auto fused_attempt = [&](int pools, int64_t pc, bool wide) {
        for (LateSends late : {LateSends::kInStream, LateSends::kOutside, LateSends::kNone})
          if (late != LateSends::kInStream || opt_.late_sends == 0)
            if (auto p = attempt(pools, pc, true, late, sliced, wide)) return p;
        return std::shared_ptr<StreamPlan>();
      };
      auto fused_plan = [&](int n) {
        std::shared_ptr<StreamPlan> p = n >= 2 && blocks.size() > 1 ? nullptr : fused_attempt(1, piece, false);
        if (p) return p;
        const int64_t most = most_peers(sch);
        // Pieces as large as the VMEM allows with K slots a stream.
        auto piece_cap = [&](int K) {
          const int64_t per_piece = stream_vmem_pieces(most, most, K) * 4;
          return std::min(piece, static_cast<int64_t>(opt_.target.vmem_bytes) * 7 / 8 / per_piece / kTileElems * kTileElems);
        };
        // A pool a stream (three streams: three pools of 5 slots), else two; then,
        // where that has fewer than 8 slots a pool, the same with wide slots.
        const int pools = std::max(2, n);
        if (const int64_t cap = piece_cap(pooled_slots(most)); cap >= kTileElems) p = fused_attempt(pools, cap, false);
        if (!p && pooled_slots(most) / pools < kSlotsAPool)
          if (const int64_t cap = piece_cap(wide_slots(most, pools)); cap >= kTileElems) p = fused_attempt(pools, cap, true);
        return p;
      };
      std::shared_ptr<StreamPlan> fresh = fused_plan(streams);
      if (!fresh && opt_.all_reduce_streams == 0 && streams == 3) fresh = fused_plan(1);
      // A plan on one slice has the schedule's steps; slices add steps.
      auto runs_whole = [&](const StreamPlan& p) { return p.sched.steps.size() == sch.steps.size(); };
      // A hierarchical all-reduce that runs whole (one slice, one block), larger
      // than a piece, also tries pieces of half its largest (rounded up to a tile,
      // so no segment is cut into a piece and a sliver: 1100 KiB 16,683 cycles,
      // 18,717 rounded down) and keeps whichever plan the ordering run finishes
      // first: where the on-chip step sends whole pieces and a torus step's chunk
      // is one piece, each hop waits for all of it (v3-8 2 MiB: 28,890 cycles on
      // 256 KiB pieces, 23,028 on 128 KiB; 1 MiB, whose largest are two 64 KiB
      // segments: 18,824 -> 16,047; the MLP's 814 KB bucket, whose largest are two
      // 51 KB segments, 100 KiB, under half a piece: 17,604 -> 15,031; docs/codegen.md
      // "Half pieces"). A buffer of one piece is latency-bound and loses (256 KiB:
      // 12,430 -> 12,681), and so does cutting under half a piece what the half
      // plan has at 128 KiB (2 / 4 MiB: 23,021 / 31,551 -> 24,284 / 36,639).
      // Sliced, the slices overlap the steps already, and the extra messages cost
      // more than the run sees (16 MiB: 103,130 against 118,170). The torus
      // algorithm over v5e-8's one-core chips, whose links are half as fast as the
      // run's, lost as often as it gained (1.5 MiB 44,242 -> 45,603, 2 MiB 59,188
      // -> 54,771).
      if (opt_.half_pieces && hier && fresh && blocks.size() <= 1 && sch.elements > piece &&
          runs_whole(*fresh) && piece / 2 >= kTileElems)
        if (const int64_t half_cap = align_up(fresh->max_piece / 2, kTileElems); half_cap < fresh->max_piece)
          if (auto half = fused_attempt(1, half_cap, false);
              half && runs_whole(*half) && half->makespan < fresh->makespan)
            fresh = half;
      if (!fresh) {
        // Unfused, slices only hold the ring up (a sum is stored and read back
        // anyway): v4-4x4x4 256 MiB planned 8.3 M cycles on 2 slices, 2.2 M whole.
        // Take whichever the ordering run finishes first.
        fresh = attempt(1, piece, false, LateSends::kNone, sliced);
        if (fresh && !runs_whole(*fresh))
          if (auto whole = attempt(1, piece, false, LateSends::kNone, no_slices); whole && whole->makespan < fresh->makespan)
            fresh = whole;
        if (fresh) {
          for (const std::string& w : fused_whys) fresh->unfused_why += (fresh->unfused_why.empty() ? "" : "; ") + w;
          if (fresh->unfused_why.empty()) fresh->unfused_why = "no fused try applies";
        }
      }
      if (fresh) {
        plan = fresh;
        std::lock_guard<std::mutex> lock(stream_mutex);
        stream_cache[key] = plan;
      }
    }
    size_t most_src = 0, most_dst = 0;
    if (plan)
      for (size_t r = 0; r < plan->sources.size(); ++r) {
        most_src = std::max(most_src, plan->sources[r].size());
        most_dst = std::max(most_dst, plan->dests[r].size());
      }
    const int64_t PzB = (plan ? plan->max_piece : piece) * 4;
    // The slots, where peers land pieces, sit at the top of VMEM, above the op's
    // own pieces and kept sums, where the nodes before it seldom reach: there
    // lower_replicated can send the entry tokens before the op (early entry
    // tokens), so the first pieces do not wait a neighbour latency for them.
    const int64_t FOOT = plan ? stream_vmem_pieces(static_cast<int64_t>(most_src), static_cast<int64_t>(most_dst), plan->K) * PzB : 0;
    const int64_t SLOT_BYTES = plan ? static_cast<int64_t>(most_src) * plan->K * PzB : 0;
    const int64_t vmem_top = static_cast<int64_t>(opt_.target.vmem_bytes) / tile_bytes * tile_bytes;
    const int64_t LOAD = 0, SCR = kStreamLoads * PzB, SEND = SCR + kStreamScratch * PzB;
    const int64_t TOP = FOOT - SLOT_BYTES, SLOTS = vmem_top - SLOT_BYTES;  // TOP: the end of the op's own pieces
    if (plan && FOOT <= vmem_top) {
      const StreamPlan& sp = *plan;
      // Unfused, every sum is stored to y and read back to be sent, and every copy
      // that is sent on lands in y: HBM bytes a fused plan does not move (v3-8,
      // torus, 16 MiB: 155 MB a chip against 101 MB fused; docs/validation.md).
      if (!sp.unfused_why.empty())
        op_note("streamed unfused, every sum and forwarded copy through y in HBM, as no fused plan was found (" +
                sp.unfused_why + "; docs/codegen.md \"Streamed lowering\")");
      const ici::Schedule& ssch = sp.sched;
      const int K = sp.K;
      if (opt_.explain_collectives)
        op_note(ssch.name + "; streamed " + (sp.unfused_why.empty() ? "fused" : "unfused") + ", " +
                std::to_string(sp.pools) + " slot pool" + (sp.pools > 1 ? "s" : "") + " of " +
                std::to_string(K / sp.pools) + " slots a stream" +
                (sp.stream_first != kStreamFirstFlag ? " (wide: flags from f" + std::to_string(sp.stream_first) + ")" : "") +
                ", pieces up to " + std::to_string(sp.max_piece * 4 / 1024) +
                " KiB; the ordering run's estimate " + std::to_string(sp.makespan) +
                " cycles (links and adds, no HBM or DMA engines)");
      // Traffic classes (docs/codegen.md "Urgent messages"): a step whose chunks are
      // at most half the widest chip-to-chip chunk (a torus schedule's inner
      // dimensions) is latency-bound, and its sends share links with another
      // group's (or block's) wide steps; they, the credits and the entry tokens go
      // as urgent (tc=1), ahead of the wide steps' queued packets. By default the
      // credits and tokens go urgent on every board: a 4-byte credit that queues
      // behind a piece's packets holds up the sender's next piece on that slot
      // (v3-8 64 MiB: credits took 2.5-3.5 K cycles against 1.9 K unloaded). The
      // inner steps' data goes urgent by default only on a 3-D torus, where it
      // was measured to gain (on v2-4x4 it lost, docs/codegen.md).
      const int64_t widest = sp.widest;  // plan_stream's, over the same schedule
      const bool urgent_data = opt_.urgent_sends == 1 || (opt_.urgent_sends == 0 && torus_dims >= 3);
      const std::string control_tc = opt_.urgent_sends != 2 ? ", tc=1" : "";  // credits and entry tokens
      auto tc_of = [&](const ici::Move& mv) {
        return urgent_data && 2 * ssch.chunks[static_cast<size_t>(mv.src_chunk)].elems <= widest ? ", tc=1" : "";
      };
      // The way round (docs/codegen.md "Both links of a size-2 dimension"): a DMA
      // to the neighbour on a size-2 dimension goes + from an even core by default,
      // so on one-core chips a - group's pieces would share the + link with the +
      // group's and leave the - link idle; they name the way. (Two-core chips
      // already use both links, a core each, as the hierarchical algorithm's groups
      // expect.)
      auto way_of = [&](const ici::Move& mv) {
        const bool minus = s.cores_per_chip == 1 && mv.direction < 0;
        return minus && s.board.route_ties(replica_chip(s, me), replica_chip(s, mv.dst)) ? ", way=-" : "";
      };
      const std::vector<int>& srcs = sp.sources[static_cast<size_t>(me)];
      const std::vector<int>& dsts = sp.dests[static_cast<size_t>(me)];
      auto idx = [](const std::vector<int>& v, int x) { return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin()); };
      auto there = [&](int r, int64_t addr) {
        return addr - opt_.hbm_base + static_cast<int64_t>(replica_core(s, r)) * opt_.replica_region;
      };
      auto endpoint = [&](const char* space, int r) {
        return std::string(space) + "@chip" + std::to_string(replica_chip(s, r)) + ".c" + std::to_string(replica_core(s, r));
      };
      // The tokens' source word is pinned too: an early token reads it during an
      // earlier node, whose placements may reuse any unpinned word.
      const int64_t zero = place_hbm_pinned(4), TOK = place_hbm_pinned(static_cast<int64_t>(std::max<size_t>(1, most_dst)) * K * 4);
      check_addr(n, TOK + static_cast<int64_t>(most_dst) * K * 4 + s.cores_per_chip * opt_.replica_region);
      // Credits (a slot's uses after the first) land in the sender's SMEM: entry
      // tokens stay in HBM, pinned, since they may arrive while the sender is still
      // in its previous node, whose credits use the same SMEM words.
      const int64_t credits = static_cast<int64_t>(opt_.target.smem_bytes) - kCreditSmemBytes,
                    credit_zero = static_cast<int64_t>(opt_.target.smem_bytes) - 4;
      if (static_cast<int64_t>(most_dst) * K * 4 > kCreditSmemBytes - 4)
        fail(n, "the streamed all-reduce needs more credit words than the SMEM reserve holds");
      check_addr(n, Y.addr + E * 4 + s.cores_per_chip * opt_.replica_region);
      int64_t& sent = coll_sent_;
      // Slot j of a stream: landing flag on the receiver, credit flag on the sender.
      auto land_flag_of = [&](int dst, int src, int j) {
        return sp.stream_first + idx(sp.sources[static_cast<size_t>(dst)], src) * K + j;
      };
      auto credit_flag_of = [&](int src, int dst, int j) {
        return sp.stream_first + sp.most * K + idx(sp.dests[static_cast<size_t>(src)], dst) * K + j;
      };
      // Piece m of a stream: its slot and how many pieces used that slot before it;
      // uses(j): how many pieces go through slot j.
      auto slot_of = [&](int src, int dst, int64_t m) { return sp.slot_use.at({src, dst})[static_cast<size_t>(m)].first; };
      auto use_of = [&](int src, int dst, int64_t m) { return sp.slot_use.at({src, dst})[static_cast<size_t>(m)].second; };
      std::map<std::tuple<int, int, int>, int64_t> slot_uses;  // (src, dst, slot) -> pieces through it
      for (const auto& [key, v] : sp.slot_use)
        for (const auto& su : v) ++slot_uses[{key.first, key.second, su.first}];
      auto uses = [&](int src, int dst, int j) {
        auto it = slot_uses.find({src, dst, j});
        return it == slot_uses.end() ? int64_t(0) : it->second;
      };
      auto land_flag = [&](int dst, int src, int64_t m) { return land_flag_of(dst, src, slot_of(src, dst, m)); };
      auto credit_flag = [&](int src, int dst, int64_t m) { return credit_flag_of(src, dst, slot_of(src, dst, m)); };
      std::map<int, int64_t> base;  // this node's landings and credits count on from here
      for (int src : srcs)
        for (int j = 0; j < K; ++j) base[land_flag_of(me, src, j)] = coll_landed_[land_flag_of(me, src, j)];
      for (int d : dsts)
        for (int j = 0; j < K; ++j) base[credit_flag_of(me, d, j)] = coll_landed_[credit_flag_of(me, d, j)];
      // Entry tokens: credit 0 of every slot of every stream into this replica,
      // tagged for lower_replicated to send them early.
      for (int src : srcs)
        for (int j = 0; j < K; ++j) {
          if (uses(src, me, j) == 0) continue;
          line("dma " + endpoint("hbm", src) + ":" +
               at(there(src, TOK + (idx(sp.dests[static_cast<size_t>(src)], me) * K + j) * 4)) + ", " + hbm(zero) +
               ", bytes=4, flag=" + kSendFlag + ", rflag=f" + std::to_string(credit_flag_of(src, me, j)) + control_tc +
               "  " + kEntryTokenTag);
          ++sent;
        }
      if (!srcs.empty()) entry_token_slots_[n.id] = SLOTS;
      std::map<int, int64_t> credits_seen;
      // Returns the wait it emitted, (flag, count), or (-1, 0) when an earlier one covers it.
      auto wait_credit = [&](int d, int64_t m) -> std::pair<int, int64_t> {
        const int f = credit_flag(me, d, m);
        const int64_t need = 1 + use_of(me, d, m);  // the token and the uses of the slot before piece m
        if (need <= credits_seen[f]) return {-1, 0};
        line("wait f" + std::to_string(f) + ", " + std::to_string(base[f] + need));
        credits_seen[f] = need;
        return {f, base[f] + need};
      };
      // A copying piece that its receiver sends on lands in a VMEM slot too: the
      // receiver copies it to a send buffer, sends it from there and stores it to y,
      // instead of reading it back from y for each send (HBM, shared by a chip's
      // cores, limits large all-reduces). (receiver, step, move, first atom)
      std::set<std::tuple<int, size_t, size_t, int>> copy_to_vmem;
      for (size_t r = 0; r < sp.prog.size(); ++r)
        for (const StreamEvent& e : sp.prog[r])
          if (!e.send && !ssch.steps[e.step][e.move].reduce && !e.fused.empty())
            copy_to_vmem.emplace(static_cast<int>(r), e.step, e.move, e.atom);
      auto target = [&](size_t t, size_t k, int a, int64_t m) {
        const ici::Move& mv = ssch.steps[t][k];
        const int d = mv.dst;
        if (mv.reduce || copy_to_vmem.count({d, t, k, a}))
          return endpoint("vmem", d) + ":" +
                 at(SLOTS + (idx(sp.sources[static_cast<size_t>(d)], me) * K + slot_of(me, d, m)) * PzB);
        return endpoint("hbm", d) + ":" + at(there(d, Y.addr + sp.atoms[static_cast<size_t>(a)].first * 4));
      };
      // The flag the sends and credits of the stream being emitted count on: f58
      // (coll_sent_ its count) in stream 0, one of its own in stream 1.
      int send_flag = -1;
      auto send_flag_text = [&] { return send_flag < 0 ? std::string(kSendFlag) : "f" + std::to_string(send_flag); };
      auto count_send = [&] {
        if (send_flag < 0) ++sent;
        else ++flag_dmas_[cur_][send_flag];
      };
      // A send counts on send_flag, or (buffer_flag) on its own flag: a second send
      // from a send buffer, which the buffer's next use waits for (its credit covers
      // only the first).
      auto send = [&](size_t t, size_t k, int a, int a_end, const std::string& from, int buffer_flag = -1) {
        const ici::Move& mv = ssch.steps[t][k];
        // A stream's piece waits for its slot's credit and raises the slot's landing
        // flag; a late send outside the streams goes into the other core's y (a
        // copy, no consume there, so target() takes no slot) on its counting flag.
        const bool in_stream = !sp.is_outside(t, k, a);
        const int64_t m = in_stream ? sp.index.at({me, t, k, a}) : -1;
        if (in_stream) wait_credit(mv.dst, m);
        const int64_t bytes = (sp.atoms[static_cast<size_t>(a_end - 1)].second - sp.atoms[static_cast<size_t>(a)].first) * 4;
        line("dma " + target(t, k, a, m) + ", " + from + ", bytes=" + std::to_string(bytes) + ", flag=" +
             (buffer_flag < 0 ? send_flag_text() : "f" + std::to_string(buffer_flag)) +
             ", rflag=f" + std::to_string(in_stream ? land_flag(mv.dst, me, m) : sp.outside_flag) + tc_of(mv) +
             way_of(mv));
        if (buffer_flag < 0)
          count_send();
        else
          ++flag_dmas_[cur_][buffer_flag];
      };
      // Stores of values to y: which flag holds the last store of an atom not yet waited for.
      std::map<int, int> store_pending;  // atom -> flag
      std::map<int, bool> flag_pending;  // flags with DMAs not yet waited for: stores, second sends from a send buffer
      auto wait_flag_if_pending = [&](int f) {
        if (!flag_pending[f]) return;
        wait_flag(f);
        for (auto i = store_pending.begin(); i != store_pending.end();) i = i->second == f ? store_pending.erase(i) : std::next(i);
        flag_pending[f] = false;
      };
      // A store still pending keeps its flag pending (both are cleared together).
      auto wait_store = [&](int a) {
        if (auto it = store_pending.find(a); it != store_pending.end()) wait_flag_if_pending(it->second);
      };
      // What one instruction stream's events use on their own (Streams below).
      struct StreamRes {
        int64_t load, scr;         // VMEM: `loads` operand buffers, `scratches` sums
        int64_t keep, keep_end;    // VMEM for kept partial sums
        int load_flag, store_flag; // the first of `loads` / `scratches` flags
        int buf_flag, buf_flags;   // the send buffers' own flags
        std::string va, vb;        // vector registers of the adds
        std::map<size_t, std::string> before, after;  // lines to emit around the stream's event i
        int loads = kStreamLoads, scratches = kStreamScratch;  // operand buffers, scratch sums
        // One pool of loads + scratches pieces from `load` (scr = its last pieces):
        // a consume's sum is made in place in its operand's piece and stored from
        // there, so a store has as long to land as a load has to arrive.
        bool pooled = false;
        int stream = 0;  // its instruction stream (the arrival-order dispatch's registers)
      };
      auto emit_events = [&](const std::vector<StreamEvent>& prog, const StreamRes& res) {
      // A fused send's buffer (VMEM) and the buffer's own flag: its store to y and
      // its second send, both from its last use. One flag for every buffer made each
      // use wait for the stores of the one before (~1 K cycles a piece); the core
      // then fell behind the three links it feeds (v4-4x4x4 64 MiB).
      auto send_buffer_of = [&](int d, int64_t m2) {
        const int buffer = idx(dsts, d) * K + slot_of(me, d, m2);
        const int Kp = K / sp.pools;  // the stream's own buffers: those of its pool's slots when it has one
        const int flag = res.buf_flag + (res.buf_flags < kSendBufFlags ? idx(dsts, d) * Kp + slot_of(me, d, m2) % Kp : buffer) %
                                            res.buf_flags;
        return std::make_pair(SEND + buffer * PzB, flag);
      };
      // Partial sums kept in VMEM: a reducing consume whose local operand is an
      // earlier consume's sum reads it from a copy of that sum's tiles in the VMEM
      // above the slots (written by one more vst as the sum is made) instead of
      // loading it from y, and the earlier consume stores to y only the atoms some
      // other use reads there (a send from y, the final value). Every tile of the
      // operand must start where one of the earlier sum's tiles starts, or the
      // operand is loaded as before. Only this core's vld/vst touch the copies, in
      // program order, so they need no flags; a tile is free again once read.
      // Without it every partial sum is stored to y and loaded back (HBM the chip's
      // cores share).
      const int64_t KEEP = res.keep;
      const int64_t keep_tiles = (res.keep_end - KEEP) / tile_bytes;
      std::map<std::pair<size_t, int64_t>, int64_t> keep_put;  // (producer event, its tile) -> VMEM address
      std::map<std::pair<size_t, int64_t>, int64_t> keep_get;  // (reader event, its tile) -> VMEM address
      std::vector<bool> kept_reader(prog.size(), false);
      std::set<std::pair<size_t, int>> skip_store;  // (producer event, atom)
      {
        auto span = [&](const StreamEvent& e) {
          return std::make_pair(sp.atoms[static_cast<size_t>(e.atom)].first, sp.atoms[static_cast<size_t>(e.atom_end - 1)].second);
        };
        std::vector<int64_t> writer(sp.atoms.size(), -1);    // the reducing consume whose sum y should hold
        std::vector<bool> y_read(sp.atoms.size(), false);    // that sum is also read from y (a send)
        std::map<size_t, std::vector<std::pair<size_t, int64_t>>> wants;  // reader -> its tiles' (producer, tile)
        std::map<std::pair<size_t, int64_t>, size_t> tile_reader;  // producer tile -> reader event
        // reader -> its atoms' (producer, atom) whose sum nothing else reads from y
        std::map<size_t, std::vector<std::pair<size_t, int>>> only_reader_of;
        for (size_t i = 0; i < prog.size(); ++i) {
          const StreamEvent& e = prog[i];
          if (e.send) {
            if (!e.from_x && !e.deferred)
              for (int b = e.atom; b < e.atom_end; ++b) y_read[static_cast<size_t>(b)] = true;
            continue;
          }
          const bool reduce = ssch.steps[e.step][e.move].reduce;
          if (reduce && !e.local_from_x) {
            const auto [lo, hi] = span(e);
            std::vector<std::pair<size_t, int64_t>> tiles;
            bool ok = true;
            for (int64_t ts = lo; ts < hi && ok; ts += kTileElems) {
              const int64_t te = std::min(hi, ts + kTileElems);
              // the atoms of [ts, te): one writer
              auto it = std::upper_bound(sp.atoms.begin(), sp.atoms.end(), std::make_pair(ts, INT64_MAX));
              size_t b = static_cast<size_t>(it - sp.atoms.begin()) - 1;
              const int64_t w = writer[b];
              for (; ok && b < sp.atoms.size() && sp.atoms[b].first < te; ++b) ok = writer[b] == w && w >= 0;
              if (!ok) break;
              const auto [wlo, whi] = span(prog[static_cast<size_t>(w)]);
              ok = (ts - wlo) % kTileElems == 0 && te <= std::min(whi, ts + kTileElems);
              tiles.emplace_back(static_cast<size_t>(w), (ts - wlo) / kTileElems);
            }
            if (ok) {
              for (const auto& pt : tiles) tile_reader[pt] = i;
              wants[i] = tiles;
              auto& only = only_reader_of[i];
              for (int b = e.atom; b < e.atom_end; ++b)
                if (!y_read[static_cast<size_t>(b)] && writer[static_cast<size_t>(b)] >= 0)
                  only.emplace_back(static_cast<size_t>(writer[static_cast<size_t>(b)]), b);
            }
          }
          for (int b = e.atom; b < e.atom_end; ++b) {
            writer[static_cast<size_t>(b)] = reduce ? static_cast<int64_t>(i) : -1;
            y_read[static_cast<size_t>(b)] = false;
          }
        }
        // Tiles in program order: a producer takes free tiles for its wanted tiles
        // while there are any; a reader is kept if all its tiles were; it frees them.
        std::set<int64_t> free_tiles;
        for (int64_t q = 0; q < keep_tiles; ++q) free_tiles.insert(q);
        for (size_t i = 0; i < prog.size(); ++i) {
          auto w = wants.find(i);
          if (w != wants.end()) {
            bool all = true;
            for (const auto& pt : w->second) all = all && keep_put.count(pt);
            kept_reader[i] = all;
            for (size_t q = 0; q < w->second.size(); ++q) {
              const auto& pt = w->second[q];
              auto put = keep_put.find(pt);
              if (put == keep_put.end()) continue;
              if (all) keep_get[{i, static_cast<int64_t>(q)}] = put->second;
              free_tiles.insert((put->second - KEEP) / tile_bytes);
            }
          }
          for (auto it = tile_reader.lower_bound({i, 0}); it != tile_reader.end() && it->first.first == i; ++it) {
            if (free_tiles.empty()) break;
            keep_put[it->first] = KEEP + *free_tiles.begin() * tile_bytes;
            free_tiles.erase(free_tiles.begin());
          }
        }
        // A producer's atoms whose sum only a kept reader reads need no store.
        for (const auto& [i, only] : only_reader_of)
          if (kept_reader[i]) skip_store.insert(only.begin(), only.end());
      }
      std::vector<size_t> loads;  // the reducing consumes that load their local operand, in program order
      for (size_t i = 0; i < prog.size(); ++i)
        if (!prog[i].send && ssch.steps[prog[i].step][prog[i].move].reduce && !kept_reader[i]) loads.push_back(i);
      // Pooled (StreamRes::pooled): the consumes that take a piece of the pool (a
      // load, or a sum that is only stored) in program order, piece use % N. The
      // load of use u waits for the store of use u - N (the DMA would overwrite
      // what the store reads), so loads run at most N - 2 uses ahead: u - N is then
      // two uses back, and its store has had a whole consume to land.
      const int pool_n = res.loads + res.scratches;
      std::vector<size_t> pool_use(prog.size(), SIZE_MAX);
      if (res.pooled) {
        assert(res.scr == res.load + res.loads * PzB);
        size_t uses = 0;
        for (size_t i = 0; i < prog.size(); ++i) {
          const StreamEvent& e = prog[i];
          if (e.send) continue;
          const bool reduce = ssch.steps[e.step][e.move].reduce;
          const bool in_vmem = reduce || copy_to_vmem.count({me, e.step, e.move, e.atom});
          if ((reduce && !kept_reader[i]) || (in_vmem && e.fused.empty())) pool_use[i] = uses++;
        }
      }
      auto pool_piece = [&](size_t u) { return static_cast<int>(u % static_cast<size_t>(pool_n)); };
      auto pool_flag = [&](int piece) {
        return piece < res.loads ? res.load_flag + piece : res.store_flag + piece - res.loads;
      };
      // Load j's piece and flag (unpooled, a load piece < loads: its load flag).
      auto load_piece = [&](size_t j) {
        return res.pooled ? pool_piece(pool_use[loads[j]]) : static_cast<int>(j % static_cast<size_t>(res.loads));
      };
      auto load_flag = [&](size_t j) { return pool_flag(load_piece(j)); };
      // Values in y that a send buffer still holds: the one a consume made them in
      // and stored them to y from, until a later consume writes that buffer
      // (`written` counts each send buffer's writes). A send from y of atoms that one
      // such buffer holds goes from it, on the buffer's flag, which the buffer's
      // next use waits for: no HBM read. On v3-8 these are a core's own final
      // sums, which the torus all-gather's second step sends on (0.125 n a core
      // read back from y). Not the operand pool's pieces: they go round every few
      // consumes, and a send on a piece's flag held up its next use (v4-4x4x4
      // 1 MiB +2.9%). Only in program order: the arrival-order dispatch may move
      // the buffer's next use ahead of the send.
      struct Held {
        int64_t buffer, lo;  // the send buffer's VMEM address and the first element it holds
        int flag;            // the buffer's flag (its stores)
        uint64_t gen;        // written[buffer] when it was made
      };
      std::map<int, Held> held;  // atom -> where its value in y is also in VMEM
      std::map<int64_t, uint64_t> written;
      const bool in_order = opt_.arrival_order == 0 || !res.pooled;
      // The VMEM source of a send of atoms [a, a_end) from y and its flag, or -1.
      auto held_source = [&](int a, int a_end) -> std::pair<int64_t, int> {
        auto first = held.find(a);
        if (!in_order || first == held.end()) return {-1, -1};
        const Held& h = first->second;
        for (int b = a; b < a_end; ++b) {
          auto it = held.find(b);
          if (it == held.end() || it->second.buffer != h.buffer || it->second.lo != h.lo ||
              it->second.gen != written[h.buffer])
            return {-1, -1};
        }
        return {h.buffer + (sp.atoms[static_cast<size_t>(a)].first - h.lo) * 4, h.flag};
      };
      size_t loads_issued = 0;
      auto issue_load = [&](size_t j, bool may_wait) {
        const StreamEvent& e = prog[loads[j]];
        for (int b = e.atom; b < e.atom_end && !e.local_from_x; ++b)
          if (store_pending.count(b)) {
            if (!may_wait) return false;
            wait_store(b);
          }
        if (res.pooled) wait_flag_if_pending(load_flag(j));  // the piece's last store
        const int64_t lo = sp.atoms[static_cast<size_t>(e.atom)].first, hi = sp.atoms[static_cast<size_t>(e.atom_end - 1)].second;
        dma_on(load_flag(j), vmem(res.load + load_piece(j) * PzB), hbm((e.local_from_x ? X.addr : Y.addr) + lo * 4),
               (hi - lo) * 4, "");
        ++loads_issued;
        return true;
      };
      size_t next_use = 0;  // pooled: the use of the next event that takes a piece
      size_t scratch = 0, load_j = 0;
      std::vector<ArrivalEvent> arrival(prog.size());  // what the dispatch must know of each event
      auto emit_event = [&](size_t i) {
        const StreamEvent& e = prog[i];
        if (auto b = res.before.find(i); b != res.before.end()) line(b->second);
        struct After {  // the line to emit once event i is, whichever way its body ends
          Emitter* em;
          const std::string* text;
          ~After() { if (text) em->line(*text); }
        } after{this, res.after.count(i) ? &res.after.at(i) : nullptr};
        const int64_t lo = sp.atoms[static_cast<size_t>(e.atom)].first, hi = sp.atoms[static_cast<size_t>(e.atom_end - 1)].second;
        const int64_t elems = hi - lo;
        if (e.send && e.deferred) {  // a consume's deferred send, from its send buffer
          const int d = ssch.steps[e.step][e.move].dst;
          const int64_t m2 = sp.index.at({me, e.step, e.move, e.atom});
          const auto [buf, flag] = send_buffer_of(d, m2);
          // Its credit wait is the event's front for the arrival-order dispatch:
          // the events after it may go while the credit is not there.
          std::tie(arrival[i].flag, arrival[i].count) = wait_credit(d, m2);
          send(e.step, e.move, e.atom, e.atom_end, vmem(buf), flag);
          flag_pending[flag] = true;
          return;
        }
        if (e.send) {
          // The stores to y still go first: a partial sum's store must land before
          // the sum it feeds comes back as the final value into the same bytes.
          for (int b = e.atom; b < e.atom_end && !e.from_x; ++b) wait_store(b);
          if (const auto [from, flag] = e.from_x ? std::pair<int64_t, int>{-1, -1} : held_source(e.atom, e.atom_end);
              from >= 0) {
            send(e.step, e.move, e.atom, e.atom_end, vmem(from), flag);
            flag_pending[flag] = true;
            return;
          }
          send(e.step, e.move, e.atom, e.atom_end, hbm((e.from_x ? X.addr : Y.addr) + lo * 4));
          return;
        }
        const ici::Move& mv = ssch.steps[e.step][e.move];
        const int64_t m = sp.index.at({mv.src, e.step, e.move, e.atom});
        // The local operand (and the next consume's) is fetched before the wait for
        // the landing, so its HBM latency overlaps the transfer.
        const size_t j = mv.reduce && !kept_reader[i] ? load_j++ : SIZE_MAX;
        const size_t use = pool_use[i];
        if (use != SIZE_MAX) next_use = use + 1;
        if (mv.reduce) {
          if (j != SIZE_MAX && loads_issued <= j) issue_load(j, true);
          // Up to kStreamLoads - 1 ahead of this one's (all kStreamLoads buffers after
          // a consume that reads a kept sum), stopping at one whose atom a consume not
          // yet emitted (this one or one before it in the window) still writes.
          // Pooled: up to N - 2 uses ahead of this one's (or of the next use).
          const size_t window = (j != SIZE_MAX ? j : load_j) + static_cast<size_t>(res.loads);
          const size_t use_window = (use != SIZE_MAX ? use : next_use) + static_cast<size_t>(pool_n - 2);
          for (size_t q = loads_issued; q < loads.size() && (res.pooled ? pool_use[loads[q]] <= use_window : q < window);
               ++q) {
            bool later_write = false;
            const StreamEvent& lq = prog[loads[q]];
            for (size_t w = i; w < loads[q] && !later_write; ++w)
              later_write = !prog[w].send && prog[w].atom < lq.atom_end && lq.atom < prog[w].atom_end;
            if (later_write || !issue_load(q, false)) break;
          }
        }
        const int lf = land_flag(me, mv.src, m);
        arrival[i].flag = lf;
        arrival[i].count = base[lf] + use_of(mv.src, me, m) + 1;
        line("wait f" + std::to_string(lf) + ", " + std::to_string(arrival[i].count));
        const bool credit = use_of(mv.src, me, m) + 1 < uses(mv.src, me, slot_of(mv.src, me, m));
        auto give_credit = [&] {
          if (!credit) return;
          const int src = mv.src;
          line("dma " + endpoint("smem", src) + ":" +
               at(credits + (idx(sp.dests[static_cast<size_t>(src)], me) * K + slot_of(src, me, m)) * 4) + ", smem:" +
               at(credit_zero) + ", bytes=4, flag=" + send_flag_text() + ", rflag=f" + std::to_string(credit_flag(src, me, m)) + control_tc);
          count_send();
        };
        const bool copy_in_vmem = !mv.reduce && copy_to_vmem.count({me, e.step, e.move, e.atom});
        const int64_t slot = SLOTS + (idx(srcs, mv.src) * K + slot_of(mv.src, me, m)) * PzB;
        if (mv.reduce || copy_in_vmem) {
          arrival[i].space = 'v';
          arrival[i].lo = slot;
          arrival[i].hi = slot + elems * 4;
        } else {
          arrival[i].space = 'h';
          arrival[i].lo = Y.addr + lo * 4;
          arrival[i].hi = Y.addr + hi * 4;
        }
        if (!mv.reduce && !copy_in_vmem) {  // landed in y: forward it from there
          for (int b = e.atom; b < e.atom_end; ++b) held.erase(b);
          give_credit();
          for (const auto& [t, k] : e.fused) send(t, k, e.atom, e.atom_end, hbm(Y.addr + lo * 4));
          return;
        }
        int64_t out;
        int store_flag;
        bool send_buffer = false;
        // A send buffer when the first fused send is a stream's (its slot names the
        // buffer); late sends outside the streams alone go from the scratch sum.
        if (!e.fused.empty() && !sp.is_outside(e.fused.front().first, e.fused.front().second, e.atom)) {
          const auto& [t, k] = e.fused.front();
          const int d = ssch.steps[t][k].dst;
          const int64_t m2 = sp.index.at({me, t, k, e.atom});
          if (!e.defer_first || e.credit_frees_buffer) wait_credit(d, m2);
          std::tie(out, store_flag) = send_buffer_of(d, m2);
          send_buffer = true;
          wait_flag_if_pending(store_flag);
        } else if (res.pooled) {  // in place: the operand's piece, else the use's own
          store_flag = pool_flag(pool_piece(use));
          out = res.load + pool_piece(use) * PzB;
          if (j == SIZE_MAX) wait_flag_if_pending(store_flag);
        } else {
          store_flag = res.store_flag + static_cast<int>(scratch % res.scratches);
          out = res.scr + static_cast<int64_t>(scratch % res.scratches) * PzB;
          ++scratch;
          wait_flag_if_pending(store_flag);
        }
        if (j != SIZE_MAX) wait_flag(load_flag(j));
        const uint64_t gen = send_buffer ? ++written[out] : 0;  // only send buffers are held
        for (int b = e.atom; b < e.atom_end; ++b) held.erase(b);
        const int64_t local = j != SIZE_MAX ? res.load + load_piece(j) * PzB : -1;
        for (int64_t t = 0; t * kTileElems < elems; ++t) {
          line("vld " + res.va + ", " + at(slot + t * tile_bytes));
          if (mv.reduce) {
            line("vld " + res.vb + ", " + at(j != SIZE_MAX ? local + t * tile_bytes : keep_get.at({i, t})));
            line("vadd " + res.va + ", " + res.va + ", " + res.vb);
          }
          line("vst " + res.va + ", " + at(out + t * tile_bytes));
          auto put = keep_put.find({i, t});
          if (put != keep_put.end()) line("vst " + res.va + ", " + at(put->second));
        }
        give_credit();
        for (size_t q = e.defer_first ? 1 : 0; q < e.fused.size(); ++q) {
          // The first stream send counts on the send flag (the receiver's credit
          // frees the buffer); every other send on the buffer's flag, which its next
          // use waits for: a second send, and any outside the streams (no credit).
          const bool on_buffer = q > 0 || sp.is_outside(e.fused[q].first, e.fused[q].second, e.atom);
          send(e.fused[q].first, e.fused[q].second, e.atom, e.atom_end, vmem(out), on_buffer ? store_flag : -1);
          if (on_buffer) flag_pending[store_flag] = true;
        }
        std::vector<std::pair<int, int>> stores;  // the runs read again from y
        if (copy_in_vmem) {  // the final value: y holds it
          for (int b = e.atom; b < e.atom_end; ++b) wait_store(b);
          stores.emplace_back(e.atom, e.atom_end);
        }
        for (const auto& [r0, r1] : e.store)
          for (int b = r0; b < r1; ++b) {
            if (skip_store.count({i, b})) continue;
            if (!stores.empty() && stores.back().second == b)
              stores.back().second = b + 1;
            else
              stores.emplace_back(b, b + 1);
          }
        for (const auto& [b0, b1] : stores) {
          const int64_t s0 = sp.atoms[static_cast<size_t>(b0)].first, s1 = sp.atoms[static_cast<size_t>(b1 - 1)].second;
          dma_on(store_flag, hbm(Y.addr + s0 * 4), vmem(out + (s0 - lo) * 4), (s1 - s0) * 4, "");
          for (int b = b0; b < b1; ++b) {
            store_pending[b] = store_flag;
            if (send_buffer) held[b] = Held{out, lo, store_flag, gen};
          }
          flag_pending[store_flag] = true;
        }
      };
      const int arrival_order = res.pooled ? opt_.arrival_order : 0;
      if (arrival_order == 0) {  // program order: the events' code straight into the program
        for (size_t i = 0; i < prog.size(); ++i) emit_event(i);
      } else {  // each event's code apart, for the dispatch to read back
        std::vector<std::string> texts(prog.size());
        for (size_t i = 0; i < prog.size(); ++i) {
          std::ostringstream text;
          std::swap(text, cs_[static_cast<size_t>(cur_)]);
          emit_event(i);
          std::swap(text, cs_[static_cast<size_t>(cur_)]);
          texts[i] = text.str();
          arrival[i].pinned = res.before.count(i) || res.after.count(i);
        }
        emit_in_arrival_order(texts, arrival, res.stream, arrival_order);
      }
      line("wait " + send_flag_text() + ", " + std::to_string(send_flag < 0 ? sent : flag_dmas_[cur_][send_flag]));
      for (int piece = res.pooled ? 0 : res.loads; piece < pool_n; ++piece) wait_flag_if_pending(pool_flag(piece));
      for (int f = res.buf_flag; f < res.buf_flag + res.buf_flags; ++f) wait_flag_if_pending(f);
      };
      // Streams (docs/codegen.md "Two streams"): blocks of both pools in one
      // program order made a landing of one block wait behind the other's flags;
      // with an instruction stream per pool each pool's blocks go in their own
      // order, every resource a stream waits on its own (flags, operand and
      // scratch VMEM, kept sums, vector registers), the slots and send buffers
      // already apart by pool. Streams 1.. report to stream 0 on their join flags.
      const int64_t vmem_end = SLOTS;  // the kept sums' end
      const std::vector<StreamEvent>& all = sp.prog[static_cast<size_t>(me)];
      const int P = sp.pools;  // streams: one a pool
      const int64_t per = (kTwoStreamLoads + kTwoStreamScratch) * PzB;  // a stream's operand and scratch pieces
      if (streams < 2 || P != streams || blocks.size() < 2 ||
          TOP + (P - 2) * per + static_cast<int64_t>(P) * tile_bytes > vmem_end) {
        streams_note(P != streams ? "no plan with " + std::to_string(streams) +
                                        " slot pools was found (its ordering run stalls, or a step's pieces outnumber "
                                        "the slots)"
                                  : "VMEM has no room for their operand buffers");
        emit_events(all, StreamRes{LOAD, SCR, TOP, vmem_end, kLoadFlag, kStoreFlag, kSendBufFirstFlag, kSendBufFlags, "v1", "v2", {}, {}});
      } else {
        std::vector<std::vector<StreamEvent>> mine(static_cast<size_t>(P));
        for (const StreamEvent& e : all) mine[static_cast<size_t>(block_of(ssch, blocks, ssch.steps[e.step][e.move]) % P)].push_back(e);
        // Streams 0 and 1's operand loads and scratch sums in the one stream's
        // pieces below TOP, so the kept sums keep all the VMEM from TOP to the
        // slots, a share each (streams 2.. take theirs from the start of their share):
        // with a stream's own 4 + 4 pieces above TOP, v2-4x4's kept sums fell from
        // 3 to 1 MiB a stream, the op's HBM bytes rose 18% and the cycles 8%.
        const int64_t share = (vmem_end - TOP) / P / tile_bytes * tile_bytes;
        const int buf_each = kSendBufFlags / P;
        std::vector<StreamRes> res;
        for (int q = 0; q < P; ++q) {
          const StreamFlags& f = kStreamFlagSets[q];
          const int64_t keep = TOP + q * share, keep_end = q + 1 == P ? vmem_end : keep + share;
          const int64_t load = q < 2 ? LOAD + q * per : keep;
          res.push_back(StreamRes{load, load + kTwoStreamLoads * PzB, q < 2 ? keep : keep + per, keep_end, f.load, f.store,
                                  kSendBufFirstFlag + q * buf_each, q + 1 == P ? kSendBufFlags - q * buf_each : buf_each,
                                  "v" + std::to_string(2 * q + 1), "v" + std::to_string(2 * q + 2), {}, {}});
          res.back().loads = kTwoStreamLoads;
          res.back().scratches = kTwoStreamScratch;
          res.back().pooled = true;
          res.back().stream = q;
        }
        // Block starts across the streams (block_start_gates): block b's first
        // event waits until block b - 1's stream has done its events of the steps
        // up to the gate; that stream raises its gate flag once past them.
        const std::vector<std::vector<int64_t>>& gates = sp.gates;
        auto add_line = [](std::map<size_t, std::string>& at, size_t i, const std::string& text) {
          auto [it, fresh] = at.emplace(i, text);
          if (!fresh) it->second += "\n  " + text;
        };
        std::vector<int64_t> raised;
        for (int q = 0; q < P; ++q) raised.push_back(flag_dmas_[cur_][kStreamFlagSets[q].gate]);
        for (int64_t b = 1; b < static_cast<int64_t>(blocks.size()) && !gates.empty(); ++b) {
          const size_t q = static_cast<size_t>(b % P), p = static_cast<size_t>((b - 1) % P);
          int64_t g = -1;
          size_t first = SIZE_MAX;
          for (size_t i = 0; i < mine[q].size() && first == SIZE_MAX; ++i) {
            const StreamEvent& e = mine[q][i];
            if (block_of(ssch, blocks, ssch.steps[e.step][e.move]) == b) {
              first = i;
              g = gates[e.step][e.move];
            }
          }
          if (first == SIZE_MAX || g < 0) continue;
          size_t last = SIZE_MAX;  // the other stream's last event of a step up to g
          for (size_t i = 0; i < mine[p].size(); ++i)
            if (static_cast<int64_t>(mine[p][i].step) <= g) last = i;
          if (last == SIZE_MAX) continue;
          const int flag = kStreamFlagSets[p].gate;
          add_line(res[p].after, last, "fadd f" + std::to_string(flag) + ", 1");
          add_line(res[q].before, first, "wait f" + std::to_string(flag) + ", " + std::to_string(++raised[p]));
        }
        flag_dmas_[cur_][kStreamFlagSets[0].gate] = raised[0];
        std::vector<std::string> labels;
        for (int q = 1; q < P; ++q) {
          labels.push_back("stream" + std::to_string(q) + "_" + std::to_string(labels_++));
          line("fork " + labels.back());
        }
        emit_events(mine[0], res[0]);
        for (int q = 1; q < P; ++q) {
          const StreamFlags& f = kStreamFlagSets[q];
          std::ostringstream stream0;
          std::swap(stream0, cs_[static_cast<size_t>(cur_)]);
          send_flag = f.send;
          emit_events(mine[static_cast<size_t>(q)], res[static_cast<size_t>(q)]);
          send_flag = -1;
          line("fadd f" + std::to_string(f.gate) + ", 1");  // the join
          flag_dmas_[cur_][f.gate] = raised[static_cast<size_t>(q)] + 1;
          line("halt");
          tail_[static_cast<size_t>(cur_)] << labels[static_cast<size_t>(q - 1)] << ":\n  op " << n.id << "\n"
                                           << cs_[static_cast<size_t>(cur_)].str();
          std::swap(stream0, cs_[static_cast<size_t>(cur_)]);
        }
        for (int q = 1; q < P; ++q) wait_flag(kStreamFlagSets[q].gate);
      }
      if (sp.outside_flag >= 0) {  // the late sends outside the streams into this replica
        int64_t into = 0;
        for (const auto& [t, k, a] : sp.outside) into += ssch.steps[t][k].dst == me;
        if (into > 0)
          wait_landed(sp.outside_flag, into);
      }
      for (int src : srcs)
        for (int j = 0; j < K; ++j) coll_landed_[land_flag_of(me, src, j)] = base[land_flag_of(me, src, j)] + uses(src, me, j);
      for (int d : dsts)
        for (int j = 0; j < K; ++j)  // the token, and a credit per use of slot j followed by another
          if (const int64_t u = uses(me, d, j); u > 0) coll_landed_[credit_flag_of(me, d, j)] = base[credit_flag_of(me, d, j)] + u;
      return;
    }
    streams_note("no streamed plan was found that fits VMEM");
  }
  if (opt_.explain_collectives)
    op_note(sch.name + "; step-ordered, each step's chunks sent whole, then combined");

  const size_t P = static_cast<size_t>(sch.chips);
  // Every replica's lowering plans the whole collective the same way, so what
  // follows from the schedule alone (the receive slots, each replica's sources and
  // destinations, the steps of each pair's messages, the largest staged run, each
  // replica's writes) and the plan below are made once per schedule and kept
  // (worked out again in each replica's lowering, they were most of a
  // 512-replica ring's compile).
  std::string plan_key = sch.name + "|" + std::to_string(E) + "|" + std::to_string(s.cores_per_chip) + "|" +
                         std::to_string(s.replicas) + "|" + std::to_string(static_cast<int>(s.board.kind()));
  for (int d : s.board.dims()) plan_key += "," + std::to_string(d);
  struct Shape {
    std::vector<std::vector<int64_t>> slot;  // [step][move]: its receive slot's offset
    int64_t slots_bytes = 0;
    std::vector<std::vector<int>> sources, dests;
    std::vector<std::map<int, std::vector<size_t>>> send_steps;
    int64_t largest = 0;
    std::vector<std::vector<std::pair<size_t, int>>> writes;
  };
  static std::mutex shape_mutex;
  static std::map<std::string, std::shared_ptr<const Shape>> shape_cache;
  std::shared_ptr<const Shape> shape;
  {
    std::lock_guard<std::mutex> lock(shape_mutex);
    auto hit = shape_cache.find(plan_key);
    if (hit != shape_cache.end()) shape = hit->second;
  }
  if (!shape) {
    auto made = std::make_shared<Shape>();
    Shape& sh = *made;
    // Receive slots: per step, the moves into a replica grouped by source (then in
    // schedule order), each at the running offset of that replica's earlier incoming
    // chunks of the step; a step takes the largest such total over the replicas.
    // Whole tiles, so a tile load never reads into a neighbouring slot that may be
    // landing; grouped, so one source's chunks of a step are one contiguous run that
    // VMEM mode sends as a single DMA (on a size-2 torus dimension both directions'
    // groups go to the same neighbour).
    sh.slot.resize(sch.steps.size());
    for (size_t st = 0; st < sch.steps.size(); ++st) {
      const auto& moves = sch.steps[st];
      std::vector<size_t> by_src(moves.size());
      for (size_t k = 0; k < moves.size(); ++k) by_src[k] = k;
      std::stable_sort(by_src.begin(), by_src.end(), [&](size_t a, size_t b) { return moves[a].src < moves[b].src; });
      std::vector<int64_t> used(static_cast<size_t>(sch.chips), 0);
      sh.slot[st].assign(moves.size(), 0);
      for (size_t k : by_src) {
        const ici::Move& m = moves[k];
        sh.slot[st][k] = sh.slots_bytes + used[static_cast<size_t>(m.dst)];
        used[static_cast<size_t>(m.dst)] += align_up(sch.chunks[static_cast<size_t>(m.dst_chunk)].elems * 4, tile_bytes);
      }
      sh.slots_bytes += *std::max_element(used.begin(), used.end());
    }
    // One landing flag per source replica of the receiver (the schedule's order of
    // first appearance), so a count waited on implies that source's DMAs of this step:
    // a shared flag could count a fast neighbour's next step for a slow one's. The
    // entry tokens of VMEM mode likewise, one flag per destination.
    peers_of(sch, sh.sources, sh.dests);
    // send_steps[dst][src]: the steps in which src sends to dst, in order.
    sh.send_steps.resize(static_cast<size_t>(sch.chips));
    for (size_t st = 0; st < sch.steps.size(); ++st)
      for (const ici::Move& m : sch.steps[st]) {
        auto& v = sh.send_steps[static_cast<size_t>(m.dst)][m.src];
        if (v.empty() || v.back() != st) v.push_back(st);
      }
    // The largest (step, source, destination) run of staged chunks (VMEM mode).
    for (const auto& step : sch.steps) {
      std::map<std::pair<int, int>, int64_t> run;
      for (const ici::Move& m : step)
        sh.largest = std::max(
            sh.largest, run[{m.src, m.dst}] += align_up(sch.chunks[static_cast<size_t>(m.src_chunk)].elems * 4, tile_bytes));
    }
    // writes[r]: (step, chunk index) of every move into replica r, in step order
    // (scanning the whole schedule per query cost a 256-replica ring ~10 s of its
    // compile).
    sh.writes.resize(P);
    for (size_t e = 0; e < sch.steps.size(); ++e)
      for (const ici::Move& w : sch.steps[e])
        sh.writes[static_cast<size_t>(w.dst)].emplace_back(e, w.dst_chunk);
    shape = made;
    std::lock_guard<std::mutex> lock(shape_mutex);
    shape_cache[plan_key] = shape;
  }
  const auto& slot = shape->slot;
  const int64_t slots_bytes = shape->slots_bytes;
  const auto& sources = shape->sources;
  const auto& dests = shape->dests;
  const auto& send_steps = shape->send_steps;
  const auto& writes = shape->writes;  // (step, chunk index) of every move into replica r
  auto index_in = [&](const std::vector<int>& v, int x, int limit) {
    const int k = static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin());
    if (k >= limit)
      fail(n, "a replica exchanges with " + std::to_string(v.size()) + " others; the lowering has flags for " +
                  std::to_string(limit));
    return k;
  };
  // Landing flags. Completion order is not issue order, so two in-flight messages
  // of one source on one flag would let the later one's landing stand for the
  // earlier one's. Each source of a receiver gets M flags used round robin over
  // the steps it sends in, and a flag is reused only where the schedule itself
  // orders the two uses: the source issues its (j+M)-th message to the receiver
  // only after (happens-before through the moves) the receiver has finished the
  // step of the j-th. Checked below for every receiver (else credits).
  size_t most_sources = 1;
  for (const auto& v : sources) most_sources = std::max(most_sources, v.size());
  const int M = kLandFlags / static_cast<int>(most_sources);
  if (M < 1) fail(n, "a replica receives from " + std::to_string(most_sources) + " others; the lowering has " +
                         std::to_string(kLandFlags) + " landing flags");
  // message_index(dst, src, st): which of src's messages to dst the one of step st is.
  auto message_index = [&](int dst, int src, size_t st) {
    const auto& v = send_steps[static_cast<size_t>(dst)].at(src);
    return static_cast<size_t>(std::lower_bound(v.begin(), v.end(), st) - v.begin());
  };
  auto land_flag = [&](int dst, int src, size_t st) {
    return kFirstLandFlag + index_in(sources[static_cast<size_t>(dst)], src, kLandFlags) * M +
           static_cast<int>(message_index(dst, src, st) % static_cast<size_t>(M));
  };
  // Where even the step order lets a source run more than M messages ahead (a ring
  // of more than M + 1 replicas: a replica's predecessor needs nothing from it for
  // R - 1 steps), the receiver returns credits: credit i after its landing wait of
  // message (i + 1) Q - 1, and the source sends message k >= M only after credit
  // ceil((k - M + 1) / Q) - 1, so message k - M has been waited for. A credit covers
  // Q messages (Q = M / 2: one 4-byte DMA per Q messages, against a data DMA each),
  // and it points back to an earlier step (M + 1 - Q >= 1 messages back), so the
  // step order stays free of cycles. Credits land on the sender's entry-token flag.
  const size_t Q = static_cast<size_t>(std::max(1, M / 2)), Mz = static_cast<size_t>(M);
  // The credit message k of a pair waits for (-1: none), and how many credits a
  // pair of `messages` messages takes.
  auto credit_for = [&](size_t k) { return k < Mz ? -1 : static_cast<int64_t>((k - Mz + 1 + Q - 1) / Q) - 1; };
  auto credits_of = [&](size_t messages) { return messages <= Mz ? size_t(0) : (messages - Mz + Q - 1) / Q; };
  // The credit the receiver returns after its wait for message j of a pair of
  // `messages` (-1: none): credit i after message (i + 1) Q - 1, if a message
  // M + i Q follows to wait for it.
  auto credit_after = [&](size_t j, size_t messages) {
    return (j + 1) % Q == 0 && Mz + j + 1 - Q < messages ? static_cast<int64_t>((j + 1) / Q) - 1 : int64_t(-1);
  };
  // The order in which a replica sends and combines (its program) is one static
  // sequence of waits, so it follows a dataflow estimate of the whole collective:
  // every replica's sends (step, destination) and combines (step, source) are list
  // scheduled over all replicas at once, an event starting as soon as what it
  // depends on is done (a send: the combines that last wrote its chunks; a combine:
  // the landing, earlier writes of its chunks and the sends that read them) and its
  // replica is free, and each replica's program takes its events in that order. A
  // group whose data lands early thus goes on without waiting for a slower group's
  // step, as the network-level runs of docs/ici.md do; a lockstep order (all of a
  // step's sends, then its combines) left the links idle for a neighbour latency
  // per step, 1.2x the closed form on v3-8 even with every link in use.
  // The estimate: a neighbour message costs the preset-independent v4 fit (setup
  // 1243 cycles, 698 more of latency, 64 B/cycle on a link that serialises the
  // messages queued on it; the same chip: 414 + 2 cycles/KiB), a staged send 2
  // cycles per tile, a combine 4 (reduce) or 2 (copy). Only the order depends on it.
  using Event = PlanEvent;
  auto overlaps = [](const ici::Chunk& a, const ici::Chunk& b) {
    return a.offset < b.offset + b.elems && b.offset < a.offset + a.elems;
  };
  // The plan, kept likewise (the shape above says why).
  static std::mutex plan_mutex;
  struct Plan {
    std::vector<std::vector<Event>> events;
    bool credits = false;  // the step order with credits (above)
  };
  static std::map<std::string, std::shared_ptr<const Plan>> plan_cache;
  std::shared_ptr<const Plan> plan;
  {
    std::lock_guard<std::mutex> lock(plan_mutex);
    auto hit = plan_cache.find(plan_key);
    if (hit != plan_cache.end()) plan = hit->second;
  }
  // chunks[r][i]: what event i of replica r reads (send) or writes (combine).
  std::vector<std::vector<Event>> evs(P);
  std::vector<std::vector<std::vector<int>>> ev_chunks(P);
  std::vector<std::vector<int64_t>> ev_bytes(P);
  std::vector<std::map<std::tuple<bool, size_t, int>, size_t>> ev_index(P);
  // Only where the plan is made (the first replica's lowering), in one pass over
  // the schedule: a pass per replica each cost R x the schedule, 40 s of a
  // 256-replica ring's compile.
  for (size_t st = 0; !plan && st < sch.steps.size(); ++st) {
    for (int pass = 0; pass < 2; ++pass) {
      const bool send = pass == 0;
      for (const ici::Move& m : sch.steps[st]) {
        const size_t r = static_cast<size_t>(send ? m.src : m.dst);
        const int peer = send ? m.dst : m.src;
        auto key = std::make_tuple(send, st, peer);
        auto it = ev_index[r].find(key);
        size_t i;
        if (it == ev_index[r].end()) {
          i = evs[r].size();
          ev_index[r][key] = i;
          evs[r].push_back({send, st, peer});
          ev_chunks[r].emplace_back();
          ev_bytes[r].push_back(0);
        } else {
          i = it->second;
        }
        ev_chunks[r][i].push_back(send ? m.src_chunk : m.dst_chunk);
        ev_bytes[r][i] += sch.chunks[static_cast<size_t>(m.src_chunk)].elems * 4;
      }
    }
  }
  // Flag reuse check: the receiver's combine of the j-th message must happen
  // before the source issues the (j+M)-th, through program order and landings
  // (a send -> the destination's combine of it) and, with credits, the credits (a
  // combine -> the source's send that waits for its credit). Returns the first
  // (receiver, source) where it does not, or (-1, -1).
  auto flag_reuse_violation = [&](const std::vector<std::vector<Event>>& all, bool credits) {
    std::vector<size_t> base(P + 1, 0);
    for (size_t r = 0; r < P; ++r) base[r + 1] = base[r] + all[r].size();
    std::map<std::tuple<size_t, bool, size_t, int>, size_t> id;
    for (size_t r = 0; r < P; ++r)
      for (size_t i = 0; i < all[r].size(); ++i) id[{r, all[r][i].send, all[r][i].step, all[r][i].peer}] = base[r] + i;
    // Each event's successors besides the next event of its program: a send's
    // landing (the receiver's combine of it), a combine's credit.
    std::vector<size_t> owner(base[P]), other(base[P], SIZE_MAX);
    for (size_t r = 0; r < P; ++r)
      for (size_t i = 0; i < all[r].size(); ++i) {
        const size_t e = base[r] + i;
        const Event& x = all[r][i];
        owner[e] = r;
        if (x.send) {
          other[e] = id.at({static_cast<size_t>(x.peer), false, x.step, static_cast<int>(r)});
        } else if (credits) {  // credit i goes back to the source's message M + i Q
          const auto& v = send_steps[r].at(x.peer);
          if (const int64_t i = credit_after(message_index(static_cast<int>(r), x.peer, x.step), v.size()); i >= 0)
            other[e] = id.at({static_cast<size_t>(x.peer), true, v[Mz + static_cast<size_t>(i) * Q], static_cast<int>(r)});
        }
      }
    // Reaching event k of the source's program reaches all its later events, so
    // `to` is reachable from `from` iff the earliest source event reachable is at
    // or before it. The queries go by their `from` latest first: what an earlier
    // event of the receiver reaches includes what its later ones do, so one walk
    // grows the reached set for all of them (a walk per query, each over the whole
    // collective, took 6 minutes for bidir-ring over v4-4x4x4's 128 replicas).
    std::vector<uint32_t> seen(base[P], 0);  // == walk: reached in this walk (no clearing between walks)
    uint32_t walk = 0;
    std::vector<size_t> stack;
    std::vector<std::pair<size_t, size_t>> queries;  // (from, to)
    for (size_t receiver = 0; receiver < P; ++receiver)
      for (const auto& [src, v] : send_steps[receiver]) {
        queries.clear();
        for (size_t j = 0; j + Mz < v.size(); ++j)
          queries.emplace_back(id.at({receiver, false, v[j], src}),
                               id.at({static_cast<size_t>(src), true, v[j + Mz], static_cast<int>(receiver)}));
        std::sort(queries.rbegin(), queries.rend());
        ++walk;
        size_t earliest = SIZE_MAX;  // of the source's events reached so far
        for (const auto& [from, to] : queries) {
          if (seen[from] != walk) {
            seen[from] = walk;
            stack.push_back(from);
          }
          while (!stack.empty()) {
            const size_t e = stack.back();
            stack.pop_back();
            if (owner[e] == static_cast<size_t>(src)) earliest = std::min(earliest, e);
            for (const size_t o : {e + 1 < base[owner[e] + 1] ? e + 1 : SIZE_MAX, other[e]})
              if (o != SIZE_MAX && seen[o] != walk) {
                seen[o] = walk;
                stack.push_back(o);
              }
          }
          if (earliest > to) return std::make_pair(static_cast<int>(receiver), src);
        }
      }
    return std::make_pair(-1, -1);
  };
  if (!plan) {
    std::vector<std::vector<Event>> plans;
    bool step_order = true;
    size_t total = 0;
    for (const auto& e : evs) total += e.size();
    if (total > kMaxPlanEvents) {
      plans = evs;
    } else {
      // Local predecessors of each event (indices into the replica's own events): j
      // before i where j is a combine of an earlier step writing what i reads or
      // writes, or a send of this or an earlier step reading what combine i writes,
      // and their chunks overlap. Found by a sweep over the replica's chunks in
      // offset order (comparing every pair of a replica's events was O(events^2):
      // 2.1 M events in a bidirectional ring of 512 replicas).
      std::vector<std::vector<std::vector<size_t>>> preds(P), succs(P);
      for (size_t r = 0; r < P; ++r) {
        const auto& e = evs[r];
        preds[r].resize(e.size());
        succs[r].resize(e.size());
        std::vector<std::tuple<int64_t, int64_t, size_t>> iv;  // (offset, end, event)
        for (size_t i = 0; i < e.size(); ++i)
          for (int a : ev_chunks[r][i]) {
            const ici::Chunk& c = sch.chunks[static_cast<size_t>(a)];
            if (c.elems > 0) iv.emplace_back(c.offset, c.offset + c.elems, i);
          }
        std::sort(iv.begin(), iv.end());
        auto before = [&](size_t j, size_t i) {
          return !e[j].send ? e[j].step < e[i].step : (!e[i].send && e[j].step <= e[i].step);
        };
        for (size_t x = 0; x < iv.size(); ++x)
          for (size_t y = x + 1; y < iv.size() && std::get<0>(iv[y]) < std::get<1>(iv[x]); ++y) {
            const size_t i = std::get<2>(iv[x]), j = std::get<2>(iv[y]);
            if (i == j) continue;
            if (before(j, i)) preds[r][i].push_back(j);
            if (before(i, j)) preds[r][j].push_back(i);
          }
        for (size_t i = 0; i < e.size(); ++i) {
          auto& v = preds[r][i];
          std::sort(v.begin(), v.end());
          v.erase(std::unique(v.begin(), v.end()), v.end());
          for (size_t j : v) succs[r][j].push_back(i);
        }
      }
      std::vector<std::vector<int64_t>> finish(P), landed(P);
      std::vector<int64_t> clock(P, 0);
      std::map<std::pair<int, int>, int64_t> link_free;  // (chip, first port) -> cycle
      // The first link of a message between two replicas: (-1, -1) on one chip. The
      // tie of a size-2 dimension goes by the issuing core's parity (hw/dma).
      auto link_of = [&](int from_r, int to_r) {
        const int from = replica_chip(s, from_r), to = replica_chip(s, to_r);
        if (from == to) return std::make_pair(-1, -1);
        const std::vector<int> ports = s.board.route_ports(from, to, replica_core(s, from_r) % 2 ? -1 : +1);
        return std::make_pair(from, ports.empty() ? -1 : ports.front());
      };
      // Per event: its other end (a send: the receiver's combine of it; a combine:
      // the sender's send), a send's first link, whether a combine adds, and what
      // it still waits for (its local predecessors, and a combine its send).
      std::vector<std::vector<size_t>> other_end(P), waiting(P);
      std::vector<std::vector<std::pair<int, int>>> first_link(P);
      std::vector<std::vector<char>> adds(P);
      for (size_t r = 0; r < P; ++r) {
        finish[r].assign(evs[r].size(), 0);
        landed[r].assign(evs[r].size(), 0);
        other_end[r].assign(evs[r].size(), 0);
        first_link[r].assign(evs[r].size(), {-1, -1});
        adds[r].assign(evs[r].size(), 0);
        waiting[r].assign(evs[r].size(), 0);
        for (size_t i = 0; i < evs[r].size(); ++i) {
          const Event& ev = evs[r][i];
          other_end[r][i] = ev_index[static_cast<size_t>(ev.peer)].at({!ev.send, ev.step, static_cast<int>(r)});
          if (ev.send) first_link[r][i] = link_of(static_cast<int>(r), ev.peer);
          waiting[r][i] = preds[r][i].size() + (ev.send ? 0 : 1);
        }
      }
      for (size_t st = 0; st < sch.steps.size(); ++st)
        for (const ici::Move& m : sch.steps[st])
          if (m.reduce) adds[static_cast<size_t>(m.dst)][ev_index[static_cast<size_t>(m.dst)].at({false, st, m.src})] = 1;
      std::vector<std::vector<size_t>> order(P);
      const int64_t tiles_per_byte_div = tile_bytes;
      // An event's start once it is ready: its replica free, its predecessors done,
      // a combine's data landed, a send's link about to be free (two messages on
      // one link share it packet by packet, which would slow the earlier, critical,
      // one, while the estimate sends them one after the other).
      auto start_now = [&](size_t r, size_t i) {
        int64_t t = clock[r];
        for (size_t j : preds[r][i]) t = std::max(t, finish[r][j]);
        const Event& ev = evs[r][i];
        if (!ev.send) {
          t = std::max(t, landed[static_cast<size_t>(ev.peer)][other_end[r][i]]);
        } else if (first_link[r][i].first >= 0) {
          auto it = link_free.find(first_link[r][i]);
          if (it != link_free.end()) t = std::max(t, it->second - 1243);
        }
        return t;
      };
      // Each replica's ready events in a heap by (start, index), the start as last
      // worked out. Every term of a start only grows (the replica's clock, a link's
      // free time), so a stale start is too early, never too late: the top whose
      // start is still the same is the replica's candidate, the same event (ties to
      // the first index) as a scan of all its events. The candidates are kept in a
      // set by (start, replica): the run takes the set's first. Taking an event
      // changes the candidates only of its replica, of a send's receiver (the
      // landing) and of the replicas on its chip (the link's free time).
      using HeapEntry = std::pair<int64_t, size_t>;
      std::vector<std::priority_queue<HeapEntry, std::vector<HeapEntry>, std::greater<HeapEntry>>> ready(P);
      for (size_t r = 0; r < P; ++r)
        for (size_t i = 0; i < evs[r].size(); ++i)
          if (waiting[r][i] == 0) ready[r].push({start_now(r, i), i});
      auto candidate = [&](size_t r) {
        auto& h = ready[r];
        while (!h.empty()) {
          const auto [was, i] = h.top();
          const int64_t t = start_now(r, i);
          if (t == was) return std::make_pair(t, i);
          h.pop();
          h.push({t, i});
        }
        return std::make_pair(INT64_MAX, size_t(0));
      };
      std::map<int, std::vector<size_t>> on_chip;  // chip -> its replicas
      for (size_t r = 0; r < P; ++r) on_chip[replica_chip(s, static_cast<int>(r))].push_back(r);
      std::set<std::tuple<int64_t, size_t, size_t>> candidates;  // (start, replica, event)
      std::vector<std::pair<int64_t, size_t>> cand(P, {INT64_MAX, 0});
      auto refresh = [&](size_t r) {
        if (cand[r].first != INT64_MAX) candidates.erase({cand[r].first, r, cand[r].second});
        cand[r] = candidate(r);
        if (cand[r].first != INT64_MAX) candidates.insert({cand[r].first, r, cand[r].second});
      };
      for (size_t r = 0; r < P; ++r) refresh(r);
      for (size_t left = total; left > 0; --left) {
        if (candidates.empty()) fail(n, "internal lowering error: the collective's schedule has a dependence cycle");
        const auto [best, br, bi] = *candidates.begin();
        if (ready[br].empty() || ready[br].top().second != bi)  // refresh(br) follows every push to it
          fail(n, "internal lowering error: replica " + std::to_string(br) + "'s ready events lost its candidate");
        ready[br].pop();
        const Event& e = evs[br][bi];
        const int64_t tiles = (ev_bytes[br][bi] + tiles_per_byte_div - 1) / tiles_per_byte_div;
        finish[br][bi] = best + 10 + (e.send ? 2 : (adds[br][bi] ? 4 : 2)) * tiles;
        if (e.send) {
          const auto key = first_link[br][bi];
          if (key.first < 0) {
            landed[br][bi] = finish[br][bi] + 414 + ev_bytes[br][bi] / 512;
          } else {
            int64_t& f = link_free[key];
            f = std::max(f, finish[br][bi] + 1243) + ev_bytes[br][bi] / 64;
            landed[br][bi] = f + 698 * static_cast<int64_t>(std::max(1, s.board.hops(key.first, replica_chip(s, e.peer))));
          }
        }
        clock[br] = finish[br][bi];
        order[br].push_back(bi);
        for (size_t i : succs[br][bi])
          if (--waiting[br][i] == 0) ready[br].push({start_now(br, i), i});
        if (e.send) {
          const size_t q = static_cast<size_t>(e.peer), c = other_end[br][bi];
          if (--waiting[q][c] == 0) ready[q].push({start_now(q, c), c});
        }
        refresh(br);
        if (e.send) {
          refresh(static_cast<size_t>(e.peer));
          for (size_t q : on_chip[replica_chip(s, static_cast<int>(br))]) refresh(q);
        }
      }
      plans.assign(P, {});
      for (size_t r = 0; r < P; ++r)
        for (size_t i : order[r]) plans[r].push_back(evs[r][i]);
      // The dataflow order may let a source run further ahead of a receiver than its
      // flags allow (a 4x4 torus dimension in HBM mode); then every replica takes the
      // step order (all of a step's sends, then its combines), as before.
      step_order = flag_reuse_violation(plans, false).first >= 0;
      if (step_order) plans = evs;
    }
    // The step order too may let a source run too far ahead: then it takes
    // credits, which make the flags hold by construction; the check confirms it.
    const bool credits = step_order && flag_reuse_violation(plans, false).first >= 0;
    if (const auto [r, src] = credits ? flag_reuse_violation(plans, true) : std::make_pair(-1, -1); r >= 0)
      fail(n, "internal lowering error: with credits, replica " + std::to_string(src) + " may still run more than " +
                  std::to_string(M) + " messages ahead of replica " + std::to_string(r));
    plan = std::make_shared<const Plan>(Plan{std::move(plans), credits});
    std::lock_guard<std::mutex> lock(plan_mutex);
    plan_cache[plan_key] = plan;
  }
  const std::vector<Event>& mine = plan->events[static_cast<size_t>(me)];
  const bool credits = plan->credits;
  if (credits && opt_.explain_collectives)
    op_note("landing flags reused after credits: a source runs at most " + std::to_string(M) +
            " messages ahead of a receiver, which returns a credit every " + std::to_string(Q) + " messages");
  auto ready_flag = [&](int src, int dst) {
    return kFirstReadyFlag + index_in(dests[static_cast<size_t>(src)], dst, kReadyFlags);
  };

  // One spare tile: a tile load of a chunk that ends unaligned reads past it.
  const int64_t w_bytes = align_up(E * 4, tile_bytes) + tile_bytes;
  const int64_t conv_bytes = f32 ? 0 : align_up(E * 2, tile_bytes);  // bf16 staging of x and y
  // VMEM mode sends from private staging copies in a ring of send slots (the rest
  // of VMEM), so a combine never waits for its own sends' round trip before it
  // overwrites W; only when the ring wraps does the replica wait for its sends.
  // The mode must be the same on every replica (senders address the receiver's
  // space), so it is decided from the schedule, not from this replica's moves.
  const int64_t vmem_top = static_cast<int64_t>(opt_.target.vmem_bytes) / tile_bytes * tile_bytes;
  const bool in_vmem = w_bytes + slots_bytes + conv_bytes + shape->largest <= vmem_top;
  // The same HBM tensor in another replica's region (same layout, its core's base).
  auto there = [&](int r, int64_t addr) {
    return addr - opt_.hbm_base + static_cast<int64_t>(replica_core(s, r)) * opt_.replica_region;
  };
  auto endpoint = [&](const char* space, int r) {
    return std::string(space) + "@chip" + std::to_string(replica_chip(s, r)) + ".c" + std::to_string(replica_core(s, r));
  };
  int64_t& sent = coll_sent_;

  int64_t W, slots, conv = 0;
  if (in_vmem) {
    W = 0;
    slots = w_bytes;
    conv = slots + slots_bytes;
  } else {
    W = f32 ? Y.addr : place_hbm(E * 4);
    slots = place_hbm(slots_bytes);
    check_addr(n, slots + slots_bytes + s.cores_per_chip * opt_.replica_region);
  }
  // Entry tokens (HBM scratch of this node, 4 bytes per writer): they keep every
  // landing of this collective after the receiver left its previous node, whose
  // code may use the same VMEM and whose collectives the same flags.
  const int64_t zero = place_hbm(4), tokens = place_hbm_pinned(4 * kReadyFlags);  // tokens: written before we enter
  check_addr(n, tokens + s.cores_per_chip * opt_.replica_region);
  // Credits: a word each in the source's HBM (pinned, like the tokens), per
  // destination of the source, so no two DMAs write one.
  size_t most_credits = 0;
  for (size_t d = 0; credits && d < P; ++d)
    for (const auto& [src, v] : send_steps[d]) most_credits = std::max(most_credits, credits_of(v.size()));
  const int64_t credit_bytes = static_cast<int64_t>(4 * kReadyFlags * most_credits);
  const int64_t credit_words = most_credits ? place_hbm_pinned(credit_bytes) : 0;
  if (most_credits) check_addr(n, credit_words + credit_bytes + s.cores_per_chip * opt_.replica_region);
  for (int src : sources[static_cast<size_t>(me)]) {
    const int64_t at_src = there(src, tokens) + 4 * index_in(dests[static_cast<size_t>(src)], me, kReadyFlags);
    line("dma " + endpoint("hbm", src) + ":" + at(at_src) + ", " + hbm(zero) + ", bytes=4, flag=" + kSendFlag +
         ", rflag=f" + std::to_string(ready_flag(src, me)));
    ++sent;
  }
  const char* wspace = in_vmem ? "vmem" : "hbm";
  auto wref = [&](int64_t a) { return std::string(wspace) + ":" + at(a); };
  const int64_t A = 0, B = kPieceElems * 4;  // HBM mode's VMEM pieces: received / local

  // Stores tile t of a run of `count` fp32 elements from v1 at `addr`: a whole tile,
  // or its full rows and then the partial row under masks (m1, m2 scratch).
  auto store_tile = [&](int64_t addr, int64_t t, int64_t count) {
    const int64_t left = count - t * kTileElems;
    if (left >= kTileElems) {
      line("vst v1, " + at(addr));
      return;
    }
    const int64_t rows = left / 128, lanes = left % 128;
    if (rows) {
      line("vmask m1, " + std::to_string(rows) + ", 128");
      line("vst v1, " + at(addr) + ", mask=m1");
    }
    if (lanes) {
      line("vmask m1, " + std::to_string(rows) + ", 128");
      line("vmask m2, " + std::to_string(rows + 1) + ", " + std::to_string(lanes));
      line("mnot m1, m1");
      line("mand m2, m2, m1");
      line("vst v1, " + at(addr) + ", mask=m2");
    }
  };

  auto written_before = [&](int r, size_t st, const ici::Chunk& c) {
    for (const auto& [e, x] : writes[static_cast<size_t>(r)]) {
      if (e >= st) break;
      if (overlaps(sch.chunks[static_cast<size_t>(x)], c)) return true;
    }
    return false;
  };
  // How much of c this replica's moves before step st (or all, st = SIZE_MAX) wrote:
  // 0 none, 1 part, 2 all of it.
  auto covered = [&](size_t st, const ici::Chunk& c) {
    std::vector<std::pair<int64_t, int64_t>> w;
    for (const auto& [e, x] : writes[static_cast<size_t>(me)]) {
      if (e >= st) break;
      const ici::Chunk& wc = sch.chunks[static_cast<size_t>(x)];
      if (overlaps(wc, c)) w.emplace_back(wc.offset, wc.offset + wc.elems);
    }
    if (w.empty()) return 0;
    std::sort(w.begin(), w.end());
    int64_t reach = c.offset;
    for (const auto& [lo, hi] : w)
      if (lo <= reach) reach = std::max(reach, hi);
    return reach >= c.offset + c.elems ? 2 : 1;
  };
  // HBM mode, fp32: no copy of x into W when every chunk this replica reads is
  // either untouched (read from x) or wholly written before (read from W), and the
  // moves write all of W (W is y).
  bool hbm_direct = !in_vmem && f32 && covered(SIZE_MAX, ici::Chunk{0, E}) == 2;
  for (size_t st = 0; hbm_direct && st < sch.steps.size(); ++st)
    for (const ici::Move& m : sch.steps[st]) {
      if (m.src == me) hbm_direct = hbm_direct && covered(st, sch.chunks[static_cast<size_t>(m.src_chunk)]) != 1;
      if (m.dst == me && m.reduce) hbm_direct = hbm_direct && covered(st, sch.chunks[static_cast<size_t>(m.dst_chunk)]) != 1;
    }
  // Where this replica's current values of c live in HBM mode before step st.
  auto hbm_src = [&](size_t st, const ici::Chunk& c) { return hbm_direct && covered(st, c) == 0 ? X.addr : W; };

  // W = fp32(x). VMEM mode, fp32: only the ranges this replica reads before it
  // writes them are loaded, after its first sends (straight from x, see below) have
  // taken their DMA engines, and waited for before the first combine.
  const bool streamed = in_vmem && f32;
  bool loaded = !streamed, load_issued = !streamed;
  if (streamed) {
  } else if (f32 && !hbm_direct) {
    dma(wref(W), hbm(X.addr), E * 4);
    wait_dmas();
  } else if (!f32) {
    const int64_t piece = in_vmem ? E : kPieceElems;
    for (int64_t p0 = 0; p0 < E; p0 += piece) {
      const int64_t pn = std::min(piece, E - p0);
      const int64_t stage = in_vmem ? conv : A;
      dma(vmem(stage), hbm(X.addr + p0 * 2), pn * 2);
      wait_dmas();
      for (int64_t t = 0; t * kTileElems < pn; ++t) {
        line("vld.bf16 v1, " + at(stage + t * kTileElems * 2));
        line("vst v1, " + at((in_vmem ? W + p0 * 4 : B) + t * tile_bytes));
      }
      if (!in_vmem) {
        dma(hbm(W + p0 * 4), vmem(B), pn * 4);
        wait_dmas();
      }
    }
  }

  // A send whose chunks the sender has not written yet goes straight from x in HBM
  // (VMEM mode, fp32): no staging copy, and no wait for W's load. Its chunks go as
  // one DMA when they are evenly spaced in x and in the receiver's slots (a dim=
  // of the longest chunk's length: a shorter chunk's extra element lands in its
  // slot's padding), else one DMA per chunk, which the receiver counts.
  struct XSend {
    bool direct = false;
    std::vector<size_t> ks;  // moves of the step
    int64_t len = 0, src_stride = 0, dst_stride = 0;
    bool one_dma = false;
  };
  auto x_send = [&](int src, size_t st, int dst) {
    XSend x;
    if (!streamed) return x;
    const auto& moves = sch.steps[st];
    for (size_t k = 0; k < moves.size(); ++k)
      if (moves[k].src == src && moves[k].dst == dst) {
        if (written_before(src, st, sch.chunks[static_cast<size_t>(moves[k].src_chunk)])) return x;
        x.ks.push_back(k);
      }
    x.direct = !x.ks.empty();
    auto chunk = [&](size_t i) { return sch.chunks[static_cast<size_t>(moves[x.ks[i]].src_chunk)]; };
    for (size_t i = 0; i < x.ks.size(); ++i) x.len = std::max(x.len, chunk(i).elems);
    x.one_dma = true;
    for (size_t i = 0; i < x.ks.size(); ++i) {
      x.one_dma = x.one_dma && align_up(chunk(i).elems * 4, tile_bytes) >= x.len * 4 && chunk(i).offset + x.len <= E;
      if (i == 1) {
        x.src_stride = (chunk(1).offset - chunk(0).offset) * 4;
        x.dst_stride = slot[st][x.ks[1]] - slot[st][x.ks[0]];
      }
      if (i >= 1)
        x.one_dma = x.one_dma && (chunk(i).offset - chunk(i - 1).offset) * 4 == x.src_stride &&
                    slot[st][x.ks[i]] - slot[st][x.ks[i - 1]] == x.dst_stride;
    }
    return x;
  };
  auto from_x = [&](int src, size_t st, int dst) { return x_send(src, st, dst).direct; };
  // The ranges of W to load: read (added into, or staged for a send) before written.
  std::vector<std::pair<int64_t, int64_t>> need;
  for (size_t i = 0; streamed && i < mine.size(); ++i) {
    const Event& ev = mine[i];
    if (ev.send && from_x(me, ev.step, ev.peer)) continue;
    for (const ici::Move& m : sch.steps[ev.step]) {
      if (ev.send ? (m.src != me || m.dst != ev.peer) : (m.dst != me || m.src != ev.peer || !m.reduce)) continue;
      const ici::Chunk& c = sch.chunks[static_cast<size_t>(ev.send ? m.src_chunk : m.dst_chunk)];
      if (!written_before(me, ev.step, c)) need.emplace_back(c.offset, c.offset + c.elems);
    }
  }
  std::sort(need.begin(), need.end());
  auto issue_loads = [&] {
    load_issued = true;
    for (size_t i = 0; i < need.size();) {
      int64_t lo = need[i].first, hi = need[i].second;
      for (++i; i < need.size() && need[i].first <= hi; ++i) hi = std::max(hi, need[i].second);
      dma_on(kLoadFlag, vmem(W + lo * 4), hbm(X.addr + lo * 4), (hi - lo) * 4, "");
    }
  };
  // VMEM mode, fp32: each run of W's tiles goes to y right after the combine that
  // writes them for the last time (whole tiles: a masked store into a tile that two
  // chunks share writes the whole tile as far as the DMA ordering rules go), so
  // storing y overlaps the rest of the collective.
  const int64_t w_tiles = (E + kTileElems - 1) / kTileElems;
  std::vector<size_t> last_write(static_cast<size_t>(streamed ? w_tiles : 0), SIZE_MAX);
  for (size_t i = 0; streamed && i < mine.size(); ++i) {
    if (mine[i].send) continue;
    for (const ici::Move& m : sch.steps[mine[i].step]) {
      if (m.dst != me || m.src != mine[i].peer) continue;
      const ici::Chunk& c = sch.chunks[static_cast<size_t>(m.dst_chunk)];
      // A combine stores whole tiles from the chunk's start (the last one masked).
      const int64_t end = std::min(w_tiles * kTileElems, c.offset + align_up(c.elems, kTileElems));
      for (int64_t t = c.offset / kTileElems; t * kTileElems < end; ++t) last_write[static_cast<size_t>(t)] = i;
    }
  }
  auto store_runs = [&](size_t event) {
    for (int64_t t = 0; t < w_tiles;) {
      if (last_write[static_cast<size_t>(t)] != event) {
        ++t;
        continue;
      }
      int64_t u = t;
      while (u < w_tiles && last_write[static_cast<size_t>(u)] == event) ++u;
      const int64_t lo = t * kTileElems, hi = std::min(E, u * kTileElems);
      dma_on(kStoreFlag, hbm(Y.addr + lo * 4), vmem(W + lo * 4), (hi - lo) * 4, "");
      t = u;
    }
  };
  std::set<int> ready;  // destinations whose entry token this replica has waited for
  std::map<int, int64_t> credit_waited;  // destination -> credits waited for
  std::vector<std::pair<int64_t, int64_t>> pending;  // HBM mode: W ranges (elements) in-flight sends read
  const int64_t ring = conv + conv_bytes;              // VMEM mode: the send slots' ring
  int64_t send_slot = ring;
  for (size_t event = 0; event < mine.size(); ++event) {
    const Event& ev = mine[event];
    if (event > 0 && streamed && !mine[event - 1].send) store_runs(event - 1);
    if (!load_issued && !(ev.send && from_x(me, ev.step, ev.peer))) issue_loads();
    const size_t st = ev.step;
    const auto& moves = sch.steps[st];
    if (ev.send) {
      const int d = ev.peer;
      if (ready.insert(d).second) {
        const int f = ready_flag(me, d);
        wait_landed(f, 1);
      }
      if (const int64_t c = credits ? credit_for(message_index(d, me, st)) : -1; c >= 0 && credit_waited[d] <= c) {
        const int f = ready_flag(me, d);  // the token, then credits 0..c
        line("wait f" + std::to_string(f) + ", " + std::to_string(coll_landed_[f] + c + 1));
        credit_waited[d] = c + 1;
      }
      const std::string rflag = ", flag=" + std::string(kSendFlag) + ", rflag=f" + std::to_string(land_flag(d, me, st));
      std::vector<size_t> ks;
      for (size_t k = 0; k < moves.size(); ++k)
        if (moves[k].src == me && moves[k].dst == d) ks.push_back(k);
      if (!in_vmem) {
        for (size_t k : ks) {
          const ici::Chunk& c = sch.chunks[static_cast<size_t>(moves[k].src_chunk)];
          if (hbm_src(st, c) == W) pending.emplace_back(c.offset, c.elems);
          // A copying move lands straight in the receiver's W: it holds the final
          // sum there, which nothing else on the receiver writes or still reads.
          const int64_t to = moves[k].reduce ? slots + slot[st][k] : W + sch.chunks[static_cast<size_t>(moves[k].dst_chunk)].offset * 4;
          line("dma " + endpoint(wspace, d) + ":" + at(there(d, to)) + ", " + hbm(hbm_src(st, c) + c.offset * 4) +
               ", bytes=" + std::to_string(c.elems * 4) + rflag);
          ++sent;
        }
        continue;
      }
      const XSend xs = x_send(me, st, d);
      if (xs.direct && xs.one_dma) {
        const ici::Chunk& c = sch.chunks[static_cast<size_t>(moves[xs.ks.front()].src_chunk)];
        const std::string dims = xs.ks.size() < 2 ? "" : ", dim=" + std::to_string(xs.ks.size()) + ":" +
                                                          std::to_string(xs.src_stride) + ":" + std::to_string(xs.dst_stride);
        line("dma " + endpoint("vmem", d) + ":" + at(slots + slot[st][xs.ks.front()]) + ", " + hbm(X.addr + c.offset * 4) +
             ", bytes=" + std::to_string(xs.len * 4) + dims + rflag);
        ++sent;
        continue;
      }
      if (xs.direct) {
        for (size_t k : ks) {
          const ici::Chunk& c = sch.chunks[static_cast<size_t>(moves[k].src_chunk)];
          line("dma " + endpoint("vmem", d) + ":" + at(slots + slot[st][k]) + ", " + hbm(X.addr + c.offset * 4) +
               ", bytes=" + std::to_string(c.elems * 4) + rflag);
          ++sent;
        }
        continue;
      }
      if (!loaded) {
        wait_flag(kLoadFlag);
        loaded = true;
      }
      // Staged copies laid out as the receiver's slots for them, one DMA.
      int64_t span = 0;
      for (size_t k : ks) span += align_up(sch.chunks[static_cast<size_t>(moves[k].src_chunk)].elems * 4, tile_bytes);
      if (send_slot + span > vmem_top) {
        line(std::string("wait ") + kSendFlag + ", " + std::to_string(sent));
        send_slot = ring;
      }
      int64_t off = 0, bytes = 0;
      for (size_t k : ks) {
        const ici::Chunk& c = sch.chunks[static_cast<size_t>(moves[k].src_chunk)];
        for (int64_t t = 0; t * kTileElems < c.elems; ++t) {
          line("vld v1, " + at(W + c.offset * 4 + t * tile_bytes));
          line("vst v1, " + at(send_slot + off + t * tile_bytes));
        }
        bytes = off + c.elems * 4;
        off += align_up(c.elems * 4, tile_bytes);
      }
      line("dma " + endpoint("vmem", d) + ":" + at(slots + slot[st][ks.front()]) + ", " + vmem(send_slot) +
           ", bytes=" + std::to_string(bytes) + rflag);
      ++sent;
      send_slot += span;
      continue;
    }
    // The landings from ev.peer in this step: one DMA (VMEM mode) or one per move.
    int64_t count = 0;
    for (const ici::Move& m : moves) count += m.dst == me && m.src == ev.peer;
    const int f = land_flag(me, ev.peer, st);
    const XSend xs = x_send(ev.peer, st, me);
    line("wait f" + std::to_string(f) + ", " +
         std::to_string(coll_landed_[f] += in_vmem && (!xs.direct || xs.one_dma) ? 1 : count));
    if (const int64_t i = credits ? credit_after(message_index(me, ev.peer, st),
                                                 send_steps[static_cast<size_t>(me)].at(ev.peer).size())
                                  : -1;
        i >= 0) {
      const int64_t word = index_in(dests[static_cast<size_t>(ev.peer)], me, kReadyFlags) * static_cast<int64_t>(most_credits) + i;
      line("dma " + endpoint("hbm", ev.peer) + ":" + at(there(ev.peer, credit_words + 4 * word)) + ", " + hbm(zero) +
           ", bytes=4, flag=" + kSendFlag + ", rflag=f" + std::to_string(ready_flag(ev.peer, me)));
      ++sent;
    }
    if (!loaded) {
      wait_flag(kLoadFlag);
      loaded = true;
    }
    for (size_t k = 0; k < moves.size(); ++k) {
      const ici::Move& m = moves[k];
      if (m.dst != me || m.src != ev.peer) continue;
      const ici::Chunk& c = sch.chunks[static_cast<size_t>(m.dst_chunk)];
      // HBM mode: a W chunk that this replica's own in-flight sends still read is
      // overwritten only after they complete (a send's completion flag takes a
      // round trip, so this wait is paid only where a schedule reuses a chunk soon).
      bool overlap = false;
      for (const auto& [o, e] : pending) overlap = overlap || (o < c.offset + c.elems && c.offset < o + e);
      if (overlap) {
        line(std::string("wait ") + kSendFlag + ", " + std::to_string(sent));
        pending.clear();
      }
      const int64_t recv = slots + slot[st][k];
      if (in_vmem) {
        for (int64_t t = 0; t * kTileElems < c.elems; ++t) {
          line("vld v1, " + at(recv + t * tile_bytes));
          if (m.reduce) {
            line("vld v2, " + at(W + c.offset * 4 + t * tile_bytes));
            line("vadd v1, v1, v2");
          }
          store_tile(W + c.offset * 4 + t * tile_bytes, t, c.elems);
        }
        continue;
      }
      if (!m.reduce) continue;  // landed in W
      // Double-buffered pieces: piece i+1 is fetched (on flag kLoad + (i+1)%2, after
      // the write-back that last used its buffers) while piece i is added.
      const int64_t pieces = (c.elems + kPieceElems - 1) / kPieceElems;
      auto buf = [&](int64_t i, int which) { return ((i % 2) * 2 + which) * kPieceElems * 4; };
      auto fetch = [&](int64_t i) {
        const int64_t p0 = i * kPieceElems, pn = std::min(kPieceElems, c.elems - p0);
        const int fl = kLoadFlag + static_cast<int>(i % 2);
        dma_on(fl, vmem(buf(i, 0)), hbm(recv + p0 * 4), pn * 4, "");
        dma_on(fl, vmem(buf(i, 1)), hbm(hbm_src(st, c) + (c.offset + p0) * 4), pn * 4, "");
      };
      fetch(0);
      for (int64_t i = 0; i < pieces; ++i) {
        if (i + 1 < pieces) {
          wait_flag(kStoreFlag + static_cast<int>((i + 1) % 2));
          fetch(i + 1);
        }
        wait_flag(kLoadFlag + static_cast<int>(i % 2));
        const int64_t p0 = i * kPieceElems, pn = std::min(kPieceElems, c.elems - p0);
        for (int64_t t = 0; t * kTileElems < pn; ++t) {
          line("vld v1, " + at(buf(i, 0) + t * tile_bytes));
          line("vld v2, " + at(buf(i, 1) + t * tile_bytes));
          line("vadd v1, v1, v2");
          line("vst v1, " + at(buf(i, 0) + t * tile_bytes));
        }
        dma_on(kStoreFlag + static_cast<int>(i % 2), hbm(W + (c.offset + p0) * 4), vmem(buf(i, 0)), pn * 4, "");
      }
      wait_flag(kStoreFlag);
      wait_flag(kStoreFlag + 1);
    }
  }
  line(std::string("wait ") + kSendFlag + ", " + std::to_string(sent));
  for (int d : credits ? dests[static_cast<size_t>(me)] : std::vector<int>{})  // each credit was waited for
    coll_landed_[ready_flag(me, d)] += static_cast<int64_t>(credits_of(send_steps[static_cast<size_t>(d)].at(me).size()));
  // y = W (bf16: rounded once).
  if (f32) {
    if (streamed) {
      if (!load_issued) issue_loads();
      if (!loaded) wait_flag(kLoadFlag);
      if (!mine.empty() && !mine.back().send) store_runs(mine.size() - 1);
      store_runs(SIZE_MAX);  // tiles no combine writes (none in an all-reduce over 2+ replicas)
      wait_flag(kStoreFlag);
    } else if (in_vmem) {
      dma(hbm(Y.addr), vmem(W), E * 4);
      wait_dmas();
    }
    return;
  }
  const int64_t piece = in_vmem ? E : kPieceElems;
  for (int64_t p0 = 0; p0 < E; p0 += piece) {
    const int64_t pn = std::min(piece, E - p0);
    const int64_t src = in_vmem ? W + p0 * 4 : A;
    const int64_t stage = in_vmem ? conv : B;
    if (!in_vmem) {
      dma(vmem(A), hbm(W + p0 * 4), pn * 4);
      wait_dmas();
    }
    for (int64_t t = 0; t * kTileElems < pn; ++t) {
      line("vld v1, " + at(src + t * tile_bytes));
      line("vst.bf16 v1, " + at(stage + t * kTileElems * 2));
    }
    dma(hbm(Y.addr + p0 * 2), vmem(stage), pn * 2);
    wait_dmas();
  }
}

}  // namespace tpusim::compiler::lowering

namespace tpusim::compiler::lowering {

// all_gather, reduce_scatter, all_to_all with {replicas=R} (one replica, or R = 1:
// the identity). Direct algorithms: every replica sends each other replica its
// block in one DMA (HBM to HBM, rflag f59 there); all_gather on chips of several
// cores sends each other chip one copy, which that chip's core passes on (rflag
// f60). First every replica sends each
// other one a 4-byte entry token over ICI (rflag f510, a word per sender in pinned
// HBM scratch) and waits for all R - 1 of theirs: a block then lands only after its
// receiver left its previous node (whose code may use the same HBM and whose
// direct collective the same f59), and the exchange costs what a token round takes
// on the links, which the ISA's board-wide `barrier` (free in the chip model) did
// not. A token of the next collective may arrive early; it counts toward that
// collective's wait only falsely when every replica has already entered this
// one (its sender finished this one, which took every replica's block).
// reduce_scatter folds the received blocks in replica order, acc = x_0; acc = acc +
// x_q, in fp32.
void Emitter::lower_direct_collective(const Node& n) {
  const ReplicaSpec& s = opt_.replicas;
  const int64_t R = n.has_attr("replicas") ? n.attr_int("replicas") : 1;
  if (s.replicas <= 1 || R <= 1) {
    lower_copy(n);
    return;
  }
  if (R != s.replicas) fail(n, "replicas=" + std::to_string(R) + " but the bundle has " + std::to_string(s.replicas));
  const Placed X = t_.at(n.inputs[0]);
  const Placed Y = t_.at(n.output);
  const DType dt = n.type.dtype;
  const int64_t e = esz(dt);
  const int64_t xb = num_elements(X.type.shape) * e;  // bytes of this replica's x
  const int me = opt_.replica;
  auto there = [&](int r, int64_t addr) {
    return addr - opt_.hbm_base + static_cast<int64_t>(replica_core(s, r)) * opt_.replica_region;
  };
  auto endpoint = [&](int r) {
    return "hbm@chip" + std::to_string(replica_chip(s, r)) + ".c" + std::to_string(replica_core(s, r));
  };
  // (destination of block q on replica q, source of it here, bytes)
  int64_t block = 0, recv_base = 0;
  auto dst_of = [&](int) -> int64_t {  // in the destination replica's layout
    switch (n.op) {
      case OpKind::kAllGather: return Y.addr + me * xb;
      case OpKind::kAllToAll: return Y.addr + me * block;
      default: return recv_base + me * block;  // reduce_scatter: q's receive slots
    }
  };
  auto src_of = [&](int q) -> int64_t { return n.op == OpKind::kAllGather ? X.addr : X.addr + q * block; };
  if (n.op == OpKind::kAllGather) {
    block = xb;
  } else {
    block = xb / R;
    if (n.op == OpKind::kReduceScatter) recv_base = place_hbm(R * block);
  }
  const int64_t zero = place_hbm(4), tokens = place_hbm_pinned(4 * R);  // tokens: written before we enter
  check_addr(n, hbm_top_ + s.cores_per_chip * opt_.replica_region);
  int64_t sent = 0;
  // A DMA from this replica's HBM to replica q's (dst in this replica's layout),
  // counted as a send (f58) and landing on q's flag `rflag`.
  auto send = [&](int q, int64_t dst, int64_t src, int64_t bytes, const std::string& dims, int rflag,
                  const char* tail = "") {
    line("dma " + endpoint(q) + ":" + at(there(q, dst)) + ", " + hbm(src) + ", bytes=" + std::to_string(bytes) + dims +
         ", flag=" + kSendFlag + ", rflag=f" + std::to_string(rflag) + tail);
    ++sent;
  };
  for (int q = 0; q < R; ++q)
    if (q != me) send(q, tokens + 4 * me, zero, 4, "", kDirectEntryFlag, ", tc=1");
  wait_landed(kDirectEntryFlag, R - 1);
  auto send_block = [&](int q, int rflag) { send(q, dst_of(q), src_of(q), block, "", rflag); };
  // all_gather on chips of several cores: one copy of the block a chip, to the core
  // of the sender's index, which passes its chip's share on to the other cores in
  // strided DMAs as it lands. Every core receiving every block over ICI sent each
  // block to each chip once per core, and doubled the links' bytes on two-core
  // chips. (A stride past the ISA's 32 bits, blocks of 1 GiB on two-core chips,
  // keeps the direct exchange.)
  const int C = s.cores_per_chip;
  const int chips = R / C;
  const bool routed = n.op == OpKind::kAllGather && R > C && R % C == 0 && C * xb <= std::numeric_limits<int32_t>::max();
  const int my_chip = replica_chip(s, me), k = replica_core(s, me);
  // Dimension by dimension (docs/codegen.md "All_gather by dimensions"): where the
  // chips form a torus of 2 or 3 dimensions, phase p sends what a core holds of
  // its index (its own chip's block, then the blocks of every chip that differs
  // from its own only in dimensions before p) to the other chips of its ring along
  // dimension p, each message one hop or two along that ring. Every block crosses
  // each ring once, where the direct exchange took each to every chip on its own
  // route (v4-4x4x4: 3 hops on average, against 4/3 a dimension). Else one phase
  // over all chips, the direct exchange.
  // Taken where the compiler's rough cost model (a neighbour message's 1941
  // cycles a phase, 64 B/cycle on a link; see plan_stream) with the mean link
  // load expects it first: on v3-8 from blocks of 248 KB, v2-4x4 21 KB,
  // v4-4x4x4 7 KB, v5e-8 166 KB.
  ici::Topology phases(ici::TopologyKind::kRing, {chips});
  if (routed) {
    const ici::Topology topo = chip_topology(s);
    int links = 0, prod = 1;
    for (int d : topo.dims()) {
      links += d - 1;
      prod *= d;
    }
    if (topo.num_dims() >= 2 && prod == chips && links <= kLandFlags) {
      constexpr double kMessage = 1941, kLinkBytesPerCycle = 64;
      auto estimate = [&](bool phased) {
        return (phased ? topo.num_dims() : 1) * kMessage +
               all_gather_link_blocks(topo, C, phased) * static_cast<double>(xb) / kLinkBytesPerCycle;
      };
      if (estimate(true) < estimate(false)) phases = topo;
    }
  }
  const std::vector<int>& pdims = phases.dims();
  const int D = phases.num_dims();
  // One-core chips have nothing to pass on: there only the phases change the route.
  const bool via_chip = routed && (C > 1 || D > 1);
  auto along = [&](int chip, int p, int j) { return chip_along(phases, chip, static_cast<size_t>(p), j); };
  // What a chip holds before phase p: the chips that differ from it only in the
  // dimensions before p, span(p) consecutive chip ids from held_lo.
  auto span = [&](int p) {
    int n = 1;
    for (int q = 0; q < p; ++q) n *= pdims[static_cast<size_t>(q)];
    return n;
  };
  auto held_lo = [&](int chip, int p) {
    std::vector<int> c = phases.coords(chip);
    for (int q = 0; q < p; ++q) c[static_cast<size_t>(q)] = 0;
    return phases.chip_at(c);
  };
  // The landings a core receives in phase p from the chip j back along dimension
  // p (the order they are sent in) land in groups of consecutive j, each group on
  // its own flag from kFirstLandFlag (the step-ordered all_reduce's landing flags,
  // which nothing lands on before its receiver has entered it: entry tokens,
  // there and here), so a group is passed on while later ones cross the links.
  // One flag for all passed nothing on before the last block had landed (v3-8, 1
  // MiB blocks: ~17.5 K of 65 K cycles). One phase over more than 33 chips puts
  // several j in a group.
  struct Group {
    int p, j0, j1;  // phase, first and last j
  };
  std::vector<Group> groups;
  std::vector<std::vector<int>> flag_of(pdims.size());  // [p][j]: the group's flag
  for (int p = 0; p < D && via_chip; ++p) {
    const size_t pp = static_cast<size_t>(p);
    const int n = pdims[pp] - 1, G = D > 1 ? n : std::min(n, kLandFlags);
    flag_of[pp].assign(static_cast<size_t>(n + 1), -1);
    for (int j = 1; j <= n; ++j) {
      if (j == 1 || (j - 1) * G / n != (j - 2) * G / n)
        groups.push_back({p, j, j});
      else
        groups.back().j1 = j;
      flag_of[pp][static_cast<size_t>(j)] = kFirstLandFlag + static_cast<int>(groups.size()) - 1;
    }
  }
  // A source sends each destination of phase p its own block and each group of
  // the phases before p (one j each: phases before p exist only when D > 1) as a
  // message of its own.
  auto parts = [&](int p) {
    int n = 1;
    for (int q = 0; q < p; ++q) n += pdims[static_cast<size_t>(q)] - 1;
    return n;
  };
  // The blocks of this core's index of chips [a, b] (a run of ids) to core q.
  auto send_run = [&](int q, int a, int b, int rflag) {
    const int64_t first = Y.addr + (static_cast<int64_t>(a) * C + k) * xb;
    send(q, first, first, xb, b > a ? dim(b - a + 1, C * xb, C * xb) : "", rflag);
  };
  // Each replica starts with the one after it (then the chip after its own): with
  // one order for all, every replica's first block went to replica 0 at once.
  if (via_chip) {
    for (int p = 0; p < D; ++p)
      for (int j = 1; j < pdims[static_cast<size_t>(p)]; ++j)
        send_block(along(my_chip, p, j) * C + k, flag_of[static_cast<size_t>(p)][static_cast<size_t>(j)]);
  } else {
    for (int d = 1; d < R; ++d) send_block((me + d) % R, kDirectLandFlag);
  }
  if (n.op != OpKind::kReduceScatter) {  // reduce_scatter folds its own block from x
    dma(hbm(dst_of(me)), hbm(src_of(me)), block);
    wait_dmas();
  }
  if (via_chip) {
    // The blocks of this core's index go to the same places in each other core's
    // y: its own at once, then each group once it has landed, a run of chip ids
    // in one strided DMA (a group of one phase over all chips that wraps past
    // chip 0 in two); and a group of phase p goes on to the rings of the later
    // phases.
    int64_t passes = 0;
    auto pass_on = [&](int a, int b, int p) {
      for (int j = 1; j < C; ++j) send_run(my_chip * C + (k + j) % C, a, b, kDirectForwardFlag);
      ++passes;
      for (int p2 = p + 1; p2 < D; ++p2)
        for (int j = 1; j < pdims[static_cast<size_t>(p2)]; ++j)
          send_run(along(my_chip, p2, j) * C + k, a, b, flag_of[static_cast<size_t>(p2)][static_cast<size_t>(j)]);
    };
    pass_on(my_chip, my_chip, D);  // (sent on from x above)
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto [p, j0, j1] = groups[g];
      wait_landed(kFirstLandFlag + static_cast<int>(g), static_cast<int64_t>(j1 - j0 + 1) * parts(p));
      if (D > 1) {  // one j: what that chip held before phase p
        const int lo = held_lo(along(my_chip, p, -j0), p);
        pass_on(lo, lo + span(p) - 1, p);
        continue;
      }
      // chips my_chip - j1 .. my_chip - j0, modulo chips
      const int a = my_chip - j1, b = my_chip - j0;
      if (a >= 0 || b < 0) {
        pass_on((a + chips) % chips, (b + chips) % chips, p);
      } else {
        pass_on(0, b, p);
        pass_on(a + chips, chips - 1, p);
      }
    }
    if (C > 1) wait_landed(kDirectForwardFlag, (C - 1) * passes);
  } else {
    wait_landed(kDirectLandFlag, R - 1);
  }
  coll_sent_ += sent;
  line(std::string("wait ") + kSendFlag + ", " + std::to_string(coll_sent_));
  if (n.op != OpKind::kReduceScatter) return;

  // Y = fold over the R blocks, in pieces through VMEM: a piece's R loads go out
  // together (the replica's own block straight from x), then each tile is folded
  // in a register in replica order and stored once. One load and one wait at a
  // time took a v3-8 reduce_scatter of 814 KB a replica 18.8 K cycles.
  const int64_t tile_in = kTileElems * e;
  const int64_t piece =
      std::max<int64_t>(1, std::min<int64_t>(kMaxPieceTiles, static_cast<int64_t>(opt_.target.vmem_bytes) / ((R + 1) * tile_in))) *
      kTileElems;
  const int64_t elems = block / e;
  const int64_t OUT = R * piece * e;  // the inputs' buffers below it, one a replica
  const std::string load = dt == DType::kBf16 ? "vld.bf16" : "vld";
  for (int64_t p0 = 0; p0 < elems; p0 += piece) {
    const int64_t pn = std::min(piece, elems - p0);
    for (int q = 0; q < R; ++q)
      dma(vmem(q * piece * e), hbm((q == me ? X.addr : recv_base) + q * block + p0 * e), pn * e);
    wait_dmas();
    for (int64_t t = 0; t * kTileElems < pn; ++t) {
      line(load + " v1, " + at(t * tile_in));
      for (int q = 1; q < R; ++q) {
        line(load + " v2, " + at(q * piece * e + t * tile_in));
        line("vadd v1, v1, v2");
      }
      line(std::string(st(dt)) + " v1, " + at(OUT + t * tile_in));
    }
    dma(hbm(Y.addr + p0 * e), vmem(OUT), pn * e);
    wait_dmas();
  }
}

}  // namespace tpusim::compiler::lowering

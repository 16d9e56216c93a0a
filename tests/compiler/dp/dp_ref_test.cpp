// The all_reduce IR op and the replicated graph reference (compiler/ref/replicas.h)
// against expectations computed here from docs/ici.md's "Add order" text and from
// the batch split's definition, not from the schedule generator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler/ref/replicas.h"
#include "isa/numerics/fp32.h"

namespace tpusim::compiler {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Wide exponent range so that any other add order changes some bits.
std::vector<float> wide_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> m(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(m(rng), e(rng));
  return v;
}

// One row per replica of n values of both signs, mantissa in [1, 2), exponent in
// [-20, 20]: any other add order of a block changes some bits.
std::vector<std::vector<float>> signed_wide_rows(size_t replicas, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<std::vector<float>> x(replicas, std::vector<float>(static_cast<size_t>(n)));
  for (auto& row : x)
    for (float& v : row) v = std::ldexp(mant(rng), ex(rng)) * (rng() % 2 ? 1.0f : -1.0f);
  return x;
}

// y, a blocked all-reduce of x cut at `cut` (block b = [cut[b], cut[b + 1])), must
// equal bit for bit in each block the all-reduce under `whole` (no blocks) of that
// block alone; *differ_from_whole counts the elements where y differs from the
// whole buffer's all-reduce under `whole`.
void check_each_block_alone(const ReplicaSpec& whole, const std::vector<std::vector<float>>& x,
                            const std::vector<std::vector<float>>& y, const std::vector<int64_t>& cut,
                            size_t* differ_from_whole) {
  const auto y_whole = all_reduce_values(whole, x);
  *differ_from_whole = 0;
  for (size_t b = 0; b + 1 < cut.size(); ++b) {
    std::vector<std::vector<float>> xb(x.size());
    for (size_t r = 0; r < x.size(); ++r) xb[r].assign(x[r].begin() + cut[b], x[r].begin() + cut[b + 1]);
    const auto yb = all_reduce_values(whole, xb);
    for (size_t r = 0; r < x.size(); ++r)
      for (int64_t e = cut[b]; e < cut[b + 1]; ++e) {
        ASSERT_EQ(bits(y[r][size_t(e)]), bits(yb[r][size_t(e - cut[b])])) << "replica " << r << " element " << e;
        *differ_from_whole += bits(y[r][size_t(e)]) != bits(y_whole[r][size_t(e)]);
      }
  }
}

// 1, 2, .., n as the IR's fp32 bit literals.
std::string hex_consts(int n) {
  std::string t = "[";
  for (int k = 1; k <= n; ++k) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", bits(static_cast<float>(k)));
    t += (k > 1 ? ", " : "") + std::string(buf);
  }
  return t + "]";
}

ReplicaSpec on_one_chip(int replicas, const std::string& algorithm) {
  ReplicaSpec s;
  s.replicas = replicas;
  s.cores_per_chip = replicas;
  s.board = ici::Topology(ici::TopologyKind::kSingle, {1});
  s.algorithm = algorithm;
  return s;
}

TEST(DpIr, AllReduceTextRoundTripsAndKeepsTheType) {
  const std::string ir = "graph g {\n  input %x : f32[4,3]\n  %y = all_reduce(%x) : f32[4,3] #0\n  output %y\n}\n";
  const Graph g = parse_graph(ir);
  verify(g);
  EXPECT_EQ(print_graph(parse_graph(print_graph(g))), print_graph(g));
  EXPECT_EQ(g.nodes[0].op, OpKind::kAllReduce);
  const std::string bad = "graph g {\n  input %x : f32[4,3]\n  %y = all_reduce(%x) : f32[4,4] #0\n  output %y\n}\n";
  EXPECT_THROW(verify(parse_graph(bad)), CompileError);
}

// docs/ici.md: in a ring over positions 0..k-1 the buffer splits into k blocks
// [E*b/k, E*(b+1)/k) and block b is ((x[b+1] + x[b+2]) + ...) + x[b+k] (mod k),
// every position ending with the same bits.
TEST(DpRef, RingAllReduceFoldsInTheDocumentedOrder) {
  for (int R : {2, 3, 5, 8}) {
    const ReplicaSpec s = on_one_chip(R, "ring");
    const int64_t E = 3 * R + 2;  // ragged blocks
    std::vector<std::vector<float>> x;
    for (int r = 0; r < R; ++r) x.push_back(wide_values(static_cast<size_t>(E), 100 + r));
    const auto y = all_reduce_values(s, x);
    const std::vector<int> order = replica_topology(s).ring_order();
    ASSERT_EQ(static_cast<int>(order.size()), R);
    for (int b = 0; b < R; ++b)
      for (int64_t e = E * b / R; e < E * (b + 1) / R; ++e) {
        float acc = x[static_cast<size_t>(order[static_cast<size_t>((b + 1) % R)])][static_cast<size_t>(e)];
        for (int j = 2; j <= R; ++j)
          acc = num::add(acc, x[static_cast<size_t>(order[static_cast<size_t>((b + j) % R)])][static_cast<size_t>(e)]);
        for (int r = 0; r < R; ++r)
          ASSERT_EQ(bits(y[static_cast<size_t>(r)][static_cast<size_t>(e)]), bits(acc)) << "R " << R << " replica " << r << " element " << e;
      }
  }
}

// Integers small enough that every order is exact: each algorithm's result is the
// plain sum on every replica, on one chip and on a v3-8-shaped board.
TEST(DpRef, EveryAlgorithmSumsExactValuesOnEveryReplica) {
  for (const std::string alg : {"ring", "bidir-ring", "torus", "auto"})
    for (int R : {2, 4, 8}) {
      ReplicaSpec s;
      s.replicas = R;
      s.cores_per_chip = 2;
      s.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
      s.algorithm = alg;
      const int64_t E = 97;
      std::vector<std::vector<float>> x(static_cast<size_t>(R), std::vector<float>(E));
      for (int r = 0; r < R; ++r)
        for (int64_t e = 0; e < E; ++e) x[static_cast<size_t>(r)][static_cast<size_t>(e)] = static_cast<float>((r + 1) * 1000 + e);
      const auto y = all_reduce_values(s, x);
      for (int r = 0; r < R; ++r)
        for (int64_t e = 0; e < E; ++e) {
          double want = 0;
          for (int q = 0; q < R; ++q) want += (q + 1) * 1000 + e;
          ASSERT_EQ(y[static_cast<size_t>(r)][static_cast<size_t>(e)], static_cast<float>(want)) << alg << " R " << R;
        }
    }
}

// The direct collectives by their definitions (graph.h), written out element by element.
TEST(DpRef, DirectCollectivesFollowTheirDefinitions) {
  const size_t R = 4, n = 8;  // 2 elements per block
  std::vector<std::vector<float>> x;
  for (size_t r = 0; r < R; ++r) x.push_back(wide_values(n, static_cast<uint32_t>(40 + r)));
  const auto ag = direct_collective_values(OpKind::kAllGather, x);
  const auto rs = direct_collective_values(OpKind::kReduceScatter, x);
  const auto aa = direct_collective_values(OpKind::kAllToAll, x);
  for (size_t r = 0; r < R; ++r) {
    ASSERT_EQ(ag[r].size(), R * n);
    for (size_t q = 0; q < R; ++q)
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(bits(ag[r][q * n + i]), bits(x[q][i]));
    ASSERT_EQ(rs[r].size(), n / R);
    for (size_t i = 0; i < n / R; ++i) {
      const size_t e = r * (n / R) + i;
      const float want = num::add(num::add(num::add(x[0][e], x[1][e]), x[2][e]), x[3][e]);
      EXPECT_EQ(bits(rs[r][i]), bits(want));
    }
    for (size_t q = 0; q < R; ++q)
      for (size_t i = 0; i < n / R; ++i) EXPECT_EQ(bits(aa[r][q * (n / R) + i]), bits(x[q][r * (n / R) + i]));
  }
  const std::string ir =
      "graph g {\n  input %x : f32[8,3]\n  %y = reduce_scatter(%x) {replicas=4} : f32[2,3] #0\n"
      "  %z = all_gather(%y) {replicas=4} : f32[8,3] #1\n  output %z\n}\n";
  const Graph g = parse_graph(ir);
  verify(g);
  EXPECT_EQ(print_graph(parse_graph(print_graph(g))), print_graph(g));
  EXPECT_THROW(verify(parse_graph("graph g {\n  input %x : f32[6,3]\n  %y = reduce_scatter(%x) {replicas=4} : f32[1,3] #0\n  output %y\n}\n")),
               CompileError);
}

TEST(DpRef, ReplicaTopologyPutsTheCoresOfAChipFirst) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
  s.replicas = 8;
  EXPECT_EQ(replica_topology(s).dims(), (std::vector<int>{2, 2, 2}));
  s.replicas = 4;
  EXPECT_EQ(replica_topology(s).dims(), (std::vector<int>{2, 2}));
  s.replicas = 2;
  EXPECT_EQ(replica_topology(s).dims(), (std::vector<int>{2}));
  EXPECT_EQ(replica_chip(s, 1), 0);
  s.replicas = 6;
  EXPECT_NO_THROW(check_replicas(s));  // 3 of the 4 chips: one ring through them
  EXPECT_EQ(replica_topology(s).dims(), (std::vector<int>{2, 3}));
  s.replicas = 7;
  EXPECT_THROW(check_replicas(s), CompileError);  // not whole chips
  s.replicas = 10;
  EXPECT_THROW(check_replicas(s), CompileError);
}

// Where the replica topology is less than the board's shape, replica_topology_note
// says why (the lowering turns it into a note for the torus algorithm, which then
// runs as a ring): v4-4x4x4's 2 cores x 4x4x4 chips are 4 dimensions, one more than
// a torus topology has, so the 128 replicas form one ring; 6 of v2-4x4's 16 chips
// are not a box of it. A whole board, or a prefix box of it, has no note.
TEST(DpRef, ReplicaTopologyNoteSaysWhereTheBoardBecomesARing) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus3d, {4, 4, 4});
  s.replicas = 128;
  EXPECT_EQ(replica_topology(s).kind(), ici::TopologyKind::kRing);
  EXPECT_EQ(replica_topology(s).chips(), 128);
  std::string note = replica_topology_note(s);
  EXPECT_NE(note.find("2x4x4x4"), std::string::npos) << note;
  EXPECT_NE(note.find("one ring of 128"), std::string::npos) << note;
  s.replicas = 32;  // 16 chips: the 4x4 prefix box, [2, 4, 4]
  EXPECT_EQ(replica_topology(s).dims(), (std::vector<int>{2, 4, 4}));
  EXPECT_EQ(replica_topology_note(s), "");
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {4, 4});
  s.replicas = 12;
  note = replica_topology_note(s);
  EXPECT_NE(note.find("the 6 chips used are not a box of the board's 4x4"), std::string::npos) << note;
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
  s.replicas = 8;
  EXPECT_EQ(replica_topology_note(s), "");
}

// auto takes the hierarchical algorithm wherever every replica is one of a chip's
// two cores on more than one chip; its schedule runs on the used chips alone.
TEST(DpRef, AutoIsHierarchicalOnBoardsOfTwoCoresPerChip) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus3d, {4, 4, 4});
  s.replicas = 128;
  EXPECT_EQ(choose_algorithm(s, 1000), ici::Algorithm::kHierarchical);
  EXPECT_EQ(chip_topology(s).dims(), (std::vector<int>{4, 4, 4}));
  const ici::Schedule sch = all_reduce_schedule(s, 1000);
  EXPECT_EQ(sch.chips, 128);
  EXPECT_EQ(sch.steps.size(), size_t(2 + 2 * 9));  // on chip, 2 x 3 x (4 - 1), on chip
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
  s.replicas = 4;  // two chips
  EXPECT_EQ(choose_algorithm(s, 1000), ici::Algorithm::kHierarchical);
  EXPECT_EQ(chip_topology(s).dims(), (std::vector<int>{2}));
  s.replicas = 2;  // one chip: the ring of its two cores
  EXPECT_EQ(choose_algorithm(s, 1000), ici::Algorithm::kBidirectionalRing);
  s.replicas = 8;
  EXPECT_EQ(choose_algorithm(s, 1), ici::Algorithm::kRing);
  s.algorithm = "hierarchical";
  EXPECT_NO_THROW(check_replicas(s));
  s.cores_per_chip = 1;
  s.replicas = 4;
  EXPECT_THROW(check_replicas(s), CompileError);
  // Every replica ends with the same sum of every replica's value (exact for these
  // small integers in any order).
  s.cores_per_chip = 2;
  s.replicas = 8;
  std::vector<std::vector<float>> x(8, std::vector<float>(37));
  for (int r = 0; r < 8; ++r)
    for (int e = 0; e < 37; ++e) x[size_t(r)][size_t(e)] = float(r * 100 + e);
  const auto y = all_reduce_values(s, x);
  for (int r = 0; r < 8; ++r)
    for (int e = 0; e < 37; ++e) ASSERT_EQ(y[size_t(r)][size_t(e)], float(2800 + 8 * e));
}

// Above block_elems per replica the hierarchical all-reduce on 16 chips or more
// runs on contiguous blocks cut on whole tiles (docs/codegen.md "Blocks"): every
// element is added in the order of its own block's schedule, so each block of the
// result equals, bit for bit, the all-reduce of that block alone; blocks are
// staggered by ceil(T / 2) steps, or ReplicaSpec::block_lag (the same values). A
// 2x2 board (4 chips) keeps one block.
TEST(DpRef, LargeHierarchicalAllReducesRunOnBlocks) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {4, 4});
  s.replicas = 32;
  s.block_elems = 4096;
  const int64_t E = 10000;
  EXPECT_EQ(all_reduce_blocks(s, E), (std::vector<int64_t>{0, 3072, 6144}));  // 3333-element thirds, on tiles
  EXPECT_EQ(all_reduce_blocks(s, 4096), (std::vector<int64_t>{0}));
  const ici::Schedule one = all_reduce_schedule(s, 4096), three = all_reduce_schedule(s, E);
  EXPECT_EQ(three.steps.size(), 2 * ((one.steps.size() + 1) / 2) + one.steps.size());
  const std::vector<std::vector<float>> x = signed_wide_rows(32, E, 7);
  const auto y = all_reduce_values(s, x);
  ReplicaSpec whole = s;
  whole.block_elems = 0;  // no blocks
  const std::vector<int64_t> cut{0, 3072, 6144, E};
  size_t differ_from_whole = 0;
  ASSERT_NO_FATAL_FAILURE(check_each_block_alone(whole, x, y, cut, &differ_from_whole));
  EXPECT_GT(differ_from_whole, 0u);  // the add order is the blocks', not the whole buffer's
  // Another lag moves the blocks' steps, not their add order: the same bits; a lag
  // above T runs the blocks one after the other, as T does.
  const size_t T = one.steps.size();
  for (const int lag : {1, 3, static_cast<int>(T), static_cast<int>(T) + 5}) {
    ReplicaSpec lagged = s;
    lagged.block_lag = lag;
    const size_t eff = std::min(T, static_cast<size_t>(lag));
    const ici::Schedule sch = all_reduce_schedule(lagged, E);
    ASSERT_EQ(sch.steps.size(), 2 * eff + T) << "lag " << lag;
    // block 1's first moves sit at step eff, not earlier
    size_t first_of_block1 = sch.steps.size();
    for (size_t t = 0; t < sch.steps.size() && first_of_block1 == sch.steps.size(); ++t)
      for (const ici::Move& m : sch.steps[t])
        if (sch.chunks[size_t(m.src_chunk)].offset >= cut[1] && sch.chunks[size_t(m.src_chunk)].offset < cut[2]) first_of_block1 = t;
    EXPECT_EQ(first_of_block1, eff) << "lag " << lag;
    const auto yl = all_reduce_values(lagged, x);
    for (size_t r = 0; r < 32; ++r)
      for (int64_t e = 0; e < E; ++e) ASSERT_EQ(bits(yl[r][size_t(e)]), bits(y[r][size_t(e)])) << "lag " << lag;
  }
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
  s.replicas = 8;
  EXPECT_EQ(all_reduce_blocks(s, E), (std::vector<int64_t>{0}));
}

// Blocks of the hierarchical all-reduce are whole multiples of 16 values (64 B,
// the HBM's pseudo-channel granule) times the schedule's finest division of a
// block, where they hold two: on v4-4x4x4 2 halves x 3 groups x 64 chips' ring
// blocks = 384 segments, so blocks of 6144-value multiples, and every chunk of the
// schedule inside them (all blocks but the last) starts and ends on a 64 B
// boundary (docs/codegen.md "Blocks on 64 B"). On v2-4x4 (64 segments) that is a tile:
// the cut is the one on tiles.
TEST(DpRef, HierarchicalBlocksKeepEveryChunkOn64Bytes) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus3d, {4, 4, 4});
  s.replicas = 128;
  const int64_t E = int64_t{8} << 20;  // 32 MiB of fp32 a replica: four blocks
  const std::vector<int64_t> starts = all_reduce_blocks(s, E);
  ASSERT_EQ(starts, (std::vector<int64_t>{0, 341 * 6144, 682 * 6144, 1024 * 6144}));
  const ici::Schedule sch = all_reduce_schedule(s, E);
  size_t inside = 0, odd_in_last = 0;
  for (const ici::Chunk& c : sch.chunks) {
    if (c.offset + c.elems <= starts.back()) {
      ++inside;
      EXPECT_EQ(c.offset % 16, 0) << c.offset;
      EXPECT_EQ(c.elems % 16, 0) << c.offset << " + " << c.elems;
    } else {
      odd_in_last += c.offset % 16 != 0;  // the last block holds the remainder: 2,097,152 / 384 values a segment
    }
  }
  EXPECT_GT(inside, 0u);
  EXPECT_GT(odd_in_last, 0u);
  // v2-4x4: blocks of E / 4, as on tiles.
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {4, 4});
  s.replicas = 32;
  EXPECT_EQ(all_reduce_blocks(s, E), (std::vector<int64_t>{0, E / 4, E / 2, 3 * E / 4}));
}

// On a 3-D chip torus (v4-4x4x4) the hierarchical all-reduce runs more than half a
// block as two blocks (docs/codegen.md "Blocks": there a one-block plan above 4 MiB
// found no fused plan), each block's result that block's own all-reduce; half a
// block or less stays whole, and a 2-D board (v2-4x4) keeps one block up to a
// whole block.
TEST(DpRef, ThreeDimensionalTorusRunsMoreThanHalfABlockAsTwo) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus3d, {4, 4, 4});
  s.replicas = 128;
  s.block_elems = 4096;
  EXPECT_EQ(all_reduce_blocks(s, 2048), (std::vector<int64_t>{0}));
  EXPECT_EQ(all_reduce_blocks(s, 2049), (std::vector<int64_t>{0, 1024}));  // under two tiles a block: cut on elements
  EXPECT_EQ(all_reduce_blocks(s, 4096), (std::vector<int64_t>{0, 2048}));  // two whole tiles each
  EXPECT_EQ(all_reduce_blocks(s, 4097), (std::vector<int64_t>{0, 2048}));  // ceil(4097 / 4096) = 2 anyway
  EXPECT_EQ(all_reduce_blocks(s, 8193).size(), 3u);
  const int64_t E = 3000;
  const std::vector<int64_t> cut{0, 1500, E};
  ASSERT_EQ(all_reduce_blocks(s, E), (std::vector<int64_t>{0, 1500}));
  const std::vector<std::vector<float>> x = signed_wide_rows(128, E, 11);
  const auto y = all_reduce_values(s, x);
  ReplicaSpec whole = s;
  whole.block_elems = 0;
  size_t differ_from_whole = 0;
  ASSERT_NO_FATAL_FAILURE(check_each_block_alone(whole, x, y, cut, &differ_from_whole));
  EXPECT_GT(differ_from_whole, 0u);
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {4, 4});
  s.replicas = 32;
  EXPECT_EQ(all_reduce_blocks(s, 4096), (std::vector<int64_t>{0}));
  EXPECT_EQ(all_reduce_blocks(s, 4097).size(), 2u);
}

// The torus algorithm on a chip torus of at most 2 dimensions runs above
// torus_block_elems on blocks too (on v3-8's replica topology [2, 2, 2]): each
// block of the result is, bit for bit, the torus all-reduce of that block alone,
// and not the whole buffer's. On a 3-D chip torus (v4) it runs whole, as do the
// rings and the hierarchical algorithm on fewer than 16 chips.
TEST(DpRef, LargeTorusAllReducesRunOnBlocksOnTwoDimensionalBoards) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {2, 2});
  s.replicas = 8;
  s.algorithm = "torus";
  s.torus_block_elems = 4096;
  const int64_t E = 10000;
  const std::vector<int64_t> cut{0, 3072, 6144, E};
  EXPECT_EQ(all_reduce_blocks(s, E), (std::vector<int64_t>{0, 3072, 6144}));
  EXPECT_EQ(all_reduce_blocks(s, 4096), (std::vector<int64_t>{0}));
  const std::vector<std::vector<float>> x = signed_wide_rows(8, E, 11);
  const auto y = all_reduce_values(s, x);
  ReplicaSpec whole = s;
  whole.torus_block_elems = 0;  // no blocks
  size_t differ_from_whole = 0;
  ASSERT_NO_FATAL_FAILURE(check_each_block_alone(whole, x, y, cut, &differ_from_whole));
  EXPECT_GT(differ_from_whole, 0u);
  for (const char* alg : {"ring", "bidir-ring", "auto"}) {
    ReplicaSpec other = s;
    other.algorithm = alg;
    EXPECT_EQ(all_reduce_blocks(other, E), (std::vector<int64_t>{0})) << alg;
  }
  s.board = ici::Topology(ici::TopologyKind::kTorus3d, {2, 2, 2});
  s.replicas = 16;
  EXPECT_EQ(all_reduce_blocks(s, E), (std::vector<int64_t>{0}));
}

// A block size that would cut a buffer into more than kMaxAllReduceBlocks blocks is
// refused with the smallest size that fits (1 element a block of a 1 Mi buffer
// planned for over two minutes and 8 GB before it was); exactly that many blocks
// is taken.
TEST(DpRef, TooManyBlocksAreRefusedWithTheSizeThatFits) {
  ReplicaSpec s;
  s.cores_per_chip = 2;
  s.board = ici::Topology(ici::TopologyKind::kTorus2d, {4, 4});
  s.replicas = 32;
  const int64_t E = kMaxAllReduceBlocks * 4096;
  s.block_elems = 4096;
  EXPECT_EQ(all_reduce_blocks(s, E).size(), static_cast<size_t>(kMaxAllReduceBlocks));
  s.block_elems = 4095;
  try {
    all_reduce_blocks(s, E);
    ADD_FAILURE() << "no error for " << E << " elements in blocks of 4095";
  } catch (const CompileError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("257 blocks, more than 256"), std::string::npos) << what;
    EXPECT_NE(what.find("give --block-bytes " + std::to_string(4096 * 4) + " or more"), std::string::npos) << what;
  }
  EXPECT_THROW(all_reduce_schedule(s, E), CompileError);
  s.block_elems = 1;
  EXPECT_THROW(all_reduce_blocks(s, E), CompileError);
}

// The replicated reference of a graph without all_reduce is the global graph's
// reference (every op here is per batch row); with an all_reduce of a per-replica
// reduction, replica 0's value is the documented fold of the replicas' partial sums.
TEST(DpRef, ReplicatedEvaluationSplitsTheBatch) {
  const std::string ir =
      "graph g {\n  input %x : f32[8,5]\n  const %w : f32[5,3] = " + hex_consts(15) + "\n"
      "  %h = matmul(%x, %w) : f32[8,3] #0\n  %r = relu(%h) : f32[8,3] #1\n"
      "  %s = reduce_sum(%r) {axes=[0], keepdims=0} : f32[3] #2\n"
      "  %t = all_reduce(%s) : f32[3] #3\n  output %r\n  output %t\n}\n";
  const Graph g = parse_graph(ir);
  std::map<std::string, HostTensor> in;
  in["x"] = HostTensor{DType::kF32, {8, 5}, wide_values(40, 7), {}};
  const auto whole = evaluate(g, in, num::PrecisionPolicy::kDefault);
  const ReplicaSpec s = on_one_chip(4, "ring");
  const auto rep = evaluate_replicated(g, in, num::PrecisionPolicy::kDefault, s);
  ASSERT_EQ(rep.at("r").shape, (Shape{8, 3}));
  for (size_t k = 0; k < 24; ++k) EXPECT_EQ(bits(rep.at("r").f[k]), bits(whole.at("r").f[k]));
  // Per-replica sums of 2 rows each, then the ring fold of docs/ici.md (3 elements
  // over 4 positions: blocks [0,0) [0,1) [1,2) [2,3), i.e. element e in block e+1).
  const auto& r = whole.at("r").f;
  std::vector<std::vector<float>> part(4, std::vector<float>(3));
  for (int q = 0; q < 4; ++q)
    for (int c = 0; c < 3; ++c) part[q][c] = num::add(r[(2 * q) * 3 + c], r[(2 * q + 1) * 3 + c]);
  for (int e = 0; e < 3; ++e) {
    const int b = e + 1;
    float acc = part[(b + 1) % 4][e];
    for (int j = 2; j <= 4; ++j) acc = num::add(acc, part[(b + j) % 4][e]);
    EXPECT_EQ(bits(rep.at("t").f[e]), bits(acc)) << "element " << e;
  }
}

}  // namespace
}  // namespace tpusim::compiler

#include "compiler/ref/replicas.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>

#include "isa/numerics/fp32.h"

namespace tpusim::compiler {

int chips_used(const ReplicaSpec& s) {
  return s.replicas <= s.cores_per_chip ? 1 : (s.replicas + s.cores_per_chip - 1) / s.cores_per_chip;
}

void check_replicas(const ReplicaSpec& s) {
  const int board = s.board.chips();
  if (s.replicas < 1) throw CompileError("--replicas must be at least 1");
  if (s.replicas > s.cores_per_chip && s.replicas % s.cores_per_chip != 0)
    throw CompileError("--replicas " + std::to_string(s.replicas) + ": more replicas than the " +
                       std::to_string(s.cores_per_chip) + " cores of a chip must fill whole chips");
  if (chips_used(s) > board)
    throw CompileError("--replicas " + std::to_string(s.replicas) + ": the board has " + std::to_string(board) +
                       " chips of " + std::to_string(s.cores_per_chip) + " cores (" +
                       std::to_string(board * s.cores_per_chip) + " replicas at most)");
  if (s.algorithm != "auto" && s.algorithm != "ring" && s.algorithm != "bidir-ring" && s.algorithm != "torus" &&
      s.algorithm != "hierarchical")
    throw CompileError("--collective '" + s.algorithm + "': expected auto, ring, bidir-ring, torus or hierarchical");
  if (s.algorithm == "hierarchical" && (s.cores_per_chip != 2 || s.replicas % 2 != 0))
    throw CompileError("--collective hierarchical: needs 2 cores per chip, each running a replica (the board has " +
                       std::to_string(s.cores_per_chip) + " cores per chip, " + std::to_string(s.replicas) +
                       " replicas)");
}

ici::Topology chip_topology(const ReplicaSpec& s) {
  ReplicaSpec one = s;
  one.replicas = chips_used(s);
  one.cores_per_chip = 1;
  return replica_topology(one);
}

// The replicas' dimensions: the cores of a chip, then the board's dimensions that
// the used chips span; `sub_box` false where the used chips are not a prefix box
// of the board (then one ring through them stands for the chip dimensions).
static std::vector<int> replica_dims(const ReplicaSpec& s, bool* sub_box) {
  const int chips = chips_used(s);
  std::vector<int> chip_dims;
  const std::vector<int>& bd = s.board.dims();
  int prefix = 1;
  size_t k = 0;
  while (k < bd.size() && prefix < chips) prefix *= bd[k++];
  *sub_box = prefix == chips;
  if (*sub_box)
    chip_dims.assign(bd.begin(), bd.begin() + static_cast<std::ptrdiff_t>(k));
  else
    chip_dims = {chips};  // not a sub-box of the board: one ring through the used chips
  std::vector<int> dims;
  const int cores = s.replicas <= s.cores_per_chip ? s.replicas : s.cores_per_chip;
  if (cores > 1) dims.push_back(cores);
  for (int d : chip_dims)
    if (d > 1) dims.push_back(d);
  return dims;
}

ici::Topology replica_topology(const ReplicaSpec& s) {
  bool sub_box = true;
  const std::vector<int> dims = replica_dims(s, &sub_box);
  switch (dims.size()) {
    case 0: return ici::Topology(ici::TopologyKind::kSingle, {1});
    case 1: return ici::Topology(ici::TopologyKind::kRing, dims);
    case 2: return ici::Topology(ici::TopologyKind::kTorus2d, dims);
    case 3: return ici::Topology(ici::TopologyKind::kTorus3d, dims);
    default: return ici::Topology(ici::TopologyKind::kRing, {s.replicas});
  }
}

static bool hierarchical_applies(const ReplicaSpec& s) {
  return s.cores_per_chip == 2 && s.replicas > 2 && s.replicas % 2 == 0;
}

std::string replica_topology_note(const ReplicaSpec& s) {
  bool sub_box = true;
  const std::vector<int> dims = replica_dims(s, &sub_box);
  auto text = [](const std::vector<int>& v) {
    std::string t;
    for (int d : v) t += (t.empty() ? "" : "x") + std::to_string(d);
    return t;
  };
  std::string why;
  if (dims.size() > 3)
    why = "the replicas' dimensions " + text(dims) + " (cores, then chips) are more than the 3 a torus topology has, "
          "so they form one ring of " + std::to_string(s.replicas);
  else if (!sub_box)
    why = "the " + std::to_string(chips_used(s)) + " chips used are not a box of the board's " + text(s.board.dims()) +
          ", so one ring through them stands for the chip dimensions";
  if (!why.empty() && hierarchical_applies(s)) why += " (the hierarchical algorithm runs on the chips' own topology)";
  return why;
}

// The dimensions of 2 or more: those a ring runs along.
static int ring_dims(const ici::Topology& t) {
  int n = 0;
  for (int d : t.dims()) n += d > 1;
  return n;
}

ici::Algorithm choose_algorithm(const ReplicaSpec& s, int64_t elements) {
  if (s.algorithm != "auto") return ici::parse_algorithm(s.algorithm);
  // Two cores per chip on more than one chip: the hierarchical algorithm has as
  // many steps as the torus algorithm on [2, chip dims..] (2 on chip + the chips'
  // torus steps), and its two cores never share a link direction, where the torus
  // algorithm's groups of both cores share every ICI link (docs/ici.md).
  if (hierarchical_applies(s) && elements >= 2) return ici::Algorithm::kHierarchical;
  const ici::Topology t = replica_topology(s);
  const int64_t p = t.chips();
  const int dims = ring_dims(t);
  // The torus algorithm takes 2 sum(k_h - 1) steps where a ring takes 2 (p - 1), so
  // it wins on latency and on bandwidth (all 2D directions busy) whenever every one
  // of its 2D groups still gets at least one element per block.
  if (dims >= 2 && elements >= 2 * dims * p) return ici::Algorithm::kTorus;
  if (p >= 2 && elements >= 2 * p) return ici::Algorithm::kBidirectionalRing;
  return ici::Algorithm::kRing;
}

// The elements per block of a blocked all-reduce, or 0 where it runs whole
// (docs/codegen.md "Blocks"): the hierarchical algorithm on 16 chips or more (half
// the buffer where a 3-D chip torus holds more than half a block), and
// the torus algorithm on a chip torus of at most 2 dimensions (v2/v3 boards, v4-8), whose
// size-2 on-chip dimension sends its + and - groups to the same peer, so a first
// step of a whole 16 MiB buffer is ~11 pieces a stream, more than the slots of any
// fused plan (docs/validation.md "The other algorithms, streamed").
static int64_t block_size(const ReplicaSpec& s, int64_t elements) {
  const ici::Algorithm a = choose_algorithm(s, elements);
  if (a == ici::Algorithm::kHierarchical) {
    const ici::Topology chips = chip_topology(s);
    if (chips.chips() < 16) return 0;
    // On a 3-D chip torus a buffer of more than half a block goes as two blocks: one
    // block's plan there has one slot pool, whose ordering run stalls above 4 MiB a
    // replica (v4-4x4x4: 4.5-8 MiB went unfused, every sum through y), while two
    // blocks plan fused on two pools (8 MiB, detailed HBM: 166,600 -> 124,814
    // cycles; docs/codegen.md "Blocks").
    if (ring_dims(chips) >= 3 && s.block_elems < 2 * elements && elements <= s.block_elems) return (elements + 1) / 2;
    return s.block_elems;
  }
  if (a != ici::Algorithm::kTorus) return 0;
  return ring_dims(chip_topology(s)) <= 2 ? s.torus_block_elems : 0;
}

std::vector<int64_t> all_reduce_blocks(const ReplicaSpec& s, int64_t elements) {
  const int64_t size = block_size(s, elements);
  if (size <= 0 || elements <= size) return {0};
  const int64_t nb = (elements + size - 1) / size;
  // The ordering run and the program grow with the blocks (v2-4x4, 1 MiB a replica:
  // 16 blocks compile in 1.5 s, 256 in 27 s, 262,144 ran out of memory), and the
  // defaults take at most 64 at 256 MiB, so a tiny --block-bytes is refused rather
  // than left to run for hours.
  if (nb > kMaxAllReduceBlocks)
    throw CompileError("all_reduce of " + std::to_string(elements) + " fp32 values a replica in blocks of " +
                       std::to_string(size) + " (--block-bytes " + std::to_string(size * 4) + ") is " +
                       std::to_string(nb) + " blocks, more than " + std::to_string(kMaxAllReduceBlocks) +
                       "; give --block-bytes " + std::to_string((elements + kMaxAllReduceBlocks - 1) / kMaxAllReduceBlocks * 4) +
                       " or more");
  int64_t unit = elements / nb >= 2 * 1024 ? 1024 : 1;  // whole 8 x 128 tiles where blocks hold two
  // The hierarchical schedule cuts a block into 2 halves x D groups x the chips'
  // ring blocks (v4-4x4x4: 2 x 3 x 64 = 384 segments). On blocks of a whole number
  // of 16-value (64 B) multiples of that, every chunk of the block starts on a
  // 64 B boundary, the HBM's pseudo-channel granule: a DMA from an odd offset
  // covers one more granule per 512 B beat. v4-4x4x4 32 MiB a replica (8 MiB
  // blocks of n / 384 = 5461.33 values): 314,591 cycles with such odd chunks,
  // 30.7 B a burst; 307,885 on blocks of 341 x 6144 values, all but the last
  // block even (docs/codegen.md "Blocks on 64 B"). Where that is a tile already
  // (v2-4x4: 64 segments) nothing moves.
  if (choose_algorithm(s, elements) == ici::Algorithm::kHierarchical) {
    const ici::Topology chips = chip_topology(s);
    const int64_t aligned = std::lcm(unit, int64_t{16} * 2 * ring_dims(chips) * chips.chips());
    if (aligned > 0 && elements / nb >= 2 * aligned) unit = aligned;
  }
  std::vector<int64_t> starts;
  for (int64_t b = 0; b < nb; ++b) starts.push_back(elements * b / nb / unit * unit);
  return starts;
}

ici::Schedule all_reduce_schedule(const ReplicaSpec& s, int64_t elements) {
  const ici::Algorithm a = choose_algorithm(s, elements);
  // The hierarchical algorithm runs on the chips (2 participants a chip), the
  // others on the replicas.
  auto whole = [&](int64_t n) {
    return a == ici::Algorithm::kHierarchical ? ici::make_schedule(ici::CollectiveKind::kAllReduce, a, chip_topology(s), n, 2)
                                              : ici::make_schedule(ici::CollectiveKind::kAllReduce, a, replica_topology(s), n);
  };
  const std::vector<int64_t> starts = all_reduce_blocks(s, elements);
  if (starts.size() == 1) return whole(elements);
  // Block b's schedule on its own range, its steps from step b * lag on.
  ici::Schedule out;
  for (size_t b = 0; b < starts.size(); ++b) {
    const int64_t lo = starts[b], hi = b + 1 < starts.size() ? starts[b + 1] : elements;
    const ici::Schedule one = whole(hi - lo);
    const size_t T = one.steps.size();
    const size_t lag = s.block_lag > 0 ? std::min(T, static_cast<size_t>(s.block_lag)) : (T + 1) / 2, t0 = b * lag;
    if (b == 0) {
      out = one;
      out.name += "|blocks=" + std::to_string(starts.size()) + "|lag=" + std::to_string(lag);
      out.elements = elements;
      out.chunks.clear();
      out.steps.clear();
    }
    const int base = static_cast<int>(out.chunks.size());
    for (ici::Chunk c : one.chunks) {
      c.offset += lo;
      out.chunks.push_back(c);
    }
    if (out.steps.size() < t0 + one.steps.size()) out.steps.resize(t0 + one.steps.size());
    for (size_t t = 0; t < one.steps.size(); ++t)
      for (ici::Move m : one.steps[t]) {
        m.src_chunk += base;
        m.dst_chunk += base;
        out.steps[t0 + t].push_back(m);
      }
  }
  return out;
}

std::shared_ptr<const ici::Schedule> shared_all_reduce_schedule(const ReplicaSpec& s, int64_t elements) {
  // Every field of the spec the schedule depends on (not `batched`).
  std::string key = std::to_string(s.replicas) + "|" + std::to_string(s.cores_per_chip) + "|" +
                    std::to_string(static_cast<int>(s.board.kind())) + "|" + s.algorithm + "|" +
                    std::to_string(s.block_elems) + "|" + std::to_string(s.torus_block_elems) + "|" +
                    std::to_string(s.block_lag) + "|" + std::to_string(elements);
  for (int d : s.board.dims()) key += "," + std::to_string(d);
  static std::mutex mutex;
  static std::pair<std::string, std::shared_ptr<const ici::Schedule>> last;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (last.second && last.first == key) return last.second;
  }
  auto made = std::make_shared<const ici::Schedule>(all_reduce_schedule(s, elements));
  std::lock_guard<std::mutex> lock(mutex);
  last = {key, made};
  return made;
}

std::vector<std::vector<float>> all_reduce_values(const ReplicaSpec& s, const std::vector<std::vector<float>>& x) {
  std::vector<std::vector<float>> state = x;
  if (s.replicas <= 1 || x.empty()) return state;
  const ici::Schedule sch = all_reduce_schedule(s, static_cast<int64_t>(x[0].size()));
  // No element of an all-reduce is ever unset; NaN compares unequal to everything,
  // so no value (NaN included) is mistaken for the marker.
  const float unset = std::numeric_limits<float>::quiet_NaN();
  ici::execute<float>(sch, state, unset, [](float received, float local) { return num::add(received, local); });
  return state;
}

std::vector<std::vector<float>> direct_collective_values(OpKind op, const std::vector<std::vector<float>>& x) {
  const size_t R = x.size(), n = x.empty() ? 0 : x[0].size();
  std::vector<std::vector<float>> y(R);
  for (size_t r = 0; r < R; ++r) {
    if (op == OpKind::kAllGather) {
      for (size_t q = 0; q < R; ++q) y[r].insert(y[r].end(), x[q].begin(), x[q].end());
    } else if (op == OpKind::kReduceScatter) {
      const size_t b = n / R;
      y[r].assign(x[0].begin() + static_cast<std::ptrdiff_t>(r * b), x[0].begin() + static_cast<std::ptrdiff_t>((r + 1) * b));
      for (size_t q = 1; q < R; ++q)
        for (size_t i = 0; i < b; ++i) y[r][i] = num::add(y[r][i], x[q][r * b + i]);
    } else {  // all_to_all: block q of replica r's result is block r of replica q's x
      const size_t b = n / R;
      for (size_t q = 0; q < R; ++q)
        y[r].insert(y[r].end(), x[q].begin() + static_cast<std::ptrdiff_t>(r * b),
                    x[q].begin() + static_cast<std::ptrdiff_t>((r + 1) * b));
    }
  }
  return y;
}

ReplicaGraph replica_graph(const Graph& global, const ReplicaSpec& s) {
  ReplicaGraph out;
  out.graph = global;
  const int R = s.replicas;
  std::set<std::string> named(s.batched.begin(), s.batched.end());
  for (const std::string& b : named) {
    bool found = false;
    for (const auto& in : global.inputs) found = found || in.name == b;
    if (!found) throw CompileError(global.name + ": batched input '" + b + "' is not an input of the graph");
  }
  std::map<std::string, TensorType> types;
  for (auto& in : out.graph.inputs) {
    if (!named.empty() && !named.count(in.name)) {
      types[in.name] = in.type;
      continue;
    }
    if (in.type.shape.empty() || in.type.shape[0] % R != 0)
      throw CompileError(global.name + ": input '" + in.name + "' " + type_str(in.type) + ": its batch (axis 0) does not split over " +
                         std::to_string(R) + " replicas");
    in.type.shape[0] /= R;
    out.batched_inputs.insert(in.name);
    types[in.name] = in.type;
  }
  for (const auto& c : out.graph.constants) types[c.name] = c.type;
  const std::map<std::string, TensorType> old = global.types();
  for (auto& n : out.graph.nodes) {
    if (n.op == OpKind::kAllGather || n.op == OpKind::kReduceScatter || n.op == OpKind::kAllToAll)
      n.attrs["replicas"] = Attr::Int(R);
    std::vector<TensorType> operands;
    for (const auto& i : n.inputs) operands.push_back(types.at(i));
    if (n.op == OpKind::kReshape && !operands.empty()) {
      const Shape& was = old.at(n.inputs[0]).shape;
      const Shape& now = operands[0].shape;
      auto it = n.attrs.find("shape");
      if (it != n.attrs.end() && !was.empty() && !now.empty() && was[0] != now[0] && !it->second.ints.empty() &&
          it->second.ints[0] == was[0])
        it->second.ints[0] = now[0];
    }
    try {
      n.type = infer_type(n, operands);
    } catch (const CompileError& e) {
      throw CompileError(std::string("per-replica graph (batch split over ") + std::to_string(R) + " replicas): " + e.what());
    }
    types[n.output] = n.type;
  }
  for (const auto& o : out.graph.outputs) {
    const TensorType& g = old.at(o);
    const TensorType& r = types.at(o);
    if (g == r) continue;
    Shape back = r.shape;
    if (!back.empty()) back[0] *= R;
    if (back != g.shape)
      throw CompileError(global.name + ": output '" + o + "' is " + type_str(g) + " but " + type_str(r) +
                         " per replica: not the replicas' results stacked along axis 0");
    out.batched_outputs.insert(o);
  }
  verify(out.graph, "per-replica graph");
  return out;
}

HostTensor batch_slice(const HostTensor& t, int r, int replicas) {
  HostTensor s;
  s.dtype = t.dtype;
  s.shape = t.shape;
  s.shape[0] /= replicas;
  const int64_t n = num_elements(s.shape);
  if (t.dtype == DType::kI64)
    s.i.assign(t.i.begin() + r * n, t.i.begin() + (r + 1) * n);
  else
    s.f.assign(t.f.begin() + r * n, t.f.begin() + (r + 1) * n);
  return s;
}

HostTensor batch_concat(const std::vector<HostTensor>& parts) {
  HostTensor t = parts.at(0);
  t.shape[0] *= static_cast<int64_t>(parts.size());
  for (size_t k = 1; k < parts.size(); ++k) {
    t.f.insert(t.f.end(), parts[k].f.begin(), parts[k].f.end());
    t.i.insert(t.i.end(), parts[k].i.begin(), parts[k].i.end());
  }
  return t;
}

}  // namespace tpusim::compiler

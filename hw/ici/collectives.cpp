#include "hw/ici/collectives.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace tpusim::ici {

CollectiveKind parse_collective(const std::string& s) {
  if (s == "all-reduce") return CollectiveKind::kAllReduce;
  if (s == "reduce-scatter") return CollectiveKind::kReduceScatter;
  if (s == "all-gather") return CollectiveKind::kAllGather;
  if (s == "all-to-all") return CollectiveKind::kAllToAll;
  throw IciError("unknown collective '" + s + "' (all-reduce | reduce-scatter | all-gather | all-to-all)");
}

Algorithm parse_algorithm(const std::string& s) {
  if (s == "ring") return Algorithm::kRing;
  if (s == "bidir-ring") return Algorithm::kBidirectionalRing;
  if (s == "torus") return Algorithm::kTorus;
  if (s == "hierarchical") return Algorithm::kHierarchical;
  throw IciError("unknown collective algorithm '" + s + "' (ring | bidir-ring | torus | hierarchical)");
}

std::string to_string(CollectiveKind k) {
  static const char* n[] = {"all-reduce", "reduce-scatter", "all-gather", "all-to-all"};
  return n[int(k)];
}

std::string to_string(Algorithm a) {
  static const char* n[] = {"ring", "bidir-ring", "torus", "hierarchical"};
  return n[int(a)];
}

size_t Schedule::moves() const {
  size_t n = 0;
  for (const auto& s : steps) n += s.size();
  return n;
}

namespace {

struct Range {
  int64_t lo = 0, hi = 0;
  bool operator==(const Range& o) const { return lo == o.lo && hi == o.hi; }
};

// Block b of k of a range; floor division, so blocks differ by at most one element.
Range block(Range r, int b, int k) {
  const int64_t len = r.hi - r.lo;
  return {r.lo + len * b / k, r.lo + len * (b + 1) / k};
}

int mod(int a, int k) { return ((a % k) + k) % k; }

// One ring phase: groups of chips ("lines"), each listed in ring order.
struct Phase {
  std::vector<std::vector<int>> lines;
  int direction = +1;
};

// The lines along dimension d, in coordinate order (+1) or its reverse round the
// ring starting at coordinate 0 (-1).
std::vector<std::vector<int>> dim_lines(const Topology& t, int d, int dir) {
  std::vector<std::vector<int>> lines;
  const int k = t.dims()[size_t(d)];
  for (int c = 0; c < t.chips(); ++c) {
    std::vector<int> co = t.coords(c);
    if (co[size_t(d)] != 0) continue;
    std::vector<int> line;
    for (int i = 0; i < k; ++i) {
      co[size_t(d)] = dir > 0 ? i : mod(-i, k);
      line.push_back(t.chip_at(co));
    }
    lines.push_back(line);
  }
  return lines;
}

std::vector<int> ring_line(const Topology& t, int dir) {
  const std::vector<int> o = t.ring_order();
  if (dir > 0) return o;
  std::vector<int> r;
  for (size_t i = 0; i < o.size(); ++i) r.push_back(o[(o.size() - i) % o.size()]);
  return r;
}

class Builder {
 public:
  explicit Builder(Schedule& s) : s_(s) {}
  int chunk(Range r) {
    const auto key = std::make_pair(r.lo, r.hi - r.lo);
    auto it = ids_.find(key);
    if (it != ids_.end()) return it->second;
    s_.chunks.push_back({r.lo, r.hi - r.lo});
    return ids_[key] = int(s_.chunks.size() - 1);
  }
  void emit(size_t step, int src, int dst, Range from, Range to, bool reduce, int dir) {
    if (from.hi == from.lo) return;  // nothing to move
    if (s_.steps.size() <= step) s_.steps.resize(step + 1);
    s_.steps[step].push_back({src, dst, chunk(from), chunk(to), reduce, dir});
  }

 private:
  Schedule& s_;
  std::map<std::pair<int64_t, int64_t>, int> ids_;
};

// One group of the data: a range every chip reduces over the phases in order.
// history[h][chip] is the range the chip's line works on in phase h.
struct Group {
  Range range;
  std::vector<Phase> phases;
  std::vector<std::vector<Range>> history;
  std::vector<Range> owned;  // after reduce-scatter
};

void plan(Group& g, int chips) {
  std::vector<Range> cur(size_t(chips), g.range);
  g.history.clear();
  for (const Phase& ph : g.phases) {
    g.history.push_back(cur);
    std::vector<Range> next = cur;
    for (const auto& line : ph.lines) {
      const int k = int(line.size());
      for (int i = 0; i < k; ++i) next[size_t(line[size_t(i)])] = block(cur[size_t(line[0])], i, k);
    }
    cur = next;
  }
  g.owned = cur;
}

// Reduce-scatter: in step s of a phase, ring position i sends block i-s-1 to i+1,
// which adds it; block b's fold starts at position b+1 and ends at its owner b.
size_t emit_reduce_scatter(Builder& b, const Group& g, size_t step) {
  for (size_t h = 0; h < g.phases.size(); ++h) {
    const Phase& ph = g.phases[h];
    size_t len = 0;
    for (const auto& line : ph.lines) {
      const int k = int(line.size());
      const Range r = g.history[h][size_t(line[0])];
      for (int s = 0; s + 1 < k; ++s)
        for (int i = 0; i < k; ++i) {
          const Range blk = block(r, mod(i - s - 1, k), k);
          b.emit(step + size_t(s), line[size_t(i)], line[size_t((i + 1) % k)], blk, blk, true, ph.direction);
        }
      len = std::max(len, size_t(k - 1));
    }
    step += len;
  }
  return step;
}

// All-gather, the phases in reverse: in step s position i sends block i-s to i+1.
size_t emit_all_gather(Builder& b, const Group& g, size_t step) {
  for (size_t h = g.phases.size(); h-- > 0;) {
    const Phase& ph = g.phases[h];
    size_t len = 0;
    for (const auto& line : ph.lines) {
      const int k = int(line.size());
      const Range r = g.history[h][size_t(line[0])];
      for (int s = 0; s + 1 < k; ++s)
        for (int i = 0; i < k; ++i) {
          const Range blk = block(r, mod(i - s, k), k);
          b.emit(step + size_t(s), line[size_t(i)], line[size_t((i + 1) % k)], blk, blk, false, ph.direction);
        }
      len = std::max(len, size_t(k - 1));
    }
    step += len;
  }
  return step;
}

std::vector<int> active_dims(const Topology& t) {
  std::vector<int> a;
  for (int d = 0; d < t.num_dims(); ++d)
    if (t.dims()[size_t(d)] > 1) a.push_back(d);
  return a;
}

std::vector<Group> make_groups(Algorithm algo, const Topology& t, int64_t elements) {
  std::vector<std::vector<Phase>> plans;
  if (algo == Algorithm::kRing) {
    plans.push_back({Phase{{ring_line(t, +1)}, +1}});
  } else if (algo == Algorithm::kBidirectionalRing) {
    plans.push_back({Phase{{ring_line(t, +1)}, +1}});
    plans.push_back({Phase{{ring_line(t, -1)}, -1}});
  } else {
    const std::vector<int> dims = active_dims(t);
    const size_t D = dims.size();
    if (D == 0) plans.push_back({});  // one chip: nothing to reduce
    for (size_t j = 0; j < D; ++j)
      for (int dir : {+1, -1}) {
        std::vector<Phase> phases;
        for (size_t h = 0; h < D; ++h) phases.push_back(Phase{dim_lines(t, dims[(j + h) % D], dir), dir});
        plans.push_back(phases);
      }
  }
  std::vector<Group> groups;
  const int64_t G = int64_t(plans.size());
  if (algo == Algorithm::kHierarchical) {
    // Participant 2 x chip + core. Core c works on half c of the buffer, split into
    // D groups (j, dir_c), dir_0 = +1 and dir_1 = -1, each the torus algorithm's
    // group over the chips' core-c participants.
    const std::vector<int> dims = active_dims(t);
    const size_t D = dims.size();
    for (int c = 0; c < 2; ++c) {
      const int dir = c == 0 ? +1 : -1;
      const Range half = block({0, elements}, c, 2);
      for (size_t j = 0; j < D; ++j) {
        Group g;
        g.range = block(half, int(j), int(D));
        for (size_t h = 0; h < D; ++h) {
          Phase ph{dim_lines(t, dims[(j + h) % D], dir), dir};
          for (auto& line : ph.lines)
            for (int& chip : line) chip = 2 * chip + c;
          g.phases.push_back(ph);
        }
        plan(g, 2 * t.chips());
        // Only core c's participants hold a part of this group.
        for (int q = 0; q < 2 * t.chips(); ++q)
          if (q % 2 != c) g.owned[size_t(q)] = {0, 0};
        groups.push_back(g);
      }
      if (D == 0) {  // one chip: the on-chip steps are the whole collective
        Group g;
        g.range = half;
        g.owned.assign(size_t(2 * t.chips()), Range{0, 0});
        g.owned[size_t(c)] = half;
        groups.push_back(g);
      }
    }
    return groups;
  }
  for (int64_t i = 0; i < G; ++i) {
    Group g;
    g.range = {elements * i / G, elements * (i + 1) / G};
    g.phases = plans[size_t(i)];
    plan(g, t.chips());
    groups.push_back(g);
  }
  return groups;
}

}  // namespace

Schedule make_schedule(CollectiveKind kind, Algorithm algorithm, const Topology& topology, int64_t elements,
                       int cores_per_chip) {
  if (elements < 0) throw IciError("collective: negative element count");
  const bool hier = kind != CollectiveKind::kAllToAll && algorithm == Algorithm::kHierarchical;
  if (hier && cores_per_chip != 2)
    throw IciError("collective: the hierarchical algorithm needs 2 cores per chip, not " + std::to_string(cores_per_chip));
  if (!hier && cores_per_chip != 1)
    throw IciError("collective: " + to_string(algorithm) + " runs one participant per chip (cores_per_chip " +
                   std::to_string(cores_per_chip) + ")");
  Schedule s;
  s.kind = kind;
  s.algorithm = algorithm;
  s.topology = topology;
  s.chips = topology.chips() * cores_per_chip;
  s.elements = elements;
  s.name = to_string(kind) + (kind == CollectiveKind::kAllToAll ? "" : "/" + to_string(algorithm)) + " on " +
           topology.name() + (hier ? " x 2 cores" : "");
  Builder b(s);
  const int p = s.chips;
  if (kind == CollectiveKind::kAllToAll) {
    // Input blocks in [0, E), output slots in [E, 2E): a block must leave before
    // its slot could be overwritten, and separate halves make that trivially so.
    if (elements % p != 0)
      throw IciError("all-to-all: " + std::to_string(elements) + " elements do not split into " + std::to_string(p) +
                     " equal blocks");
    s.elements = 2 * elements;
    const int64_t B = elements / p;
    for (int k = 0; k < p; ++k)
      for (int i = 0; i < p; ++i) {
        const int j = (i + k) % p;
        b.emit(size_t(k), i, j, {j * B, (j + 1) * B}, {elements + i * B, elements + (i + 1) * B}, false, +1);
      }
    for (int c = 0; c < p; ++c) {
      for (int j = 0; j < p && B > 0; ++j) s.inputs.push_back({c, b.chunk({j * B, (j + 1) * B})});
      for (int i = 0; i < p && B > 0; ++i) s.results.push_back({c, b.chunk({elements + i * B, elements + (i + 1) * B})});
    }
    return s;
  }
  const std::vector<Group> groups = make_groups(algorithm, topology, elements);
  // Hierarchical: the on-chip reduce-scatter is step 0 (a ring of the chip's two
  // cores: core i sends half 1 - i, which core 1 - i adds), the on-chip all-gather
  // the step after the last chip-level one (core i sends its half, copied).
  const size_t first = hier && kind != CollectiveKind::kAllGather ? 1 : 0;
  size_t last = first;
  if (hier && kind != CollectiveKind::kAllGather)
    for (int c = 0; c < topology.chips(); ++c)
      for (int i = 0; i < 2; ++i) {
        const Range h = block({0, elements}, 1 - i, 2);
        b.emit(0, 2 * c + i, 2 * c + 1 - i, h, h, true, i == 0 ? +1 : -1);
      }
  for (const Group& g : groups) {
    size_t step = first;
    if (kind != CollectiveKind::kAllGather) step = emit_reduce_scatter(b, g, step);
    if (kind != CollectiveKind::kReduceScatter) step = emit_all_gather(b, g, step);
    last = std::max(last, step);
  }
  if (hier && kind != CollectiveKind::kReduceScatter)
    for (int c = 0; c < topology.chips(); ++c)
      for (int i = 0; i < 2; ++i) {
        const Range h = block({0, elements}, i, 2);
        b.emit(last, 2 * c + i, 2 * c + 1 - i, h, h, false, i == 0 ? +1 : -1);
      }
  for (const Group& g : groups) {
    for (int c = 0; c < p; ++c) {
      const Range o = g.owned[size_t(c)];
      if (o.hi == o.lo) continue;
      if (kind == CollectiveKind::kReduceScatter) s.results.push_back({c, b.chunk(o)});
      if (kind == CollectiveKind::kAllGather) s.inputs.push_back({c, b.chunk(o)});
    }
  }
  return s;
}

double closed_form_cycles(CollectiveKind kind, Algorithm algorithm, const Topology& t, double n, double alpha,
                          double beta, double onchip_alpha, double onchip_beta) {
  if (kind == CollectiveKind::kAllToAll) return -1;  // no alpha-beta form claimed (routed, contended)
  const double passes = kind == CollectiveKind::kAllReduce ? 2 : 1;
  if (algorithm == Algorithm::kHierarchical)
    return passes * (onchip_alpha + onchip_beta * n / 2) +
           closed_form_cycles(kind, Algorithm::kTorus, t, n, alpha, beta);
  const double p = t.chips();
  if (p <= 1) return 0;
  if (algorithm == Algorithm::kRing) return passes * (p - 1) * (alpha + beta * n / p);
  if (algorithm == Algorithm::kBidirectionalRing) return passes * (p - 1) * (alpha + beta * n / (2 * p));
  std::vector<int> dims = active_dims(t);
  const size_t D = dims.size();
  const double G = 2.0 * double(D);
  double worst = 0;
  for (size_t j = 0; j < D; ++j) {
    double tj = 0, prod = 1;
    for (size_t h = 0; h < D; ++h) {
      const double k = t.dims()[size_t(dims[(j + h) % D])];
      prod *= k;
      tj += (k - 1) * (alpha + beta * n / (G * prod));
    }
    worst = std::max(worst, tj);
  }
  return passes * worst;
}

}  // namespace tpusim::ici

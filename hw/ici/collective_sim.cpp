#include "hw/ici/collective_sim.h"

#include <algorithm>

namespace tpusim::ici {

CollectiveDriver::CollectiveDriver(Network& net, const Schedule& s, int64_t bytes_per_element)
    : net_(net), s_(s), bytes_per_element_(bytes_per_element) {
  if (net.topology().chips() * participants_per_chip() != s.chips)
    throw IciError(s.name + ": schedule is for " + std::to_string(s.chips) + " participants, network has " +
                   std::to_string(net.topology().chips()) + " chips" +
                   (participants_per_chip() > 1 ? " of 2 cores" : ""));
  if (bytes_per_element < 1) throw IciError(s.name + ": bytes_per_element must be >= 1");
  // Atoms: the finest pieces every chunk is a union of.
  std::vector<int64_t> cuts{0, s.elements};
  for (const Chunk& c : s.chunks) {
    cuts.push_back(c.offset);
    cuts.push_back(c.offset + c.elems);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  const size_t atoms = cuts.size() - 1;
  auto atom_range = [&](const Chunk& c) {
    const size_t a = size_t(std::lower_bound(cuts.begin(), cuts.end(), c.offset) - cuts.begin());
    const size_t b = size_t(std::lower_bound(cuts.begin(), cuts.end(), c.offset + c.elems) - cuts.begin());
    return std::make_pair(a, b);
  };

  std::vector<Node>& nodes = nodes_;
  nodes.reserve(s.moves());
  const uint32_t kNone = UINT32_MAX;
  std::vector<std::vector<uint32_t>> last_writer(size_t(s.chips), std::vector<uint32_t>(atoms, kNone));
  std::vector<std::vector<std::vector<uint32_t>>> readers(size_t(s.chips), std::vector<std::vector<uint32_t>>(atoms));
  std::vector<uint32_t> deps;
  for (const auto& step : s.steps) {
    const size_t first = nodes.size();
    for (const Move& m : step) {
      Node n;
      n.move = &m;
      n.bytes = uint64_t(s.chunks[size_t(m.src_chunk)].elems * bytes_per_element);
      nodes.push_back(std::move(n));
    }
    // Dependences on earlier steps only, then this step's reads and writes.
    for (size_t i = first; i < nodes.size(); ++i) {
      const Move& m = *nodes[i].move;
      deps.clear();
      const auto [a0, a1] = atom_range(s.chunks[size_t(m.src_chunk)]);
      for (size_t a = a0; a < a1; ++a)
        if (last_writer[size_t(m.src)][a] != kNone) deps.push_back(last_writer[size_t(m.src)][a]);
      const auto [b0, b1] = atom_range(s.chunks[size_t(m.dst_chunk)]);
      for (size_t a = b0; a < b1; ++a) {
        if (last_writer[size_t(m.dst)][a] != kNone) deps.push_back(last_writer[size_t(m.dst)][a]);
        for (uint32_t r : readers[size_t(m.dst)][a]) deps.push_back(r);
      }
      std::sort(deps.begin(), deps.end());
      deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
      for (uint32_t d : deps) nodes[d].dependents.push_back(uint32_t(i));
      nodes[i].waiting = uint32_t(deps.size());
    }
    for (size_t i = first; i < nodes.size(); ++i) {
      const Move& m = *nodes[i].move;
      const auto [a0, a1] = atom_range(s.chunks[size_t(m.src_chunk)]);
      for (size_t a = a0; a < a1; ++a) readers[size_t(m.src)][a].push_back(uint32_t(i));
    }
    for (size_t i = first; i < nodes.size(); ++i) {
      const Move& m = *nodes[i].move;
      const auto [b0, b1] = atom_range(s.chunks[size_t(m.dst_chunk)]);
      for (size_t a = b0; a < b1; ++a) {
        last_writer[size_t(m.dst)][a] = uint32_t(i);
        readers[size_t(m.dst)][a].clear();
      }
    }
  }

}

void CollectiveDriver::start() {
  start_ = last_ = net_.now();
  for (uint32_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].waiting == 0) issue(i, start_);
}

// Recursive through delivery callbacks; empty moves complete at once.
void CollectiveDriver::issue(uint32_t i, uint64_t t) {
  const Node& n = nodes_[i];
  const Move& m = *n.move;
  if (n.bytes == 0) {
    finish(i, t);
    return;
  }
  ++run_.messages;
  run_.bytes_moved += n.bytes;
  const int per = participants_per_chip();
  net_.send({m.src / per, m.src % per}, {m.dst / per, m.dst % per}, n.bytes, t,
            [this, i](MessageId, uint64_t when) { finish(i, when); }, m.direction);
}

void CollectiveDriver::finish(uint32_t i, uint64_t t) {
  ++finished_;
  last_ = std::max(last_, t);
  for (uint32_t d : nodes_[i].dependents)
    if (--nodes_[d].waiting == 0) issue(d, t);
}

CollectiveRun CollectiveDriver::result() const {
  if (!done())
    throw IciError(s_.name + ": " + std::to_string(nodes_.size() - finished_) + " moves never completed");
  CollectiveRun run = run_;
  run.cycles = last_ - start_;
  run.seconds = double(run.cycles) / net_.params().clock_hz;
  const double buffer_bytes = double(s_.kind == CollectiveKind::kAllToAll ? s_.elements / 2 : s_.elements) *
                              double(bytes_per_element_);
  run.algorithm_bytes_per_s = run.seconds > 0 ? buffer_bytes / run.seconds : 0;
  return run;
}

CollectiveRun simulate(Network& net, const Schedule& s, int64_t bytes_per_element) {
  CollectiveDriver driver(net, s, bytes_per_element);
  driver.start();
  net.run();
  return driver.result();
}

}  // namespace tpusim::ici

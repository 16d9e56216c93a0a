#include "hw/ici/topology.h"

#include <algorithm>
#include <cstdlib>

#include "hw/config/params.h"

namespace tpusim::ici {

namespace {

int dims_for(TopologyKind k) {
  switch (k) {
    case TopologyKind::kSingle: return 0;
    case TopologyKind::kRing: return 1;
    case TopologyKind::kMesh2d:
    case TopologyKind::kTorus2d: return 2;
    case TopologyKind::kTorus3d: return 3;
  }
  return 0;
}

}  // namespace

TopologyKind Topology::parse_kind(const std::string& name) {
  if (name == "single") return TopologyKind::kSingle;
  if (name == "ring") return TopologyKind::kRing;
  if (name == "mesh2d") return TopologyKind::kMesh2d;
  if (name == "torus2d") return TopologyKind::kTorus2d;
  if (name == "torus3d") return TopologyKind::kTorus3d;
  throw IciError("system.topology: unknown topology '" + name + "' (single | ring | mesh2d | torus2d | torus3d)");
}

std::string Topology::name() const {
  static const char* names[] = {"single", "ring", "mesh2d", "torus2d", "torus3d"};
  std::string s = names[int(kind_)];
  for (size_t i = 0; i < dims_.size(); ++i) s += (i ? "x" : " ") + std::to_string(dims_[i]);
  return s;
}

Topology::Topology(TopologyKind kind, std::vector<int> dims) : kind_(kind), dims_(std::move(dims)) {
  const int want = dims_for(kind);
  if (kind == TopologyKind::kSingle) {
    if (dims_.empty()) dims_ = {1};
    for (int d : dims_)
      if (d != 1) throw IciError("system.dims: topology 'single' needs every dim 1");
    dims_ = {1};
    chips_ = 1;
    return;
  }
  // A 2-D shape written with a trailing 1 ([2, 2, 1] on a torus3d board) is fine:
  // a dimension of size 1 has no links.
  while (int(dims_.size()) > want && dims_.back() == 1) dims_.pop_back();
  while (int(dims_.size()) < want) dims_.push_back(1);
  if (int(dims_.size()) != want)
    throw IciError("system.dims: topology '" + name() + "' needs " + std::to_string(want) + " dims");
  chips_ = 1;
  for (int d : dims_) {
    if (d < 1 || d > 4096) throw IciError("system.dims: dim " + std::to_string(d) + " out of range 1..4096");
    chips_ *= d;
    if (chips_ > 65536) throw IciError("system.dims: " + name() + " has more than 65536 chips");
  }
}

Topology Topology::from_params(const config::Params& p) {
  const TopologyKind kind = parse_kind(p.get_string("system.topology"));
  std::vector<int> dims;
  for (int64_t d : p.get_int_list("system.dims")) dims.push_back(int(d));
  Topology t(kind, dims);
  const int64_t chips = p.get_int("system.chips");
  if (chips != t.chips())
    throw IciError(p.source() + ": system.chips is " + std::to_string(chips) + " but system.dims make " +
                   std::to_string(t.chips()));
  int ports = 0;
  for (int d = 0; d < t.num_dims(); ++d)
    if (t.dims_[d] > 1) ports += 2;
  if (ports > p.get_int("ici.links"))
    throw IciError(p.source() + ": topology " + t.name() + " needs " + std::to_string(ports) +
                   " ICI links per chip, ici.links is " + std::to_string(p.get_int("ici.links")));
  return t;
}

std::vector<int> Topology::coords(int chip) const {
  std::vector<int> c(dims_.size());
  for (size_t d = 0; d < dims_.size(); ++d) {
    c[d] = chip % dims_[d];
    chip /= dims_[d];
  }
  return c;
}

int Topology::chip_at(const std::vector<int>& c) const {
  int chip = 0;
  for (int d = int(dims_.size()) - 1; d >= 0; --d) chip = chip * dims_[d] + c[d];
  return chip;
}

int Topology::neighbour(int chip, int port) const {
  const int d = port / 2;
  if (d >= num_dims() || dims_[d] == 1) return -1;
  std::vector<int> c = coords(chip);
  const int step = (port % 2 == 0) ? +1 : -1;
  int v = c[d] + step;
  if (v < 0 || v >= dims_[d]) {
    if (!wraps()) return -1;
    v = (v + dims_[d]) % dims_[d];
  }
  c[d] = v;
  return chip_at(c);
}

bool Topology::is_wrap_link(int chip, int port) const {
  const int d = port / 2;
  if (!wraps() || d >= num_dims()) return false;
  const int x = coords(chip)[d];
  return (port % 2 == 0) ? x == dims_[d] - 1 : x == 0;
}

std::vector<int> Topology::route_ports(int src_chip, int dst_chip, int tie_direction) const {
  if (src_chip < 0 || src_chip >= chips_ || dst_chip < 0 || dst_chip >= chips_)
    throw IciError("route: chip " + std::to_string(src_chip < 0 || src_chip >= chips_ ? src_chip : dst_chip) +
                   " not in " + name());
  const std::vector<int> s = coords(src_chip), t = coords(dst_chip);
  std::vector<int> ports;
  for (int d = 0; d < num_dims(); ++d) {
    if (s[d] == t[d]) continue;
    const int k = dims_[d];
    int dir, n;
    if (wraps()) {
      const int fwd = ((t[d] - s[d]) % k + k) % k, bwd = k - fwd;
      dir = fwd < bwd ? +1 : (bwd < fwd ? -1 : (tie_direction < 0 ? -1 : +1));
      n = dir > 0 ? fwd : bwd;
    } else {
      dir = t[d] > s[d] ? +1 : -1;
      n = std::abs(t[d] - s[d]);
    }
    for (int i = 0; i < n; ++i) ports.push_back(dir > 0 ? port_plus(d) : port_minus(d));
  }
  return ports;
}

std::vector<int> Topology::ring_order() const {
  // A mesh with an even number of rows (or columns) has a true Hamiltonian
  // cycle: snake over columns 1.. and come back down column 0 (or transposed).
  if (kind_ == TopologyKind::kMesh2d && dims_[0] >= 2 && dims_[1] >= 2 && (dims_[1] % 2 == 0 || dims_[0] % 2 == 0)) {
    const bool rows_even = dims_[1] % 2 == 0;
    const int kx = rows_even ? dims_[0] : dims_[1], ky = rows_even ? dims_[1] : dims_[0];
    auto at = [&](int x, int y) { return rows_even ? chip_at({x, y}) : chip_at({y, x}); };
    std::vector<int> order;
    for (int y = 0; y < ky; ++y)
      for (int i = 1; i < kx; ++i) order.push_back(at(y % 2 == 0 ? i : kx - i, y));
    for (int y = ky - 1; y >= 0; --y) order.push_back(at(0, y));
    std::rotate(order.begin(), order.end() - 1, order.end());  // start at chip 0
    return order;
  }
  std::vector<std::vector<int>> walk;
  for (int x = 0; x < dims_[0]; ++x) walk.push_back({x});
  for (int d = 1; d < num_dims(); ++d) {
    std::vector<std::vector<int>> next;
    for (int v = 0; v < dims_[d]; ++v) {
      for (int i = 0; i < int(walk.size()); ++i) {
        auto c = walk[v % 2 == 0 ? i : walk.size() - 1 - i];
        c.push_back(v);
        next.push_back(c);
      }
    }
    walk.swap(next);
  }
  std::vector<int> order;
  for (const auto& c : walk) order.push_back(chip_at(c));
  return order;
}

}  // namespace tpusim::ici

// The chip-level shape of a system: how many chips, their coordinates, which router
// port of which chip reaches which neighbour, and the dimension-order route between
// any two chips. Plain C++, no SystemC: the network model, the collective schedule
// generators and the compiler all ask the same object.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpusim::config {
class Params;
}

namespace tpusim::ici {

// Every topology or routing problem; the message names the preset key or the chip.
class IciError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class TopologyKind { kSingle, kRing, kMesh2d, kTorus2d, kTorus3d };

// A router port: 2*d is the +d neighbour, 2*d+1 the -d neighbour.
inline int port_plus(int dim) { return 2 * dim; }
inline int port_minus(int dim) { return 2 * dim + 1; }

class Topology {
 public:
  Topology() = default;
  // dims[0] varies fastest in the chip id: chip = x + dims[0] * (y + dims[1] * z).
  Topology(TopologyKind kind, std::vector<int> dims);
  // From `system.topology` and `system.dims`; checks `system.chips` agrees and
  // that the topology needs no more ports than `ici.links`.
  static Topology from_params(const config::Params& p);
  static TopologyKind parse_kind(const std::string& name);  // throws IciError

  TopologyKind kind() const { return kind_; }
  const std::vector<int>& dims() const { return dims_; }
  int num_dims() const { return int(dims_.size()); }
  int chips() const { return chips_; }
  bool wraps() const { return kind_ == TopologyKind::kRing || kind_ == TopologyKind::kTorus2d || kind_ == TopologyKind::kTorus3d; }
  std::string name() const;

  std::vector<int> coords(int chip) const;
  int chip_at(const std::vector<int>& coords) const;
  // The chip a port leads to, or -1 if the port has no link (a mesh edge, a
  // dimension of size 1). In a wrapping dimension of size 2 both ports lead to
  // the same neighbour over two parallel links.
  int neighbour(int chip, int port) const;
  // True when the +d (or -d) link of `chip` is the wraparound link of dimension d,
  // the dateline where a packet moves to the second virtual channel.
  bool is_wrap_link(int chip, int port) const;

  // Dimension-order route: dimension 0 first, in each the shorter way around; a
  // tie (exactly half way round a wrapping dimension) goes the way `tie_direction`
  // says (+1 or -1), so a ring schedule can send its two directions over the two
  // parallel links of a size-2 dimension. Returns the ports taken, chip by chip.
  std::vector<int> route_ports(int src_chip, int dst_chip, int tie_direction = +1) const;
  // Whether that route has such a tie, so tie_direction picks the links.
  bool route_ties(int src_chip, int dst_chip) const { return route_ports(src_chip, dst_chip, +1) != route_ports(src_chip, dst_chip, -1); }
  int hops(int src_chip, int dst_chip) const { return int(route_ports(src_chip, dst_chip).size()); }

  // A ring through every chip in which consecutive chips are neighbours where the
  // topology allows it: a boustrophedon (reflected mixed-radix Gray code) walk,
  // which closes with one wraparound hop on a torus of even dims. On a mesh the
  // closing hop is routed over several chips. Position 0 is chip 0.
  std::vector<int> ring_order() const;

 private:
  TopologyKind kind_ = TopologyKind::kSingle;
  std::vector<int> dims_{1};
  int chips_ = 1;
};

}  // namespace tpusim::ici

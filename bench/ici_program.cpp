// Writes a collective schedule as a chip program (hw/ici/collective_program.h) and
// prints, on stderr, the network-level cycles of the same schedule and its
// alpha-beta closed form, so a program-level run can be set beside them:
//   ici_program v3-8 ring 262144 > ar.s
//   core_run ar.s v3-8 fast out.json     (tests/hw/system; "cycles" in out.json)
// Pod scale (docs/ici.md "Scale"): --pod writes the program in its compact form
// (loops of 8 tiles, masked ragged tiles, 16 sample tiles of I/O per chip, VMEM of
// the buffer's size), e.g. the 100e6-byte torus all-reduce on 256 chips:
//   ici_program v2-16x16 torus 25000000 --pod > big.s
//   tpusim asm big.s -o big.tpb && tpusim run big.tpb --preset v2-16x16 --mode fast --random-inputs 1 --out o
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "hw/config/params.h"
#include "hw/ici/collective_program.h"
#include "hw/ici/collective_sim.h"
#include "hw/ici/network.h"

int main(int argc, char** argv) {
  using namespace tpusim;
  const bool pod = argc == 5 && std::string(argv[4]) == "--pod";
  if (argc != 4 && !pod) {
    std::cerr << "usage: ici_program PRESET ring|bidir-ring|torus FP32_ELEMENTS_PER_CHIP [--pod] > prog.s\n";
    return 2;
  }
  try {
    const config::Params preset = config::load_preset(argv[1], {});
    const ici::Topology topo = ici::Topology::from_params(preset);
    const ici::Algorithm alg = ici::parse_algorithm(argv[2]);
    const int64_t elements = std::stoll(argv[3]);
    if (elements <= 0) throw ici::IciError("elements must be positive");
    const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, alg, topo, elements);
    ici::ProgramOptions po;
    if (pod) {
      po.unroll = 8;
      po.io_tiles = std::min<int64_t>(16, elements / 1024);
      po.allow_ragged = true;
      // Buffer plus receive areas (about twice the buffer), in whole MiB.
      po.vmem_bytes = std::max<int64_t>(int64_t(16) << 20, (elements * 4 * 9 / 4 + (1 << 20)) >> 20 << 20);
      po.cores_per_chip = static_cast<int>(preset.get_int("cores_per_chip"));
      po.extra_target = " vmem=" + std::to_string(po.vmem_bytes);
    }
    std::cout << ici::collective_program(s, po);
    ici::Network net = ici::Network::from_params(preset);
    const auto ab = net.neighbour_alpha_beta();
    const double closed = ici::closed_form_cycles(ici::CollectiveKind::kAllReduce, alg, topo, double(elements) * 4,
                                                  ab.alpha_cycles, ab.beta_cycles_per_byte);
    const auto run = ici::simulate(net, s, 4);
    fmt::print(stderr, "{} {} {} B/chip: network-level {} cycles, closed form {:.0f} cycles\n", argv[1], argv[2],
               elements * 4, run.cycles, closed);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ici_program: " << e.what() << "\n";
    return 2;
  }
}

// Writes a collective schedule as a chip program (hw/ici/collective_program.h) and
// prints, on stderr, the network-level cycles of the same schedule and its
// alpha-beta closed form, so a program-level run can be set beside them:
//   ici_program v3-8 ring 262144 > ar.s
//   core_run ar.s v3-8 fast out.json     (tests/hw/system; "cycles" in out.json)
#include <fmt/core.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "hw/config/params.h"
#include "hw/ici/collective_program.h"
#include "hw/ici/collective_sim.h"
#include "hw/ici/network.h"

int main(int argc, char** argv) {
  using namespace tpusim;
  if (argc != 4) {
    std::cerr << "usage: ici_program PRESET ring|bidir-ring|torus FP32_ELEMENTS_PER_CHIP > prog.s\n";
    return 2;
  }
  try {
    const config::Params preset = config::load_preset(argv[1], {});
    const ici::Topology topo = ici::Topology::from_params(preset);
    const ici::Algorithm alg = ici::parse_algorithm(argv[2]);
    const int64_t elements = std::stoll(argv[3]);
    if (elements <= 0) throw ici::IciError("elements must be positive");
    const ici::Schedule s = ici::make_schedule(ici::CollectiveKind::kAllReduce, alg, topo, elements);
    std::cout << ici::collective_program(s);
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

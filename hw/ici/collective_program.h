// A collective schedule (collectives.h) written out as an assembly program for the
// chip model: every move is a DMA from core 0 of the sending chip into core 0 of
// the receiving chip (over ICI when the chips differ), and every reducing move a
// run of vld / vadd / vst over 8x128 fp32 tiles that adds the received partial
// sum on the left (received + local), the add order of docs/ici.md. Used to check
// the network-level figures against a program the chip model runs end to end.
//
// Layout on each chip's core 0: the fp32 buffer of `elements` at VMEM 0 (input
// `x<c>` and output `y<c>` of chip c), then per step a receive area for the
// reducing moves into that chip. Every receive of a chip has its own flag
// (f8, f9, .. in step order; the sender's rflag). A chip's program waits for its
// receives one at a time in step order, adds each, and right after it issues the
// sends that needed it (a DMA starts only after the vst issued before it), so the
// groups of a bidirectional ring or torus schedule pipeline independently, as in
// the network-level run. Sends of a step read elements no receive of the same
// step writes (collectives.h), and later writes land only after data-dependent
// receipts, so the program needs no issuer flags.
#pragma once

#include <cstdint>
#include <string>

#include "hw/ici/collectives.h"

namespace tpusim::ici {

struct ProgramOptions {
  int mxus = 1;                 // .target fields the preset must fit
  int cores_per_chip = 2;
  std::string extra_target;     // appended to the .target line
};

// Throws IciError if a chunk is not a whole number of 1024-element tiles, a chip
// receives more than 56 moves (one flag each), or the buffers do not fit 16 MiB
// of VMEM.
std::string collective_program(const Schedule& s, const ProgramOptions& o = {});

}  // namespace tpusim::ici

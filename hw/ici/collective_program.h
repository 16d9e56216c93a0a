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

//
// Pod scale (a chip receiving more than 56 moves, e.g. the torus all-reduce on
// v2-16x16 with 240): the flags count per link instead. A chip's sends to one
// destination go out one at a time (each waits for the previous one's completion
// flag, one flag per destination), so they land in the order they were issued and
// the receiver waits on one counting rflag per source for the count of that
// source's sends up to the one it needs. Options below keep such a program small:
// reducing moves as a loop of `unroll` tiles, ragged chunks with masked
// tiles, and I/O of a few sample tiles so a 100 MB buffer per chip need not be
// filled (memory reads as zero and stays unallocated until written nonzero).
struct ProgramOptions {
  int mxus = 1;                 // .target fields the preset must fit
  int cores_per_chip = 2;
  std::string extra_target;     // appended to the .target line
  int64_t vmem_bytes = int64_t(16) << 20;  // VMEM the buffer and receive areas must fit
  int unroll = 0;               // > 0: a reducing move is a loop of this many tiles per pass
  int64_t io_tiles = 0;         // > 0: inputs/outputs are this many evenly spaced tiles per chip
  bool allow_ragged = false;    // chunks that are not whole tiles: masked tiles at their ends
};

// Byte stride between the sample tiles of io_tiles > 0 (the tiles are
// k * io_tile_stride / 4096, k < io_tiles).
int64_t io_tile_stride(int64_t elements, int64_t io_tiles);

// Throws IciError if a chunk is not a whole number of 1024-element tiles (unless
// allow_ragged), a chip talks to more than 56 sources and destinations, or the
// buffers do not fit o.vmem_bytes of VMEM.
std::string collective_program(const Schedule& s, const ProgramOptions& o = {});

}  // namespace tpusim::ici

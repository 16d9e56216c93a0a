// Gathers through VMEM (im2col, pooling taps, weight rearrangement). HBM moves
// data in bursts spread over its channels, so a gather whose runs are one element
// long costs one memory request per element; staged through VMEM the HBM side is
// two contiguous transfers and the element-sized runs are VMEM -> VMEM copies.
#include "compiler/lower/emitter.h"

namespace tpusim::compiler::lowering {

void Emitter::staged_gather(int64_t src, int64_t src_bytes, int64_t dst, int64_t dst_bytes,
                            const std::vector<Gather>& gathers, bool fill, float fill_value, DType fill_dt,
                            int64_t planes, int64_t plane_stride) {
  const int64_t sv = 0, dv = align_up(src_bytes, kAlign);
  dma(vmem(sv), hbm(src), src_bytes);
  if (fill) {
    // One vst per tile: 8 x 128 elements of the fill value.
    const int64_t tile = kTileElems * esz(fill_dt);
    line("vbcast v0, " + fimm(fill_value));
    for (int64_t off = 0; off < dst_bytes; off += tile) line(std::string(st(fill_dt)) + " v0, " + at(dv + off));
  }
  wait_dmas();
  for (const Gather& g : gathers) {
    dma(vmem(dv + g.dst_off), vmem(sv + g.src_off), g.run, g.dims);
    wait_dmas();  // the gathers' bounding ranges interleave (race checker)
  }
  const int64_t part = dst_bytes / planes;
  for (int64_t p = 0; p < planes; ++p) dma(hbm(dst + p * plane_stride), vmem(dv + p * part), part);
  wait_dmas();
}

}  // namespace tpusim::compiler::lowering

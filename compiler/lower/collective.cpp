// Collectives between the replicas of a data-parallel bundle (docs/codegen.md
// "Collectives"): the schedule of compiler/ref/replicas.h, whose add order the
// graph reference folds in, lowered move by move to DMAs into the receiving
// replica's HBM plus vector adds.
#include <algorithm>
#include <map>

#include "compiler/lower/emitter.h"
#include "compiler/ref/replicas.h"

namespace tpusim::compiler::lowering {

namespace {
// The collective's own flags, apart from the node lowerings' (f1..f3) and the
// replicated driver's (f60..f62): sends count on the issuer, landings on the
// receiver, one flag per source replica.
constexpr const char* kSendFlag = "f58";
constexpr int kFirstLandFlag = 20, kLastLandFlag = 57;
// VMEM pieces of a combine: 64 tiles of 8 x 128 fp32 each for the received and the
// local values.
constexpr int64_t kPieceElems = 64 * kTileElems;
}  // namespace

// all_reduce(x): with one replica the identity; otherwise every replica holds an
// fp32 work buffer W (y itself for fp32, scratch for bf16) and runs the schedule's
// steps: each move it sends is one DMA of its W chunk into a receive slot of the
// destination replica's HBM (rflag there), and each move it receives is combined
// after the landing: W[chunk] = received + W[chunk] (vadd, received on the left, as
// the schedule's add order says) or W[chunk] = received. Receive slots are fresh
// per (step, move), at the same offsets in every replica, so no slot is reused and a
// sender never waits for a receiver.
void Emitter::lower_all_reduce(const Node& n) {
  const ReplicaSpec& s = opt_.replicas;
  if (s.replicas <= 1) {
    lower_copy(n);
    return;
  }
  const Placed X = t_.at(n.inputs[0]);
  const Placed Y = t_.at(n.output);
  const int64_t E = num_elements(n.type.shape);
  const bool f32 = n.type.dtype == DType::kF32;
  const ici::Schedule sch = all_reduce_schedule(s, E);
  const int me = opt_.replica;
  const int64_t W = f32 ? Y.addr : place_hbm(E * 4);

  // Receive slots: per step, the moves into a replica in schedule order, each at the
  // running offset of that replica's earlier incoming chunks of the step; a step
  // takes the largest such total over the replicas.
  std::vector<std::vector<int64_t>> slot(sch.steps.size());
  int64_t slots_bytes = 0;
  for (size_t st = 0; st < sch.steps.size(); ++st) {
    std::vector<int64_t> used(static_cast<size_t>(sch.chips), 0);
    for (const ici::Move& m : sch.steps[st]) {
      slot[st].push_back(slots_bytes + used[static_cast<size_t>(m.dst)]);
      used[static_cast<size_t>(m.dst)] += align_up(sch.chunks[static_cast<size_t>(m.dst_chunk)].elems * 4, 64);
    }
    slots_bytes += *std::max_element(used.begin(), used.end());
  }
  const int64_t slots = place_hbm(slots_bytes);
  check_addr(n, slots + slots_bytes + s.cores_per_chip * opt_.replica_region);
  // The same tensor in another replica's region (same layout, its core's base).
  auto there = [&](int r, int64_t addr) {
    return addr - opt_.hbm_base + static_cast<int64_t>(replica_core(s, r)) * opt_.replica_region;
  };
  const int64_t A = 0, B = kPieceElems * 4;  // VMEM: received / local piece

  // W = fp32(x).
  if (f32) {
    dma(hbm(W), hbm(X.addr), E * 4);
    wait_dmas();
  } else {
    for (int64_t p0 = 0; p0 < E; p0 += kPieceElems) {
      const int64_t pn = std::min(kPieceElems, E - p0);
      dma(vmem(A), hbm(X.addr + p0 * 2), pn * 2);
      wait_dmas();
      for (int64_t t = 0; t * kTileElems < pn; ++t) {
        line("vld.bf16 v1, " + at(A + t * kTileElems * 2));
        line("vst v1, " + at(B + t * kTileElems * 4));
      }
      dma(hbm(W + p0 * 4), vmem(B), pn * 4);
      wait_dmas();
    }
  }

  // One landing flag per source replica of the receiver (the schedule's order of
  // first appearance), so a count waited on implies that source's DMAs of this step:
  // a shared flag could count a fast neighbour's next step for a slow one's.
  std::vector<std::vector<int>> sources(static_cast<size_t>(sch.chips));
  for (const auto& step : sch.steps)
    for (const ici::Move& m : step) {
      auto& v = sources[static_cast<size_t>(m.dst)];
      if (std::find(v.begin(), v.end(), m.src) == v.end()) v.push_back(m.src);
    }
  auto land_flag = [&](int dst, int src) {
    const auto& v = sources[static_cast<size_t>(dst)];
    const int k = static_cast<int>(std::find(v.begin(), v.end(), src) - v.begin());
    if (kFirstLandFlag + k > kLastLandFlag)
      fail(n, "a replica receives from " + std::to_string(v.size()) + " others; the lowering has flags for " +
                  std::to_string(kLastLandFlag - kFirstLandFlag + 1));
    return kFirstLandFlag + k;
  };
  int64_t& sent = coll_sent_;
  for (size_t st = 0; st < sch.steps.size(); ++st) {
    const auto& moves = sch.steps[st];
    std::map<int, int64_t> incoming;  // landing flag -> moves of this step
    for (size_t k = 0; k < moves.size(); ++k) {
      const ici::Move& m = moves[k];
      if (m.dst == me) ++incoming[land_flag(me, m.src)];
      if (m.src != me) continue;
      const ici::Chunk& c = sch.chunks[static_cast<size_t>(m.src_chunk)];
      const std::string dst = "hbm@chip" + std::to_string(replica_chip(s, m.dst)) + ".c" +
                              std::to_string(replica_core(s, m.dst)) + ":" + at(there(m.dst, slots + slot[st][k]));
      line("dma " + dst + ", " + hbm(W + c.offset * 4) + ", bytes=" + std::to_string(c.elems * 4) + ", flag=" +
           kSendFlag + ", rflag=f" + std::to_string(land_flag(m.dst, me)));
      ++sent;
    }
    if (incoming.empty()) continue;
    for (const auto& [flag, count] : incoming)
      line("wait f" + std::to_string(flag) + ", " + std::to_string(coll_landed_[flag] += count));
    // W chunks this step overwrites may still be read by this replica's own sends.
    line(std::string("wait ") + kSendFlag + ", " + std::to_string(sent));
    for (size_t k = 0; k < moves.size(); ++k) {
      const ici::Move& m = moves[k];
      if (m.dst != me) continue;
      const ici::Chunk& c = sch.chunks[static_cast<size_t>(m.dst_chunk)];
      const int64_t recv = slots + slot[st][k];
      if (!m.reduce) {
        dma(hbm(W + c.offset * 4), hbm(recv), c.elems * 4);
        wait_dmas();
        continue;
      }
      for (int64_t p0 = 0; p0 < c.elems; p0 += kPieceElems) {
        const int64_t pn = std::min(kPieceElems, c.elems - p0);
        const int64_t w = W + (c.offset + p0) * 4;
        dma(vmem(A), hbm(recv + p0 * 4), pn * 4);
        dma(vmem(B), hbm(w), pn * 4);
        wait_dmas();
        for (int64_t t = 0; t * kTileElems < pn; ++t) {
          line("vld v1, " + at(A + t * kTileElems * 4));
          line("vld v2, " + at(B + t * kTileElems * 4));
          line("vadd v1, v1, v2");
          line("vst v1, " + at(A + t * kTileElems * 4));
        }
        dma(hbm(w), vmem(A), pn * 4);
        wait_dmas();
      }
    }
  }
  line(std::string("wait ") + kSendFlag + ", " + std::to_string(sent));
  if (f32) return;
  // y = bf16(W), rounded once.
  for (int64_t p0 = 0; p0 < E; p0 += kPieceElems) {
    const int64_t pn = std::min(kPieceElems, E - p0);
    dma(vmem(A), hbm(W + p0 * 4), pn * 4);
    wait_dmas();
    for (int64_t t = 0; t * kTileElems < pn; ++t) {
      line("vld v1, " + at(A + t * kTileElems * 4));
      line("vst.bf16 v1, " + at(B + t * kTileElems * 2));
    }
    dma(hbm(Y.addr + p0 * 2), vmem(B), pn * 2);
    wait_dmas();
  }
}

}  // namespace tpusim::compiler::lowering

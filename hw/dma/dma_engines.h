// The DMA engines of one TensorCore. A DMA descriptor (up to 3 outer strided
// dimensions around a contiguous run) is resolved at issue (exec::plan_dma); an
// engine then moves it in beats of core.dma.chunk_bytes. Beats to or from HBM go
// through the chip's memory port (hw/mem/memory_port.h), which decides when each
// completes; the engine issues beats no faster than its path's streaming rate.
// A transfer between the cores of one chip goes on the core's on-chip path to the
// other core: the engine hands it over (like one to another chip) and the path
// carries the core's transfers in turn at the preset's rate, each landing the
// preset's latency after its turn (alone: the published figure). A copy within
// the core's own VMEM and SMEM keeps an engine for that figure. A transfer to or
// from `host:` space goes over the chip's host link (hw/host/host_link.h: PCIe
// FIFO and the infeed source). A transfer with an endpoint on another chip goes
// to the board's ICI network through a RemotePort (hw/system): its bytes are
// read when it leaves, written and the rflag raised when it lands, and the
// issuer's flag rises when the completion is back. Local
// transfers move their data (exec::dma_copy) and count their flags (flag on the
// issuing core, rflag on the destination core) at the cycle the last beat lands,
// so a program that waits on the flags sees exactly the reference.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "hw/config/params.h"
#include "hw/host/host_link.h"
#include "hw/core/core_env.h"
#include "hw/mem/memory_port.h"
#include "hw/vmem/vmem_banks.h"

namespace tpusim::hw {

struct DmaPath {
  double latency_cycles = 0;
  double cycles_per_kib = 0;
};

struct DmaParams {
  int engines = 4;
  uint32_t chunk_bytes = 512;
  // core.dma.remote_queue: "own" lets a transfer to or from another chip start
  // ahead of queued local transfers waiting for an engine ("shared": in order).
  bool remote_own_queue = false;
  DmaPath hbm_to_vmem, vmem_to_hbm, core_to_core;
  static DmaParams from_config(const config::Params& p);
};

// The chip's memory port shared by every core's DMA engines, in core cycles.
class MemoryHub {
 public:
  using Sink = std::function<void(uint64_t token, uint64_t cycle)>;
  MemoryHub(std::unique_ptr<mem::MemoryPort> port, uint64_t cycle_ps);
  // Returns false on back-pressure.
  bool enqueue(uint64_t addr, uint32_t bytes, bool write, uint32_t source, uint64_t cycle, Sink* sink,
               uint64_t token);
  // Delivers the completions due by `cycle` to their sinks.
  void tick(uint64_t cycle);
  uint64_t next_event_cycle(uint64_t now) const;
  uint64_t cycle_ps() const { return cycle_ps_; }
  mem::MemoryPort& port() { return *port_; }
  uint64_t bytes_read = 0, bytes_written = 0;
  // Cycles one beat of `bytes` takes through an idle copy of this memory (for the
  // engines' fixed overhead, so the sum matches the published figure).
  static uint64_t unloaded_beat_cycles(mem::MemoryPort& fresh, uint32_t bytes, bool write, uint64_t cycle_ps);

 private:
  std::unique_ptr<mem::MemoryPort> port_;
  uint64_t cycle_ps_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::pair<Sink*, uint64_t>> waiting_;
};

// A transfer with an endpoint on another chip, for the board's ICI network. The
// data travels from (src_chip, src_core) to (dst_chip, dst_core); when src_chip is
// not the issuer's, a request travels there first. The port calls `complete`
// once, from inside a later cycle's network events, with the cycle (> the cycle it
// runs in) at which the issuer's flag may rise; when the issuer is the destination
// chip, from that chip's own tick (after the writes).
struct RemoteTransfer {
  exec::DmaPlan plan;
  uint32_t issuer_chip = 0, issuer_core = 0;
  uint32_t src_chip = 0, src_core = 0, dst_chip = 0, dst_core = 0;
  uint64_t cycle = 0;  // issue cycle
  // Whether the source / destination is HBM: its chip's memory then reads / writes
  // the bytes (hw/dma/remote_hbm.h).
  bool src_hbm = false, dst_hbm = false;
  // The way round a dimension exactly half way round (a size-2 torus dimension has
  // two parallel links to the neighbour): the ISA has no field for it, so the two
  // cores of a chip take one link each (core 0 +, core 1 -, ..., by parity), which
  // spreads a chip's traffic to a 2-wide neighbour over both links.
  int tie_direction = +1;
  uint8_t traffic_class = 0;  // the DMA's tc= (docs/isa.md "Traffic class")
  // Critical path records (hw/core/path_log.h): the issuer's log index and the
  // DMA's record there, for the landing's raise of rflag; path_core < 0: none.
  int32_t path_core = -1;
  uint32_t path_dma = 0;
  std::function<void(uint64_t)> complete;
};
using RemotePort = std::function<void(RemoteTransfer&&)>;  // throws on a request it cannot carry

// The bytes a DMA reads, in the order exec::dma_copy moves them, and their write
// into the destination: a transfer read when it leaves and written when it lands.
std::vector<uint8_t> dma_gather(const exec::DmaPlan& p);
void dma_scatter(const exec::DmaPlan& p, const std::vector<uint8_t>& bytes);
// The same bytes, holding only what was read from written pages: the rest of the
// stream is zeros, never materialised. A pod-scale all-reduce moves ~50 GB whose
// buffers are mostly never-written memory (docs/ici.md, "Scale").
struct DmaPayload {
  uint64_t total = 0;                                // bytes in the stream
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // (stream offset, length), increasing, disjoint
  std::vector<uint8_t> data;                         // the spans' bytes, concatenated
};
DmaPayload dma_gather_sparse(const exec::DmaPlan& p);
void dma_scatter(const exec::DmaPlan& p, const DmaPayload& payload);

class DmaEngines {
 public:
  // `remote` carries transfers with an endpoint on another chip; `host` is the
  // chip's host link, shared by its cores.
  DmaEngines(CoreEnv& env, VmemBanks& banks, MemoryHub& hub, const DmaParams& p, size_t queue_depth,
             uint64_t hbm_read_beat_cycles, uint64_t hbm_write_beat_cycles, uint32_t core_index,
             RemotePort remote, HostLink& host);

  bool queue_full() const { return queue_.size() >= depth_; }
  void push(Issued&& it);
  bool idle() const;
  // Whether tick(cycle) would do nothing at all (nothing queued, no engine busy, no
  // beat landed, no handed-off transfer finishing): a skipped tick then equals it,
  // and so does skip(), which has nothing to count.
  bool quiet(uint64_t cycle) const;
  // Ordering rule: a DMA starts only after the vld/vst issued before it are done.
  void set_vmem_ops_retired(std::function<uint64_t()> f) { vmem_ops_retired_ = std::move(f); }

  void tick(uint64_t cycle);
  void skip(uint64_t n);
  uint64_t next_event_cycle(uint64_t now) const;

  nlohmann::json engine_json(int e) const;
  int engines() const { return p_.engines; }
  // Traced state.
  int queue_depth_now_ = 0;
  int active_now_ = 0;

 private:
  enum class Kind { kHbmRead, kHbmWrite, kFixed, kHost, kRemote };
  struct Beat {
    uint64_t mem_addr;    // HBM side
    uint64_t vmem_addr;   // local VMEM side (bank claims); ~0 when none
    uint32_t bytes;
    uint64_t write_addr;  // HBM -> HBM: where the beat is written once read; ~0 otherwise
  };
  struct Transfer {
    Issued it;
    Kind kind = Kind::kFixed;
    int engine = 0;
    uint64_t start = 0;
    uint64_t first_issue = 0;   // cycle of beat 0
    double cycles_per_byte = 0;
    std::vector<Beat> beats;
    size_t issued = 0, landed = 0;
    uint64_t bytes_before_next = 0;  // bytes of beats already issued
    uint64_t done = kNever;          // known for fixed/remote paths, set when the last beat lands
    std::vector<uint64_t> land_cycles;  // beats landed this cycle (VMEM bank claims)
    bool dst_local_vmem = false, src_local_vmem = false;
    bool other_core = false;  // an end is another core's (a kFixed goes on the on-chip path)
    // HBM -> HBM on this chip (a kHbmRead): each beat read is then written, and the
    // transfer is done when the last write lands.
    bool hbm_to_hbm = false;
    std::deque<size_t> writes_due;  // beats read, their writes not yet accepted
    size_t written = 0;
  };
  // `other_core`, if given: an end is the other core's (for a kFixed: the on-chip path).
  Kind classify(const Issued& it, bool& dst_local_vmem, bool& src_local_vmem, bool* other_core = nullptr) const;
  // A local DMA that reads host space: the flags it raises mark an infeed wait.
  bool is_infeed(const Issued& it) const;
  void mark_infeed(const Issued& it, int delta);
  void start(Issued&& it, int engine, uint64_t cycle);
  // The first queued transfer that may start now (queue_.size() if none): the
  // front once an engine is free, or with remote_own_queue a remote one behind it.
  size_t startable(bool engine_free) const;
  void finish(Transfer& t, uint64_t cycle);
  // Critical path records (CoreEnv::path): a finished transfer and the flags it raised.
  void path_done(const Transfer& t, uint64_t cycle);
  uint64_t next_issue_cycle(const Transfer& t) const;

  CoreEnv& env_;
  VmemBanks& banks_;
  MemoryHub& hub_;
  DmaParams p_;
  size_t depth_;
  uint64_t read_beat_cycles_, write_beat_cycles_;
  uint32_t core_index_;
  RemotePort remote_;
  HostLink& host_;
  std::deque<Issued> queue_;
  std::vector<std::unique_ptr<Transfer>> active_;  // by engine, null when free
  std::vector<Transfer*> by_age_;                  // the active HBM transfers in start order
  // Remote and core-to-core transfers after their start: the ICI interface or the
  // on-chip path carries them, no engine.
  std::vector<std::unique_ptr<Transfer>> handed_off_;
  std::function<uint64_t()> vmem_ops_retired_;
  MemoryHub::Sink sink_;
  std::vector<std::pair<uint64_t, uint64_t>> landed_;  // (token, cycle) from the hub
  std::vector<Counters> engine_counters_;
  bool ordering_stall_ = false;
  uint64_t stall_ordering_cycles_ = 0, stall_no_engine_cycles_ = 0, stall_backpressure_cycles_ = 0;
  bool backpressured_ = false;
  // The on-chip path to the other core: free from this cycle; cycles transfers
  // waited for it behind earlier ones.
  uint64_t onchip_path_free_ = 0, core_to_core_wait_cycles_ = 0;
  timeline::TrackId track_ = 0;
  int recorded_active_ = 0;
};

}  // namespace tpusim::hw

// The ICI network as a plain C++ core: per chip one router, chip-to-chip links
// on the router's +d/-d ports, and per TensorCore an on-chip path (inject link
// core->router, eject link router->core). Every link has a payload bandwidth, a
// latency and credit-based flow control into the next router's buffers; routers
// forward with dimension-order routing (topology.h) after a pipeline latency.
//
// Messages are the transport the DMA engines use: N bytes from (chip, core) to
// (chip, core), asked for at cycle t, delivered (last byte written plus the
// completion cost) at a cycle the network reports by callback and by poll. A
// message is cut into packets of `ici.packet_bytes`; packets move store-and-
// forward, one at a time per link.
//
// Time: integer cycles for every event; a link's busy-until time is kept in
// 1/65536 cycle so back-to-back packets reach the exact fractional link rate.
// The core is event-driven (cheap events: one per packet per hop, plus a wake
// when a link frees with work queued); tick() and skip(n) give the same state
// as n ticks, so the clocked and the event-driven SystemC views (ici_views.h)
// agree bit for bit.
//
// Scale-out rule (architecture.md): chips interact only through links of at
// least one cycle latency (checked), events at the same cycle are taken in
// (cycle, sequence) order and every arbitration of a cycle sees all the arrivals
// of that cycle, so the outcome does not depend on the order events were queued.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <string>
#include <vector>

#include "hw/ici/topology.h"

namespace tpusim::config {
class Params;
}
namespace tpusim::timeline {
class Timeline;
}

namespace tpusim::ici {

// Everything the network reads from a preset; units in the names.
struct NetworkParams {
  double clock_hz = 1.05e9;
  int cores_per_chip = 2;
  double link_bytes_per_s = 50e9;          // raw, per direction
  double link_payload_efficiency = 0.868;  // payload share of the raw rate
  int64_t link_latency_cycles = 500;       // serdes + wire, one way; also the credit return time
  int64_t router_latency_cycles = 30;      // input to output, per router traversal
  double onchip_bytes_per_cycle = 512;     // core <-> router path
  int64_t onchip_latency_cycles = 40;
  int64_t packet_bytes = 2048;             // payload per packet
  int64_t buffer_packets = 64;             // router input buffer per (input, output, VC)
  int64_t dma_setup_cycles = 250;          // descriptor to first packet, every message
  int64_t remote_setup_cycles = 993;       // extra for a message to another chip
  int64_t completion_cycles = 50;          // last packet in to data visible + sync flag
  // How a core's inject link picks among its transfers in flight (docs/ici.md
  // "Injection"): per router output, the oldest first, and round robin among the
  // outputs; or round robin among all the transfers, packet by packet.
  enum class InjectOrder : uint8_t { kOldestPerOutput, kRoundRobin };
  InjectOrder inject_order = InjectOrder::kOldestPerOutput;

  static NetworkParams from_params(const config::Params& p);  // throws IciError / ConfigError
  double link_payload_bytes_per_cycle() const { return link_bytes_per_s * link_payload_efficiency / clock_hz; }
  void validate() const;  // throws IciError naming the bad key
};

struct Endpoint {
  int chip = 0;
  int core = 0;
};

using MessageId = uint32_t;
inline constexpr uint64_t kNever = UINT64_MAX;

struct LinkCounters {
  std::string name;            // "chip3.ici.x+", "chip0.core1.ici.inject"
  uint64_t bytes = 0;          // payload bytes sent
  uint64_t packets = 0;
  double busy_cycles = 0;      // serialising
  uint64_t credit_stall_cycles = 0;  // free, with a packet waiting, but no credit downstream
};

class Network {
 public:
  using DeliveryCallback = std::function<void(MessageId, uint64_t delivery_cycle)>;

  Network(const Topology& topology, const NetworkParams& params);
  static Network from_params(const config::Params& p);

  const Topology& topology() const { return topo_; }
  const NetworkParams& params() const { return prm_; }

  // Asks for N bytes to move from `src` to `dst`, the DMA issued at cycle `at`
  // (>= now()). `tie_direction` (+1/-1) picks the way round a dimension when both
  // are equally short. The callback runs at the delivery cycle, inside the event
  // loop; it may send further messages at that cycle or later.
  // A `gated` message's packets may leave the source core only as far as
  // release() has made its bytes available (a DMA streaming its source out of HBM:
  // the packets follow the memory reads); an ungated one has all its bytes from
  // the start. `traffic_class` 1 (urgent; a DMA's tc=1) goes ahead of class 0
  // (bulk) at every inject port and router output, in router buffers of its own
  // (docs/ici.md "Traffic classes").
  MessageId send(Endpoint src, Endpoint dst, uint64_t bytes, uint64_t at, DeliveryCallback on_delivery = {},
                 int tie_direction = +1, bool gated = false, uint8_t traffic_class = 0);
  // The first `bytes` of gated message `id` are available from cycle `at` (>=
  // now()); releases only grow. A packet leaves once all its bytes are.
  void release(MessageId id, uint64_t bytes, uint64_t at);
  // Throws what send() would for these endpoints and size (IciError), without
  // sending: a caller that queues the send for later checks it now.
  void check_send(Endpoint src, Endpoint dst, uint64_t bytes) const;
  bool delivered(MessageId id) const { return msgs_.at(id).delivered != kNever; }
  uint64_t delivery_cycle(MessageId id) const { return msgs_.at(id).delivered; }  // kNever until delivered
  size_t messages() const { return msgs_.size(); }
  size_t messages_in_flight() const { return in_flight_; }
  // A lower bound on the cycle of the next delivery (the only time a callback
  // runs), from the messages sent so far; kNever when none is in flight. A
  // message's undelivered packets must still cross its eject link one after
  // another, whatever the arbitration, so the bound holds under any later sends
  // (which only add contention). A message sent at cycle s is delivered no
  // earlier than s + min_delivery_cycles(its source and destination chips differ).
  // The board runs the chips of a pod slice apart up to these bounds (hw/system,
  // "windows").
  uint64_t next_delivery_bound();
  uint64_t min_delivery_cycles(bool between_chips) const {
    return uint64_t(prm_.dma_setup_cycles) + (between_chips ? uint64_t(prm_.remote_setup_cycles) : 0) +
           uint64_t(prm_.completion_cycles);
  }

  // Time. tick() handles every event of cycle now() and moves to the next cycle;
  // skip(n) equals n ticks; next_event() is the cycle of the earliest pending
  // event (kNever if none), so a caller may skip(next_event() - now()).
  uint64_t now() const { return now_; }
  uint64_t next_event() const;
  void tick();
  void skip(uint64_t n);
  // Runs the event loop until nothing is pending; throws IciError if messages
  // are left undelivered (a deadlock) or `max_cycles` passes.
  void run(uint64_t max_cycles = kNever);

  std::vector<LinkCounters> link_counters() const;
  // Every link's counters in place, so a waveform can trace their payload bytes
  // and packets as they grow (links are made by the constructor only, so the
  // pointers hold for the network's life).
  std::vector<const LinkCounters*> live_link_counters() const;
  // The counters in the stats.json "units" shape, keyed by hierarchical name:
  // units["chip3.ici.x+"] = {"bytes": .., "packets": .., "busy_cycles": ..,
  // "credit_stall_cycles": ..}; links that never carried a packet are left out.
  void add_stats(nlohmann::json& units) const;
  // Records every message from then on as a slice, issue to delivery, on the
  // track ("chipC", "coreK.ici") of its source core (nullptr stops recording).
  // The timeline must outlive the network's run.
  // Also records each link's traffic as a counter ("chipC" process, track
  // "ici.x+" or "coreK.ici.inject"): payload bytes per cycle averaged over
  // windows of kTrafficWindow cycles, written when a window closes.
  void set_timeline(timeline::Timeline* t) { timeline_ = t; }
  // Writes the traffic counters of the windows still open (call after the run).
  void flush_timeline();
  static constexpr uint64_t kTrafficWindow = 1024;
  // The analytic time of one message over an otherwise idle network: the fixed
  // part (setup, latencies, the first/last packet on the faster links) and the
  // cycles per byte of the slowest link on the path. Used by calibration and
  // by the alpha-beta closed forms; tests check it against the event model.
  struct AlphaBeta {
    double alpha_cycles = 0;
    double beta_cycles_per_byte = 0;
  };
  AlphaBeta neighbour_alpha_beta() const;

 private:
  enum class LinkKind : uint8_t { kChip, kInject, kEject };
  struct Packet {
    uint64_t ready = 0;  // cycle it may leave the router (or endpoint)
    uint32_t msg = 0;
    uint32_t index = 0;
    uint32_t bytes = 0;
    uint32_t hop = 0;    // index into the message's route of the link it waits for
  };
  // Credits a sender holds for one downstream buffer: the cycles at which each
  // free slot became known to the sender, oldest first.
  struct Credits {
    std::vector<uint64_t> ring;
    size_t head = 0, count = 0;
    uint64_t front() const { return count ? ring[head] : kNever; }
    void pop() { head = (head + 1) % ring.size(); --count; }
    void push(uint64_t t) { ring[(head + count) % ring.size()] = t; ++count; }
  };
  // Router buffers per input link: (bulk / urgent) x (VC before / after the dateline).
  static constexpr size_t kVcs = 2, kBuffersPerInput = 2 * kVcs;
  struct Slot {  // one virtual output queue: (input link, traffic class, VC) of this output link's router
    std::deque<Packet> queue;
    Credits credits;   // held by the input link's sender for this queue
    uint32_t input_link = 0;
  };
  struct Link {
    LinkKind kind = LinkKind::kChip;
    int chip = 0;       // chip of the sending side
    int port = 0;       // router port (chip links) or core (inject/eject)
    uint64_t q32_cycles_per_byte = 0;
    uint64_t latency = 1;
    uint64_t free_q16 = 0;
    std::vector<Slot> slots;       // router-side links only
    std::vector<uint64_t> busy_slots;  // bit per slot with a packet queued: arbitration scans only those
    int endpoint = -1;             // inject/eject: the endpoint
    uint64_t wake_at = kNever;
    bool stalled = false;
    uint64_t stall_since = 0;
    bool dirty = false;
    LinkCounters ctr;
    uint64_t busy_q16 = 0;
    uint64_t window = kNever;      // traffic counter: the open window and its bytes
    uint64_t window_bytes = 0;
  };
  struct Hop {
    uint32_t link = 0;
    uint32_t slot = 0;  // slot of the previous hop (and VC) in this link's queues
  };
  struct Message {
    int src_ep = 0, dst_ep = 0;
    uint64_t bytes = 0;
    bool urgent = false;  // traffic class 1: ahead of bulk at every arbitration, own buffers
    uint64_t issued = 0;
    uint64_t active = kNever;
    uint64_t last_served_q16 = 0;  // round_robin: when its last packet left the core; 0 = never
    uint32_t inject_queue = 0;     // its (first router output, source core) in inject_served_q16_
    uint32_t packets = 0, injected = 0, arrived = 0;
    uint32_t released = UINT32_MAX;  // packets whose bytes are available (gated messages)
    uint64_t released_at = 0;        // cycle of the last release
    uint64_t delivered = kNever;
    uint64_t deliver_at = kNever;  // once the last packet is in: the delivery cycle
    std::vector<Hop> route;
    DeliveryCallback callback;
  };
  enum class EvKind : uint8_t { kActivate, kReady, kArrive, kDeliver, kWake, kRelease };
  // 32 bytes: the event queue is the hot data structure of a large run.
  struct Event {
    uint64_t time = 0;
    uint32_t target = 0;  // link (kReady, kWake) or message (kActivate, kDeliver, kRelease)
    uint32_t slot : 24;   // kReady: the queue at the target link
    uint32_t kind : 8;
    uint32_t msg = 0, index = 0, bytes = 0, hop = 0;  // kReady, kArrive: the packet
    Event() : slot(0), kind(0) {}
    EvKind what() const { return EvKind(kind); }
    Packet packet() const { return {time, msg, index, bytes, hop}; }
    void set_packet(const Packet& p) {
      msg = p.msg;
      index = p.index;
      bytes = p.bytes;
      hop = p.hop;
    }
  };
  struct FarEvent {
    Event e;
    uint64_t seq;
    bool operator>(const FarEvent& o) const { return e.time != o.e.time ? e.time > o.e.time : seq > o.seq; }
  };

  void build();
  int endpoint_id(Endpoint e) const { return e.chip * prm_.cores_per_chip + e.core; }
  void push(Event e);
  void wake(uint32_t link, uint64_t t);
  void process_cycle(uint64_t t);
  void arbitrate(uint32_t link, uint64_t t);
  void mark_dirty(uint32_t link);
  void traffic(uint32_t link, uint64_t cycle, uint64_t bytes);
  void close_window(uint32_t link, uint64_t next_window);
  uint64_t ser_q16(const Link& l, uint64_t bytes) const { return (bytes * l.q32_cycles_per_byte + 0xFFFF) >> 16; }

  Topology topo_;
  NetworkParams prm_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> chip_port_link_;  // [chip][port] -> link or -1
  std::vector<uint32_t> inject_link_, eject_link_;  // per endpoint
  std::vector<std::vector<uint32_t>> router_inputs_;  // per chip: input links
  std::vector<std::vector<uint32_t>> active_;         // per endpoint: messages still injecting
  // Per (router output link, core of that chip): when the core's inject link last
  // sent a packet bound for that output (InjectOrder::kOldestPerOutput's turns).
  std::vector<uint64_t> inject_served_q16_;
  std::vector<Message> msgs_;
  // Pending events: a timing wheel for the next kWheel cycles (every latency of
  // the model falls in it; a bucket holds one cycle's events in the order they
  // were queued) and a heap for anything further out (sends issued ahead).
  static constexpr uint64_t kWheel = 2048;
  std::vector<std::vector<Event>> wheel_;
  std::vector<uint64_t> wheel_bits_;
  std::priority_queue<FarEvent, std::vector<FarEvent>, std::greater<FarEvent>> far_;
  size_t pending_ = 0;
  std::vector<uint32_t> dirty_, work_;
  timeline::Timeline* timeline_ = nullptr;
  uint64_t seq_ = 0;
  uint64_t now_ = 0;
  size_t in_flight_ = 0;
  std::vector<uint32_t> live_;  // messages possibly in flight (next_delivery_bound compacts it)
};

}  // namespace tpusim::ici

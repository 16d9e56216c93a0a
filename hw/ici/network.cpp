#include "hw/ici/network.h"

#include <algorithm>
#include <cmath>

#include "hw/config/params.h"
#include "hw/timeline/timeline.h"

namespace tpusim::ici {

NetworkParams NetworkParams::from_params(const config::Params& p) {
  NetworkParams n;
  n.clock_hz = p.get_double("clock_hz");
  n.cores_per_chip = int(p.get_int("cores_per_chip"));
  n.link_bytes_per_s = p.get_double("ici.link_bytes_per_s");
  n.link_payload_efficiency = p.get_double("ici.link_payload_efficiency");
  n.link_latency_cycles = p.get_int("ici.link_latency_cycles");
  n.router_latency_cycles = p.get_int("ici.router_latency_cycles");
  n.onchip_bytes_per_cycle = p.get_double("ici.onchip_bytes_per_cycle");
  n.onchip_latency_cycles = p.get_int("ici.onchip_latency_cycles");
  n.packet_bytes = p.get_int("ici.packet_bytes");
  n.buffer_packets = p.get_int("ici.buffer_packets");
  n.dma_setup_cycles = p.get_int("ici.dma_setup_cycles");
  n.remote_setup_cycles = p.get_int("ici.remote_setup_cycles");
  n.completion_cycles = p.get_int("ici.completion_cycles");
  const std::string order = p.get_string("ici.inject_order");
  if (order == "oldest_per_output")
    n.inject_order = NetworkParams::InjectOrder::kOldestPerOutput;
  else if (order == "round_robin")
    n.inject_order = NetworkParams::InjectOrder::kRoundRobin;
  else
    throw IciError(p.source() + ": ici.inject_order must be oldest_per_output or round_robin, not '" + order + "'");
  try {
    n.validate();
  } catch (const IciError& e) {
    throw IciError(p.source() + ": " + e.what());
  }
  return n;
}

void NetworkParams::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw IciError(what);
  };
  need(clock_hz > 0, "clock_hz must be > 0");
  need(cores_per_chip >= 1 && cores_per_chip <= 64, "cores_per_chip must be in 1..64");
  need(link_payload_efficiency > 0 && link_payload_efficiency <= 1, "ici.link_payload_efficiency must be in (0, 1]");
  const double rate = link_payload_bytes_per_cycle();
  need(rate >= 0.01 && rate <= 1e6, "ici.link_bytes_per_s gives " + std::to_string(rate) +
                                        " payload bytes/cycle, outside 0.01..1e6");
  need(onchip_bytes_per_cycle >= 0.01 && onchip_bytes_per_cycle <= 1e6, "ici.onchip_bytes_per_cycle outside 0.01..1e6");
  // At least one cycle per link: the lookahead a partitioned (MPI) run needs.
  need(link_latency_cycles >= 1 && link_latency_cycles <= 1000000, "ici.link_latency_cycles must be in 1..1e6");
  need(onchip_latency_cycles >= 1 && onchip_latency_cycles <= 1000000, "ici.onchip_latency_cycles must be in 1..1e6");
  need(router_latency_cycles >= 0 && router_latency_cycles <= 1000000, "ici.router_latency_cycles must be in 0..1e6");
  need(packet_bytes >= 1 && packet_bytes <= (1 << 20), "ici.packet_bytes must be in 1..1048576");
  need(buffer_packets >= 1 && buffer_packets <= 65536, "ici.buffer_packets must be in 1..65536");
  need(dma_setup_cycles >= 0 && remote_setup_cycles >= 0 && completion_cycles >= 0,
       "ici.dma_setup_cycles, remote_setup_cycles and completion_cycles must be >= 0");
}

Network::Network(const Topology& topology, const NetworkParams& params) : topo_(topology), prm_(params) {
  prm_.validate();
  build();
}

Network Network::from_params(const config::Params& p) {
  return Network(Topology::from_params(p), NetworkParams::from_params(p));
}

namespace {
uint64_t q32_per_byte(double bytes_per_cycle) { return uint64_t(std::llround(4294967296.0 / bytes_per_cycle)); }
uint64_t ceil16(uint64_t q16) { return (q16 + 0xFFFF) >> 16; }
const char* port_name(int port) {
  static const char* n[] = {"x+", "x-", "y+", "y-", "z+", "z-"};
  return port < 6 ? n[port] : "?";
}
}  // namespace

void Network::build() {
  const int chips = topo_.chips(), cores = prm_.cores_per_chip, ports = 2 * topo_.num_dims();
  wheel_.assign(kWheel, {});
  wheel_bits_.assign(kWheel / 64, 0);
  chip_port_link_.assign(chips, std::vector<int>(ports, -1));
  router_inputs_.assign(chips, {});
  const uint64_t chip_q32 = q32_per_byte(prm_.link_payload_bytes_per_cycle());
  const uint64_t on_q32 = q32_per_byte(prm_.onchip_bytes_per_cycle);
  auto add = [&](LinkKind k, int chip, int port, uint64_t q32, uint64_t lat, std::string name) {
    Link l;
    l.kind = k;
    l.chip = chip;
    l.port = port;
    l.q32_cycles_per_byte = q32;
    l.latency = lat;
    l.ctr.name = std::move(name);
    links_.push_back(std::move(l));
    return uint32_t(links_.size() - 1);
  };
  for (int c = 0; c < chips; ++c)
    for (int p = 0; p < ports; ++p)
      if (topo_.neighbour(c, p) >= 0)
        chip_port_link_[c][p] = int(add(LinkKind::kChip, c, p, chip_q32, uint64_t(prm_.link_latency_cycles),
                                        "chip" + std::to_string(c) + ".ici." + port_name(p)));
  inject_link_.resize(size_t(chips) * cores);
  eject_link_.resize(size_t(chips) * cores);
  active_.assign(size_t(chips) * cores, {});
  for (int c = 0; c < chips; ++c)
    for (int k = 0; k < cores; ++k) {
      const std::string base = "chip" + std::to_string(c) + ".core" + std::to_string(k) + ".ici.";
      const int ep = c * cores + k;
      inject_link_[ep] = add(LinkKind::kInject, c, k, on_q32, uint64_t(prm_.onchip_latency_cycles), base + "inject");
      eject_link_[ep] = add(LinkKind::kEject, c, k, on_q32, uint64_t(prm_.onchip_latency_cycles), base + "eject");
      links_[inject_link_[ep]].endpoint = ep;
      links_[eject_link_[ep]].endpoint = ep;
    }
  inject_served_q16_.assign(links_.size() * size_t(cores), 0);
  // Router inputs: the chip links arriving at a chip, then its cores' inject links.
  for (uint32_t i = 0; i < links_.size(); ++i) {
    const Link& l = links_[i];
    if (l.kind == LinkKind::kChip) router_inputs_[topo_.neighbour(l.chip, l.port)].push_back(i);
    if (l.kind == LinkKind::kInject) router_inputs_[l.chip].push_back(i);
  }
  for (auto& l : links_) {
    if (l.kind == LinkKind::kInject) continue;
    const auto& inputs = router_inputs_[l.chip];
    // Per input, four buffers: two VCs (before and after the dateline) for each
    // traffic class, so an urgent packet never queues behind bulk ones.
    l.slots.resize(inputs.size() * kBuffersPerInput);
    l.busy_slots.assign((l.slots.size() + 63) / 64, 0);
    for (size_t s = 0; s < l.slots.size(); ++s) {
      l.slots[s].input_link = inputs[s / kBuffersPerInput];
      l.slots[s].credits.ring.assign(size_t(prm_.buffer_packets), 0);
      l.slots[s].credits.count = size_t(prm_.buffer_packets);
    }
  }
}

void Network::push(Event e) {
  ++pending_;
  if (e.time >= now_ + kWheel) {
    far_.push({e, seq_++});
    return;
  }
  const uint64_t b = e.time % kWheel;
  wheel_[b].push_back(e);
  wheel_bits_[b / 64] |= uint64_t(1) << (b % 64);
}

uint64_t Network::next_event() const {
  if (pending_ == 0) return kNever;
  uint64_t best = far_.empty() ? kNever : far_.top().e.time;
  // First non-empty bucket at or after now_, scanning the bitmap round the wheel.
  const uint64_t start = now_ % kWheel, words = kWheel / 64;
  for (uint64_t i = 0; i <= words; ++i) {
    const uint64_t w = (start / 64 + i) % words;
    uint64_t bits = wheel_bits_[w];
    if (i == 0) bits &= ~uint64_t(0) << (start % 64);
    if (i == words) bits &= (start % 64) ? ~(~uint64_t(0) << (start % 64)) : 0;
    if (bits) {
      const uint64_t b = w * 64 + uint64_t(__builtin_ctzll(bits));
      const uint64_t t = now_ + (b + kWheel - start) % kWheel;
      return std::min(best, t);
    }
  }
  return best;
}

void Network::wake(uint32_t link, uint64_t t) {
  Link& l = links_[link];
  if (l.wake_at != kNever && l.wake_at >= now_ && l.wake_at <= t) return;  // an earlier wake re-arbitrates anyway
  l.wake_at = t;
  Event e;
  e.time = t;
  e.kind = uint32_t(EvKind::kWake);
  e.target = link;
  push(e);
}

void Network::mark_dirty(uint32_t link) {
  if (!links_[link].dirty) {
    links_[link].dirty = true;
    dirty_.push_back(link);
  }
}

void Network::check_send(Endpoint src, Endpoint dst, uint64_t bytes) const {
  auto check_ep = [&](Endpoint e, const char* what) {
    if (e.chip < 0 || e.chip >= topo_.chips() || e.core < 0 || e.core >= prm_.cores_per_chip)
      throw IciError(std::string("ici send: ") + what + " (chip " + std::to_string(e.chip) + ", core " +
                     std::to_string(e.core) + ") not in " + topo_.name() + " with " +
                     std::to_string(prm_.cores_per_chip) + " cores per chip");
  };
  check_ep(src, "source");
  check_ep(dst, "destination");
  if (bytes > (uint64_t(1) << 40)) throw IciError("ici send: message of " + std::to_string(bytes) + " bytes > 1 TiB");
}

MessageId Network::send(Endpoint src, Endpoint dst, uint64_t bytes, uint64_t at, DeliveryCallback on_delivery,
                        int tie_direction, bool gated, uint8_t traffic_class) {
  check_send(src, dst, bytes);
  if (at < now_)
    throw IciError("ici send: issue cycle " + std::to_string(at) + " is before the current cycle " +
                   std::to_string(now_));
  if (msgs_.size() >= UINT32_MAX - 1) throw IciError("ici send: too many messages");
  Message m;
  m.src_ep = endpoint_id(src);
  m.dst_ep = endpoint_id(dst);
  m.bytes = bytes;
  if (traffic_class > 1) throw IciError("traffic class " + std::to_string(traffic_class) + " (expected 0 or 1)");
  m.urgent = traffic_class == 1;
  const uint64_t P = uint64_t(prm_.packet_bytes);
  m.packets = uint32_t(std::max<uint64_t>(1, (bytes + P - 1) / P));  // an empty message still carries a header
  if (gated) m.released = 0;
  m.callback = std::move(on_delivery);
  // Route: inject, chip links in dimension order, eject.
  m.route.push_back({inject_link_[m.src_ep], 0});
  uint32_t prev = inject_link_[m.src_ep];
  int chip = src.chip, vc = 0, prev_dim = -1;
  auto slot_of = [&](int at_chip, uint32_t in_link, int v) {
    const auto& in = router_inputs_[at_chip];
    const auto it = std::find(in.begin(), in.end(), in_link);
    return uint32_t((it - in.begin()) * kBuffersPerInput + (m.urgent ? kVcs : 0) + v);
  };
  for (int port : topo_.route_ports(src.chip, dst.chip, tie_direction)) {
    const uint32_t link = uint32_t(chip_port_link_[chip][port]);
    m.route.push_back({link, slot_of(chip, prev, vc)});
    const int dim = port / 2;
    if (dim != prev_dim) vc = 0;
    if (topo_.is_wrap_link(chip, port)) vc = 1;
    prev_dim = dim;
    prev = link;
    chip = topo_.neighbour(chip, port);
  }
  m.route.push_back({eject_link_[m.dst_ep], slot_of(chip, prev, vc)});
  m.inject_queue = m.route[1].link * uint32_t(prm_.cores_per_chip) + uint32_t(src.core);
  m.issued = at;
  const bool remote = src.chip != dst.chip;
  m.active = at + uint64_t(prm_.dma_setup_cycles) + (remote ? uint64_t(prm_.remote_setup_cycles) : 0);
  msgs_.push_back(std::move(m));
  const MessageId id = MessageId(msgs_.size() - 1);
  ++in_flight_;
  live_.push_back(id);
  Event e;
  e.time = msgs_[id].active;
  e.kind = uint32_t(EvKind::kActivate);
  e.target = id;
  push(e);
  return id;
}

void Network::release(MessageId id, uint64_t bytes, uint64_t at) {
  if (at < now_)
    throw IciError("ici release: cycle " + std::to_string(at) + " is before the current cycle " + std::to_string(now_));
  const Message& m = msgs_.at(id);
  const uint64_t P = uint64_t(prm_.packet_bytes);
  Event e;
  e.time = at;
  e.kind = uint32_t(EvKind::kRelease);
  e.target = id;
  e.index = bytes >= m.bytes ? m.packets : uint32_t(bytes / P);
  push(e);
}

uint64_t Network::next_delivery_bound() {
  uint64_t bound = kNever;
  size_t kept = 0;
  for (uint32_t id : live_) {
    const Message& m = msgs_[id];
    if (m.delivered != kNever) continue;
    live_[kept++] = id;
    if (m.deliver_at != kNever) {
      bound = std::min(bound, m.deliver_at);
      continue;
    }
    // k packets still to arrive, each no earlier than now: k - 1 gaps on the eject
    // link, all but the last gap a full packet's serialisation (floored to cycles,
    // as arrivals are rounded up to whole cycles).
    const uint64_t k = m.packets - m.arrived;
    const uint64_t full = ser_q16(links_[eject_link_[size_t(m.dst_ep)]], uint64_t(prm_.packet_bytes)) >> 16;
    bound = std::min(bound, now_ + (k >= 2 ? (k - 2) * full : 0) + uint64_t(prm_.completion_cycles));
  }
  live_.resize(kept);
  return bound;
}

void Network::tick() { skip(1); }

void Network::skip(uint64_t n) {
  const uint64_t end = now_ + n;
  for (uint64_t t = next_event(); t < end; t = next_event()) process_cycle(t);
  now_ = end;
}

void Network::run(uint64_t max_cycles) {
  for (uint64_t t = next_event(); t != kNever; t = next_event()) {
    if (max_cycles != kNever && t >= max_cycles)
      throw IciError("ici: still " + std::to_string(in_flight_) + " messages in flight at the cycle limit " +
                     std::to_string(max_cycles));
    process_cycle(t);
    now_ = t + 1;
  }
  if (in_flight_)
    throw IciError("ici: deadlock: " + std::to_string(in_flight_) + " messages undelivered and no event pending at cycle " +
                   std::to_string(now_));
}

void Network::process_cycle(uint64_t t) {
  now_ = t;
  std::vector<Event>& bucket = wheel_[t % kWheel];
  for (;;) {
    // Events queued far ahead come first, then the cycle's bucket in queue order.
    size_t handled = 0;
    for (size_t i = 0;; ++i) {
      Event e;
      if (!far_.empty() && far_.top().e.time == t) {
        e = far_.top().e;
        far_.pop();
        --i;
      } else if (i < bucket.size()) {
        e = bucket[i];  // a copy: handling may append to the bucket
      } else {
        break;
      }
      ++handled;
      --pending_;
      switch (e.what()) {
        case EvKind::kActivate: {
          Message& m = msgs_[e.target];
          active_[m.src_ep].push_back(e.target);
          mark_dirty(inject_link_[m.src_ep]);
          break;
        }
        case EvKind::kReady: {
          Link& l = links_[e.target];
          l.slots[e.slot].queue.push_back(e.packet());
          l.busy_slots[e.slot / 64] |= uint64_t(1) << (e.slot % 64);
          // A busy link only needs its wake at the end of the current packet.
          if (ceil16(l.free_q16) > t)
            wake(e.target, ceil16(l.free_q16));
          else
            mark_dirty(e.target);
          break;
        }
        case EvKind::kArrive: {
          Message& m = msgs_[e.msg];
          if (++m.arrived == m.packets) {
            Event d;
            d.time = t + uint64_t(prm_.completion_cycles);
            d.kind = uint32_t(EvKind::kDeliver);
            d.target = e.msg;
            m.deliver_at = d.time;
            push(d);
          }
          break;
        }
        case EvKind::kDeliver: {
          Message& m = msgs_[e.target];
          m.delivered = t;
          --in_flight_;
          if (timeline_) {
            const int cores = prm_.cores_per_chip;
            const timeline::TrackId tr = timeline_->track("chip" + std::to_string(m.src_ep / cores),
                                                          "core" + std::to_string(m.src_ep % cores) + ".ici");
            std::vector<std::pair<std::string, std::string>> args = {
                {"to", "chip" + std::to_string(m.dst_ep / cores) + ".core" + std::to_string(m.dst_ep % cores)},
                {"message", std::to_string(e.target)}};
            if (m.urgent) args.emplace_back("class", "urgent");
            timeline_->slice(tr, "dma " + std::to_string(m.bytes) + " B", m.issued, t, std::move(args));
          }
          m.route = {};  // a long run issues millions of DMAs; keep only the delivery cycle
          if (m.callback) {
            // Moved out first: the callback may send, which may grow msgs_.
            auto cb = std::move(m.callback);
            m.callback = nullptr;
            cb(e.target, t);
          }
          break;
        }
        case EvKind::kRelease: {
          Message& m = msgs_[e.target];
          if (m.released != UINT32_MAX && e.index > m.released) {
            m.released = e.index;
            m.released_at = t;
            mark_dirty(inject_link_[m.src_ep]);
          }
          break;
        }
        case EvKind::kWake:
          if (links_[e.target].wake_at == t) links_[e.target].wake_at = kNever;
          mark_dirty(e.target);
          break;
      }
    }
    bucket.clear();
    wheel_bits_[(t % kWheel) / 64] &= ~(uint64_t(1) << ((t % kWheel) % 64));
    if (handled == 0) break;
    // Arbitration after every arrival of the cycle is in, in link order, so the
    // choice depends on the cycle's state, not on the order events were queued.
    std::sort(dirty_.begin(), dirty_.end());
    work_.swap(dirty_);
    for (uint32_t l : work_) {
      links_[l].dirty = false;
      arbitrate(l, t);
    }
    work_.clear();
  }
}

void Network::arbitrate(uint32_t li, uint64_t t) {
  Link& L = links_[li];
  const bool per_output = prm_.inject_order == NetworkParams::InjectOrder::kOldestPerOutput;
  for (;;) {
    if (ceil16(L.free_q16) > t) {
      wake(li, ceil16(L.free_q16));
      return;
    }
    // Candidates: (ready, source endpoint, message, packet) smallest first.
    int best = -1;  // slot index, or index into active_ for inject links
    uint64_t best_order = 0, best_ready = 0, best_credit = 0, next_try = kNever;
    uint32_t best_msg = 0, best_idx = 0;
    int best_src = 0, best_cls = 0;
    bool any = false;
    // `order` is the packet's age at a router. At a core's inject link the
    // transfers queue per router output, as a router's inputs do: the outputs
    // take turns (`order` is when the core last sent a packet towards the
    // transfer's output, so 4-6 transfers to different neighbours start
    // together instead of the oldest one bursting through all its credits
    // first), and to one output the oldest transfer goes first (the tie falls to
    // the smallest message id, the earliest sent), so a pipelined ring's next
    // piece lands at the link's rate instead of sharing it with every later
    // piece (docs/ici.md "Injection"). ici.inject_order: round_robin interleaves
    // every transfer packet by packet (`order`: when it was last served).
    auto consider = [&](int cand, uint64_t order, uint64_t ready, uint32_t msg, uint32_t idx, uint32_t hop) {
      any = true;
      const Message& m = msgs_[msg];
      uint64_t credit = 0;
      if (L.kind != LinkKind::kEject) {
        const Hop& next = m.route[hop + 1];
        credit = links_[next.link].slots[next.slot].credits.front();
        if (credit > t) {
          if (credit != kNever) next_try = std::min(next_try, credit);
          return;
        }
      }
      // Urgent (traffic class 1) before bulk, then by `order`.
      const int cls = m.urgent ? 0 : 1;
      if (best < 0 ||
          std::tie(cls, order, m.src_ep, msg, idx) < std::tie(best_cls, best_order, best_src, best_msg, best_idx)) {
        best_cls = cls;
        best = cand;
        best_order = order;
        best_ready = ready;
        best_credit = credit;
        best_msg = msg;
        best_idx = idx;
        best_src = m.src_ep;
      }
    };
    if (L.kind == LinkKind::kInject) {
      const auto& act = active_[L.endpoint];
      for (size_t i = 0; i < act.size(); ++i) {
        const Message& m = msgs_[act[i]];
        if (m.injected >= m.released) continue;  // its next packet's bytes are still being read
        const uint64_t order = per_output ? inject_served_q16_[m.inject_queue] : m.last_served_q16;
        consider(int(i), order, std::max(m.active, m.released_at), act[i], m.injected, 0);
      }
    } else {
      for (size_t w = 0; w < L.busy_slots.size(); ++w)
        for (uint64_t bits = L.busy_slots[w]; bits; bits &= bits - 1) {
          const size_t s = w * 64 + size_t(__builtin_ctzll(bits));
          const Packet& h = L.slots[s].queue.front();
          consider(int(s), h.ready, h.ready, h.msg, h.index, h.hop);
        }
    }
    if (best < 0) {
      if (any) {
        if (!L.stalled) {
          L.stalled = true;
          L.stall_since = std::max(t, ceil16(L.free_q16));
        }
        if (next_try != kNever) wake(li, next_try);
        // else: every candidate waits on a credit still in flight; its return wakes us.
      }
      return;
    }
    if (L.stalled) {
      L.ctr.credit_stall_cycles += t - L.stall_since;
      L.stalled = false;
    }
    Packet p;
    if (L.kind == LinkKind::kInject) {
      auto& act = active_[L.endpoint];
      Message& m = msgs_[act[size_t(best)]];
      p.ready = std::max(m.active, m.released_at);
      p.msg = act[size_t(best)];
      p.index = m.injected;
      const uint64_t P = uint64_t(prm_.packet_bytes);
      p.bytes = uint32_t(std::min<uint64_t>(P, m.bytes - std::min<uint64_t>(m.bytes, uint64_t(m.injected) * P)));
      p.hop = 0;
      if (++m.injected == m.packets) act.erase(act.begin() + best);
    } else {
      Slot& s = L.slots[size_t(best)];
      p = s.queue.front();
      s.queue.pop_front();
      if (s.queue.empty()) L.busy_slots[size_t(best) / 64] &= ~(uint64_t(1) << (best % 64));
    }
    Message& m = msgs_[p.msg];
    if (L.kind != LinkKind::kEject) {
      const Hop& next = m.route[p.hop + 1];
      links_[next.link].slots[next.slot].credits.pop();
    }
    const uint64_t start = std::max({L.free_q16, best_ready << 16, best_credit << 16});
    const uint64_t ser = ser_q16(L, p.bytes);
    const uint64_t end = start + ser;
    const uint64_t start_cycle = std::max(t, ceil16(start));
    if (L.kind == LinkKind::kInject) (per_output ? inject_served_q16_[m.inject_queue] : m.last_served_q16) = start + 1;
    L.free_q16 = end;
    L.busy_q16 += ser;
    L.ctr.bytes += p.bytes;
    L.ctr.packets += 1;
    if (timeline_) traffic(li, start_cycle, p.bytes);
    // The buffer this packet leaves frees a slot; the sender upstream learns of it
    // one link latency later.
    if (L.kind != LinkKind::kInject) {
      Slot& s = L.slots[size_t(best)];
      const uint32_t up = s.input_link;
      const uint64_t back = start_cycle + links_[up].latency;
      s.credits.push(back);
      if (links_[up].stalled) wake(up, back);
    }
    const uint64_t arrival = ceil16(end) + L.latency;
    Event e;
    if (L.kind == LinkKind::kEject) {
      e.time = arrival;
      e.kind = uint32_t(EvKind::kArrive);
      e.set_packet(p);
    } else {
      const Hop& next = m.route[p.hop + 1];
      e.time = arrival + uint64_t(prm_.router_latency_cycles);
      e.kind = uint32_t(EvKind::kReady);
      e.target = next.link;
      e.slot = next.slot;
      e.set_packet(p);
      e.hop = p.hop + 1;
    }
    push(e);
    // Only a link with more work queued needs waking when this packet is out.
    const bool more = L.kind == LinkKind::kInject ? !active_[L.endpoint].empty()
                                                   : std::any_of(L.busy_slots.begin(), L.busy_slots.end(),
                                                                 [](uint64_t w) { return w != 0; });
    if (!more) return;
  }
}

void Network::close_window(uint32_t li, uint64_t next_window) {
  Link& l = links_[li];
  const size_t dot = l.ctr.name.find('.');
  const timeline::TrackId tr = timeline_->track(l.ctr.name.substr(0, dot), l.ctr.name.substr(dot + 1));
  const std::string name = l.ctr.name + " B/cycle";
  timeline_->counter(tr, name, l.window * kTrafficWindow, double(l.window_bytes) / double(kTrafficWindow));
  // An idle stretch reads as zero, not as the last busy window's rate.
  if (next_window != l.window + 1) timeline_->counter(tr, name, (l.window + 1) * kTrafficWindow, 0.0);
}

void Network::traffic(uint32_t li, uint64_t cycle, uint64_t bytes) {
  Link& l = links_[li];
  const uint64_t w = cycle / kTrafficWindow;
  if (l.window != w) {
    if (l.window != kNever) close_window(li, w);
    l.window = w;
    l.window_bytes = 0;
  }
  l.window_bytes += bytes;
}

void Network::flush_timeline() {
  if (!timeline_) return;
  for (uint32_t li = 0; li < links_.size(); ++li)
    if (links_[li].window != kNever) {
      close_window(li, kNever);
      links_[li].window = kNever;
    }
}

std::vector<LinkCounters> Network::link_counters() const {
  std::vector<LinkCounters> out;
  for (const auto& l : links_) {
    LinkCounters c = l.ctr;
    c.busy_cycles = double(l.busy_q16) / 65536.0;
    out.push_back(c);
  }
  return out;
}

std::vector<const LinkCounters*> Network::live_link_counters() const {
  std::vector<const LinkCounters*> out;
  for (const auto& l : links_) out.push_back(&l.ctr);
  return out;
}

void Network::add_stats(nlohmann::json& units) const {
  for (const auto& c : link_counters()) {
    if (c.packets == 0) continue;
    units[c.name] = {{"bytes", c.bytes},
                     {"packets", c.packets},
                     {"busy_cycles", c.busy_cycles},
                     {"credit_stall_cycles", c.credit_stall_cycles}};
  }
}

Network::AlphaBeta Network::neighbour_alpha_beta() const {
  AlphaBeta ab;
  const double P = double(prm_.packet_bytes);
  ab.alpha_cycles = double(prm_.dma_setup_cycles + prm_.remote_setup_cycles + 2 * prm_.onchip_latency_cycles +
                           2 * prm_.router_latency_cycles + prm_.link_latency_cycles + prm_.completion_cycles) +
                    2 * P / prm_.onchip_bytes_per_cycle;
  ab.beta_cycles_per_byte = 1.0 / prm_.link_payload_bytes_per_cycle();
  return ab;
}

}  // namespace tpusim::ici

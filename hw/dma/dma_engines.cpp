#include "hw/dma/dma_engines.h"

#include <algorithm>
#include <cmath>

namespace tpusim::hw {

using isa::Space;

namespace {
// Marks a hub token as the write half of an HBM -> HBM beat (below the engine bits).
constexpr uint64_t kWriteToken = 1ull << 39;

DmaPath path(const config::Params& c, const std::string& key) {
  DmaPath p{c.get_double(key + ".latency_cycles"), c.get_double(key + ".cycles_per_kib")};
  // Bounded so that a transfer's cycles fit in 64 bits (1e30 cycles/KiB used to
  // overflow into a shorter run than the preset's own).
  if (!(p.latency_cycles >= 0 && p.latency_cycles <= 1e9 && p.cycles_per_kib >= 0 && p.cycles_per_kib <= 1e9))
    throw config::ConfigError(c.source() + ": " + key + ": latency_cycles and cycles_per_kib must be in 0..1e9");
  return p;
}
}  // namespace

DmaParams DmaParams::from_config(const config::Params& c) {
  DmaParams p;
  p.engines = static_cast<int>(c.get_int("core.dma.engines"));
  p.chunk_bytes = static_cast<uint32_t>(c.get_int("core.dma.chunk_bytes"));
  if (p.engines < 1 || p.engines > 64) throw config::ConfigError(c.source() + ": core.dma.engines must be 1..64");
  if (p.chunk_bytes < 32 || p.chunk_bytes > (1u << 20))
    throw config::ConfigError(c.source() + ": core.dma.chunk_bytes must be 32..1048576");
  p.hbm_to_vmem = path(c, "core.dma.hbm_to_vmem");
  p.vmem_to_hbm = path(c, "core.dma.vmem_to_hbm");
  p.core_to_core = path(c, "core.dma.core_to_core");
  const std::string q = c.get_string("core.dma.remote_queue");
  if (q != "shared" && q != "own")
    throw config::ConfigError(c.source() + ": core.dma.remote_queue must be shared or own, not '" + q + "'");
  p.remote_own_queue = q == "own";
  return p;
}

namespace {
// Calls f(src_offset, dst_offset) for each contiguous run in exec::dma_copy's order.
template <typename F>
void for_each_run(const exec::DmaPlan& p, F f) {
  uint32_t count[isa::kMaxDmaDims] = {1, 1, 1};
  for (int d = 0; d < p.ndims; ++d) count[d] = p.dims[d].count;
  for (uint32_t i2 = 0; i2 < count[2]; ++i2)
    for (uint32_t i1 = 0; i1 < count[1]; ++i1)
      for (uint32_t i0 = 0; i0 < count[0]; ++i0) {
        int64_t s = p.src_addr, d = p.dst_addr;
        const uint32_t idx[3] = {i0, i1, i2};
        for (int k = 0; k < p.ndims; ++k) {
          s += static_cast<int64_t>(idx[k]) * p.dims[k].src_stride;
          d += static_cast<int64_t>(idx[k]) * p.dims[k].dst_stride;
        }
        f(static_cast<uint64_t>(s), static_cast<uint64_t>(d));
      }
}
}  // namespace

std::vector<uint8_t> dma_gather(const exec::DmaPlan& p) {
  std::vector<uint8_t> out(static_cast<size_t>(p.total_bytes()));
  size_t at = 0;
  if (!out.empty())
    for_each_run(p, [&](uint64_t s, uint64_t) {
      p.src->read(s, out.data() + at, p.bytes);
      at += p.bytes;
    });
  return out;
}

void dma_scatter(const exec::DmaPlan& p, const std::vector<uint8_t>& bytes) {
  size_t at = 0;
  if (!bytes.empty())
    for_each_run(p, [&](uint64_t, uint64_t d) {
      p.dst->write(d, bytes.data() + at, p.bytes);
      at += p.bytes;
    });
}

DmaPayload dma_gather_sparse(const exec::DmaPlan& p) {
  DmaPayload out;
  out.total = p.total_bytes();
  if (out.total == 0) return out;
  uint64_t at = 0;  // stream offset
  for_each_run(p, [&](uint64_t s, uint64_t) {
    for (uint64_t done = 0; done < p.bytes;) {
      const uint64_t a = s + done;
      const uint64_t n = std::min(p.bytes - done, exec::Memory::kPageBytes - (a & (exec::Memory::kPageBytes - 1)));
      if (p.src->written(a)) {
        if (!out.spans.empty() && out.spans.back().first + out.spans.back().second == at) out.spans.back().second += n;
        else out.spans.emplace_back(at, n);
        const size_t old = out.data.size();
        out.data.resize(old + static_cast<size_t>(n));
        p.src->read(a, out.data.data() + old, n);
      }
      done += n;
      at += n;
    }
  });
  return out;
}

void dma_scatter(const exec::DmaPlan& p, const DmaPayload& payload) {
  if (payload.total == 0) return;
  uint64_t at = 0;        // stream offset of the run
  size_t span = 0;        // first span not wholly before `at`
  uint64_t span_data = 0; // offset in payload.data of that span
  for_each_run(p, [&](uint64_t, uint64_t d) {
    const uint64_t end = at + p.bytes;
    for (uint64_t pos = at; pos < end;) {
      while (span < payload.spans.size() && payload.spans[span].first + payload.spans[span].second <= pos) {
        span_data += payload.spans[span].second;
        ++span;
      }
      if (span < payload.spans.size() && payload.spans[span].first <= pos) {
        const uint64_t n = std::min(end, payload.spans[span].first + payload.spans[span].second) - pos;
        p.dst->write(d + (pos - at), payload.data.data() + span_data + (pos - payload.spans[span].first), n);
        pos += n;
      } else {
        const uint64_t next = span < payload.spans.size() ? std::min(end, payload.spans[span].first) : end;
        p.dst->write_zeros(d + (pos - at), next - pos);
        pos = next;
      }
    }
    at = end;
  });
}

// ---- MemoryHub ---------------------------------------------------------------

MemoryHub::MemoryHub(std::unique_ptr<mem::MemoryPort> port, uint64_t cycle_ps) : port_(std::move(port)), cycle_ps_(cycle_ps) {}

bool MemoryHub::enqueue(uint64_t addr, uint32_t bytes, bool write, uint32_t source, uint64_t cycle, Sink* sink,
                        uint64_t token) {
  mem::MemRequest r;
  r.id = next_id_;
  r.addr = addr;
  r.bytes = bytes;
  r.is_write = write;
  r.source = source;
  if (!port_->try_enqueue(r, cycle * cycle_ps_)) return false;
  waiting_[next_id_++] = {sink, token};
  (write ? bytes_written : bytes_read) += bytes;
  return true;
}

void MemoryHub::tick(uint64_t cycle) {
  if (waiting_.empty()) return;
  port_->advance_to(cycle * cycle_ps_);
  mem::MemCompletion c;
  while (port_->pop_completion(c)) {
    auto it = waiting_.find(c.id);
    if (it == waiting_.end()) continue;
    (*it->second.first)(it->second.second, cycle);
    waiting_.erase(it);
  }
}

uint64_t MemoryHub::next_event_cycle(uint64_t now) const {
  if (waiting_.empty()) return kNever;
  const uint64_t ps = port_->next_event_ps();
  if (ps == mem::kNever) return kNever;
  return std::max(now + 1, (ps + cycle_ps_ - 1) / cycle_ps_);
}

uint64_t MemoryHub::unloaded_beat_cycles(mem::MemoryPort& fresh, uint32_t bytes, bool write, uint64_t cycle_ps) {
  mem::MemRequest r;
  r.id = 1;
  r.bytes = bytes;
  r.is_write = write;
  if (!fresh.try_enqueue(r, 0)) return 0;
  uint64_t t = fresh.next_event_ps();
  mem::MemCompletion c;
  for (int guard = 0; guard < 1000000 && t != mem::kNever; ++guard) {
    fresh.advance_to(t);
    if (fresh.pop_completion(c)) return (c.done_ps + cycle_ps - 1) / cycle_ps;
    t = fresh.next_event_ps();
  }
  return 0;
}

// ---- DmaEngines ----------------------------------------------------------------

DmaEngines::DmaEngines(CoreEnv& env, VmemBanks& banks, MemoryHub& hub, const DmaParams& p, size_t queue_depth,
                       uint64_t hbm_read_beat_cycles, uint64_t hbm_write_beat_cycles, uint32_t core_index,
                       RemotePort remote, HostLink& host)
    : env_(env),
      banks_(banks),
      hub_(hub),
      p_(p),
      depth_(queue_depth),
      read_beat_cycles_(hbm_read_beat_cycles),
      write_beat_cycles_(hbm_write_beat_cycles),
      core_index_(core_index),
      remote_(std::move(remote)),
      host_(host),
      active_(static_cast<size_t>(p.engines)),
      engine_counters_(static_cast<size_t>(p.engines)) {
  sink_ = [this](uint64_t token, uint64_t cycle) { landed_.push_back({token, cycle}); };
  if (env_.timeline)
    track_ = env_.timeline->track(env_.name.substr(0, env_.name.find('.')),
                                  env_.name.substr(env_.name.find('.') + 1) + ".dma");
}

bool DmaEngines::is_infeed(const Issued& it) const {
  bool dst_local = false, src_local = false;
  return it.in->src.space == Space::kHost && classify(it, dst_local, src_local) == Kind::kHost;
}

void DmaEngines::mark_infeed(const Issued& it, int delta) {
  if (it.plan->flag_core) host_.infeed_pending(it.plan->flag_core->core, it.plan->flag, delta);
  if (it.plan->rflag_core) host_.infeed_pending(it.plan->rflag_core->core, it.plan->rflag, delta);
}

void DmaEngines::push(Issued&& it) {
  // From issue on, a wait on its flags is a wait for the host.
  if (is_infeed(it)) mark_infeed(it, +1);
  queue_.push_back(std::move(it));
}

bool DmaEngines::idle() const {
  if (!queue_.empty() || !handed_off_.empty()) return false;
  for (const auto& t : active_)
    if (t) return false;
  return true;
}

bool DmaEngines::quiet(uint64_t cycle) const {
  if (!queue_.empty() || !landed_.empty()) return false;
  for (const auto& t : active_)
    if (t) return false;
  for (const auto& t : handed_off_)
    if (t->done <= cycle) return false;
  return true;
}

size_t DmaEngines::startable(bool engine_free) const {
  const uint64_t retired = vmem_ops_retired_ ? vmem_ops_retired_() : ~0ull;
  for (size_t i = 0; i < queue_.size(); ++i) {
    // Later DMAs were issued after even more vld/vst.
    if (retired < queue_[i].vmem_ops_before) break;
    if (engine_free) return i;
    if (!p_.remote_own_queue) break;
    // core.dma.remote_queue: own. A transfer with an endpoint on another chip holds
    // no engine (start() hands it to the ICI interface), so it need not wait behind
    // local transfers waiting for one.
    bool dst_local = false, src_local = false;
    if (classify(queue_[i], dst_local, src_local) == Kind::kRemote) return i;
  }
  return queue_.size();
}

DmaEngines::Kind DmaEngines::classify(const Issued& it, bool& dst_local_vmem, bool& src_local_vmem,
                                      bool* other_core) const {
  const isa::Instr& in = *it.in;
  const uint32_t chip = env_.state->chip, core = env_.state->core;
  auto where = [&](const isa::DmaEndpoint& e, uint32_t& c, uint32_t& k) {
    c = e.chip >= 0 ? static_cast<uint32_t>(e.chip) : chip;
    const bool per_core = e.space == Space::kVmem || e.space == Space::kSmem;
    k = e.core >= 0 ? static_cast<uint32_t>(e.core) : (per_core && e.chip < 0 ? core : 0);
  };
  uint32_t dc, dk, sc, sk;
  where(in.dst, dc, dk);
  where(in.src, sc, sk);
  dst_local_vmem = in.dst.space == Space::kVmem && dc == chip && dk == core;
  src_local_vmem = in.src.space == Space::kVmem && sc == chip && sk == core;
  if (other_core) *other_core = dk != core || sk != core;
  if (dc != chip || sc != chip) return Kind::kRemote;
  if (in.src.space == Space::kHost || in.dst.space == Space::kHost) return Kind::kHost;
  if (in.src.space == Space::kHbm) return Kind::kHbmRead;
  if (in.dst.space == Space::kHbm) return Kind::kHbmWrite;
  return Kind::kFixed;
}

void DmaEngines::start(Issued&& it, int engine, uint64_t cycle) {
  auto t = std::make_unique<Transfer>();
  t->it = std::move(it);
  t->engine = engine;
  t->start = cycle;
  t->kind = classify(t->it, t->dst_local_vmem, t->src_local_vmem, &t->other_core);
  t->hbm_to_hbm = t->kind == Kind::kHbmRead && t->it.in->dst.space == Space::kHbm;
  if (env_.path) {
    PathLog::Dma& d = env_.path->dmas[t->it.path_dma];
    d.started = cycle;
    d.kind = t->kind == Kind::kRemote ? PathLog::DmaKind::kIci
             : t->kind == Kind::kHost ? PathLog::DmaKind::kHost
             : t->kind == Kind::kFixed ? PathLog::DmaKind::kCoreToCore
                                       : PathLog::DmaKind::kHbm;
  }
  const exec::DmaPlan& pl = *t->it.plan;
  const isa::Instr& in = *t->it.in;
  const uint64_t total = pl.total_bytes();
  engine_counters_[static_cast<size_t>(engine)]["transfers"]++;
  engine_counters_[static_cast<size_t>(engine)]["bytes"] += total;
  const auto fixed_done = [&](const DmaPath& p) {
    return cycle + std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(
                                             p.latency_cycles + static_cast<double>(total) * p.cycles_per_kib / 1024.0)));
  };
  // To the chip's other core: handed to the on-chip path below, no engine held.
  const bool onchip = t->kind == Kind::kFixed && t->other_core;
  if (onchip) {
    // The on-chip path to the chip's other core carries this core's transfers one
    // after another at its rate; each lands the path's latency after its turn came.
    // One alone takes the published figure (fixed_done at `cycle`).
    const uint64_t turn = std::max(cycle, onchip_path_free_);
    core_to_core_wait_cycles_ += turn - cycle;
    onchip_path_free_ = turn + static_cast<uint64_t>(std::llround(static_cast<double>(total) *
                                                                   p_.core_to_core.cycles_per_kib / 1024.0));
    t->done = fixed_done(p_.core_to_core) + (turn - cycle);
  } else if (t->kind == Kind::kFixed) {
    t->done = fixed_done(p_.core_to_core);  // a copy within this core's memories: on its engine
  } else if (t->kind == Kind::kHost) {
    t->done = host_.transfer(total, in.src.space == Space::kHost, cycle);
  } else if (t->kind == Kind::kRemote) {
    const uint32_t chip = env_.state->chip, core = env_.state->core;
    auto where = [&](const isa::DmaEndpoint& e, uint32_t& c, uint32_t& k) {
      c = e.chip >= 0 ? static_cast<uint32_t>(e.chip) : chip;
      const bool per_core = e.space == Space::kVmem || e.space == Space::kSmem;
      k = e.core >= 0 ? static_cast<uint32_t>(e.core) : (per_core && e.chip < 0 ? core : 0);
    };
    RemoteTransfer rt;
    rt.plan = pl;
    rt.issuer_chip = chip;
    rt.issuer_core = core;
    where(in.src, rt.src_chip, rt.src_core);
    where(in.dst, rt.dst_chip, rt.dst_core);
    // A push leaves through the issuing core's own path to the router.
    if (rt.src_chip == chip) rt.src_core = core;
    rt.cycle = cycle;
    rt.src_hbm = in.src.space == Space::kHbm;
    rt.dst_hbm = in.dst.space == Space::kHbm;
    rt.tie_direction = in.way != 0 ? in.way : (core % 2 ? -1 : +1);
    rt.traffic_class = in.tc;
    if (env_.path) {
      rt.path_core = env_.path->id;
      rt.path_dma = t->it.path_dma;
    }
    Transfer* tp = t.get();
    rt.complete = [tp](uint64_t c) { tp->done = c; };
    try {
      remote_(std::move(rt));
    } catch (const std::exception& e) {
      env_.raise(t->it.pc, e.what());
    }
  } else {
    const bool read = t->kind == Kind::kHbmRead;
    const DmaPath& p = read ? p_.hbm_to_vmem : p_.vmem_to_hbm;
    const uint64_t beat = read ? read_beat_cycles_ : write_beat_cycles_;
    // The published latency includes one beat's trip through the memory; the rest
    // is the engine's own fixed cost (descriptor, address generation, write-back).
    const double head = std::max(0.0, p.latency_cycles - static_cast<double>(beat));
    t->first_issue = cycle + static_cast<uint64_t>(std::llround(head));
    t->cycles_per_byte = p.cycles_per_kib / 1024.0;
    uint32_t count[isa::kMaxDmaDims] = {1, 1, 1};
    for (int d = 0; d < pl.ndims; ++d) count[d] = pl.dims[d].count;
    for (uint32_t i2 = 0; i2 < count[2]; ++i2)
      for (uint32_t i1 = 0; i1 < count[1]; ++i1)
        for (uint32_t i0 = 0; i0 < count[0]; ++i0) {
          int64_t s = pl.src_addr, d = pl.dst_addr;
          const uint32_t idx[3] = {i0, i1, i2};
          for (int k = 0; k < pl.ndims; ++k) {
            s += static_cast<int64_t>(idx[k]) * pl.dims[k].src_stride;
            d += static_cast<int64_t>(idx[k]) * pl.dims[k].dst_stride;
          }
          for (uint64_t off = 0; off < pl.bytes; off += p_.chunk_bytes) {
            const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(p_.chunk_bytes, pl.bytes - off));
            const uint64_t mem = static_cast<uint64_t>(read ? s : d) + off;
            const bool local = read ? t->dst_local_vmem : t->src_local_vmem;
            const uint64_t vm = local ? static_cast<uint64_t>(read ? d : s) + off : ~0ull;
            t->beats.push_back({mem, vm, n, t->hbm_to_hbm ? static_cast<uint64_t>(d) + off : ~0ull});
          }
        }
    if (t->beats.empty()) t->done = cycle + 1;
  }
  if (t->kind == Kind::kRemote || onchip) {
    // Handed to the chip's ICI interface or to the on-chip path: the engine is free
    // from the next cycle. A remote transfer's packets share the core's inject link
    // and the links' credits, and its flag rises when the completion is back; one
    // to the other core waits for the on-chip path above.
    handed_off_.push_back(std::move(t));
    return;
  }
  if (t->kind == Kind::kHbmRead || t->kind == Kind::kHbmWrite) by_age_.push_back(t.get());
  active_[static_cast<size_t>(engine)] = std::move(t);
}

uint64_t DmaEngines::next_issue_cycle(const Transfer& t) const {
  return t.first_issue +
         static_cast<uint64_t>(std::floor(static_cast<double>(t.bytes_before_next) * t.cycles_per_byte));
}

void DmaEngines::finish(Transfer& t, uint64_t cycle) {
  try {
    if (t.kind != Kind::kRemote) {
      exec::dma_copy(*t.it.plan);
      exec::dma_signal_destination(*t.it.plan);
    }
    exec::dma_signal_issuer(*t.it.plan);
    if (env_.path) path_done(t, cycle);
  } catch (const exec::Fault& e) {
    env_.raise(t.it.pc, e.what());
  }
  if (is_infeed(t.it)) mark_infeed(t.it, -1);
  env_.note_activity(cycle);
  if (env_.timeline) {
    env_.timeline->slice(track_, CoreEnv::slice_name(*t.it.in), t.start, cycle,
                         {{"engine", std::to_string(t.engine)}, {"transfer", t.it.plan->describe()}});
  }
  uint64_t hbm_bytes = t.kind == Kind::kHbmRead || t.kind == Kind::kHbmWrite
                           ? t.it.plan->total_bytes() * (t.hbm_to_hbm ? 2 : 1)
                           : 0;
  // The chip's HBM counter takes this core's local transfers here; the HBM ends of
  // one to or from another chip (hw/dma/remote_hbm.h: a source read, a
  // destination write) go through the memory of the chips they are on, whose
  // RemoteHbm counts them there. The op that issued it owns both.
  const uint64_t chip_hbm_bytes = hbm_bytes;
  if (t.kind == Kind::kRemote)
    for (const isa::DmaEndpoint* e : {&t.it.in->src, &t.it.in->dst})
      if (e->space == Space::kHbm) hbm_bytes += t.it.plan->total_bytes();
  env_.profile.dma_done(*t.it.in, hbm_bytes, chip_hbm_bytes, t.start, cycle, track_);
}

void DmaEngines::path_done(const Transfer& t, uint64_t cycle) {
  const exec::DmaPlan& p = *t.it.plan;
  const PathLog::Raise by{env_.path->id, t.it.path_dma, cycle, 0};
  env_.path->dmas[t.it.path_dma].done = cycle;
  if (p.flag >= 0) env_.path->raised[static_cast<size_t>(p.flag)] = by;
  // A transfer to another chip raises its rflag when it lands (hw/system).
  if (p.rflag >= 0 && t.kind != Kind::kRemote && p.rflag_core)
    env_.paths->raised_by(p.rflag_core->chip, p.rflag_core->core, p.rflag, by);
}

void DmaEngines::tick(uint64_t cycle) {
  banks_.begin_cycle(cycle);
  // Beats the memory finished.
  for (const auto& [token, at] : landed_) {
    (void)at;
    const size_t e = static_cast<size_t>(token >> 40);
    Transfer* t = active_[e].get();
    if (!t) continue;
    if (token & kWriteToken) {  // the write half of an HBM -> HBM beat
      if (++t->written == t->beats.size()) t->done = cycle;
      continue;
    }
    const size_t i = token & (kWriteToken - 1);
    const Beat& b = t->beats[i];
    if (t->kind == Kind::kHbmRead && b.vmem_addr != ~0ull) banks_.claim_dma(banks_.banks_of(b.vmem_addr, b.bytes));
    if (t->hbm_to_hbm) t->writes_due.push_back(i);
    if (++t->landed == t->beats.size() && !t->hbm_to_hbm) t->done = cycle;
  }
  landed_.clear();
  for (auto& slot : active_) {
    if (slot && slot->done == cycle) {
      finish(*slot, cycle);
      by_age_.erase(std::remove(by_age_.begin(), by_age_.end(), slot.get()), by_age_.end());
      slot.reset();
    }
  }
  for (size_t i = 0; i < handed_off_.size();) {
    if (handed_off_[i]->done == cycle) {
      finish(*handed_off_[i], cycle);
      handed_off_.erase(handed_off_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  // Beats due to go out.
  backpressured_ = false;
  // Oldest transfer first: under the memory's back-pressure the beats go in the
  // order the program issued the DMAs, not by engine number. With engine 0 first, a
  // load issued early on engine 3 waited behind later ones on engines 0..2 (v3-8
  // all-reduce, 16 MiB: a 256 KiB load took 6.8 K cycles instead of ~1.5 K, and the
  // first sends of the op, placed behind its consume, waited for it). by_age_ is
  // kept in start order as transfers start and finish: sorting here every tick
  // cost the 256-chip pod run ~28% of its wall time.
  for (Transfer* oldest : by_age_) {
    Transfer& t = *oldest;
    // Writes of beats read (HBM -> HBM) before new reads.
    while (!t.writes_due.empty()) {
      const Beat& b = t.beats[t.writes_due.front()];
      const uint64_t token = (static_cast<uint64_t>(t.engine) << 40) | kWriteToken | t.writes_due.front();
      if (!hub_.enqueue(b.write_addr, b.bytes, true, core_index_, cycle, &sink_, token)) {
        backpressured_ = true;
        break;
      }
      t.writes_due.pop_front();
    }
    if (!t.writes_due.empty()) continue;
    while (t.issued < t.beats.size() && next_issue_cycle(t) <= cycle) {
      const Beat& b = t.beats[t.issued];
      const bool write = t.kind == Kind::kHbmWrite;
      const uint64_t token = (static_cast<uint64_t>(t.engine) << 40) | t.issued;
      if (!hub_.enqueue(b.mem_addr, b.bytes, write, core_index_, cycle, &sink_, token)) {
        backpressured_ = true;
        break;
      }
      if (write && b.vmem_addr != ~0ull) banks_.claim_dma(banks_.banks_of(b.vmem_addr, b.bytes));
      t.bytes_before_next += b.bytes;
      ++t.issued;
    }
  }
  // A new transfer.
  ordering_stall_ = false;
  int free_engine = -1;
  for (int e = 0; e < p_.engines && free_engine < 0; ++e)
    if (!active_[static_cast<size_t>(e)]) free_engine = e;
  if (!queue_.empty()) {
    const size_t pick = startable(free_engine >= 0);
    if (pick != 0) {  // the front waits: for an engine, or for the vld/vst before it
      if (free_engine < 0) {
        ++stall_no_engine_cycles_;
      } else {
        ordering_stall_ = true;
        ++stall_ordering_cycles_;
      }
    }
    if (pick < queue_.size()) {
      // A remote transfer started with every engine busy is counted on engine 0.
      start(std::move(queue_[pick]), free_engine >= 0 ? free_engine : 0, cycle);
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(pick));
      env_.note_activity(cycle);
    }
  }
  if (backpressured_) ++stall_backpressure_cycles_;
  active_now_ = 0;
  for (size_t e = 0; e < active_.size(); ++e)
    if (active_[e]) {
      ++engine_counters_[e]["busy_cycles"];
      ++active_now_;
    }
  const int depth_before = queue_depth_now_;
  queue_depth_now_ = static_cast<int>(queue_.size());
  if (env_.timeline && queue_depth_now_ != depth_before)  // sampled at the engines' ticks
    env_.timeline->counter(track_, env_.name + ".dma queue", cycle, queue_depth_now_);
  if (env_.timeline && active_now_ != recorded_active_) {
    recorded_active_ = active_now_;
    env_.timeline->counter(track_, env_.name + ".dma transfers in flight", cycle, active_now_);
  }
}

void DmaEngines::skip(uint64_t n) {
  for (size_t e = 0; e < active_.size(); ++e)
    if (active_[e]) engine_counters_[e]["busy_cycles"] += n;
  if (!queue_.empty()) {
    bool free_engine = false;
    for (const auto& t : active_) free_engine |= !t;
    if (!free_engine) stall_no_engine_cycles_ += n;
    else stall_ordering_cycles_ += n;  // otherwise it would have started
  }
}

uint64_t DmaEngines::next_event_cycle(uint64_t now) const {
  uint64_t next = kNever;
  bool free_engine = false;
  for (const auto& t : handed_off_)
    if (t->done != kNever) next = std::min(next, std::max(now + 1, t->done));
  for (const auto& slot : active_) {
    if (!slot) {
      free_engine = true;
      continue;
    }
    if (slot->done != kNever) next = std::min(next, std::max(now + 1, slot->done));
    if (slot->issued < slot->beats.size())
      next = std::min(next, backpressured_ ? now + 1 : std::max(now + 1, next_issue_cycle(*slot)));
    if (!slot->writes_due.empty()) next = std::min(next, now + 1);  // writes refused by back-pressure
  }
  if (!queue_.empty() && startable(free_engine) < queue_.size()) next = std::min(next, now + 1);
  return next;
}

nlohmann::json DmaEngines::engine_json(int e) const {
  nlohmann::json j = engine_counters_[static_cast<size_t>(e)].to_json();
  if (e == 0) {
    j["stall_ordering_cycles"] = stall_ordering_cycles_;
    j["stall_no_engine_cycles"] = stall_no_engine_cycles_;
    j["stall_memory_backpressure_cycles"] = stall_backpressure_cycles_;
    j["core_to_core_wait_cycles"] = core_to_core_wait_cycles_;
  }
  return j;
}

}  // namespace tpusim::hw

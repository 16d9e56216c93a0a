#include "hw/system/system.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <systemc>
#include <thread>
#include <tuple>

#include "hw/chip/chip.h"
#include "hw/ici/network.h"
#include "hw/mem/memory_factory.h"
#include "hw/mxu/result_values.h"
#include "hw/system/critical_path.h"
#include "hw/wave/vcd_filter.h"
#include "isa/exec/tensors.h"

namespace tpusim::hw {

namespace {

// The chips of a board and the ICI network between them, as plain C++: both
// SystemC views drive this one object. Within a cycle the chips tick first (a DMA
// that starts hands its message to the network at that cycle), then the network
// handles every event of the cycle (deliveries write the destination and raise
// its flags; the cores see them from the next cycle on).
class Board {
 public:
  std::vector<std::unique_ptr<Chip>> chips;
  std::unique_ptr<Barrier> barrier;
  std::unique_ptr<ici::Network> net;
  uint64_t max_cycles = 0;
  uint64_t max_instructions = 0;
  uint64_t last_landing = 0;
  PathLogs* paths = nullptr;  // critical path records (RunOptions::critical_path), else null

  // Fast mode on a pod slice: a chip ticks only at its own event cycles and at the
  // cycles the network touches it; the cycles in between it is behind by are
  // skipped when it next ticks or is touched (a tick without an event is a skip of
  // one cycle, which the detailed = fast tests hold). Without it every event of any
  // chip ticked all 256 chips. Off with a barrier (a board-wide object whose release
  // wakes cores on other chips), a timeline or a waveform (their records follow
  // tick order).
  bool lazy = false;
  std::vector<uint64_t> synced;  // per chip: cycles [0, synced) are accounted
  std::vector<uint64_t> next;    // per chip: its next event cycle, as of its last tick or touch
  std::vector<uint32_t> dirty;   // chips ticked or touched in the current cycle
  std::vector<char> is_dirty;

  void start_lazy() {
    lazy = true;
    for (auto& c : chips) c->set_quiet_units_skip(true);
    synced.assign(chips.size(), 0);
    next.assign(chips.size(), 0);
    is_dirty.assign(chips.size(), 0);
  }
  // Brings chip c up to the end of `cycle` before the network changes its state at
  // that cycle (a landing, a completion, a read of its memory).
  void touch(uint32_t c, uint64_t cycle) {
    if (!lazy) return;
    if (synced[c] > cycle + 1)  // a window ran it past a delivery its bound ruled out
      throw std::logic_error("chip " + std::to_string(c) + " touched at cycle " + std::to_string(cycle) +
                             " after it ran to " + std::to_string(synced[c] - 1) + " (window bound violated)");
    if (synced[c] <= cycle) {
      chips[c]->skip(cycle + 1 - synced[c]);
      synced[c] = cycle + 1;
    }
    if (!is_dirty[c]) {
      is_dirty[c] = 1;
      dirty.push_back(c);
    }
  }
  // The run ends at `cycle`: every chip accounted to its end, as the full ticks did.
  void sync_all(uint64_t cycle) {
    if (!lazy) return;
    for (uint32_t c = 0; c < chips.size(); ++c)
      if (synced[c] <= cycle) {
        chips[c]->skip(cycle + 1 - synced[c]);
        synced[c] = cycle + 1;
      }
  }

  // A transfer with an endpoint on another chip (RemotePort). The source bytes
  // are read when the data message leaves, written when it has landed; the
  // issuer's completion comes back over the links the data crossed (their
  // latency, as a credit returns), so no chip sees another chip's state earlier
  // than a link could tell it. An HBM end costs that chip's memory its beats
  // (hw/dma/remote_hbm.h): a source in HBM is read beat by beat from the data
  // leg's start and the message's packets leave only as their bytes are back
  // (a gated message); a destination in HBM is written from the landing on, and
  // the bytes and the rflag appear when those writes are done (in landing order
  // per chip). The issuer's flag is a posted write's (at the landing plus the
  // way back), except when the issuer is the destination chip: then it follows
  // the writes, one cycle after they retire.
  void remote(RemoteTransfer&& rt) {
    auto t = std::make_shared<RemoteTransfer>(std::move(rt));
    const ici::Endpoint src{int(t->src_chip), int(t->src_core)}, dst{int(t->dst_chip), int(t->dst_core)};
    auto data_leg = [this, t, src, dst](uint64_t at, bool in_tick) {
      // The same memory on both ends (a chip asks another to copy within itself):
      // copied at landing like a local DMA, overlapping runs included.
      auto bytes = std::make_shared<DmaPayload>();
      if (!in_window) touch(t->src_chip, at);  // in a window it is the chip ticking now
      if (t->plan.src != t->plan.dst) *bytes = dma_gather_sparse(t->plan);
      const uint64_t total = t->plan.total_bytes();
      const bool gated = t->src_hbm && total > 0;
      auto id = std::make_shared<ici::MessageId>(0);
      send(t->issuer_chip, src, dst, total, at, [this, t, bytes](ici::MessageId, uint64_t landed) {
        touch(t->dst_chip, landed);
        touch(t->issuer_chip, landed);
        last_landing = std::max(last_landing, landed);
        const bool own = t->dst_chip == t->issuer_chip;
        // Runs on the destination chip's tick (or here): its own memory and flags only.
        auto retire = [t, bytes, own, paths = paths](uint64_t at) {
          if (t->plan.src != t->plan.dst) dma_scatter(t->plan, *bytes);
          else exec::dma_copy(t->plan);
          exec::dma_signal_destination(t->plan);
          if (paths && t->path_core >= 0 && t->plan.rflag >= 0)
            paths->raised_by(t->plan.rflag_core->chip, t->plan.rflag_core->core, t->plan.rflag,
                             PathLog::Raise{t->path_core, t->path_dma, at, 0});
          if (own) t->complete(at + 1);
        };
        RemoteHbm& hbm = chips[t->dst_chip]->remote_hbm();
        hbm.land(t->dst_hbm ? hbm.beats(t->plan, false) : std::vector<RemoteHbm::Beat>{}, landed, landed + 1,
                 std::move(retire));
        if (!own) {
          const uint64_t back = uint64_t(net->topology().hops(int(t->dst_chip), int(t->issuer_chip))) *
                                uint64_t(net->params().link_latency_cycles);
          t->complete(std::max(landed + 1, landed + back));
        }
      }, t->tie_direction, gated, id, t->traffic_class);
      if (gated) {
        // A push reads from the issuing core's tick on (the chip's RemoteHbm ticks
        // after its cores); a pull from the cycle after its request arrived.
        RemoteHbm& hbm = chips[t->src_chip]->remote_hbm();
        const uint32_t chip = t->src_chip;
        hbm.read(hbm.beats(t->plan, true), in_tick ? at : at + 1, uint64_t(net->params().packet_bytes),
                 [this, chip, id](uint64_t b, uint64_t cycle) { release(chip, id, b, cycle); });
      }
    };
    // window_end's lookahead assumes what a tick sends crosses chips.
    if (in_window && t->src_chip == t->issuer_chip && t->dst_chip == t->issuer_chip)
      throw std::logic_error("a same-chip transfer through the network inside a window");
    if (t->src_chip == t->issuer_chip) {
      data_leg(t->cycle, true);
    } else {
      // A read of another chip's memory: a header-only request travels there first.
      send(t->issuer_chip, {int(t->issuer_chip), int(t->issuer_core)}, src, 0, t->cycle,
           [data_leg](ici::MessageId, uint64_t arrived) { data_leg(arrived, false); }, +1, false, nullptr,
           t->traffic_class);
    }
  }
  // net->send, or, from a chip ticking on a worker thread, queued per chip and sent
  // after the window in chip order: the order a one-thread window sends in. Checked
  // now, so a bad request faults the issuing core as it would have. `id` gets the
  // message's id once it is sent.
  void send(uint32_t issuer, ici::Endpoint src, ici::Endpoint dst, uint64_t bytes, uint64_t at,
            ici::Network::DeliveryCallback cb, int tie = +1, bool gated = false,
            std::shared_ptr<ici::MessageId> id = nullptr, uint8_t tc = 0) {
    if (!threaded_window) {
      const ici::MessageId m = net->send(src, dst, bytes, at, std::move(cb), tie, gated, tc);
      if (id) *id = m;
      return;
    }
    net->check_send(src, dst, bytes);
    deferred_sends[issuer].push_back([this, src, dst, bytes, at, cb = std::move(cb), tie, gated, id, tc]() mutable {
      const ici::MessageId m = net->send(src, dst, bytes, at, std::move(cb), tie, gated, tc);
      if (id) *id = m;
    });
  }
  // The first `bytes` of a gated message are read, on `chip`'s tick at `cycle`:
  // queued like a send from a worker thread (after the message's own send, which
  // the same chip queued earlier).
  void release(uint32_t chip, const std::shared_ptr<ici::MessageId>& id, uint64_t bytes, uint64_t cycle) {
    if (!threaded_window) {
      net->release(*id, bytes, cycle);
      return;
    }
    deferred_sends[chip].push_back([this, id, bytes, cycle] { net->release(*id, bytes, cycle); });
  }

  // Lazy: kept up to date by tick() (only ticks issue), instead of summing every
  // core of the slice after every event.
  uint64_t lazy_instructions = 0;
  static uint64_t chip_instructions(const Chip& c) {
    uint64_t n = 0;
    for (const auto& k : c.cores()) n += k->instructions();
    return n;
  }
  // Windows (lazy, pod slices of >= kWindowChips chips): chips interact only
  // through deliveries, and the network bounds the next one
  // (Network::next_delivery_bound; a transfer started now is delivered no earlier
  // than min_delivery_cycles() later). Up to that bound each chip runs alone
  // through the window, many cycles in a row, so its registers and VMEM pages stay
  // in the host's caches (ticking 256 chips per cycle evicted them every cycle);
  // then the network catches up, with no callback inside the window. Same cycles,
  // values and counters (its transfers reach the network in a different order;
  // the network's outcome does not depend on it). A fault ends the run after the
  // window it is in: other chips' counters may then run on to the window's end.
  static constexpr size_t kWindowChips = 64;
  bool windows = false;
  bool in_window = false;
  // Window threads (`tpusim run --threads N` on a program without MXU work: the
  // MXU workers assume one simulation thread): chips split in N contiguous groups,
  // each ticked by its own thread. A chip's tick touches only its own state, and its
  // sends are queued (send()), so every N gives the same results.
  int window_threads = 1;
  bool threaded_window = false;
  std::vector<std::vector<std::function<void()>>> deferred_sends;  // per issuing chip
  std::string window_fault;
  uint64_t window_fault_cycle = kNever;
  uint32_t window_fault_chip = 0;
  // The last cycle of the window starting at `cycle`, or `cycle` for a plain tick.
  uint64_t window_end(uint64_t cycle) {
    if (!windows) return cycle;
    // What a chip's tick sends always crosses chips (a push to another chip, or the
    // request of a read from one); a same-chip leg is sent only by a delivery.
    const uint64_t look = net->min_delivery_cycles(true);
    const uint64_t bound = std::min(net->next_delivery_bound(), look ? cycle + look : cycle);
    uint64_t end = bound > cycle ? bound - 1 : cycle;
    if (max_cycles) end = std::min(end, std::max(cycle, max_cycles - 1));
    return end < cycle + 8 ? cycle : end;  // too short to pay: a plain tick
  }
  // What a group of chips did in a window.
  struct WindowPart {
    uint64_t instructions = 0;
    std::string fault;
    uint64_t fault_cycle = kNever;
    uint32_t fault_chip = 0;
    std::exception_ptr error;
  };
  void run_chips(uint32_t from, uint32_t to, uint64_t last, WindowPart& part) {
    try {
      for (uint32_t c = from; c < to; ++c) {
        for (uint64_t t = next[c]; t <= last; t = next[c]) {
          if (synced[c] < t) chips[c]->skip(t - synced[c]);
          synced[c] = t + 1;
          const uint64_t before = chip_instructions(*chips[c]);
          chips[c]->tick(t);
          part.instructions += chip_instructions(*chips[c]) - before;
          next[c] = chips[c]->next_event_cycle(t);
          const std::string& f = chips[c]->fault();
          if (!f.empty()) {
            if (t < part.fault_cycle) {  // chips ascend: the first at a cycle is the lowest
              part.fault = f;
              part.fault_cycle = t;
              part.fault_chip = c;
            }
            break;
          }
        }
      }
    } catch (...) {
      part.error = std::current_exception();
    }
  }
  void run_window(uint64_t first, uint64_t last) {
    in_window = true;
    const uint32_t n = uint32_t(chips.size());
    const uint32_t groups = uint32_t(std::max(1, std::min<int>(window_threads, int(n))));
    std::vector<WindowPart> parts(groups);
    if (groups == 1) {
      run_chips(0, n, last, parts[0]);
    } else {
      threaded_window = true;
      if (deferred_sends.size() != n) deferred_sends.resize(n);
      std::vector<std::thread> workers;
      for (uint32_t g = 1; g < groups; ++g)
        workers.emplace_back([this, g, groups, n, last, &parts] {
          run_chips(uint32_t(uint64_t(n) * g / groups), uint32_t(uint64_t(n) * (g + 1) / groups), last, parts[g]);
        });
      run_chips(0, uint32_t(n / groups), last, parts[0]);
      for (auto& w : workers) w.join();
      threaded_window = false;
    }
    for (const WindowPart& p : parts)
      if (p.error) std::rethrow_exception(p.error);
    for (uint32_t g = 0; g < groups; ++g) {
      const WindowPart& p = parts[g];
      lazy_instructions += p.instructions;
      if (p.fault_cycle < window_fault_cycle ||
          (p.fault_cycle == window_fault_cycle && p.fault_chip < window_fault_chip && p.fault_cycle != kNever)) {
        window_fault = p.fault;
        window_fault_cycle = p.fault_cycle;
        window_fault_chip = p.fault_chip;
      }
    }
    if (groups > 1)
      for (auto& q : deferred_sends) {
        for (auto& f : q) f();
        q.clear();
      }
    in_window = false;
    for (uint32_t c : dirty) is_dirty[c] = 0;  // transfers it started touched its issuer
    dirty.clear();
    (void)first;
    net->skip(last + 1 - net->now());
    if (!dirty.empty()) throw std::logic_error("a delivery inside a window (bound violated)");
  }
  // Ticks `cycle`, or the window from it; returns the last cycle done.
  uint64_t step(uint64_t cycle) {
    const uint64_t last = window_end(cycle);
    if (last == cycle) {
      tick(cycle);
      return cycle;
    }
    run_window(cycle, last);
    return last;
  }

  uint64_t instructions() const {
    if (lazy) return lazy_instructions;
    uint64_t n = 0;
    for (const auto& c : chips) n += chip_instructions(*c);
    return n;
  }
  void tick(uint64_t cycle) {
    if (!lazy) {
      for (auto& c : chips) c->tick(cycle);
      net->skip(cycle + 1 - net->now());
      return;
    }
    dirty.clear();
    for (uint32_t c = 0; c < chips.size(); ++c) {
      if (next[c] > cycle) continue;
      if (synced[c] < cycle) chips[c]->skip(cycle - synced[c]);
      synced[c] = cycle + 1;  // before the tick: a transfer it starts touches it
      is_dirty[c] = 1;
      dirty.push_back(c);
      const uint64_t before = chip_instructions(*chips[c]);
      chips[c]->tick(cycle);
      lazy_instructions += chip_instructions(*chips[c]) - before;
    }
    net->skip(cycle + 1 - net->now());
    // Kept until the next tick: fault() looks at these chips only.
    for (uint32_t c : dirty) {
      next[c] = chips[c]->next_event_cycle(cycle);
      is_dirty[c] = 0;
    }
  }
  void skip(uint64_t n) {
    if (lazy) return;  // each chip catches up when it next ticks or is touched
    for (auto& c : chips) c->skip(n);
  }
  uint64_t next_event_cycle(uint64_t now) const {
    uint64_t n = kNever;
    if (lazy) {
      for (uint64_t x : next) n = std::min(n, x);
    } else {
      for (const auto& c : chips) n = std::min(n, c->next_event_cycle(now));
    }
    const uint64_t ici = net->next_event();
    if (ici != ici::kNever) n = std::min(n, std::max(now + 1, ici));
    return n;
  }
  // Only the chips of this cycle can have faulted in it (the ones before stopped the run).
  std::string fault() const {
    if (!window_fault.empty()) return window_fault;
    if (lazy) {
      uint32_t first = UINT32_MAX;
      for (uint32_t c : dirty)
        if (!chips[c]->fault().empty()) first = std::min(first, c);
      return first == UINT32_MAX ? std::string() : chips[first]->fault();
    }
    for (const auto& c : chips) {
      std::string f = c->fault();
      if (!f.empty()) return f;
    }
    return {};
  }
  bool done() const {
    if (net->messages_in_flight()) return false;
    for (const auto& c : chips)
      if (!c->done()) return false;
    return true;
  }
  uint64_t last_activity_cycle() const {
    uint64_t t = last_landing;
    for (const auto& c : chips) t = std::max(t, c->last_activity_cycle());
    return t;
  }
  std::string deadlock_report() const {
    std::string s = "deadlock: no core can proceed and no transfer is in flight;";
    for (const auto& c : chips)
      for (const auto& k : c->cores())
        if (k->has_program() && !k->done()) s += " " + k->blocked_on() + ";";
    return s;
  }

  // After the ticks of `cycle`: whether the run ends here, and why.
  enum class End { kNo, kDone, kFault, kDeadlock, kLimit };
  // `next` gets the board's next event cycle when the run goes on.
  End end_after(uint64_t cycle, std::string& why, uint64_t* next = nullptr) const {
    why = fault();
    if (!why.empty()) return End::kFault;
    if (done()) return End::kDone;
    if (max_cycles && cycle + 1 >= max_cycles) {
      why = "cycle limit of " + std::to_string(max_cycles) + " reached (max_cycles)";
      return End::kLimit;
    }
    if (max_instructions && instructions() >= max_instructions) {
      why = "instruction budget of " + std::to_string(max_instructions) +
            " exhausted, likely an infinite loop (max_instructions)";
      return End::kLimit;
    }
    const uint64_t n = next_event_cycle(cycle);
    if (n == kNever) {
      why = deadlock_report();
      return End::kDeadlock;
    }
    if (next) *next = n;
    return End::kNo;
  }
};

// Named, traceable stand-ins for each unit, so waveforms and reports read
// chip0.core1.vpu.busy. The units themselves are plain C++ (hw/core, hw/vpu, ...).
// SystemC takes the parent of a module from the constructor being run, so each
// level builds its children in its own constructor.
struct Tracing {
  sc_core::sc_trace_file* tf = nullptr;
  std::vector<std::string> scopes;
  template <typename T>
  void trace(const T& value, const std::string& full) const {
    if (tf && wave::scope_matches(scopes, full)) sc_core::sc_trace(tf, value, full);
  }
};
struct UnitModule : sc_core::sc_module {
  explicit UnitModule(sc_core::sc_module_name n) : sc_module(n) {}
};
struct CoreModule : sc_core::sc_module {
  std::vector<std::unique_ptr<UnitModule>> units;
  std::string unit(const std::string& n) {
    units.push_back(std::make_unique<UnitModule>(n.c_str()));
    return units.back()->name();
  }
  CoreModule(sc_core::sc_module_name n, TensorCore& core, const Tracing& t) : sc_module(n) {
    std::string u = unit("sequencer");
    t.trace(core.sequencer().pc_now_, u + ".pc");
    t.trace(core.sequencer().stall_reason_, u + ".stall_reason");
    u = unit("vpu");
    t.trace(core.vpu().busy_, u + ".busy");
    t.trace(core.vpu().queue_depth_now_, u + ".queue_depth");
    t.trace(core.vpu().current_op_, u + ".current_op");
    for (size_t i = 0; i < core.mxus().size(); ++i) {
      u = unit("mxu" + std::to_string(i));
      t.trace(core.mxus()[i]->busy_, u + ".busy");
      t.trace(core.mxus()[i]->queue_depth_now_, u + ".queue_depth");
      t.trace(core.mxus()[i]->current_op_, u + ".current_op");
    }
    for (int e = 0; e < core.dma().engines(); ++e) {
      u = unit("dma" + std::to_string(e));
      if (e == 0) {  // the queue and the count of busy engines are shared by all engines
        t.trace(core.dma().queue_depth_now_, u + ".queue_depth");
        t.trace(core.dma().active_now_, u + ".active_engines");
      }
    }
  }
};
struct ChipModule : sc_core::sc_module {
  std::vector<std::unique_ptr<CoreModule>> cores;
  ChipModule(sc_core::sc_module_name n, Chip& chip, const Tracing& t) : sc_module(n) {
    for (auto& core : chip.cores()) {
      const std::string cname = core->name().substr(core->name().find('.') + 1);
      cores.push_back(std::make_unique<CoreModule>(cname.c_str(), *core, t));
    }
  }
};

// The two views of one Board.
struct Driver : sc_core::sc_module {
  Board& board;
  sc_core::sc_time period;
  Mode mode;
  std::unique_ptr<sc_core::sc_clock> clock;
  uint64_t cycle = 0;
  bool finished = false;
  // Fast mode: whether SystemC time must follow every event (a trace file samples
  // the units' state at each time step); otherwise the board runs up to kQuantum
  // cycles per activation of its thread, since nothing else in the kernel needs it.
  bool sync_each_event = true;
  static constexpr uint64_t kQuantum = 1u << 20;
  Board::End end = Board::End::kNo;
  std::string why;

  SC_HAS_PROCESS(Driver);
  Driver(sc_core::sc_module_name n, Board& b, sc_core::sc_time p, Mode m) : sc_module(n), board(b), period(p), mode(m) {
    if (mode == Mode::kFast) {
      SC_THREAD(run_fast);
    } else {
      clock = std::make_unique<sc_core::sc_clock>("clock", period);
      SC_METHOD(on_edge);
      sensitive << clock->posedge_event();
      dont_initialize();
    }
  }

  // Event-driven: sleep until the next cycle at which any unit has work, and
  // account the cycles between with skip().
  void run_fast() {
    uint64_t behind = 0;  // cycles the board is ahead of SystemC time
    for (;;) {
      const uint64_t last = board.step(cycle);
      uint64_t next = 0;
      end = board.end_after(last, why, &next);
      if (end != Board::End::kNo) {
        behind += last - cycle;
        cycle = last;
        break;
      }
      board.skip(next - last - 1);
      behind += next - cycle;
      cycle = next;
      if (sync_each_event || behind >= kQuantum) {
        wait(static_cast<double>(behind) * period);
        behind = 0;
      }
    }
    board.sync_all(cycle);
    if (behind) wait(static_cast<double>(behind) * period);
    finished = true;
    wait(period);  // one more step, so the trace file writes the last values
  }

  // Clocked: every unit ticks every cycle.
  void on_edge() {
    if (finished) {
      sc_core::sc_stop();
      return;
    }
    board.tick(cycle);
    end = board.end_after(cycle, why);
    if (end != Board::End::kNo) finished = true;
    else ++cycle;
  }
};

}  // namespace

struct System::Impl {
  const config::Params& preset;
  const isa::Bundle& bundle;
  exec::Machine machine;
  bool ran = false;
};

System::System(const config::Params& preset, const isa::Bundle& bundle)
    : impl_(new Impl{preset, bundle, exec::Machine(bundle.target)}) {
  const std::string err = isa::check_bundle(bundle);
  if (!err.empty()) throw SystemError("bundle: " + err);
  const isa::Target& t = bundle.target;
  const auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw SystemError("bundle target does not fit preset '" + preset.source() + "': " + what);
  };
  need(t.chips <= static_cast<uint64_t>(preset.get_int("system.chips")),
       std::to_string(t.chips) + " chips, the preset has " + std::to_string(preset.get_int("system.chips")));
  need(t.cores_per_chip <= static_cast<uint64_t>(preset.get_int("cores_per_chip")),
       std::to_string(t.cores_per_chip) + " cores per chip, the preset has " +
           std::to_string(preset.get_int("cores_per_chip")));
  need(t.mxus_per_core <= static_cast<uint64_t>(preset.get_int("core.mxu.count")),
       std::to_string(t.mxus_per_core) + " MXUs per core, the preset has " +
           std::to_string(preset.get_int("core.mxu.count")));
  need(t.mxu_rows == static_cast<uint64_t>(preset.get_int("core.mxu.rows")) &&
           t.mxu_cols == static_cast<uint64_t>(preset.get_int("core.mxu.cols")),
       "MXU " + std::to_string(t.mxu_rows) + "x" + std::to_string(t.mxu_cols) + ", the preset's is " +
           std::to_string(preset.get_int("core.mxu.rows")) + "x" + std::to_string(preset.get_int("core.mxu.cols")));
  // Memories: the bundle's target sizes the simulated ones, so a preset (or a
  // --set) with less than the program was written for cannot host it.
  const auto bytes = [&](const char* key) {
    const int64_t v = preset.get_int(key);
    if (v < 1) throw config::ConfigError(preset.source() + ": " + key + " must be at least 1, is " + std::to_string(v));
    return static_cast<uint64_t>(v);
  };
  using MemorySize = std::tuple<const char*, uint64_t, const char*>;  // preset key, the bundle's size, what
  for (const auto& [key, want, what] : {MemorySize{"core.vmem.bytes", t.vmem_bytes, "VMEM per core"},
                                        MemorySize{"core.smem.bytes", t.smem_bytes, "SMEM per core"},
                                        MemorySize{"hbm.bytes", t.hbm_bytes, "HBM per chip"}}) {
    const uint64_t have = bytes(key);
    need(want <= have, std::to_string(want) + " bytes of " + what + ", the preset has " + std::to_string(have) + " (" +
                           key + ")");
  }
  // The bundle's FIFO depth decides when an mmul faults (as in the reference), the
  // preset's when one stalls: a program written for a deeper FIFO than the
  // hardware has would stall forever or fault in the timing model only.
  const int64_t fifo_rows = preset.get_int("core.mxu.result_fifo_vregs") * isa::kSublanes;
  need(t.fifo_rows <= static_cast<uint64_t>(fifo_rows),
       "result FIFO of " + std::to_string(t.fifo_rows) + " rows, the preset's MXUs hold " +
           std::to_string(fifo_rows) + " (core.mxu.result_fifo_vregs x 8)");
  exec::load_constants(impl_->machine, bundle);
}

System::~System() = default;

RunResult System::run(const RunOptions& opt) {
  if (impl_->ran) throw SystemError("System::run called twice (SystemC allows one elaboration per process)");
  impl_->ran = true;
  const config::Params& preset = impl_->preset;
  const isa::Bundle& bundle = impl_->bundle;
  const double clock_hz = preset.get_double("clock_hz");
  if (!(clock_hz > 0)) throw config::ConfigError(preset.source() + ": clock_hz must be positive");
  // SystemC time here steps in whole picoseconds, so the cycle is the period rounded
  // to 1 ps: 1064 ps at 940 MHz (0.02% slow). A clock whose period would round by
  // more than 1% (above ~20 GHz) would run silently off its own clock_hz.
  const double period_ps = 1e12 / clock_hz;
  const uint64_t cycle_ps = static_cast<uint64_t>(std::llround(period_ps));
  if (cycle_ps == 0 || std::abs(double(cycle_ps) - period_ps) > 0.01 * period_ps) {
    char why[160];
    std::snprintf(why, sizeof why, ": clock_hz %g is a %.3g ps cycle, which the model's 1 ps time step would round by "
                  "more than 1%%", clock_hz, period_ps);
    throw config::ConfigError(preset.source() + why);
  }

  CoreParams cp = CoreParams::from_config(preset, static_cast<int>(bundle.target.mxus_per_core));
  // The HBM model the preset names, or its latency + bandwidth fallback at
  // hbm.peak_bytes_per_s when it has no timing table (mem::make_memory).
  const YAML::Node hbm = preset.node("hbm");
  const uint32_t beat = cp.dma.chunk_bytes;
  const std::function<std::unique_ptr<mem::MemoryPort>()> make_memory = [hbm, &preset, beat] {
    return mem::make_memory(hbm, preset.source(), beat);
  };
  // The published DMA latencies were measured on the preset's own memory, so the
  // engines' head is each latency minus one beat through an idle copy of that
  // memory, not of a what-if one: a faster `--set hbm.*` memory then shortens
  // every transfer instead of handing its gain to the engine (docs/tensorcore.md).
  const YAML::Node calibration_hbm = preset.as_loaded().node("hbm");
  const auto calibration_memory = [&] { return mem::make_memory(calibration_hbm, preset.source(), beat); };
  const DmaBeatCycles calibration_beat{MemoryHub::unloaded_beat_cycles(*calibration_memory(), beat, false, cycle_ps),
                                       MemoryHub::unloaded_beat_cycles(*calibration_memory(), beat, true, cycle_ps)};

  Board board;
  board.max_cycles = opt.max_cycles;
  board.max_instructions = opt.max_instructions;
  board.barrier = std::make_unique<Barrier>(bundle.cores.size());
  HostParams host;
  try {
    board.net = std::make_unique<ici::Network>(ici::Network::from_params(preset));
    host = HostParams::from_config(preset);
  } catch (const ici::IciError& e) {
    throw config::ConfigError(e.what());  // a preset problem: bad input, like the units' own checks
  }
  board.net->set_timeline(opt.timeline);
  const RemotePort remote = [&board](RemoteTransfer&& t) { board.remote(std::move(t)); };
  for (uint32_t c = 0; c < bundle.target.chips; ++c)
    board.chips.push_back(std::make_unique<Chip>(cp, impl_->machine, bundle, c, make_memory, cycle_ps,
                                                 calibration_beat, *board.barrier, opt.timeline, remote, host));
  PathLogs paths;
  if (opt.critical_path) {
    paths.cores_per_chip = static_cast<uint32_t>(board.chips.front()->cores().size());
    paths.cores.resize(board.chips.size() * paths.cores_per_chip);
    for (auto& chip : board.chips)
      for (uint32_t k = 0; k < paths.cores_per_chip; ++k) {
        PathLog& own = paths.at(chip->index(), k);
        own.id = static_cast<int32_t>(chip->index() * paths.cores_per_chip + k);
        chip->cores()[k]->set_path_log(&own, &paths);
      }
    board.paths = &paths;
  }

  // SystemC hierarchy with explicit names: chip0.core1.vpu, chip0.core1.mxu0, ...
  std::vector<std::unique_ptr<ChipModule>> chip_modules;
  sc_core::sc_trace_file* tf = nullptr;
  std::string raw_vcd;
  sc_core::sc_report_handler::set_actions(sc_core::SC_INFO, sc_core::SC_DO_NOTHING);  // stop and timescale notes
  if (!opt.wave_path.empty()) {
    raw_vcd = opt.wave_path + ".raw." + std::to_string(::getpid());
    tf = sc_core::sc_create_vcd_trace_file(raw_vcd.c_str());
    tf->set_time_unit(1, sc_core::SC_PS);
  }
  Tracing tracing{tf, opt.wave_scopes};
  for (auto& chip : board.chips)
    chip_modules.push_back(
        std::make_unique<ChipModule>(("chip" + std::to_string(chip->index())).c_str(), *chip, tracing));
  // The ICI links' payload bytes and packets so far (chip0.ici.x+.bytes,
  // chip0.core1.ici.inject.packets): a link's slope is its traffic, a flat
  // stretch an idle link, beside the cores' units in the same waveform.
  if (board.chips.size() > 1)
    for (const ici::LinkCounters* c : board.net->live_link_counters()) {
      tracing.trace(c->bytes, c->name + ".bytes");
      tracing.trace(c->packets, c->name + ".packets");
    }
  const sc_core::sc_time period(static_cast<double>(cycle_ps), sc_core::SC_PS);
  Driver driver("scheduler", board, period, opt.mode);
  driver.sync_each_event = tf != nullptr;
  bool barrier = false;
  for (const auto& p : bundle.cores)
    for (const auto& in : p.code) barrier |= in.op == isa::Op::kBarrier;
  if (opt.mode == Mode::kFast && !tf && !opt.timeline && !barrier) {
    board.start_lazy();
    board.windows = opt.windows && board.chips.size() >= Board::kWindowChips;
    bool mxu_work = false;
    for (const auto& p : bundle.cores)
      for (const auto& in : p.code) mxu_work |= isa::op_info(in.op).unit == isa::Unit::kMatrix;
    if (board.windows && !mxu_work) board.window_threads = std::max(1, mxu::matmul_threads());
  }

  RunResult r;
  try {
    sc_core::sc_start();
  } catch (const std::exception& e) {
    if (tf) {  // no waveform of a run the model itself gave up on, and no stray raw file
      sc_core::sc_close_vcd_trace_file(tf);
      std::remove((raw_vcd + ".vcd").c_str());
    }
    throw SystemError(std::string("simulation error: ") + e.what());
  }
  if (tf) {
    sc_core::sc_close_vcd_trace_file(tf);
    wave::FilterOptions fo;
    fo.scopes = opt.wave_scopes;
    fo.begin_ps = opt.wave_begin == 0 ? 0 : opt.wave_begin * cycle_ps;
    fo.end_ps = opt.wave_end == UINT64_MAX ? UINT64_MAX : opt.wave_end * cycle_ps;
    const std::string raw_file = raw_vcd + ".vcd";
    try {
      wave::finish_wave(raw_file, opt.wave_path, fo);
    } catch (...) {
      std::remove(raw_file.c_str());
      throw;
    }
    std::remove(raw_file.c_str());
  }

  for (auto& chip : board.chips) chip->settle();
  r.cycles = board.last_activity_cycle() + 1;
  r.faulted = driver.end != Board::End::kDone;
  if (r.faulted) r.fault = driver.why;
  for (auto& chip : board.chips) {
    for (auto& core : chip->cores()) {
      core->add_counters(r.units);
      r.flops += 2 * core->macs();
    }
    r.hbm_bytes_read += chip->hub().bytes_read;
    r.hbm_bytes_written += chip->hub().bytes_written;
    r.units["chip" + std::to_string(chip->index()) + ".hbm"] = chip->hub().port().stats_json();
    const nlohmann::json remote_hbm = chip->remote_hbm().stats_json();
    if (remote_hbm["read_transfers"] != 0 || remote_hbm["write_transfers"] != 0)
      r.units["chip" + std::to_string(chip->index()) + ".ici_hbm"] = remote_hbm;
    const HostLink& h = chip->host();
    if (h.bytes_in || h.bytes_out)
      r.units["chip" + std::to_string(chip->index()) + ".host"] = {
          {"bytes_to_chip", h.bytes_in},
          {"bytes_to_host", h.bytes_out},
          {"infeed_batches", h.batches},
          {"infeed_wait_cycles", static_cast<uint64_t>(std::llround(h.producer_wait_cycles))}};
  }
  board.net->add_stats(r.units);
  board.net->flush_timeline();
  if (opt.critical_path && !r.faulted) {
    std::vector<uint64_t> ends;
    for (auto& chip : board.chips)
      for (auto& core : chip->cores()) ends.push_back(core->has_program() ? core->last_activity_cycle() + 1 : 0);
    r.critical_path = walk_critical_path(paths, ends);
  }
  return r;
}

exec::Machine& System::machine() { return impl_->machine; }
const exec::Machine& System::machine() const { return impl_->machine; }

}  // namespace tpusim::hw

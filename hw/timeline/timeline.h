// A whole-chip timeline in Chrome/Perfetto trace-event JSON: one process per chip,
// one track per unit ("core0.mxu1", "hbm.ch3", "ici.link2"), slices named by the
// compiler's op ids, counters (HBM bandwidth, VMEM occupancy, queue depths), and
// flow arrows from a DMA to the op that consumes its data. Units record in cycles;
// the writer converts to microseconds at the preset clock.
//
// Units may record overlapping slices on one track (a pipelined MXU has several
// ops in flight). Perfetto wants the slices of a track to nest, so at write time
// each track's slices are spread over as many lanes ("core0.mxu0", "core0.mxu0 #2",
// ...) as needed for every lane to nest properly.
//
// Big runs stay usable: a cycle window drops everything outside it, process globs
// drop other chips, and an event cap stops recording once reached (the file says
// how many events were dropped).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tpusim::timeline {

using TrackId = uint32_t;
using FlowId = uint64_t;

struct Options {
  double clock_hz = 1e9;
  uint64_t window_begin_cycle = 0;
  uint64_t window_end_cycle = std::numeric_limits<uint64_t>::max();
  uint64_t max_events = 4'000'000;  // ~400 MB of JSON at most; Perfetto's UI stays responsive
  uint64_t rate_window_cycles = 256;  // resolution of rate counters (HBM bandwidth)
  // Globs on process names ("chip0", "chip[0-3]"); empty keeps every process. A
  // 128-core board passes the event cap within a few microseconds; one chip of it
  // does not.
  std::vector<std::string> processes;
};

class Timeline {
 public:
  explicit Timeline(Options options);

  // A track for one unit, e.g. track("chip0", "core0.mxu0"). Tracks are listed in
  // the order of their first registration, so output order is deterministic.
  TrackId track(const std::string& process, const std::string& unit);

  // A slice [begin, end) in cycles, with optional string arguments.
  void slice(TrackId track, const std::string& name, uint64_t begin_cycle, uint64_t end_cycle,
             std::vector<std::pair<std::string, std::string>> args = {});
  // A counter sample on the process of `track`: the counter keeps `value` from
  // `cycle` until the next sample of the same name.
  void counter(TrackId track, const std::string& name, uint64_t cycle, double value);
  // A flow arrow from a slice of `from` that covers `from_cycle` to a slice of `to`
  // that starts at `to_cycle`. Dropped as a whole when either end is outside the
  // window or over the cap, so every written flow has both ends.
  void flow(TrackId from, uint64_t from_cycle, TrackId to, uint64_t to_cycle, const std::string& name);
  // A rate counter on the process of `track`: `amount` spread evenly over
  // [begin, end) and summed with every other amount of the same process and
  // name, written as one sample per window of `rate_window_cycles` in units per
  // second (amount per cycle x clock_hz x `scale`). For bandwidth: bytes in, GB/s
  // out with scale 1e-9.
  void rate(TrackId track, const std::string& name, uint64_t begin_cycle, uint64_t end_cycle, double amount,
            double scale = 1.0);

  // The slices recorded on `track` so far, in recording order, as (begin, end,
  // name): for counters derived from them after a run (VMEM occupancy follows the
  // sequencer's op slices, sim/run/profile.h).
  struct SliceSpan {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<SliceSpan> slices_on(TrackId track) const;

  // Slices named exactly like a key are written under its value: units name
  // slices "op N" while they run; the writer adds what the bundle knows of op N.
  void rename_slices(std::map<std::string, std::string> names) { renames_ = std::move(names); }

  uint64_t recorded_events() const { return recorded_; }
  uint64_t dropped_events() const { return dropped_; }

  // Writes the JSON to `path` through a temporary file renamed into place, so a
  // failed write never leaves a file that looks complete. Throws std::runtime_error.
  void write(const std::string& path) const;
  std::string to_json() const;

 private:
  struct Track {
    std::string process;
    std::string unit;
    bool kept;  // its process matches Options::processes
  };
  struct Slice {
    TrackId track;
    std::string name;
    uint64_t begin, end;
    std::vector<std::pair<std::string, std::string>> args;
  };
  struct Counter {
    TrackId track;
    std::string name;
    uint64_t cycle;
    double value;
  };
  struct Flow {
    TrackId from, to;
    uint64_t from_cycle, to_cycle;
    std::string name;
  };

  bool admit(uint64_t begin, uint64_t end, uint64_t events);
  std::string timestamp(uint64_t cycle) const;

  Options opt_;
  std::vector<Track> tracks_;
  std::map<std::pair<std::string, std::string>, TrackId> track_ids_;
  std::vector<Slice> slices_;
  std::vector<Counter> counters_;
  std::vector<Flow> flows_;
  struct Rate {
    TrackId track;
    double scale;
    std::map<uint64_t, double> per_window;  // window index -> amount
  };
  std::map<std::string, Rate> rates_;  // by "process\nname"
  uint64_t recorded_ = 0;
  uint64_t dropped_ = 0;
  std::map<std::string, std::string> renames_;
};

// Checks a trace-event JSON text the way a careful consumer would: every event
// well formed (name, ph, ts, pid, tid; dur >= 0 on complete events), the complete
// events of each (pid, tid) nest, every flow start has its end and vice versa, and
// every pid/tid used has a name. Returns the problems found, empty when valid.
std::vector<std::string> validate(const std::string& json_text);

}  // namespace tpusim::timeline

#include "hw/timeline/timeline.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fnmatch.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <tuple>

namespace tpusim::timeline {

namespace {

std::string json_string(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

Timeline::Timeline(Options options) : opt_(options) {
  if (!(opt_.clock_hz > 0)) throw std::invalid_argument("timeline: clock_hz must be positive");
}

TrackId Timeline::track(const std::string& process, const std::string& unit) {
  auto key = std::make_pair(process, unit);
  auto it = track_ids_.find(key);
  if (it != track_ids_.end()) return it->second;
  const TrackId id = static_cast<TrackId>(tracks_.size());
  bool kept = opt_.processes.empty();
  for (const auto& glob : opt_.processes) kept = kept || fnmatch(glob.c_str(), process.c_str(), 0) == 0;
  tracks_.push_back({process, unit, kept});
  track_ids_.emplace(std::move(key), id);
  return id;
}

bool Timeline::admit(uint64_t begin, uint64_t end, uint64_t events) {
  if (end < opt_.window_begin_cycle || begin > opt_.window_end_cycle) return false;
  if (recorded_ + events > opt_.max_events) {
    dropped_ += events;
    return false;
  }
  recorded_ += events;
  return true;
}

void Timeline::slice(TrackId track, const std::string& name, uint64_t begin_cycle, uint64_t end_cycle,
                     std::vector<std::pair<std::string, std::string>> args) {
  if (end_cycle < begin_cycle) std::swap(begin_cycle, end_cycle);
  if (!tracks_.at(track).kept || !admit(begin_cycle, end_cycle, 1)) return;
  slices_.push_back({track, name, begin_cycle, end_cycle, std::move(args)});
}

std::vector<Timeline::SliceSpan> Timeline::slices_on(TrackId track) const {
  std::vector<SliceSpan> out;
  for (const Slice& s : slices_)
    if (s.track == track) out.push_back({s.begin, s.end, s.name});
  return out;
}

void Timeline::counter(TrackId track, const std::string& name, uint64_t cycle, double value) {
  if (!tracks_.at(track).kept || !admit(cycle, cycle, 1)) return;
  counters_.push_back({track, name, cycle, value});
}

void Timeline::flow(TrackId from, uint64_t from_cycle, TrackId to, uint64_t to_cycle, const std::string& name) {
  const bool inside = from_cycle >= opt_.window_begin_cycle && to_cycle <= opt_.window_end_cycle &&
                      tracks_.at(from).kept && tracks_.at(to).kept;
  if (!inside || !admit(from_cycle, to_cycle, 2)) return;
  flows_.push_back({from, to, from_cycle, to_cycle, name});
}

void Timeline::rate(TrackId track, const std::string& name, uint64_t begin_cycle, uint64_t end_cycle, double amount,
                    double scale) {
  if (end_cycle <= begin_cycle) end_cycle = begin_cycle + 1;
  if (!tracks_.at(track).kept || end_cycle <= opt_.window_begin_cycle || begin_cycle > opt_.window_end_cycle) return;
  Rate& r = rates_[tracks_.at(track).process + "\n" + name];
  r.track = track;
  r.scale = scale;
  const uint64_t w = std::max<uint64_t>(1, opt_.rate_window_cycles);
  const double per_cycle = amount / double(end_cycle - begin_cycle);
  for (uint64_t c = begin_cycle; c < end_cycle;) {
    const uint64_t window_end = (c / w + 1) * w;
    const uint64_t upto = std::min(end_cycle, window_end);
    r.per_window[c / w] += per_cycle * double(upto - c);
    c = upto;
  }
}

// Microseconds with picosecond resolution, printed from an integer so that a
// slice's end (ts + dur) is exact and neighbouring slices never overlap by rounding.
std::string Timeline::timestamp(uint64_t cycle) const {
  const long double ps = std::round(static_cast<long double>(cycle) * 1e12L / static_cast<long double>(opt_.clock_hz));
  const auto p = static_cast<uint64_t>(ps);
  return fmt::format("{}.{:06}", p / 1000000, p % 1000000);
}

std::string Timeline::to_json() const {
  // Process ids by first registration of a track in that process; processes left
  // out by Options::processes have no events and are not named.
  std::vector<std::string> processes;
  std::vector<int> pid_of(tracks_.size());
  for (size_t t = 0; t < tracks_.size(); ++t) {
    if (!tracks_[t].kept) continue;
    auto it = std::find(processes.begin(), processes.end(), tracks_[t].process);
    if (it == processes.end()) it = processes.insert(processes.end(), tracks_[t].process);
    pid_of[t] = static_cast<int>(it - processes.begin()) + 1;
  }

  // Spread each track's slices over lanes in which they nest: sort by (begin,
  // longer first), then put each slice in the first lane whose open slices either
  // contain it or have all ended.
  std::vector<size_t> order(slices_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Slice& x = slices_[a];
    const Slice& y = slices_[b];
    return std::make_tuple(x.track, x.begin, y.end) < std::make_tuple(y.track, y.begin, x.end);
  });
  std::vector<int> lane_of(slices_.size(), 0);
  std::vector<int> lanes_per_track(tracks_.size(), 1);
  {
    std::vector<std::vector<std::vector<uint64_t>>> open(tracks_.size());  // track -> lane -> stack of ends
    for (size_t idx : order) {
      const Slice& s = slices_[idx];
      auto& lanes = open[s.track];
      int chosen = -1;
      for (size_t l = 0; l < lanes.size() && chosen < 0; ++l) {
        auto& stack = lanes[l];
        while (!stack.empty() && stack.back() <= s.begin) stack.pop_back();
        if (stack.empty() || s.end <= stack.back()) chosen = static_cast<int>(l);
      }
      if (chosen < 0) {
        lanes.emplace_back();
        chosen = static_cast<int>(lanes.size()) - 1;
      }
      lanes[chosen].push_back(s.end);
      lane_of[idx] = chosen;
      lanes_per_track[s.track] = std::max(lanes_per_track[s.track], chosen + 1);
    }
  }
  // Thread ids: tracks in registration order, each followed by its extra lanes.
  std::vector<int> first_tid(tracks_.size());
  int next_tid = 1;
  for (size_t t = 0; t < tracks_.size(); ++t) {
    first_tid[t] = next_tid;
    next_tid += lanes_per_track[t];
  }
  // The lane of a track holding a slice that covers `cycle` (for flow ends): a
  // binary search in `order` (sorted by track, then begin), then a short walk back
  // over the slices that began earlier, so many flows stay cheap on a big trace.
  auto lane_at = [&](TrackId track, uint64_t cycle) {
    const auto first = std::upper_bound(order.begin(), order.end(), std::make_pair(track, cycle),
                                        [&](const std::pair<TrackId, uint64_t>& key, size_t idx) {
                                          return key < std::make_pair(slices_[idx].track, slices_[idx].begin);
                                        });
    int steps = 0;
    for (auto it = first; it != order.begin() && steps < 256; ++steps) {
      --it;
      const Slice& s = slices_[*it];
      if (s.track != track) break;
      if (s.begin <= cycle && cycle <= s.end) return lane_of[*it];
    }
    return 0;
  };

  std::string out = "{\"displayTimeUnit\":\"ns\",\"otherData\":{";
  out += fmt::format("\"clock_hz\":{},\"recorded_events\":{},\"dropped_events\":{}}},\n\"traceEvents\":[\n",
                     opt_.clock_hz, recorded_, dropped_);
  bool first = true;
  auto emit = [&](const std::string& event) {
    if (!first) out += ",\n";
    first = false;
    out += event;
  };
  for (size_t p = 0; p < processes.size(); ++p)
    emit(fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":{}}}}}",
                     p + 1, json_string(processes[p])));
  for (size_t t = 0; t < tracks_.size(); ++t) {
    if (!tracks_[t].kept) continue;
    for (int l = 0; l < lanes_per_track[t]; ++l) {
      const std::string name = l == 0 ? tracks_[t].unit : fmt::format("{} #{}", tracks_[t].unit, l + 1);
      const int tid = first_tid[t] + l;
      emit(fmt::format("{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}",
                       pid_of[t], tid, json_string(name)));
      emit(fmt::format(
          "{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"sort_index\":{}}}}}",
          pid_of[t], tid, tid));
    }
  }
  for (size_t idx : order) {
    const Slice& s = slices_[idx];
    std::string args;
    for (const auto& [k, v] : s.args) args += fmt::format("{}{}:{}", args.empty() ? "" : ",", json_string(k), json_string(v));
    const long double ps_per_cycle = 1e12L / static_cast<long double>(opt_.clock_hz);
    const auto b = static_cast<uint64_t>(std::round(static_cast<long double>(s.begin) * ps_per_cycle));
    const auto e = static_cast<uint64_t>(std::round(static_cast<long double>(s.end) * ps_per_cycle));
    const auto renamed = renames_.find(s.name);
    emit(fmt::format("{{\"name\":{},\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{}.{:06},\"args\":{{{}}}}}",
                     json_string(renamed == renames_.end() ? s.name : renamed->second), pid_of[s.track], first_tid[s.track] + lane_of[idx], timestamp(s.begin),
                     (e - b) / 1000000, (e - b) % 1000000, args));
  }
  for (const Counter& c : counters_) {
    emit(fmt::format("{{\"name\":{},\"ph\":\"C\",\"pid\":{},\"tid\":0,\"ts\":{},\"args\":{{\"value\":{}}}}}",
                     json_string(c.name), pid_of[c.track], timestamp(c.cycle), std::isfinite(c.value) ? c.value : 0.0));
  }
  // Rate counters: a sample per window that saw traffic, and a 0 after each run of
  // windows, so the counter drops back when the traffic stops.
  for (const auto& [key, r] : rates_) {
    const std::string name = key.substr(key.find('\n') + 1);
    const uint64_t w = std::max<uint64_t>(1, opt_.rate_window_cycles);
    uint64_t next = UINT64_MAX;
    for (const auto& [window, amount] : r.per_window) {
      if (next != UINT64_MAX && window != next)
        emit(fmt::format("{{\"name\":{},\"ph\":\"C\",\"pid\":{},\"tid\":0,\"ts\":{},\"args\":{{\"value\":0}}}}",
                         json_string(name), pid_of[r.track], timestamp(next * w)));
      const double value = amount / double(w) * opt_.clock_hz * r.scale;
      emit(fmt::format("{{\"name\":{},\"ph\":\"C\",\"pid\":{},\"tid\":0,\"ts\":{},\"args\":{{\"value\":{}}}}}",
                       json_string(name), pid_of[r.track], timestamp(window * w), std::isfinite(value) ? value : 0.0));
      next = window + 1;
    }
    if (next != UINT64_MAX)
      emit(fmt::format("{{\"name\":{},\"ph\":\"C\",\"pid\":{},\"tid\":0,\"ts\":{},\"args\":{{\"value\":0}}}}",
                       json_string(name), pid_of[r.track], timestamp(next * w)));
  }
  for (size_t i = 0; i < flows_.size(); ++i) {
    const Flow& f = flows_[i];
    emit(fmt::format("{{\"name\":{},\"cat\":\"flow\",\"ph\":\"s\",\"id\":{},\"pid\":{},\"tid\":{},\"ts\":{}}}",
                     json_string(f.name), i + 1, pid_of[f.from], first_tid[f.from] + lane_at(f.from, f.from_cycle),
                     timestamp(f.from_cycle)));
    emit(fmt::format(
        "{{\"name\":{},\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\",\"id\":{},\"pid\":{},\"tid\":{},\"ts\":{}}}",
        json_string(f.name), i + 1, pid_of[f.to], first_tid[f.to] + lane_at(f.to, f.to_cycle), timestamp(f.to_cycle)));
  }
  out += "\n]}\n";
  return out;
}

void Timeline::write(const std::string& path) const {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(path + ": cannot write the timeline");
    const std::string text = to_json();
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out.flush()) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": error while writing the timeline");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot write the timeline: " + ec.message());
  }
}

std::vector<std::string> validate(const std::string& json_text) {
  std::vector<std::string> problems;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return {std::string("not JSON: ") + e.what()};
  }
  const nlohmann::json* events = &doc;
  if (doc.is_object()) {
    if (!doc.contains("traceEvents") || !doc["traceEvents"].is_array()) return {"no traceEvents array"};
    events = &doc["traceEvents"];
  } else if (!doc.is_array()) {
    return {"neither an object with traceEvents nor an array"};
  }

  struct Complete {
    double ts, end;
    size_t index;
  };
  std::map<std::pair<int64_t, int64_t>, std::vector<Complete>> complete;
  std::set<int64_t> named_pids, used_pids;
  std::set<std::pair<int64_t, int64_t>> named_threads, used_threads;
  std::map<std::string, int> flow_balance;  // id -> starts minus finishes
  auto problem = [&](size_t i, const std::string& what) {
    if (problems.size() < 50) problems.push_back(fmt::format("event {}: {}", i, what));
  };
  for (size_t i = 0; i < events->size(); ++i) {
    const auto& e = (*events)[i];
    if (!e.is_object()) {
      problem(i, "not an object");
      continue;
    }
    if (!e.contains("ph") || !e["ph"].is_string()) {
      problem(i, "no ph");
      continue;
    }
    const std::string ph = e["ph"];
    if (!e.contains("name") || !e["name"].is_string() || e["name"].get<std::string>().empty())
      problem(i, "no name");
    if (!e.contains("pid") || !e["pid"].is_number_integer()) {
      problem(i, "no integer pid");
      continue;
    }
    const int64_t pid = e["pid"];
    const int64_t tid = e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<int64_t>() : -1;
    if (ph == "M") {
      if (!e.contains("args") || !e["args"].is_object()) problem(i, "metadata without args");
      if (e.value("name", "") == "process_name") named_pids.insert(pid);
      if (e.value("name", "") == "thread_name") named_threads.insert({pid, tid});
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number() || e["ts"].get<double>() < 0) {
      problem(i, "no valid ts");
      continue;
    }
    const double ts = e["ts"];
    used_pids.insert(pid);
    if (ph == "X") {
      if (tid < 0) problem(i, "complete event without tid");
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0) {
        problem(i, "complete event without a non-negative dur");
        continue;
      }
      used_threads.insert({pid, tid});
      complete[{pid, tid}].push_back({ts, ts + e["dur"].get<double>(), i});
    } else if (ph == "C") {
      if (!e.contains("args") || !e["args"].is_object() || e["args"].empty()) {
        problem(i, "counter without values");
        continue;
      }
      for (const auto& [k, v] : e["args"].items())
        if (!v.is_number()) problem(i, "counter value '" + k + "' is not a number");
    } else if (ph == "s" || ph == "f" || ph == "t") {
      if (!e.contains("id")) {
        problem(i, "flow event without id");
        continue;
      }
      used_threads.insert({pid, tid});
      const std::string id = e["id"].dump();
      if (ph == "s") flow_balance[id] += 1;
      if (ph == "f") flow_balance[id] -= 1;
    } else if (ph == "B" || ph == "E" || ph == "i" || ph == "I") {
      used_threads.insert({pid, tid});
    } else {
      problem(i, "unknown ph '" + ph + "'");
    }
  }
  constexpr double kEps = 1e-7;  // timestamps carry picoseconds: 1e-6 us
  for (auto& [thread, list] : complete) {
    std::sort(list.begin(), list.end(), [](const Complete& a, const Complete& b) {
      return a.ts < b.ts || (a.ts == b.ts && a.end > b.end);
    });
    std::vector<const Complete*> stack;
    for (const auto& c : list) {
      while (!stack.empty() && stack.back()->end <= c.ts + kEps) stack.pop_back();
      if (!stack.empty() && c.end > stack.back()->end + kEps)
        problem(c.index, fmt::format("slice overlaps event {} on pid {} tid {} without nesting", stack.back()->index,
                                     thread.first, thread.second));
      stack.push_back(&c);
    }
  }
  for (const auto& [id, balance] : flow_balance)
    if (balance != 0) problems.push_back("flow " + id + " does not have both ends");
  for (int64_t pid : used_pids)
    if (!named_pids.count(pid)) problems.push_back(fmt::format("pid {} has no process_name", pid));
  for (const auto& t : used_threads)
    if (!named_threads.count(t)) problems.push_back(fmt::format("pid {} tid {} has no thread_name", t.first, t.second));
  return problems;
}

}  // namespace tpusim::timeline

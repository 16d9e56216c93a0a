#include "sim/run/profile.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "isa/bundle/bundle_file.h"

namespace tpusim::run {

using nlohmann::json;

namespace {

constexpr const char* kCauses[] = {"compute", "hbm", "infeed", "sync"};
constexpr const char* kSum[] = {"instructions", "hbm_bytes", "vector_ops", "mxu_busy_cycles", "vpu_busy_cycles",
                                "dma_busy_cycles"};

uint64_t u(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0 ? it->get<uint64_t>() : 0;
}

uint64_t take(uint64_t& from, uint64_t want) {
  const uint64_t t = std::min(from, want);
  from -= t;
  return t;
}

}  // namespace

json fold_profiles(json& units, uint64_t run_cycles, const std::map<int32_t, std::string>& node_names,
                   const std::map<int32_t, uint64_t>& op_flops) {
  std::map<int64_t, json> ops;  // id -> folded entry
  json time = json::object();
  std::vector<std::string> profiled;
  for (const auto& [name, rec] : units.items()) {
    const std::string suffix = ".profile";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    profiled.push_back(name);
    const std::string core = name.substr(0, name.size() - suffix.size());
    for (const auto& op : rec.value("ops", json::array())) {
      const int64_t id = op.at("id").get<int64_t>();
      json& f = ops[id];
      if (f.is_null()) {
        f = {{"id", id}, {"name", id >= 0 ? "op " + std::to_string(id) : std::string("unmarked")},
             {"cycles", 0}, {"core_cycles", 0}, {"cores", 0}, {"flops", 0}, {"mxu_flops", 0}};
        for (const char* k : kSum) f[k] = 0;
        for (const char* c : kCauses) f["stall_cycles"][c] = 0;
        if (id < 0) f["id"] = "unmarked";
        if (const auto n = node_names.find(static_cast<int32_t>(id)); id >= 0 && n != node_names.end()) f["node"] = n->second;
      }
      const uint64_t cycles = u(op, "cycles");
      f["cycles"] = std::max(f["cycles"].get<uint64_t>(), cycles);
      f["core_cycles"] = f["core_cycles"].get<uint64_t>() + cycles;
      f["cores"] = f["cores"].get<uint64_t>() + 1;
      f["mxu_flops"] = f["mxu_flops"].get<uint64_t>() + 2 * u(op, "macs");
      for (const char* k : kSum) f[k] = f[k].get<uint64_t>() + u(op, k);
      for (const char* c : kCauses)
        f["stall_cycles"][c] = f["stall_cycles"][c].get<uint64_t>() + u(op, ("stall_" + std::string(c) + "_cycles").c_str());
      for (const char* key : {"wait_cycles_by_flag", "wait_cycles_by_stream_flag"}) {
        const json waits = op.value(key, json::object());  // a named copy: items() does not keep it alive
        for (const auto& [flag, n] : waits.items()) {
          json& w = f[key];
          w[flag] = (w.contains(flag) ? w[flag].get<uint64_t>() : 0) + n.get<uint64_t>();
        }
      }
    }

    // Where this core's run went.
    const json stall = rec.value("stall_cycles", json::object());
    const uint64_t active = std::min(u(rec, "active_cycles"), run_cycles);
    uint64_t hbm = u(stall, "hbm"), infeed = u(stall, "infeed"), sync = u(stall, "sync");
    const auto seq = units.find(core + ".sequencer");
    const uint64_t seq_infeed = seq != units.end() ? u(*seq, "stall_infeed_cycles") : 0;
    if (seq_infeed > infeed) {
      uint64_t extra = seq_infeed - infeed;
      extra -= take(sync, extra);
      extra -= take(hbm, extra);
      infeed = seq_infeed - extra;
    }
    // Cannot happen (each stalled cycle is an active one); kept so the causes always sum.
    uint64_t over = hbm + infeed + sync > active ? hbm + infeed + sync - active : 0;
    over -= take(sync, over);
    over -= take(hbm, over);
    take(infeed, over);
    time[core] = {{"compute", active - hbm - infeed - sync}, {"hbm", hbm}, {"infeed", infeed}, {"sync", sync},
                  {"idle", run_cycles - active}};
  }
  for (const auto& n : profiled) units.erase(n);
  json list = json::array();
  for (auto& [id, f] : ops) {
    // plot.py's schema needs positive cycles; every op the sequencer met took at least one.
    if (f["cycles"].get<uint64_t>() == 0) f["cycles"] = 1;
    const auto model = op_flops.find(static_cast<int32_t>(id));
    f["flops"] = id >= 0 && model != op_flops.end() ? json(model->second) : f["mxu_flops"];
    list.push_back(std::move(f));
  }
  return {{"ops", list}, {"time_by_cause", time}};
}

json vmem_use(const isa::Bundle& bundle, const json& units) {
  json out = json::object();
  for (const auto& prog : bundle.cores) {
    const std::string core = "chip" + std::to_string(prog.chip) + ".core" + std::to_string(prog.core);
    json rec = {{"capacity_bytes", bundle.target.vmem_bytes}};
    if (!prog.vmem_plan.empty()) {
      const auto use = isa::vmem_in_use_by_op(prog);
      uint64_t peak = 0;
      const auto profile = units.find(core + ".profile");
      if (profile != units.end())
        for (const auto& op : profile->value("ops", json::array())) {
          const auto it = use.find(static_cast<int32_t>(op.at("id").get<int64_t>()));
          if (it != use.end()) peak = std::max(peak, it->second);
        }
      rec["peak_bytes_in_use"] = peak;
    }
    out[core] = rec;
  }
  return out;
}

void vmem_counters(const isa::Bundle& bundle, timeline::Timeline& tl) {
  for (const auto& prog : bundle.cores) {
    if (prog.vmem_plan.empty()) continue;
    const auto use = isa::vmem_in_use_by_op(prog);
    const std::string chip = "chip" + std::to_string(prog.chip), core = "core" + std::to_string(prog.core);
    const timeline::TrackId seq = tl.track(chip, core + ".sequencer");
    const std::string name = chip + "." + core + ".vmem bytes in use";
    uint64_t last_end = 0, value = 0;
    bool any = false;
    for (const auto& s : tl.slices_on(seq)) {
      // Sequencer slices are named "op N" or "unmarked" (hw/core/op_profile.cpp).
      int32_t op;
      if (s.name.rfind("op ", 0) == 0) op = static_cast<int32_t>(std::stoll(s.name.substr(3)));
      else if (s.name == "unmarked") op = -1;
      else continue;
      const auto it = use.find(op);
      const uint64_t v = it == use.end() ? 0 : it->second;
      if (!any || v != value) tl.counter(seq, name, s.begin, double(v));
      any = true;
      value = v;
      last_end = std::max(last_end, s.end);
    }
    if (any && value != 0) tl.counter(seq, name, last_end, 0.0);
  }
}

}  // namespace tpusim::run

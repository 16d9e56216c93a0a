#include "sim/run/stats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "isa/io/npy.h"

namespace tpusim::run {

using nlohmann::json;

json make_stats(const RunFigures& f) {
  json s;
  s["preset"] = f.preset;
  s["mode"] = f.mode;
  s["clock_hz"] = f.clock_hz;
  s["cycles"] = f.cycles;
  const double seconds = f.clock_hz > 0 ? double(f.cycles) / f.clock_hz : 0.0;
  s["seconds"] = seconds;
  s["flops"] = f.flops;
  s["peak_flops_per_s"] = f.peak_flops_per_s;
  // A run of zero cycles did no work; 0 rather than NaN keeps the file valid JSON.
  const double peak_flops = f.peak_flops_per_s * seconds;
  s["mxu_utilization"] = peak_flops > 0 ? double(f.flops) / peak_flops : 0.0;
  s["hbm"] = {{"bytes_read", f.hbm_bytes_read},
              {"bytes_written", f.hbm_bytes_written},
              {"peak_bytes_per_s", f.hbm_peak_bytes_per_s}};
  s["host"] = {{"wall_seconds", f.wall_seconds}};
  s["units"] = f.units.is_null() ? json::object() : f.units;
  if (!f.ops.is_null()) s["ops"] = f.ops;
  if (!f.time_by_cause.is_null()) s["time_by_cause"] = f.time_by_cause;
  if (!f.vmem.is_null()) s["vmem"] = f.vmem;
  if (!f.critical_path.is_null()) s["critical_path"] = f.critical_path;
  return s;
}

namespace {

void require(std::vector<std::string>& problems, const json& j, const std::string& path, const char* key,
             bool (json::*is_type)() const noexcept, const char* type_name) {
  if (!j.is_object() || !j.contains(key)) {
    problems.push_back("missing key " + path + key);
  } else if (!(j.at(key).*is_type)()) {
    problems.push_back("key " + path + key + " is not " + type_name);
  }
}

// Objects and arrays (per-channel records, histogram buckets) nest; every leaf
// must be a value a plotting script can read, never null (a NaN or unset value).
void check_leaves(std::vector<std::string>& problems, const json& j, const std::string& path) {
  for (const auto& [name, value] : j.items()) {
    const std::string where = j.is_array() ? path + "[" + name + "]" : path + "." + name;
    if (value.is_structured()) check_leaves(problems, value, where);
    else if (!value.is_number() && !value.is_string() && !value.is_boolean())
      problems.push_back(where + " is neither a number nor a string");
  }
}

// A count written by tpusim: an integer >= 0 (unsigned once read from a file,
// possibly signed in a document built in memory).
bool is_count(const json& n) { return n.is_number_integer() && n.get<int64_t>() >= 0; }

bool close(double a, double b) {
  const double scale = std::max(std::abs(a), std::abs(b));
  return std::abs(a - b) <= 1e-12 * scale + 1e-300;
}

// The optional per-op list (the schema scripts/plot.py reads) and the per-core
// time by cause, whose causes must account for every cycle of the run.
void check_profile(std::vector<std::string>& p, const json& s) {
  if (s.contains("ops")) {
    if (!s["ops"].is_array()) {
      p.push_back("key ops is not a list");
    } else {
      for (size_t i = 0; i < s["ops"].size(); ++i) {
        const json& op = s["ops"][i];
        const std::string where = "ops[" + std::to_string(i) + "].";
        if (!op.is_object()) {
          p.push_back("ops[" + std::to_string(i) + "] is not an object");
          continue;
        }
        const bool id_ok = op.contains("id") && (op["id"].is_string() || is_count(op["id"]));
        if (!id_ok) p.push_back("key " + where + "id is not a non-negative integer or a string");
        require(p, op, where, "name", &json::is_string, "a string");
        require(p, op, where, "flops", &json::is_number_unsigned, "an unsigned integer");
        if (op.contains("mxu_flops") && !op["mxu_flops"].is_number_unsigned())  // optional: older files lack it
          p.push_back("key " + where + "mxu_flops is not an unsigned integer");
        require(p, op, where, "hbm_bytes", &json::is_number_unsigned, "an unsigned integer");
        require(p, op, where, "cycles", &json::is_number_unsigned, "an unsigned integer");
        if (op.contains("cycles") && op["cycles"].is_number_unsigned() && op["cycles"].get<uint64_t>() == 0)
          p.push_back("key " + where + "cycles is 0");
      }
    }
  }
  if (s.contains("vmem")) {
    if (!s["vmem"].is_object()) p.push_back("key vmem is not an object");
    else
      for (const auto& [core, v] : s["vmem"].items()) {
        const bool cap = v.is_object() && v.contains("capacity_bytes") && v["capacity_bytes"].is_number_unsigned();
        if (!cap) {
          p.push_back("vmem." + core + " lacks an unsigned capacity_bytes");
        } else if (v.contains("peak_bytes_in_use")) {
          if (!v["peak_bytes_in_use"].is_number_unsigned())
            p.push_back("vmem." + core + ".peak_bytes_in_use is not an unsigned integer");
          else if (v["peak_bytes_in_use"].get<uint64_t>() > v["capacity_bytes"].get<uint64_t>())
            p.push_back("vmem." + core + ".peak_bytes_in_use exceeds capacity_bytes");
        }
      }
  }
  if (s.contains("critical_path")) {
    const json& c = s["critical_path"];
    uint64_t sum = 0;
    bool ok = c.is_object() && c.contains("cycles") && is_count(c["cycles"]) && c.contains("by_cause") &&
              c["by_cause"].is_object();
    if (ok)
      for (const auto& [cause, n] : c["by_cause"].items()) {
        ok = ok && is_count(n);
        if (ok) sum += n.get<uint64_t>();
      }
    if (!ok) p.push_back("critical_path lacks a count of cycles or by_cause counts");
    else if (sum != c["cycles"].get<uint64_t>()) p.push_back("critical_path.by_cause does not sum to its cycles");
  }
  if (s.contains("time_by_cause")) {
    if (!s["time_by_cause"].is_object()) {
      p.push_back("key time_by_cause is not an object");
      return;
    }
    const uint64_t cycles = s["cycles"].get<uint64_t>();
    for (const auto& [core, t] : s["time_by_cause"].items()) {
      uint64_t sum = 0;
      bool ok = t.is_object();
      for (const char* k : {"compute", "hbm", "infeed", "sync", "idle"}) {
        ok = ok && t.contains(k) && is_count(t[k]);
        if (ok) sum += t[k].get<uint64_t>();
      }
      if (!ok) p.push_back("time_by_cause." + core + " lacks a count of compute, hbm, infeed, sync or idle");
      else if (sum != cycles) p.push_back("time_by_cause." + core + " does not sum to cycles");
    }
  }
}

}  // namespace

std::vector<std::string> check_stats(const json& s) {
  std::vector<std::string> p;
  if (!s.is_object()) return {"stats is not a JSON object"};
  require(p, s, "", "preset", &json::is_string, "a string");
  require(p, s, "", "mode", &json::is_string, "a string");
  require(p, s, "", "clock_hz", &json::is_number, "a number");
  require(p, s, "", "cycles", &json::is_number_unsigned, "an unsigned integer");
  require(p, s, "", "seconds", &json::is_number, "a number");
  require(p, s, "", "flops", &json::is_number_unsigned, "an unsigned integer");
  require(p, s, "", "peak_flops_per_s", &json::is_number, "a number");
  require(p, s, "", "mxu_utilization", &json::is_number, "a number");
  require(p, s, "", "hbm", &json::is_object, "an object");
  require(p, s, "", "host", &json::is_object, "an object");
  require(p, s, "", "units", &json::is_object, "an object");
  if (!p.empty()) return p;
  require(p, s["hbm"], "hbm.", "bytes_read", &json::is_number_unsigned, "an unsigned integer");
  require(p, s["hbm"], "hbm.", "bytes_written", &json::is_number_unsigned, "an unsigned integer");
  require(p, s["hbm"], "hbm.", "peak_bytes_per_s", &json::is_number, "a number");
  require(p, s["host"], "host.", "wall_seconds", &json::is_number, "a number");
  // Units report counters, but also histograms (nested objects) and labels
  // (strings); what no unit may write is null (a NaN or an unset value).
  for (const auto& [unit, counters] : s["units"].items()) {
    if (!counters.is_object()) {
      p.push_back("units." + unit + " is not an object");
      continue;
    }
    check_leaves(p, counters, "units." + unit);
  }
  const std::string mode = s["mode"].get<std::string>();
  if (mode != "fast" && mode != "detailed") p.push_back("mode is \"" + mode + "\", not fast or detailed");
  if (!p.empty()) return p;

  const double clock = s["clock_hz"].get<double>();
  const double cycles = double(s["cycles"].get<uint64_t>());
  const double seconds = s["seconds"].get<double>();
  if (clock <= 0) p.push_back("clock_hz is not positive");
  else if (!close(seconds, cycles / clock)) p.push_back("seconds != cycles / clock_hz");
  const double denom = s["peak_flops_per_s"].get<double>() * seconds;
  const double util = denom > 0 ? double(s["flops"].get<uint64_t>()) / denom : 0.0;
  if (!close(s["mxu_utilization"].get<double>(), util))
    p.push_back("mxu_utilization != flops / (peak_flops_per_s * seconds)");
  if (s["mxu_utilization"].get<double>() > 1.0 + 1e-12) p.push_back("mxu_utilization exceeds 1");
  check_profile(p, s);
  return p;
}

json deterministic_part(json s, bool drop_mode) {
  if (s.contains("host") && s["host"].is_object()) s["host"].erase("wall_seconds");
  if (drop_mode) s.erase("mode");
  return s;
}

std::string stats_text(const json& s) { return s.dump(2) + "\n"; }

void write_stats(const std::string& path, const json& s) {
  const std::string text = stats_text(s);
  io::write_file_atomic(path, text);
}

json read_stats(const std::string& path) {
  std::vector<uint8_t> bytes = io::read_file(path);
  json s = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (s.is_discarded()) throw std::runtime_error(path + ": not valid JSON");
  const auto problems = check_stats(s);
  if (!problems.empty()) throw std::runtime_error(path + ": not a tpusim stats file: " + problems.front());
  return s;
}

}  // namespace tpusim::run

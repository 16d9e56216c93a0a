#include "hw/mem/memory_factory.h"

#include <fmt/core.h>

#include "hw/config/params.h"
#include "hw/hbm/hbm_config.h"
#include "hw/hbm/hbm_memory.h"
#include "hw/mem/simple_memory.h"

namespace tpusim::mem {

namespace {

// The `model` key; `peak` when absent: a preset without a timing table, whose
// memory is a pipe at its `peak_bytes_per_s` (make_memory).
std::string model_of(const YAML::Node& hbm) { return hbm["model"] ? hbm["model"].as<std::string>() : "peak"; }

SimpleMemoryConfig simple_config(const YAML::Node& hbm, const std::string& source) {
  using config::ConfigError;
  const YAML::Node s = hbm["simple"];
  if (!s || !s.IsMap()) throw ConfigError(source + ": hbm.simple: missing (latency_ps, bytes_per_s, max_outstanding)");
  SimpleMemoryConfig cfg;
  try {
    cfg.latency_ps = s["latency_ps"].as<uint64_t>();
    cfg.bytes_per_s = s["bytes_per_s"].as<double>();
    cfg.max_outstanding = s["max_outstanding"].as<uint32_t>();
  } catch (const YAML::Exception&) {
    throw ConfigError(source + ": hbm.simple: expected latency_ps (integer), bytes_per_s (number), "
                      "max_outstanding (integer)");
  }
  if (!(cfg.bytes_per_s > 0) || cfg.max_outstanding == 0)
    throw ConfigError(source + ": hbm.simple: bytes_per_s and max_outstanding must be positive");
  return cfg;
}

}  // namespace

std::unique_ptr<MemoryPort> make_memory(const YAML::Node& hbm, const std::string& source, uint32_t request_bytes) {
  using config::ConfigError;
  if (!hbm || !hbm.IsMap()) throw ConfigError(source + ": hbm: expected a mapping");
  const std::string model = model_of(hbm);
  if (model == "hbm") return std::make_unique<hbm::HbmMemory>(hbm::hbm_config_from_yaml(hbm, source));
  if (model == "peak") {
    double peak = 0;
    try {
      peak = hbm["peak_bytes_per_s"] ? hbm["peak_bytes_per_s"].as<double>() : 0.0;
    } catch (const YAML::Exception&) {
      throw ConfigError(source + ": hbm.peak_bytes_per_s: expected a number");
    }
    if (!(peak > 0))
      throw ConfigError(source + ": hbm: no model (hbm | simple) and no positive peak_bytes_per_s for the fallback pipe");
    return std::make_unique<SimpleMemory>(SimpleMemoryConfig::peak_pipe(peak, request_bytes));
  }
  if (model != "simple") throw ConfigError(source + ": hbm.model: expected hbm or simple, got '" + model + "'");
  return std::make_unique<SimpleMemory>(simple_config(hbm, source));
}

std::string simple_memory_note(const YAML::Node& hbm, const std::string& source, uint32_t request_bytes) {
  if (!hbm || !hbm.IsMap() || model_of(hbm) != "simple" || request_bytes == 0) return "";
  const SimpleMemoryConfig cfg = simple_config(hbm, source);
  const double cap = cfg.sustained_bytes_per_s(request_bytes);
  if (cap >= cfg.bytes_per_s * (1 - 1e-9)) return "";
  return fmt::format("{}: hbm.simple: {} requests in flight of {} B over a {} ps latency carry at most {:.3g} B/s, "
                     "below bytes_per_s {:.3g} (raise hbm.simple.max_outstanding to at least {})",
                     source, cfg.max_outstanding, request_bytes, cfg.latency_ps, cap, cfg.bytes_per_s,
                     cfg.outstanding_for_peak(request_bytes));
}

std::unique_ptr<MemoryPort> make_memory_from_preset(const std::string& name_or_path,
                                                    const std::vector<std::string>& overrides, uint32_t request_bytes) {
  const std::string path = hbm::find_hbm_preset(name_or_path);
  config::Params p = config::Params::load(path);
  for (const auto& o : overrides) p.set(o);
  return make_memory(p.node("hbm"), path, request_bytes);
}

}  // namespace tpusim::mem

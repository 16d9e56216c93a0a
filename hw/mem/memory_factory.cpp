#include "hw/mem/memory_factory.h"

#include "hw/config/params.h"
#include "hw/hbm/hbm_config.h"
#include "hw/hbm/hbm_memory.h"
#include "hw/mem/simple_memory.h"

namespace tpusim::mem {


std::unique_ptr<MemoryPort> make_memory(const YAML::Node& hbm, const std::string& source) {
  using config::ConfigError;
  if (!hbm || !hbm.IsMap()) throw ConfigError(source + ": hbm: expected a mapping");
  const std::string model = hbm["model"] ? hbm["model"].as<std::string>() : "hbm";
  if (model == "hbm") return std::make_unique<hbm::HbmMemory>(hbm::hbm_config_from_yaml(hbm, source));
  if (model != "simple") throw ConfigError(source + ": hbm.model: expected hbm or simple, got '" + model + "'");
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
  return std::make_unique<SimpleMemory>(cfg);
}

std::unique_ptr<MemoryPort> make_memory_from_preset(const std::string& name_or_path,
                                                    const std::vector<std::string>& overrides) {
  const std::string path = hbm::find_hbm_preset(name_or_path);
  config::Params p = config::Params::load(path);
  for (const auto& o : overrides) p.set(o);
  return make_memory(p.node("hbm"), path);
}

}  // namespace tpusim::mem

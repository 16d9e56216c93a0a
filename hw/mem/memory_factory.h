// A memory model from the `hbm:` section of a preset: `model: hbm` (the default,
// the DRAM controller of hw/hbm/) or `model: simple` (latency + bandwidth).
#pragma once

#include "hw/mem/memory_port.h"

#include <yaml-cpp/yaml.h>

#include <memory>
#include <string>
#include <vector>

namespace tpusim::mem {

// Throws config::ConfigError naming `source` and the key on bad input.
std::unique_ptr<MemoryPort> make_memory(const YAML::Node& hbm, const std::string& source);
// configs/hbm/NAME.yaml (or a path) plus "hbm.KEY=VALUE" overrides.
std::unique_ptr<MemoryPort> make_memory_from_preset(const std::string& name_or_path,
                                                    const std::vector<std::string>& overrides = {});

}  // namespace tpusim::mem

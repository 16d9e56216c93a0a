// A memory model from the `hbm:` section of a preset: `model: hbm` (the default,
// the DRAM controller of hw/hbm/) or `model: simple` (latency + bandwidth).
#pragma once

#include "hw/mem/memory_port.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tpusim::mem {

// Throws config::ConfigError naming `source` and the key on bad input.
std::unique_ptr<MemoryPort> make_memory(const YAML::Node& hbm, const std::string& source);
// With `model: simple`, a note when the pipe cannot reach its bytes_per_s with
// requests of `request_bytes` (SimpleMemoryConfig::sustained_bytes_per_s: too few
// requests in flight to cover the latency); else empty. A sweep of bytes_per_s
// alone would otherwise stop mattering above that ceiling without a word.
std::string simple_memory_note(const YAML::Node& hbm, const std::string& source, uint32_t request_bytes);

// configs/hbm/NAME.yaml (or a path) plus "hbm.KEY=VALUE" overrides.
std::unique_ptr<MemoryPort> make_memory_from_preset(const std::string& name_or_path,
                                                    const std::vector<std::string>& overrides = {});

}  // namespace tpusim::mem

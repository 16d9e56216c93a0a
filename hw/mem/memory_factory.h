// A memory model from the `hbm:` section of a preset: `model: hbm` (the DRAM
// controller of hw/hbm/), `model: simple` (latency + bandwidth), or no `model`: a
// preset without a timing table, whose memory is a latency + bandwidth pipe at its
// `peak_bytes_per_s` (SimpleMemoryConfig::peak_pipe), the rate hw/config/peaks.h
// reports for it too.
#pragma once

#include "hw/mem/memory_port.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tpusim::mem {

// Throws config::ConfigError naming `source` and the key on bad input.
// `request_bytes`: the DMA beat, which sizes the fallback pipe's requests in flight.
std::unique_ptr<MemoryPort> make_memory(const YAML::Node& hbm, const std::string& source, uint32_t request_bytes);
// With `model: simple`, a note when the pipe cannot reach its bytes_per_s with
// requests of `request_bytes` (SimpleMemoryConfig::sustained_bytes_per_s: too few
// requests in flight to cover the latency); else empty. A sweep of bytes_per_s
// alone would otherwise stop mattering above that ceiling without a word.
std::string simple_memory_note(const YAML::Node& hbm, const std::string& source, uint32_t request_bytes);

// configs/hbm/NAME.yaml (or a path) plus "hbm.KEY=VALUE" overrides.
std::unique_ptr<MemoryPort> make_memory_from_preset(const std::string& name_or_path,
                                                    const std::vector<std::string>& overrides = {},
                                                    uint32_t request_bytes = 512);

}  // namespace tpusim::mem

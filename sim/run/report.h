// The short human report `tpusim run` prints and `tpusim report` reprints from a
// stats.json: one formatter, so both always say the same thing.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace tpusim::run {

// Multi-line text ending in '\n'. Expects a document that passes check_stats.
std::string format_report(const nlohmann::json& stats);

}  // namespace tpusim::run

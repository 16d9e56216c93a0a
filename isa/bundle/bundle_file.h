// The bundle file: one versioned binary holding everything a run needs
// (docs/isa.md, "Bundle file"). Little-endian throughout.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/asm/instr.h"

namespace tpusim::isa {

inline constexpr char kBundleMagic[8] = {'T', 'P', 'U', 'S', 'I', 'M', 'B', 0x1A};
inline constexpr uint32_t kBundleVersion = 1;

struct BundleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<uint8_t> serialize_bundle(const Bundle& b);
// `name` labels messages. Checks magic, version, bounds of every table, the
// instruction encoding and check_bundle(); throws BundleError("<name>: ...").
Bundle parse_bundle(const std::vector<uint8_t>& bytes, const std::string& name);

Bundle read_bundle(const std::string& path);
void write_bundle(const std::string& path, const Bundle& b);  // atomic (temp + rename)

}  // namespace tpusim::isa

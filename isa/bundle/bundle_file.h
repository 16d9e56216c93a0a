// The bundle file: one versioned binary holding everything a run needs
// (docs/isa.md, "Bundle file"). Little-endian throughout.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/asm/instr.h"

namespace tpusim::isa {

inline constexpr char kBundleMagic[8] = {'T', 'P', 'U', 'S', 'I', 'M', 'B', 0x1A};
// Version 2 adds each core's VMEM plan and the op name table (docs/isa.md,
// "Bundle file"), version 3 the op FLOPs table after them. A bundle is written at
// the lowest version that holds what it carries, so tools that read only an older
// version still read it; version 4 adds each I/O entry's spread and further places
// (split or copied tensors of data-parallel bundles). This tpusim reads all four.
inline constexpr uint32_t kBundleVersionPlaces = 4;
inline constexpr uint32_t kBundleVersionFlops = 3;
inline constexpr uint32_t kBundleVersion = 2;
inline constexpr uint32_t kBundleVersionNoPlan = 1;

struct BundleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<uint8_t> serialize_bundle(const Bundle& b);
// `name` labels messages. Checks magic, version, bounds of every table, the
// instruction encoding and check_bundle(); throws BundleError("<name>: ...").
Bundle parse_bundle(const std::vector<uint8_t>& bytes, const std::string& name);

// VMEM bytes in use while `prog` executes each op of its plan: the size of the
// union of that op's buffers (overlapping buffers count once). Ops without a
// buffer are absent (0 bytes).
std::map<int32_t, uint64_t> vmem_in_use_by_op(const CoreProgram& prog);

Bundle read_bundle(const std::string& path);
void write_bundle(const std::string& path, const Bundle& b);  // atomic (temp + rename)

}  // namespace tpusim::isa

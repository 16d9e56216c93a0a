// A one-pseudo-channel HBM with a timing table of distinct values, so a measured gap
// can only be the constraint under test, plus helpers to place a burst at a chosen
// bank/row/column and arrival cycle and to read back the command stream.
#pragma once

#include "hw/hbm/hbm_memory.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <memory>
#include <vector>

namespace tpusim::hbm::testing {

inline HbmConfig small_config(const std::string& extra = "") {
  const std::string text = R"(
hbm:
  clock_hz: 1000000000
  stacks: 1
  channels_per_stack: 1
  pseudo_channels_per_channel: 1
  pseudo_channel_width_bits: 64
  bank_groups: 4
  banks_per_group: 4
  rows: 1024
  row_bytes: 1024
  address_mapping: "row bank bank_group column"
  page_policy: open
  refresh_mode: per_bank
  queue_entries: 64
  sample_interval_cycles: 0
  tRCD: 11
  tRP: 13
  tRAS: 29
  tRC: 47
  tCL: 17
  tCWL: 5
  tCCD_S: 3
  tCCD_L: 7
  tRRD_S: 5
  tRRD_L: 9
  tFAW: 31
  tWR: 19
  tWTR: 23
  tRTP: 6
  tRFC: 101
  tRFCsb: 53
  tREFI: 1000000
  tRTRS: 2
  BL: 4
)";
  YAML::Node root = YAML::Load(text);
  if (!extra.empty()) {
    const YAML::Node over = YAML::Load(extra);
    for (const auto& kv : over) root["hbm"][kv.first.as<std::string>()] = kv.second;
  }
  return hbm_config_from_yaml(root["hbm"], "test");
}

struct Rig {
  explicit Rig(const HbmConfig& c) : cfg(c), mem(std::make_unique<HbmMemory>(cfg)) {
    mem->channel(0).record_commands(true);
  }
  // One 32-byte burst, visible to the scheduler from cycle `arrival` (>= 1).
  void burst(uint64_t arrival, uint32_t group, uint32_t bank, uint32_t row, uint32_t column, bool write = false) {
    DecodedAddress d;
    d.bank_group = group, d.bank = bank, d.row = row, d.column = column;
    mem::MemRequest r;
    r.id = next_id++;
    r.addr = encode_address(cfg, d);
    r.bytes = cfg.burst_bytes();
    r.is_write = write;
    ASSERT_TRUE(mem->try_enqueue(r, mem->clock().cycle_to_ps(arrival - 1)));
  }
  void run_until(uint64_t cycle) { mem->advance_to(mem->clock().cycle_to_ps(cycle)); }
  const std::vector<IssuedCommand>& log() const { return mem->channel(0).command_log(); }
  // The n-th (0-based) command of a kind.
  IssuedCommand nth(Command cmd, size_t n = 0) const {
    size_t seen = 0;
    for (const auto& c : log())
      if (c.cmd == cmd && seen++ == n) return c;
    ADD_FAILURE() << "no command " << command_name(cmd) << " #" << n;
    return {0, cmd, 0, 0};
  }
  std::vector<mem::MemCompletion> completions() {
    std::vector<mem::MemCompletion> out;
    mem::MemCompletion c;
    while (mem->pop_completion(c)) out.push_back(c);
    return out;
  }
  HbmConfig cfg;
  std::unique_ptr<HbmMemory> mem;
  uint64_t next_id = 0;
};

}  // namespace tpusim::hbm::testing

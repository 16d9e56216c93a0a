// An HBM configuration: geometry, clock, address mapping, policies and the timing
// table, read from the `hbm:` section of a YAML preset (configs/hbm/*.yaml) after
// the user's `--set hbm.KEY=VALUE` overrides. docs/hbm.md lists every key.
#pragma once

#include "hw/config/params.h"

#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace tpusim::hbm {

// The JEDEC timing parameters, in DRAM clock cycles (tCK). The scheduler never
// names a number: it consults the constraint rules built from this table.
enum Timing : int {
  tRCD,    // ACT to RD/WR, same bank
  tRP,     // PRE to ACT (or REF), same bank
  tRAS,    // ACT to PRE, same bank
  tRC,     // ACT to ACT, same bank
  tCL,     // RD to first read data
  tCWL,    // WR to first write data
  tCCD_S,  // RD/WR to RD/WR, different bank group
  tCCD_L,  // RD/WR to RD/WR, same bank group
  tRRD_S,  // ACT to ACT, different bank group
  tRRD_L,  // ACT to ACT, same bank group
  tFAW,    // window in which at most four ACTs may issue
  tWR,     // end of write data to PRE, same bank
  tWTR,    // end of write data to RD
  tRTP,    // RD to PRE, same bank
  tRFC,    // all-bank REF to ACT
  tRFCsb,  // single-bank REF to ACT of that bank
  tREFI,   // average interval between refreshes of each bank
  tRTRS,   // data-bus turnaround between a read burst and a write burst
  BL,      // burst length in data beats (two beats per clock)
  kTimingCount
};

struct TimingName {
  const char* name;
  const char* meaning;
};
extern const std::array<TimingName, kTimingCount> kTimingNames;

struct TimingTable {
  std::array<uint32_t, kTimingCount> cycles{};
  uint32_t operator[](Timing t) const { return cycles[t]; }
  uint32_t tBURST() const { return cycles[BL] / 2; }  // double data rate
};

enum class PagePolicy { kOpen, kClosed };
enum class RefreshMode { kAllBank, kPerBank };
// kXorRow: the bank and the bank group the mapping gives are each XORed with the
// row folded to their width (log2 banks_per_group, log2 bank_groups bits; a form of
// permutation-based page interleaving, Zhang, Zhu and Zhang, MICRO 2000), so two
// buffers a power of two rows apart (an all-reduce's x and y, a copy's source and
// destination) use other banks instead of taking turns at one bank's row buffer.
// A 256 KiB piece keeps one bank index in every bank group, so the hash has to
// change the bank, not only the bank group, to keep two such pieces apart.
enum class BankHash { kNone, kXorRow };
// kXorUpper: the flat pseudo-channel index the mapping gives is XORed with the
// address bits above every channel bit (stack, channel, pseudo-channel), folded to
// its width: the channel interleaving hash of CPU and GPU memory controllers. Each
// channel-interleave block (4 KiB on the presets) still gives every pseudo-channel
// one 64 B granule, in an order that changes from block to block, so streams
// whose addresses are equal modulo that block (buffers a power of two apart,
// transfers cut at the same alignment, a stride) queue at other pseudo-channels
// instead of the same few.
enum class ChannelHash { kNone, kXorUpper };

// Which address bits select what. Written most significant field first, like
// Ramulator's "RoBaBgCoCh": "row bank column bank_group stack channel
// pseudo_channel column:1". A field may appear several times; every occurrence but
// one carries its width (":bits"), the one without takes the field's remaining
// bits (log2 of its count). The bits below the first field select the byte within a
// burst.
enum class Field { kStack, kChannel, kPseudoChannel, kBankGroup, kBank, kRow, kColumn, kCount };

struct DecodedAddress {
  uint32_t channel = 0;  // flat pseudo-channel index: (stack * channels + channel) * pcs + pc
  uint32_t bank_group = 0;
  uint32_t bank = 0;     // within the bank group
  uint32_t row = 0;
  uint32_t column = 0;   // in bursts
};

struct AddressMapping {
  struct Slice {
    Field field;
    uint32_t addr_lsb;   // where the slice sits in the address
    uint32_t bits;
    uint32_t value_lsb;  // where it sits in the field's value
  };
  std::string text;
  std::vector<Slice> slices;  // least significant first
  uint32_t offset_bits = 0;   // byte within a burst
  uint32_t total_bits = 0;    // address bits the mapping decodes
  uint32_t above_channels = 0;  // the lowest address bit above every stack, channel and pseudo-channel bit
  std::array<uint32_t, size_t(Field::kCount)> field_counts{};
};

struct HbmConfig {
  std::string name;
  std::string standard;               // "HBM2", "HBM2e": informational
  uint64_t clock_hz = 0;              // command clock; data moves on both edges
  uint32_t stacks = 0;
  uint32_t channels_per_stack = 0;
  uint32_t pseudo_channels_per_channel = 0;
  uint32_t pseudo_channel_width_bits = 0;
  uint32_t bank_groups = 0;           // per pseudo-channel
  uint32_t banks_per_group = 0;
  uint32_t rows = 0;                  // per bank
  uint32_t row_bytes = 0;             // page size per pseudo-channel
  uint32_t queue_entries = 0;         // bursts each pseudo-channel queue holds
  PagePolicy page_policy = PagePolicy::kOpen;
  RefreshMode refresh_mode = RefreshMode::kPerBank;
  BankHash bank_hash = BankHash::kNone;
  ChannelHash channel_hash = ChannelHash::kNone;
  uint64_t sample_interval_cycles = 0;  // per-channel counter samples; 0 = none
  TimingTable timing;
  AddressMapping mapping;

  uint32_t channels() const { return stacks * channels_per_stack * pseudo_channels_per_channel; }
  uint32_t banks() const { return bank_groups * banks_per_group; }
  uint32_t burst_bytes() const { return pseudo_channel_width_bits / 8 * timing[BL]; }
  uint32_t bursts_per_row() const { return row_bytes / burst_bytes(); }
  uint64_t capacity_bytes() const { return uint64_t(1) << mapping.total_bits; }
  // Every pseudo-channel moving data on both clock edges all the time.
  double peak_bytes_per_s() const {
    return double(channels()) * double(pseudo_channel_width_bits / 8) * 2.0 * double(clock_hz);
  }
};

// The `hbm:` section as a config. Throws config::ConfigError naming `source`, the
// key and the problem (unknown policy, a count that is not a power of two, a
// mapping whose widths do not add up, a timing table that contradicts itself).
HbmConfig hbm_config_from_yaml(const YAML::Node& hbm, const std::string& source);
// configs/hbm/NAME.yaml (or a path), then each "hbm.KEY=VALUE" override in order.
HbmConfig load_hbm_preset(const std::string& name_or_path, const std::vector<std::string>& overrides = {});
std::string find_hbm_preset(const std::string& name_or_path);
std::vector<std::string> hbm_preset_names();

// Decodes a byte address (below capacity_bytes()).
DecodedAddress decode_address(const HbmConfig& cfg, uint64_t addr);
// The inverse, for traffic generators and tests.
uint64_t encode_address(const HbmConfig& cfg, const DecodedAddress& d);

// The bursts of a request [addr, addr + bytes), in address order, as decode_address
// gives them. Every field is a set of address bits and every count a power of two,
// so the decode of a | b with disjoint bits is the field-wise OR of the decodes:
// a request aligned to its power-of-two span is its base's decode ORed with cached
// decodes of the offsets (a 4 KiB request: one decode instead of 128).
class BurstDecoder {
 public:
  explicit BurstDecoder(const HbmConfig& cfg) : cfg_(&cfg) {}
  void decode(uint64_t addr, uint64_t bytes, std::vector<DecodedAddress>& out);

 private:
  const HbmConfig* cfg_;
  std::vector<DecodedAddress> offsets_;  // decodes of bursts 0 .. span - 1
};

// Exact DRAM-cycle <-> picosecond conversion: the period 1e12 / clock_hz ps as a
// reduced fraction, so clocks like 878.90625 MHz keep no rounding drift.
class ClockConversion {
 public:
  explicit ClockConversion(uint64_t clock_hz);
  uint64_t cycle_to_ps(uint64_t cycle) const;   // the edge of `cycle`, rounded up
  uint64_t last_cycle_at_or_before(uint64_t ps) const;  // largest k with cycle_to_ps(k) <= ps
 private:
  uint64_t num_ = 1, den_ = 1;  // period = num_ / den_ ps
};

}  // namespace tpusim::hbm

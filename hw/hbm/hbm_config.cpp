#include "hw/hbm/hbm_config.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <sstream>

namespace tpusim::hbm {

using config::ConfigError;
namespace fs = std::filesystem;

const std::array<TimingName, kTimingCount> kTimingNames = {{
    {"tRCD", "ACT to RD/WR, same bank"},
    {"tRP", "PRE to ACT or REF, same bank"},
    {"tRAS", "ACT to PRE, same bank"},
    {"tRC", "ACT to ACT, same bank"},
    {"tCL", "RD to first read data"},
    {"tCWL", "WR to first write data"},
    {"tCCD_S", "column to column, different bank group"},
    {"tCCD_L", "column to column, same bank group"},
    {"tRRD_S", "ACT to ACT, different bank group"},
    {"tRRD_L", "ACT to ACT, same bank group"},
    {"tFAW", "four-activate window"},
    {"tWR", "end of write data to PRE, same bank"},
    {"tWTR", "end of write data to RD"},
    {"tRTP", "RD to PRE, same bank"},
    {"tRFC", "all-bank REF to ACT"},
    {"tRFCsb", "single-bank REF to ACT of that bank"},
    {"tREFI", "refresh interval of each bank"},
    {"tRTRS", "read-to-write data-bus turnaround"},
    {"BL", "burst length, data beats"},
}};

namespace {

const char* kFieldNames[] = {"stack", "channel", "pseudo_channel", "bank_group", "bank", "row", "column"};

[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& what) {
  throw ConfigError(source + ": hbm." + key + ": " + what);
}

YAML::Node need(const YAML::Node& hbm, const std::string& source, const std::string& key) {
  const YAML::Node n = hbm[key];
  if (!n) fail(source, key, "missing");
  return n;
}

template <typename T>
T get(const YAML::Node& hbm, const std::string& source, const std::string& key, const char* what) {
  try {
    return need(hbm, source, key).as<T>();
  } catch (const YAML::Exception&) {
    fail(source, key, std::string("expected ") + what);
  }
}

uint64_t get_positive(const YAML::Node& hbm, const std::string& source, const std::string& key) {
  const auto v = get<int64_t>(hbm, source, key, "a positive integer");
  if (v <= 0) fail(source, key, "expected a positive integer, got " + std::to_string(v));
  return uint64_t(v);
}

uint32_t get_pow2(const YAML::Node& hbm, const std::string& source, const std::string& key) {
  const uint64_t v = get_positive(hbm, source, key);
  if (v > (uint64_t(1) << 31) || (v & (v - 1)) != 0)
    fail(source, key, "expected a power of two (address bits select it), got " + std::to_string(v));
  return uint32_t(v);
}

uint32_t log2u(uint64_t v) { return v <= 1 ? 0 : uint32_t(63 - __builtin_clzll(v)); }

AddressMapping parse_mapping(const std::string& text, const HbmConfig& c, const std::string& source) {
  AddressMapping m;
  m.text = text;
  m.field_counts = {c.stacks, c.channels_per_stack, c.pseudo_channels_per_channel, c.bank_groups,
                    c.banks_per_group, c.rows, c.bursts_per_row()};
  struct Item {
    Field f;
    int bits;  // -1: the remainder
  };
  std::vector<Item> items;  // most significant first, as written
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    const auto colon = word.find(':');
    const std::string name = word.substr(0, colon);
    int f = -1;
    for (int i = 0; i < int(Field::kCount); ++i)
      if (name == kFieldNames[i]) f = i;
    if (f < 0)
      fail(source, "address_mapping",
           "unknown field '" + name + "' (fields: stack channel pseudo_channel bank_group bank row column)");
    int bits = -1;
    if (colon != std::string::npos) {
      try {
        size_t used = 0;
        bits = std::stoi(word.substr(colon + 1), &used);
        if (used != word.size() - colon - 1 || bits < 0) throw std::invalid_argument("");
      } catch (const std::exception&) {
        fail(source, "address_mapping", "'" + word + "': expected FIELD or FIELD:BITS");
      }
    }
    items.push_back({Field(f), bits});
  }
  std::array<int, size_t(Field::kCount)> explicit_bits{}, remainders{};
  for (const auto& it : items) {
    if (it.bits < 0) ++remainders[size_t(it.f)];
    else explicit_bits[size_t(it.f)] += it.bits;
  }
  std::array<int, size_t(Field::kCount)> rest{};
  for (int f = 0; f < int(Field::kCount); ++f) {
    const int need_bits = int(log2u(m.field_counts[size_t(f)]));
    if (remainders[size_t(f)] > 1)
      fail(source, "address_mapping", std::string("field '") + kFieldNames[f] + "' appears twice without a width");
    rest[size_t(f)] = need_bits - explicit_bits[size_t(f)];
    if (rest[size_t(f)] < 0 || (remainders[size_t(f)] == 0 && rest[size_t(f)] != 0))
      fail(source, "address_mapping",
           std::string("field '") + kFieldNames[f] + "' needs " + std::to_string(need_bits) + " bits, the mapping gives " +
               std::to_string(explicit_bits[size_t(f)]) + (remainders[size_t(f)] ? " plus the remainder" : ""));
  }
  m.offset_bits = log2u(c.burst_bytes());
  uint32_t lsb = m.offset_bits;
  std::array<uint32_t, size_t(Field::kCount)> value_lsb{};
  for (auto it = items.rbegin(); it != items.rend(); ++it) {
    const uint32_t bits = it->bits < 0 ? uint32_t(rest[size_t(it->f)]) : uint32_t(it->bits);
    if (bits == 0) continue;
    m.slices.push_back({it->f, lsb, bits, value_lsb[size_t(it->f)]});
    value_lsb[size_t(it->f)] += bits;
    lsb += bits;
  }
  m.total_bits = lsb;
  for (const auto& sl : m.slices)
    if (sl.field == Field::kStack || sl.field == Field::kChannel || sl.field == Field::kPseudoChannel)
      m.above_channels = std::max(m.above_channels, sl.addr_lsb + sl.bits);
  if (m.total_bits > 62) fail(source, "address_mapping", "more than 62 address bits");
  return m;
}

void check_timing(const HbmConfig& c, const std::string& source) {
  const auto& t = c.timing;
  auto key = [](Timing x) { return std::string(kTimingNames[x].name); };
  if (t[tRC] < t[tRAS] + t[tRP])
    fail(source, key(tRC), "tRC (" + std::to_string(t[tRC]) + ") must be at least tRAS + tRP (" +
                              std::to_string(t[tRAS] + t[tRP]) + ")");
  if (t[tCCD_L] < t[tCCD_S]) fail(source, key(tCCD_L), "must be at least tCCD_S");
  if (t[tRRD_L] < t[tRRD_S]) fail(source, key(tRRD_L), "must be at least tRRD_S");
  if (t[tCCD_S] < t.tBURST())
    fail(source, key(tCCD_S), "must be at least BL/2 = " + std::to_string(t.tBURST()) + " (one burst on the bus)");
  if (t[BL] % 2 != 0) fail(source, key(BL), "must be even (two beats per clock)");
  const uint32_t refresh_busy = c.refresh_mode == RefreshMode::kAllBank ? t[tRFC] : t[tRFCsb];
  const uint32_t interval =
      c.refresh_mode == RefreshMode::kAllBank ? t[tREFI] : t[tREFI] / std::max<uint32_t>(1, c.banks());
  if (interval == 0) fail(source, key(tREFI), "too small: the per-bank refresh interval tREFI/banks is zero");
  if (c.refresh_mode == RefreshMode::kAllBank && refresh_busy + t[tRP] >= interval)
    fail(source, key(tREFI), "must exceed tRFC + tRP, or the channel never leaves refresh");
  if (c.refresh_mode == RefreshMode::kPerBank && refresh_busy + t[tRP] >= t[tREFI])
    fail(source, key(tREFI), "must exceed tRFCsb + tRP, or a bank never leaves refresh");
}

}  // namespace

HbmConfig hbm_config_from_yaml(const YAML::Node& hbm, const std::string& source) {
  if (!hbm || !hbm.IsMap()) throw ConfigError(source + ": hbm: expected a mapping of HBM parameters");
  HbmConfig c;
  c.name = hbm["name"] ? get<std::string>(hbm, source, "name", "a string") : source;
  c.standard = hbm["standard"] ? get<std::string>(hbm, source, "standard", "a string") : "";
  c.clock_hz = get_positive(hbm, source, "clock_hz");
  // The controller steps through every DRAM cycle and times them in picoseconds: a
  // clock above 1 THz has several cycles in one picosecond (1e15 Hz took 23 s and
  // 1e17 Hz over 100 s on a 1,490-cycle run). More bandwidth is more stacks or channels.
  if (c.clock_hz > 1000000000000ull)
    fail(source, "clock_hz", "at most 1e12 (a 1 ps cycle, the model's time step), got " + std::to_string(c.clock_hz));
  c.stacks = get_pow2(hbm, source, "stacks");
  c.channels_per_stack = get_pow2(hbm, source, "channels_per_stack");
  c.pseudo_channels_per_channel = get_pow2(hbm, source, "pseudo_channels_per_channel");
  c.pseudo_channel_width_bits = get_pow2(hbm, source, "pseudo_channel_width_bits");
  if (c.pseudo_channel_width_bits < 8) fail(source, "pseudo_channel_width_bits", "must be at least 8");
  c.bank_groups = get_pow2(hbm, source, "bank_groups");
  c.banks_per_group = get_pow2(hbm, source, "banks_per_group");
  if (c.banks() > 64) fail(source, "banks_per_group", "at most 64 banks per pseudo-channel");
  c.rows = get_pow2(hbm, source, "rows");
  c.row_bytes = get_pow2(hbm, source, "row_bytes");
  c.queue_entries = uint32_t(get_positive(hbm, source, "queue_entries"));
  const auto policy = get<std::string>(hbm, source, "page_policy", "a string");
  if (policy == "open") c.page_policy = PagePolicy::kOpen;
  else if (policy == "closed") c.page_policy = PagePolicy::kClosed;
  else fail(source, "page_policy", "expected open or closed, got '" + policy + "'");
  if (hbm["bank_hash"]) {  // optional; none keeps the mapping's bank bits as they are
    const auto hash = get<std::string>(hbm, source, "bank_hash", "a string");
    if (hash == "none") c.bank_hash = BankHash::kNone;
    else if (hash == "xor_row") c.bank_hash = BankHash::kXorRow;
    else fail(source, "bank_hash", "expected none or xor_row, got '" + hash + "'");
  }
  if (hbm["channel_hash"]) {  // optional; none keeps the mapping's channel bits as they are
    const auto hash = get<std::string>(hbm, source, "channel_hash", "a string");
    if (hash == "none") c.channel_hash = ChannelHash::kNone;
    else if (hash == "xor_upper") c.channel_hash = ChannelHash::kXorUpper;
    else fail(source, "channel_hash", "expected none or xor_upper, got '" + hash + "'");
  }
  const auto refresh = get<std::string>(hbm, source, "refresh_mode", "a string");
  if (refresh == "per_bank") c.refresh_mode = RefreshMode::kPerBank;
  else if (refresh == "all_bank") c.refresh_mode = RefreshMode::kAllBank;
  else fail(source, "refresh_mode", "expected per_bank or all_bank, got '" + refresh + "'");
  {
    const auto v = get<int64_t>(hbm, source, "sample_interval_cycles", "a non-negative integer");
    if (v < 0) fail(source, "sample_interval_cycles", "expected a non-negative integer");
    c.sample_interval_cycles = uint64_t(v);
  }
  for (int i = 0; i < kTimingCount; ++i) {
    const std::string key = kTimingNames[size_t(i)].name;
    const auto v = get<int64_t>(hbm, source, key, "a whole number of clock cycles");
    if (v < 0 || v > 1000000000) fail(source, key, "expected 0..1e9 clock cycles, got " + std::to_string(v));
    c.timing.cycles[size_t(i)] = uint32_t(v);
  }
  if (c.timing[BL] == 0) fail(source, "BL", "must be positive");
  if (c.timing[tREFI] == 0) fail(source, "tREFI", "must be positive");
  if (c.row_bytes < c.burst_bytes())
    fail(source, "row_bytes", "smaller than one burst (" + std::to_string(c.burst_bytes()) + " B)");
  if ((c.burst_bytes() & (c.burst_bytes() - 1)) != 0) fail(source, "BL", "burst bytes must be a power of two");
  check_timing(c, source);
  c.mapping = parse_mapping(get<std::string>(hbm, source, "address_mapping", "a string"), c, source);
  // Anything else under hbm: is a typo; saying so beats ignoring it.
  static const char* kOther[] = {"name", "standard", "clock_hz", "stacks", "channels_per_stack",
                                 "pseudo_channels_per_channel", "pseudo_channel_width_bits", "bank_groups",
                                 "banks_per_group", "rows", "row_bytes", "queue_entries", "page_policy", "bank_hash",
                                 "channel_hash", "refresh_mode", "sample_interval_cycles", "address_mapping", "model",
                                 "simple", "bytes", "peak_bytes_per_s"};
  for (const auto& kv : hbm) {
    const std::string k = kv.first.as<std::string>();
    bool known = std::find(std::begin(kOther), std::end(kOther), k) != std::end(kOther);
    for (const auto& t : kTimingNames) known = known || k == t.name;
    if (!known) fail(source, k, "unknown HBM parameter");
  }
  return c;
}

std::string find_hbm_preset(const std::string& name_or_path) {
  if (name_or_path.find('/') != std::string::npos || fs::path(name_or_path).extension() == ".yaml") {
    if (fs::is_regular_file(name_or_path)) return name_or_path;
    throw ConfigError(name_or_path + ": no such HBM preset file");
  }
  const fs::path p = fs::path(config::configs_dir()) / "hbm" / (name_or_path + ".yaml");
  if (fs::is_regular_file(p)) return p.string();
  std::string known;
  for (const auto& n : hbm_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown HBM preset '" + name_or_path + "' (known: " + known + ")");
}

std::vector<std::string> hbm_preset_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(config::configs_dir()) / "hbm", ec))
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

HbmConfig load_hbm_preset(const std::string& name_or_path, const std::vector<std::string>& overrides) {
  const std::string path = find_hbm_preset(name_or_path);
  config::Params p = config::Params::load(path);
  for (const auto& o : overrides) p.set(o);
  return hbm_config_from_yaml(p.node("hbm"), path);
}

namespace {
// `x` folded into `bits`-wide chunks XORed together (0 for 0 bits): the row for
// BankHash::kXorRow, the address bits above the channel bits for
// ChannelHash::kXorUpper. Linear over GF(2), like the mapping itself, so
// BurstDecoder may combine decodes with XOR; and, since neither hash changes what
// it folds, each is its own inverse given the row or the upper bits.
uint32_t fold(uint64_t x, uint32_t bits) {
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  uint64_t f = 0;
  for (; x && bits; x >>= bits) f ^= x & mask;
  return uint32_t(f);
}
uint32_t channel_xor(const HbmConfig& cfg, uint64_t addr) {
  if (cfg.channel_hash == ChannelHash::kNone) return 0;
  return fold(addr >> cfg.mapping.above_channels, log2u(cfg.channels()));
}
void apply_bank_xor(const HbmConfig& cfg, DecodedAddress& d) {
  if (cfg.bank_hash == BankHash::kNone) return;
  d.bank ^= fold(d.row, log2u(cfg.banks_per_group));
  d.bank_group ^= fold(d.row, log2u(cfg.bank_groups));
}
}  // namespace

DecodedAddress decode_address(const HbmConfig& cfg, uint64_t addr) {
  std::array<uint32_t, size_t(Field::kCount)> v{};
  for (const auto& s : cfg.mapping.slices)
    v[size_t(s.field)] |= uint32_t((addr >> s.addr_lsb) & ((uint64_t(1) << s.bits) - 1)) << s.value_lsb;
  DecodedAddress d;
  d.channel = (v[size_t(Field::kStack)] * cfg.channels_per_stack + v[size_t(Field::kChannel)]) *
                  cfg.pseudo_channels_per_channel +
              v[size_t(Field::kPseudoChannel)];
  d.bank_group = v[size_t(Field::kBankGroup)];
  d.bank = v[size_t(Field::kBank)];
  d.row = v[size_t(Field::kRow)];
  d.column = v[size_t(Field::kColumn)];
  apply_bank_xor(cfg, d);
  d.channel ^= channel_xor(cfg, addr);
  return d;
}

void BurstDecoder::decode(uint64_t addr, uint64_t bytes, std::vector<DecodedAddress>& out) {
  const uint32_t shift = cfg_->mapping.offset_bits;
  const uint64_t first = addr >> shift, last = (addr + bytes - 1) >> shift, n = last - first + 1;
  uint64_t span = 1;
  while (span < n) span <<= 1;
  out.clear();
  if (first % span != 0 || span > 4096) {
    for (uint64_t b = first; b <= last; ++b) out.push_back(decode_address(*cfg_, b << shift));
    return;
  }
  for (uint64_t k = offsets_.size(); k < span; ++k) offsets_.push_back(decode_address(*cfg_, k << shift));
  const DecodedAddress base = decode_address(*cfg_, first << shift);
  // Fields are XORs of address bits (OR for the unhashed mapping: base and offset
  // bits are disjoint), so the decode of base + k is the field-wise XOR.
  for (uint64_t k = 0; k < n; ++k) {
    const DecodedAddress& o = offsets_[k];
    out.push_back({base.channel ^ o.channel, base.bank_group ^ o.bank_group, base.bank ^ o.bank, base.row ^ o.row,
                   base.column ^ o.column});
  }
}

uint64_t encode_address(const HbmConfig& cfg, const DecodedAddress& hashed) {
  DecodedAddress d = hashed;
  apply_bank_xor(cfg, d);  // its own inverse
  const auto compose = [&cfg, &d](uint32_t channel) {
    std::array<uint32_t, size_t(Field::kCount)> v{};
    v[size_t(Field::kPseudoChannel)] = channel % cfg.pseudo_channels_per_channel;
    const uint32_t ch = channel / cfg.pseudo_channels_per_channel;
    v[size_t(Field::kChannel)] = ch % cfg.channels_per_stack;
    v[size_t(Field::kStack)] = ch / cfg.channels_per_stack;
    v[size_t(Field::kBankGroup)] = d.bank_group;
    v[size_t(Field::kBank)] = d.bank;
    v[size_t(Field::kRow)] = d.row;
    v[size_t(Field::kColumn)] = d.column;
    uint64_t addr = 0;
    for (const auto& s : cfg.mapping.slices)
      addr |= uint64_t((v[size_t(s.field)] >> s.value_lsb) & ((uint32_t(1) << s.bits) - 1)) << s.addr_lsb;
    return addr;
  };
  // The channel hash reads only bits above the channel bits, which the other
  // fields give: undo it from the address composed without a channel.
  return compose(d.channel ^ channel_xor(cfg, compose(0)));
}

namespace {
__extension__ typedef unsigned __int128 u128;
}

ClockConversion::ClockConversion(uint64_t clock_hz) {
  if (clock_hz == 0) throw ConfigError("hbm.clock_hz: must be positive");
  const uint64_t ps_per_s = 1000000000000ull;
  const uint64_t g = std::gcd(ps_per_s, clock_hz);
  num_ = ps_per_s / g;
  den_ = clock_hz / g;
}

// 128-bit division is a library call; most products fit in 64 bits.
uint64_t ClockConversion::cycle_to_ps(uint64_t cycle) const {
  if (cycle <= (UINT64_MAX - den_) / num_) return (cycle * num_ + den_ - 1) / den_;
  return uint64_t((u128(cycle) * num_ + den_ - 1) / den_);
}

uint64_t ClockConversion::last_cycle_at_or_before(uint64_t ps) const {
  if (ps <= UINT64_MAX / den_) return ps * den_ / num_;
  return uint64_t(u128(ps) * den_ / num_);
}

}  // namespace tpusim::hbm

// Presets and overrides: each preset's peak equals the chip's published bandwidth,
// capacities match, every key can be overridden, and bad input fails with a message
// naming the key. Address mapping: decode and encode are inverse, and a 4 KiB block
// spreads evenly over every pseudo-channel.
#include "hw/config/peaks.h"
#include "hw/hbm/hbm_config.h"
#include "hw/hbm/hbm_memory.h"
#include "hw/mem/memory_factory.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace tpusim::hbm {
namespace {

struct Published {
  const char* preset;
  double bytes_per_s;  // architecture.md, "TPU facts"
  uint64_t capacity;
  uint32_t channels;
};
const Published kPublished[] = {
    {"hbm2_v2", 700e9, 16ull << 30, 64},
    {"hbm2_v3", 900e9, 32ull << 30, 64},
    {"hbm2_v4", 1200e9, 32ull << 30, 64},
    {"hbm2e_v5e", 819e9, 16ull << 30, 32},  // 16 GB published; addressed as 16 GiB
};

TEST(HbmPresets, PeakEqualsPublishedBandwidth) {
  for (const auto& p : kPublished) {
    const HbmConfig c = load_hbm_preset(p.preset);
    EXPECT_DOUBLE_EQ(c.peak_bytes_per_s(), p.bytes_per_s) << p.preset;
    EXPECT_EQ(c.capacity_bytes(), p.capacity) << p.preset;
    EXPECT_EQ(c.channels(), p.channels) << p.preset;
    EXPECT_EQ(c.burst_bytes(), 32u) << p.preset;
  }
  EXPECT_EQ(hbm_preset_names(), (std::vector<std::string>{"hbm2_v2", "hbm2_v3", "hbm2_v4", "hbm2e_v5e"}));
}

TEST(HbmPresets, ClockConversionIsExact) {
  // 878.90625 MHz: 9 cycles are exactly 10240 ps.
  ClockConversion clk(878906250);
  EXPECT_EQ(clk.cycle_to_ps(9), 10240u);
  EXPECT_EQ(clk.cycle_to_ps(9000000000ull), 10240000000000ull);
  EXPECT_EQ(clk.cycle_to_ps(1), 1138u);  // 1137.78 rounded up
  for (uint64_t k : {0ull, 1ull, 2ull, 8ull, 9ull, 10ull, 123456789ull}) {
    EXPECT_EQ(clk.last_cycle_at_or_before(clk.cycle_to_ps(k)), k);
    if (clk.cycle_to_ps(k) > 0) {
      EXPECT_EQ(clk.last_cycle_at_or_before(clk.cycle_to_ps(k) - 1), k - 1);
    }
  }
}

TEST(HbmOverrides, DottedKeysChangeTheConfig) {
  const HbmConfig c = load_hbm_preset("hbm2_v3", {"hbm.tCL=16", "hbm.page_policy=closed", "hbm.refresh_mode=all_bank",
                                                  "hbm.queue_entries=8", "hbm.stacks=2"});
  EXPECT_EQ(c.timing[tCL], 16u);
  EXPECT_EQ(c.page_policy, PagePolicy::kClosed);
  EXPECT_EQ(c.refresh_mode, RefreshMode::kAllBank);
  EXPECT_EQ(c.queue_entries, 8u);
  EXPECT_EQ(c.channels(), 32u);  // the mapping's stack field shrinks with the count
  EXPECT_EQ(c.capacity_bytes(), 16ull << 30);
}

void expect_error(const std::vector<std::string>& overrides, const std::string& fragment) {
  try {
    load_hbm_preset("hbm2_v3", overrides);
    ADD_FAILURE() << "no error for " << overrides.back();
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(HbmOverrides, BadKeysAndValuesFailClearly) {
  expect_error({"hbm.tCLL=16"}, "unknown parameter 'hbm.tCLL'");
  expect_error({"hbm.tCL=fast"}, "hbm.tCL");
  expect_error({"hbm.page_policy=sometimes"}, "expected open or closed");
  expect_error({"hbm.refresh_mode=never"}, "expected per_bank or all_bank");
  expect_error({"hbm.bank_hash=xor"}, "expected none or xor_row");
  expect_error({"hbm.channel_hash=xor_row"}, "expected none or xor_upper");
  expect_error({"hbm.stacks=3"}, "power of two");
  expect_error({"hbm.queue_entries=0"}, "positive");
  // Cycles below 1 ps: 1e17 Hz took over 100 s to simulate a 1,490-cycle run.
  expect_error({"hbm.clock_hz=1000000000001"}, "hbm.clock_hz");
  expect_error({"hbm.clock_hz=1000000000001"}, "at most 1e12");
  expect_error({"hbm.tRC=10"}, "at least tRAS + tRP");
  expect_error({"hbm.tCCD_S=1"}, "BL/2");
  expect_error({"hbm.address_mapping=row bank column"}, "needs");
  expect_error({"hbm.address_mapping=row bank colum bank_group stack channel pseudo_channel"}, "unknown field");
  expect_error({"hbm.tREFI=100"}, "tREFI");
  expect_error({"hbm.tCL"}, "KEY=VALUE");
  EXPECT_THROW(load_hbm_preset("hbm9"), config::ConfigError);
}

TEST(HbmMapping, DecodeAndEncodeAreInverse) {
  for (const char* preset : {"hbm2_v3", "hbm2e_v5e"})
  for (const char* hash : {"hbm.bank_hash=none", "hbm.bank_hash=xor_row"})
  for (const char* channel : {"hbm.channel_hash=none", "hbm.channel_hash=xor_upper"}) {
    SCOPED_TRACE(std::string(preset) + " " + hash + " " + channel);
    const HbmConfig c = load_hbm_preset(preset, {hash, channel});
    std::mt19937_64 rng(7);
    for (int i = 0; i < 20000; ++i) {
      const uint64_t addr = (rng() % c.capacity_bytes()) & ~uint64_t(c.burst_bytes() - 1);
      const DecodedAddress d = decode_address(c, addr);
      ASSERT_LT(d.channel, c.channels());
      ASSERT_LT(d.bank_group, c.bank_groups);
      ASSERT_LT(d.bank, c.banks_per_group);
      ASSERT_LT(d.row, c.rows);
      ASSERT_LT(d.column, c.bursts_per_row());
      ASSERT_EQ(encode_address(c, d), addr);
    }
  }
}

TEST(HbmMapping, FourKibSpreadsOverEveryPseudoChannelAndRowsStayTogether) {
  const HbmConfig c = load_hbm_preset("hbm2_v3");
  std::map<uint32_t, int> per_channel;
  for (uint64_t a = 0; a < 4096; a += 32) ++per_channel[decode_address(c, a).channel];
  EXPECT_EQ(per_channel.size(), 64u);
  for (const auto& [ch, n] : per_channel) EXPECT_EQ(n, 2) << ch;
  // Bytes 0..63 are one pseudo-channel, one row, adjacent columns.
  const DecodedAddress a = decode_address(c, 0), b = decode_address(c, 32);
  EXPECT_EQ(a.channel, b.channel);
  EXPECT_EQ(a.row, b.row);
  EXPECT_EQ(b.column, a.column + 1);
  // The next 4 KiB block moves to the next bank group.
  EXPECT_EQ(decode_address(c, 4096).bank_group, 1u);
}

TEST(HbmFactory, BuildsEitherModelFromThePreset) {
  auto hbm = mem::make_memory_from_preset("hbm2_v3");
  EXPECT_EQ(hbm->stats_json()["model"], "hbm");
  EXPECT_DOUBLE_EQ(hbm->peak_bytes_per_s(), 900e9);
  auto simple = mem::make_memory_from_preset("hbm2_v3", {"hbm.model=simple", "hbm.simple.latency_ps=5000"});
  EXPECT_EQ(simple->stats_json()["model"], "simple");
  EXPECT_THROW(mem::make_memory_from_preset("hbm2_v3", {"hbm.model=magic"}), config::ConfigError);
}

// No `model` key: a chip without a timing table. The factory, like peaks.h, reads
// that as the pipe at hbm.peak_bytes_per_s with enough DMA beats in flight for its
// rate, and a section with neither is an error naming the key, not an HBM
// controller built from missing timings.
TEST(HbmFactory, NoModelIsThePipeAtThePeak) {
  const YAML::Node peak = YAML::Load("{peak_bytes_per_s: 4.8e12, bytes: 1048576}");
  auto pipe = mem::make_memory(peak, "chip.yaml", 512);
  EXPECT_EQ(pipe->stats_json()["model"], "simple");
  EXPECT_DOUBLE_EQ(pipe->peak_bytes_per_s(), 4.8e12);
  config::Params p = config::Params::parse("hbm: {peak_bytes_per_s: 4.8e12}\n", "chip.yaml");
  EXPECT_DOUBLE_EQ(config::hbm_peak_bytes_per_s(p), pipe->peak_bytes_per_s());
  try {
    mem::make_memory(YAML::Load("{bytes: 1048576}"), "chip.yaml", 512);
    FAIL() << "no model and no peak accepted";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("chip.yaml: hbm: no model"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("peak_bytes_per_s"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mem::make_memory(YAML::Load("{peak_bytes_per_s: fast}"), "chip.yaml", 512), config::ConfigError);
}

TEST(HbmAddressMapping, BurstDecoderEqualsDecodingEveryBurst) {
  // Aligned requests take the combined-decodes path (field-wise XOR), unaligned
  // ones the plain one; both must give decode_address of each burst, for the
  // default mapping, one with the column split differently, and one with a field
  // in three pieces, with and without the bank and the channel hash.
  for (const char* mapping : {"row bank column bank_group stack channel pseudo_channel column:1",
                              "row column bank bank_group stack channel pseudo_channel",
                              "row:4 bank column:2 row bank_group stack column:1 channel pseudo_channel column:2"})
  for (const char* hash : {"hbm.bank_hash=none", "hbm.bank_hash=xor_row"})
  for (const char* channel : {"hbm.channel_hash=none", "hbm.channel_hash=xor_upper"}) {
    SCOPED_TRACE(std::string(mapping) + " " + hash + " " + channel);
    const HbmConfig c = load_hbm_preset("hbm2_v3", {std::string("hbm.address_mapping=") + mapping, hash, channel});
    BurstDecoder dec(c);
    std::mt19937_64 rng(7);
    std::vector<DecodedAddress> got;
    for (int i = 0; i < 3000; ++i) {
      const uint64_t bytes = i % 3 == 0 ? 1 + rng() % 8192 : (uint64_t(32) << (rng() % 9));
      const uint64_t align = i % 3 == 0 ? 1 : bytes;
      const uint64_t addr = (rng() % ((c.capacity_bytes() - bytes) / align)) * align;
      dec.decode(addr, bytes, got);
      const uint64_t first = addr / 32, last = (addr + bytes - 1) / 32;
      ASSERT_EQ(got.size(), last - first + 1);
      for (uint64_t b = first; b <= last; ++b) {
        const DecodedAddress want = decode_address(c, b * 32), &g = got[b - first];
        ASSERT_TRUE(g.channel == want.channel && g.bank_group == want.bank_group && g.bank == want.bank &&
                    g.row == want.row && g.column == want.column)
            << "addr " << addr << " bytes " << bytes << " burst " << b;
      }
    }
  }
}

TEST(HbmMapping, XorRowHashPutsBuffersAPowerOfTwoRowsApartInOtherBanks) {
  // Without the hash, an address and the one a power of two rows above it (the x
  // and y of an all-reduce, a copy's source and destination) fall in the same bank
  // and bank group and take turns at its row buffer. With it, both the bank and the
  // bank group differ (each is XORed with the row folded to its width), for every
  // distance from one row up, and channel, row and column are left as they were.
  const HbmConfig plain = load_hbm_preset("hbm2_v4", {"hbm.bank_hash=none"}),
                  hashed = load_hbm_preset("hbm2_v4", {"hbm.bank_hash=xor_row"});
  DecodedAddress one_row;
  one_row.row = 1;
  const uint64_t row_stride = encode_address(plain, one_row);
  auto same_but_banks = [](const DecodedAddress& p, const DecodedAddress& h) {
    return p.channel == h.channel && p.row == h.row && p.column == h.column;
  };
  std::mt19937_64 rng(11);
  for (uint32_t k = 0; (uint32_t(1) << k) < plain.rows; ++k) {
    SCOPED_TRACE(k);
    const uint64_t d = row_stride << k;
    for (int i = 0; i < 200; ++i) {
      // A base whose row has bit k clear, so base + d is the row with that bit set.
      uint64_t base = (rng() % (plain.capacity_bytes() - d)) & ~uint64_t(31);
      base &= ~d;
      const DecodedAddress p0 = decode_address(plain, base), p1 = decode_address(plain, base + d);
      const DecodedAddress h0 = decode_address(hashed, base), h1 = decode_address(hashed, base + d);
      ASSERT_EQ(p1.row, p0.row + (uint32_t(1) << k));
      ASSERT_TRUE(p0.bank == p1.bank && p0.bank_group == p1.bank_group);
      EXPECT_NE(h0.bank, h1.bank) << base;
      EXPECT_NE(h0.bank_group, h1.bank_group) << base;
      ASSERT_TRUE(same_but_banks(p0, h0) && same_but_banks(p1, h1)) << base;
    }
  }
  // Row 0 is left alone, so the first row-stride of memory maps as without the hash.
  for (uint64_t a = 0; a < row_stride; a += 1056) {
    const DecodedAddress p = decode_address(plain, a), h = decode_address(hashed, a);
    EXPECT_TRUE(p.bank == h.bank && p.bank_group == h.bank_group) << a;
  }
}

TEST(HbmMapping, XorUpperChannelHashPutsAddressesAPowerOfTwoApartOnOtherPseudoChannels) {
  // Without it, addresses a multiple of 4 KiB apart (the presets' channel
  // interleave) share a pseudo-channel: two buffers a power of two apart, or a
  // stride, queue at the same few. With it the channel index XORs the address bits
  // above the channel bits, folded: for every distance 2^k from 4 KiB up the
  // pseudo-channel differs, bank group, bank, row and column stay as they were,
  // each 4 KiB block still covers every pseudo-channel twice (two bursts of one 64
  // B granule), and the first 4 KiB maps as without the hash.
  const HbmConfig plain = load_hbm_preset("hbm2_v4"),
                  hashed = load_hbm_preset("hbm2_v4", {"hbm.channel_hash=xor_upper"});
  ASSERT_EQ(plain.channel_hash, ChannelHash::kNone);
  ASSERT_EQ(hashed.mapping.above_channels, 12u);  // 32 B bursts, column:1, 64 pseudo-channels
  std::mt19937_64 rng(13);
  for (uint32_t k = hashed.mapping.above_channels; k < hashed.mapping.total_bits; ++k) {
    SCOPED_TRACE(k);
    const uint64_t d = uint64_t(1) << k;
    for (int i = 0; i < 200; ++i) {
      const uint64_t base = (rng() % hashed.capacity_bytes()) & ~uint64_t(31) & ~d;
      const DecodedAddress p0 = decode_address(plain, base), p1 = decode_address(plain, base + d);
      const DecodedAddress h0 = decode_address(hashed, base), h1 = decode_address(hashed, base + d);
      ASSERT_EQ(p0.channel, p1.channel);
      EXPECT_NE(h0.channel, h1.channel) << base;
      for (const auto& [p, h] : {std::make_pair(p0, h0), std::make_pair(p1, h1)})
        ASSERT_TRUE(p.bank_group == h.bank_group && p.bank == h.bank && p.row == h.row && p.column == h.column)
            << base;
    }
  }
  for (int i = 0; i < 100; ++i) {
    const uint64_t block = (rng() % hashed.capacity_bytes()) & ~uint64_t(4095);
    std::map<uint32_t, int> per_channel;
    for (uint64_t a = block; a < block + 4096; a += 32) ++per_channel[decode_address(hashed, a).channel];
    ASSERT_EQ(per_channel.size(), 64u) << block;
    for (const auto& [ch, n] : per_channel) ASSERT_EQ(n, 2) << block << " channel " << ch;
    EXPECT_EQ(decode_address(hashed, block).channel, decode_address(hashed, block + 32).channel) << block;
  }
  for (uint64_t a = 0; a < 4096; a += 32)
    EXPECT_EQ(decode_address(plain, a).channel, decode_address(hashed, a).channel) << a;
}

}  // namespace
}  // namespace tpusim::hbm

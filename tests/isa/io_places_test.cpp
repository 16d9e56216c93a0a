// Tensors with further places (docs/isa.md "Directives", split= and copies=): the
// directive, the printer's round trip, the version 4 file section (and that a
// bundle without places keeps its older version), where write_tensor puts each part
// or copy and what read_tensor gathers, and the one-line errors of bad places.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "isa/asm/assembler.h"
#include "isa/bundle/bundle_file.h"
#include "isa/exec/state.h"
#include "isa/exec/tensors.h"
#include "tests/isa/error_text.h"

namespace tpusim::isa {
namespace {

// Two chips of two cores: x's 4 rows split over three HBM places and a host one,
// w copied to every core's VMEM.
const char* kPlaced = R"(.target chips=2 cores=2 vmem=64K hbm=1M host=1M
.input x f32 [4, 3] hbm@chip0.c0:0x100 split=[hbm@chip0.c0:0x2000, hbm@chip1.c0:0x100, host@chip1.c0:0x40]
.input w i32 [5] vmem@chip0.c0:0x10 copies=[vmem@chip0.c1:0x20, vmem@chip1.c0:0x30, vmem@chip1.c1:0x40]
.output y f32 [4, 3] hbm@chip0.c0:0x8000 split=[hbm@chip1.c0:0x8000]
.core chip0.core0
  halt
)";

std::vector<uint8_t> iota_bytes(size_t n, uint8_t first) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(first + i);
  return v;
}

TEST(IoPlaces, DirectiveRoundTripsThroughTextAndFile) {
  const Bundle b = assemble(kPlaced, "p.s");
  ASSERT_EQ(b.io.size(), 3u);
  const IoEntry& x = b.io[0];
  EXPECT_EQ(x.spread, IoSpread::kSplit);
  ASSERT_EQ(x.more.size(), 3u);
  EXPECT_TRUE((x.more[2] == IoPlace{Space::kHost, 1, 0, 0x40}));
  EXPECT_EQ(x.place_bytes(), 12u);  // a row of 3 fp32 a place
  EXPECT_EQ(b.io[1].spread, IoSpread::kCopies);
  EXPECT_EQ(b.io[1].place_bytes(), 20u);  // the whole tensor a place
  const std::string text = print_bundle(b);
  EXPECT_NE(text.find(".input x f32 [4, 3] hbm@chip0.c0:0x100 split=[hbm@chip0.c0:0x2000, hbm@chip1.c0:0x100, "
                      "host@chip1.c0:0x40]"),
            std::string::npos)
      << text;
  EXPECT_TRUE(assemble(text, "p.s").io == b.io);  // the code's line numbers differ
  EXPECT_EQ(print_bundle(assemble(text, "p.s")), text);
  const auto bytes = serialize_bundle(b);
  EXPECT_EQ(version_of(bytes), 4u);
  EXPECT_TRUE(parse_bundle(bytes, "b.tpb") == b);
  // Without places the bundle keeps the version it had (1 here: no plan, names or FLOPs).
  Bundle plain = b;
  for (auto& e : plain.io) {
    e.spread = IoSpread::kOne;
    e.more.clear();
  }
  EXPECT_EQ(version_of(serialize_bundle(plain)), 1u);
  // The places are the last fields of each I/O entry: a cut anywhere is a bad bundle.
  for (size_t n = 12; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(load_error(cut).rfind("b.tpb: ", 0), 0u) << n;
    EXPECT_NE(load_error(cut), "no error") << n;
  }
}

TEST(IoPlaces, PartsAndCopiesLandAtTheirPlaces) {
  const Bundle b = assemble(kPlaced, "p.s");
  exec::Machine m(b.target);
  const auto x = iota_bytes(48, 1), w = iota_bytes(20, 100);
  exec::write_tensor(m, b.io[0], x);
  exec::write_tensor(m, b.io[1], w);
  // Row i of x at place i, nothing of it anywhere else.
  const struct {
    Space space;
    uint32_t chip;
    uint64_t addr;
  } rows[4] = {{Space::kHbm, 0, 0x100}, {Space::kHbm, 0, 0x2000}, {Space::kHbm, 1, 0x100}, {Space::kHost, 1, 0x40}};
  for (int i = 0; i < 4; ++i) {
    std::vector<uint8_t> got(12);
    m.memory(rows[i].space, rows[i].chip, 0).read(rows[i].addr, got.data(), 12);
    EXPECT_EQ(got, std::vector<uint8_t>(x.begin() + 12 * i, x.begin() + 12 * (i + 1))) << "row " << i;
  }
  std::vector<uint8_t> after(4);
  m.memory(Space::kHbm, 0, 0).read(0x100 + 12, after.data(), 4);
  EXPECT_EQ(after, std::vector<uint8_t>(4, 0));  // place 0 holds one row, not the tensor
  // w whole in each core's VMEM at its own address.
  const uint64_t at[4] = {0x10, 0x20, 0x30, 0x40};
  for (uint32_t k = 0; k < 4; ++k) {
    std::vector<uint8_t> got(20);
    m.memory(Space::kVmem, k / 2, k % 2).read(at[k], got.data(), 20);
    EXPECT_EQ(got, w) << "copy " << k;
  }
  // Reading: a split tensor's parts in place order, a copied one's first place.
  EXPECT_EQ(exec::read_tensor(m, b.io[0]), x);
  EXPECT_EQ(exec::copies_disagree(m, b.io[1]), "");
  m.memory(Space::kVmem, 1, 1).write(0x40, iota_bytes(20, 7).data(), 20);
  EXPECT_EQ(exec::read_tensor(m, b.io[1]), w);
  // ... and copies that differ are named, with the first element that does.
  EXPECT_EQ(exec::copies_disagree(m, b.io[1]),
            "input 'w': its copy 3 at vmem@chip1.c1:0x40 differs from copy 0 at vmem@chip0.c0:0x10, first at flat "
            "index 0 (bits 0x0a090807 against 0x67666564)");
  m.memory(Space::kVmem, 1, 1).write(0x40, w.data(), 20);
  m.memory(Space::kVmem, 0, 1).write(0x20 + 19, iota_bytes(1, 0).data(), 1);
  EXPECT_NE(exec::copies_disagree(m, b.io[1]).find("its copy 1 at vmem@chip0.c1:0x20 differs from copy 0 at "
                                                   "vmem@chip0.c0:0x10, first at flat index 4 (bits 0x00767574 "
                                                   "against 0x77767574)"),
            std::string::npos);
  EXPECT_EQ(exec::copies_disagree(m, b.io[0]), "");  // a split entry's parts differ by design
  const auto y0 = iota_bytes(24, 50), y1 = iota_bytes(24, 80);
  m.memory(Space::kHbm, 0, 0).write(0x8000, y0.data(), 24);
  m.memory(Space::kHbm, 1, 0).write(0x8000, y1.data(), 24);
  std::vector<uint8_t> y = y0;
  y.insert(y.end(), y1.begin(), y1.end());
  EXPECT_EQ(exec::read_tensor(m, b.io[2]), y);
}

TEST(IoPlaces, BadPlacesAreOneLineErrors) {
  const std::string t = ".target chips=2 cores=2 hbm=1M\n";
  auto err = [&](const std::string& line) { return asm_error(t + line + "\n  halt\n"); };
  EXPECT_NE(err(".input x f32 [3, 2] hbm:0 split=[hbm@chip1.c0:0]").find("t.s: error: input 'x': split= needs a "
                                                                         "first dimension divisible by its 2 places"),
            std::string::npos)
      << err(".input x f32 [3, 2] hbm:0 split=[hbm@chip1.c0:0]");
  EXPECT_NE(err(".input x f32 [4] hbm:0 split=[hbm@chip2.c0:0]").find("input 'x' place 1: placed outside the target"),
            std::string::npos)
      << err(".input x f32 [4] hbm:0 split=[hbm@chip2.c0:0]");
  EXPECT_NE(err(".input x f32 [4] hbm:0 copies=[hbm@chip1.c0:0xffff8]").find("input 'x' place 1: does not fit in hbm"),
            std::string::npos);
  EXPECT_NE(err(".input x f32 [2, 2] hbm:0 strides=[64, 4] copies=[hbm@chip1.c0:0]").find("a spread tensor is dense"),
            std::string::npos);
  EXPECT_NE(err(".input x f32 [4] hbm:0 split=[hbm@chip1:0] copies=[hbm@chip1:64]")
                .find("give one of split= and copies=, once"),
            std::string::npos);
  EXPECT_NE(err(".input x f32 [4] hbm:0 split=[]").find("split= names no place"), std::string::npos);
  EXPECT_NE(err(".input x f32 [4] hbm:0 split=[hbm@chip1.c0]").find("expected a place SPACE@chipN.cM:ADDR"),
            std::string::npos);
  EXPECT_NE(err(".input x f32 [4] hbm:0 split=[dram@chip1:0]").find("unknown memory space 'dram'"), std::string::npos);
  EXPECT_NE(err(".input x f32 [4] hbm:0 copies=[hbm@chip1:-64]").find("negative address"), std::string::npos);
  // File: a bad spread or a place's bad space, patched after serialising.
  const auto bytes = serialize_bundle(assemble(kPlaced, "p.s"));
  // y's spread byte follows its empty data (u64 0) and precedes its place count (u32 1).
  const uint8_t tail[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, static_cast<uint8_t>(Space::kHbm)};
  auto it = std::search(bytes.rbegin(), bytes.rend(), std::rbegin(tail), std::rend(tail));
  ASSERT_NE(it, bytes.rend());
  const size_t spread_at = static_cast<size_t>(bytes.rend() - it) - sizeof tail + 8;
  auto bad = bytes;
  bad[spread_at] = 3;
  EXPECT_NE(load_error(bad).find("b.tpb: bad bundle: bad spread in the I/O table"), std::string::npos)
      << load_error(bad);
  bad = bytes;
  bad[spread_at + 5] = 9;
  EXPECT_NE(load_error(bad).find("bad memory space in the I/O places"), std::string::npos) << load_error(bad);
  bad = bytes;
  bad[spread_at] = static_cast<uint8_t>(IoSpread::kOne);
  EXPECT_NE(load_error(bad).find("inconsistent bundle: output 'y': further places without split= or copies="),
            std::string::npos)
      << load_error(bad);
}

}  // namespace
}  // namespace tpusim::isa

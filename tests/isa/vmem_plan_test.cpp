// The optional VMEM plan of a bundle (docs/isa.md "Bundle file", `.vmem`): the
// directive, the printer's round trip, the version 2 file section, compatibility
// with version 1 files, and the errors of a bad plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "isa/asm/assembler.h"
#include "isa/bundle/bundle_file.h"
#include "tests/isa/error_text.h"

namespace tpusim::isa {
namespace {

const char* kPlanned = R"(.target chips=1 cores=2 vmem=64K
.core chip0.core0
.vmem op=3 addr=0x0 bytes=4096
.vmem op=3 addr=0x800 bytes=4096
.vmem op=4 addr=0x2000 bytes=512
  op 3
  nop
  op 4
  halt
.core chip0.core1
  halt
)";

TEST(VmemPlan, DirectiveRoundTripsThroughTextAndFile) {
  const Bundle b = assemble(kPlanned, "p.s");
  ASSERT_EQ(b.cores.size(), 2u);
  const std::vector<VmemBuffer> want = {{3, 0, 4096}, {3, 0x800, 4096}, {4, 0x2000, 512}};
  EXPECT_EQ(b.cores[0].vmem_plan, want);
  EXPECT_TRUE(b.cores[1].vmem_plan.empty());
  // Text: disasm prints the plan and assembling it gives it back; printing is a fixed point.
  const std::string text = print_bundle(b);
  EXPECT_NE(text.find(".vmem op=3 addr=0x800 bytes=4096"), std::string::npos) << text;
  const Bundle again = assemble(text, "p.s");
  EXPECT_EQ(again.cores[0].vmem_plan, want);
  EXPECT_EQ(print_bundle(again), text);
  // File: a planned bundle is version 2 and parses back equal.
  const auto bytes = serialize_bundle(b);
  EXPECT_EQ(version_of(bytes), 2u);
  EXPECT_TRUE(parse_bundle(bytes, "b.tpb") == b);
}

TEST(VmemPlan, InUseIsTheUnionOfAnOpsBuffers) {
  const auto use = vmem_in_use_by_op(assemble(kPlanned, "p.s").cores[0]);
  ASSERT_EQ(use.size(), 2u);
  EXPECT_EQ(use.at(3), 0x800u + 4096u);  // [0, 4096) and [2048, 6144) overlap by 2048
  EXPECT_EQ(use.at(4), 512u);
  EXPECT_TRUE(vmem_in_use_by_op(assemble(kPlanned, "p.s").cores[1]).empty());
}

TEST(VmemPlan, OpNamesRoundTripAndAreVersion2) {
  const char* text = ".opname 3 \"matmul %h +relu\"\n.opname 12 \"/layer1/conv:0\"\n.core 0\n  op 3\n  halt\n";
  const Bundle b = assemble(text, "p.s");
  const std::map<int32_t, std::string> want = {{3, "matmul %h +relu"}, {12, "/layer1/conv:0"}};
  EXPECT_EQ(b.op_names, want);
  const std::string printed = print_bundle(b);
  EXPECT_NE(printed.find(".opname 12 \"/layer1/conv:0\"\n"), std::string::npos) << printed;
  EXPECT_EQ(assemble(printed, "p.s").op_names, want);
  const auto bytes = serialize_bundle(b);
  EXPECT_EQ(version_of(bytes), 2u);  // names alone make a version 2 file
  EXPECT_EQ(parse_bundle(bytes, "b.tpb").op_names, want);
  // Errors: a name twice, a negative id, no string; a quote smuggled into the file.
  EXPECT_NE(asm_error(".opname 1 \"a\"\n.opname 1 \"b\"\n").find("t.s:2:9: error: op 1 already has a name"),
            std::string::npos);
  EXPECT_NE(asm_error(".opname -1 \"a\"\n").find("op id out of range"), std::string::npos);
  EXPECT_NE(asm_error(".opname 1 a\n").find("usage: .opname N \"name\""), std::string::npos);
  auto bad = bytes;
  const std::string needle = "matmul";
  auto it = std::search(bad.begin(), bad.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bad.end());
  *it = '"';
  EXPECT_NE(load_error(bad).find("b.tpb: inconsistent bundle: op 3: name holds a quote or a control character"),
            std::string::npos)
      << load_error(bad);
}

// Op FLOPs (`.opflops`): text and file round trips, version 3 only when present
// (a bundle without them keeps the version older readers take), every truncation
// of the new section an error, and the directive's own errors.
TEST(VmemPlan, OpFlopsRoundTripAndAreVersion3) {
  const char* text = ".opname 3 \"matmul %h\"\n.opflops 3 1920000\n.opflops 7 1099511627776 + 2\n.core 0\n  op 3\n  halt\n";
  const Bundle b = assemble(text, "p.s");
  const std::map<int32_t, uint64_t> want = {{3, 1920000}, {7, (uint64_t(1) << 40) + 2}};
  EXPECT_EQ(b.op_flops, want);
  const std::string printed = print_bundle(b);
  EXPECT_NE(printed.find(".opflops 7 1099511627778\n"), std::string::npos) << printed;
  EXPECT_EQ(assemble(printed, "p.s").op_flops, want);
  EXPECT_EQ(print_bundle(assemble(printed, "p.s")), printed);
  const auto bytes = serialize_bundle(b);
  EXPECT_EQ(version_of(bytes), 3u);
  EXPECT_TRUE(parse_bundle(bytes, "b.tpb") == b);
  Bundle named = b;
  named.op_flops.clear();
  EXPECT_EQ(version_of(serialize_bundle(named)), 2u);
  // The section is the last before the trailer: cut anywhere in it, the file is bad.
  for (size_t n = bytes.size() - 8 - 4 - 2 * 12; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(load_error(cut).rfind("b.tpb: bad bundle: ", 0), 0u) << n << ": " << load_error(cut);
  }
  EXPECT_NE(asm_error(".opflops 1 5\n.opflops 1 6\n").find("t.s:2:10: error: op 1 already has FLOPs"),
            std::string::npos)
      << asm_error(".opflops 1 5\n.opflops 1 6\n");
  EXPECT_NE(asm_error(".opflops 1 -5\n").find("FLOPs must be non-negative"), std::string::npos);
  EXPECT_NE(asm_error(".opflops 1\n").find("usage: .opflops N FLOPS"), std::string::npos);
}

TEST(VmemPlan, BundlesWithoutAPlanStayVersion1) {
  const char* plain = ".core 0\n  op 1\n  halt\n";
  const auto bytes = serialize_bundle(assemble(plain, "p.s"));
  EXPECT_EQ(version_of(bytes), 1u);
  // A version 1 file (the format before plans) still loads, without a plan.
  const Bundle b = parse_bundle(bytes, "b.tpb");
  EXPECT_TRUE(b.cores[0].vmem_plan.empty());
  EXPECT_EQ(serialize_bundle(b), bytes);
}

TEST(VmemPlan, BadPlansAreOneLineErrors) {
  // Assembler: outside VMEM, empty, missing key, unknown key, bad op id.
  EXPECT_NE(asm_error(".target vmem=64K\n.vmem op=1 addr=0xf000 bytes=8192\n").find("t.s:2:1: error: VMEM buffer does not fit in vmem (65536 bytes)"),
            std::string::npos);
  EXPECT_NE(asm_error(".vmem op=1 addr=0 bytes=0\n").find("t.s:1:1: error: empty VMEM buffer"), std::string::npos);
  EXPECT_NE(asm_error(".vmem op=1 addr=0\n").find("usage: .vmem op=N addr=A bytes=B"), std::string::npos);
  EXPECT_NE(asm_error(".vmem op=1 addr=0 size=4\n").find("unknown key 'size'"), std::string::npos);
  EXPECT_NE(asm_error(".vmem op=-2 addr=0 bytes=4\n").find("op id out of range"), std::string::npos);
  // File: a buffer past the target's VMEM (patched after serialising), truncation
  // inside the plan, and a version this tpusim does not know.
  Bundle b = assemble(kPlanned, "p.s");
  auto bytes = serialize_bundle(b);
  // The last buffer's bytes field: the last 512 as a u64 in the file.
  const uint8_t want[8] = {0x00, 0x02, 0, 0, 0, 0, 0, 0};  // 512
  auto it = std::find_end(bytes.begin(), bytes.end(), want, want + 8);
  ASSERT_NE(it, bytes.end());
  auto bad = bytes;
  bad[static_cast<size_t>(it - bytes.begin()) + 2] = 0x01;  // 512 -> 66048 bytes: past 64 KiB
  EXPECT_NE(load_error(bad).find("b.tpb: inconsistent bundle: chip0.core0 VMEM plan buffer (op 4): does not fit in vmem"),
            std::string::npos)
      << load_error(bad);
  for (size_t n = 12; n < bytes.size(); n += 7) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(load_error(cut).rfind("b.tpb: bad bundle: ", 0), 0u) << n << ": " << load_error(cut);
  }
  bad = bytes;
  bad[8] = 5;
  EXPECT_NE(load_error(bad).find("b.tpb: bundle format version 5, this tpusim reads versions 1 to 4"),
            std::string::npos);
}

}  // namespace
}  // namespace tpusim::isa

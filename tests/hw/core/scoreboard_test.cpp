// The scoreboard against sequential semantics: an access may go ahead only when
// no earlier instruction has a conflicting access pending.
#include <gtest/gtest.h>

#include "hw/core/reg_use.h"
#include "hw/core/scoreboard.h"

namespace {

using tpusim::hw::RegUse;
using tpusim::hw::Scoreboard;

RegUse use(std::initializer_list<int> reads, std::initializer_list<int> writes) {
  RegUse u;
  for (int r : reads) u.read(r);
  for (int w : writes) u.write(w);
  return u;
}

TEST(Scoreboard, ReadAfterWriteWaitsForTheWriter) {
  Scoreboard sb;
  const RegUse w = use({}, {1}), r = use({1}, {2});
  sb.reserve(w, 0);
  sb.reserve(r, 1);
  EXPECT_TRUE(sb.ready(w, 0));
  EXPECT_FALSE(sb.ready(r, 1));
  sb.release(w, 0);
  EXPECT_TRUE(sb.ready(r, 1));
}

TEST(Scoreboard, WriteAfterReadWaitsForTheReader) {
  Scoreboard sb;
  const RegUse r = use({1}, {2}), w = use({}, {1});
  sb.reserve(r, 0);
  sb.reserve(w, 1);
  EXPECT_FALSE(sb.ready(w, 1));
  sb.release(r, 0);
  EXPECT_TRUE(sb.ready(w, 1));
}

TEST(Scoreboard, ReadsDoNotOrderEachOther) {
  Scoreboard sb;
  const RegUse a = use({1}, {2}), b = use({1}, {3});
  sb.reserve(a, 0);
  sb.reserve(b, 1);
  EXPECT_TRUE(sb.ready(b, 1));
}

TEST(Scoreboard, WriteAfterWriteKeepsProgramOrder) {
  Scoreboard sb;
  const RegUse a = use({}, {4}), b = use({}, {4});
  sb.reserve(a, 0);
  sb.reserve(b, 1);
  EXPECT_FALSE(sb.ready(b, 1));
  sb.release(a, 0);
  EXPECT_TRUE(sb.ready(b, 1));
  sb.release(b, 1);
  EXPECT_TRUE(sb.empty());
}

TEST(RegUse, OperandRolesFollowTheSignature) {
  tpusim::isa::Instr in;
  in.op = tpusim::isa::Op::kVsel;  // vsel vd, m, va, vb
  in.a = 1, in.b = 2, in.c = 3, in.d = 4;
  const RegUse u = tpusim::hw::reg_use(in);
  ASSERT_EQ(u.nwrites, 1);
  EXPECT_EQ(u.writes[0], 1);
  ASSERT_EQ(u.nreads, 3);
  EXPECT_EQ(u.reads[0], tpusim::hw::kMaskRegBase + 2);
  in.op = tpusim::isa::Op::kMpopAdd;  // mpop.add vd, mxu: reads and writes vd
  const RegUse p = tpusim::hw::reg_use(in);
  EXPECT_EQ(p.nreads, 1);
  EXPECT_EQ(p.nwrites, 1);
  in.op = tpusim::isa::Op::kVxpose;
  in.a = 16, in.b = 0;
  const RegUse x = tpusim::hw::reg_use(in);
  EXPECT_EQ(x.nreads, 16);
  EXPECT_EQ(x.nwrites, 16);
}

}  // namespace

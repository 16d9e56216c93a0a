// One test per JEDEC constraint: a command sequence that would violate it if issued
// as early as everything else allows is delayed by exactly the constraint. The
// timing table of small_config() has distinct values, and each test's arithmetic
// (in its comments) shows the constraint under test is the binding one.
#include "hbm_test_util.h"

namespace tpusim::hbm::testing {
namespace {

using C = Command;

TEST(HbmTiming, tRCD_ActToRead) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.run_until(500);
  EXPECT_EQ(r.nth(C::kAct).cycle, 1u);  // an idle channel activates on arrival
  EXPECT_EQ(r.nth(C::kRd).cycle - r.nth(C::kAct).cycle, r.cfg.timing[tRCD]);
}

TEST(HbmTiming, tCL_ReadDataEndsTclPlusBurstAfterRead) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.run_until(500);
  const auto done = r.completions();
  ASSERT_EQ(done.size(), 1u);
  const uint64_t rd = r.nth(C::kRd).cycle;
  EXPECT_EQ(done[0].done_ps, r.mem->clock().cycle_to_ps(rd + r.cfg.timing[tCL] + r.cfg.timing[BL] / 2));
}

TEST(HbmTiming, tCWL_WriteDataEndsTcwlPlusBurstAfterWrite) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0, true);
  r.run_until(500);
  const auto done = r.completions();
  ASSERT_EQ(done.size(), 1u);
  const uint64_t wr = r.nth(C::kWr).cycle;
  EXPECT_EQ(done[0].done_ps, r.mem->clock().cycle_to_ps(wr + r.cfg.timing[tCWL] + r.cfg.timing[BL] / 2));
}

TEST(HbmTiming, tRAS_ActToPrecharge) {
  // Row 5 read, then row 6 of the same bank: PRE waits for tRAS (29), which exceeds
  // tRCD + tRTP (11 + 6).
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.burst(1, 0, 0, 6, 0);
  r.run_until(500);
  EXPECT_EQ(r.nth(C::kPre).cycle - r.nth(C::kAct, 0).cycle, r.cfg.timing[tRAS]);
}

TEST(HbmTiming, tWR_WriteRecoveryBeforePrecharge) {
  // WR at 12; PRE at max(ACT + tRAS = 30, WR + tCWL + BL/2 + tWR = 38) = 38.
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0, true);
  r.burst(1, 0, 0, 6, 0);
  r.run_until(500);
  const auto& t = r.cfg.timing;
  EXPECT_EQ(r.nth(C::kPre).cycle - r.nth(C::kWr).cycle, t[tCWL] + t.tBURST() + t[tWR]);
}

TEST(HbmTiming, tRP_PrechargeToActivate) {
  // Same sequence: PRE at 38 (write recovery); ACT at max(PRE + tRP = 51, ACT + tRC = 48).
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0, true);
  r.burst(1, 0, 0, 6, 0);
  r.run_until(500);
  EXPECT_EQ(r.nth(C::kAct, 1).cycle - r.nth(C::kPre).cycle, r.cfg.timing[tRP]);
}

TEST(HbmTiming, tRC_ActToActSameBank) {
  // tRC 60: PRE at 30, PRE + tRP = 43 < ACT + tRC = 61.
  Rig r(small_config("{tRC: 60}"));
  r.burst(1, 0, 0, 5, 0);
  r.burst(1, 0, 0, 6, 0);
  r.run_until(500);
  EXPECT_EQ(r.nth(C::kAct, 1).cycle - r.nth(C::kAct, 0).cycle, 60u);
}

TEST(HbmTiming, tRTP_ReadToPrecharge) {
  // tRAS 12: PRE at max(ACT + tRAS = 13, RD + tRTP = 18).
  Rig r(small_config("{tRAS: 12}"));
  r.burst(1, 0, 0, 5, 0);
  r.burst(1, 0, 0, 6, 0);
  r.run_until(500);
  EXPECT_EQ(r.nth(C::kPre).cycle - r.nth(C::kRd).cycle, r.cfg.timing[tRTP]);
}

// Opens row 5 in (group 0, bank 0) and (group 1, bank 0), then lets the channel idle.
void open_two_groups(Rig& r) {
  r.burst(1, 0, 0, 5, 0);
  r.burst(1, 1, 0, 5, 0);
  r.run_until(300);
}

TEST(HbmTiming, tCCD_S_ColumnToColumnOtherGroup) {
  Rig r(small_config());
  open_two_groups(r);
  r.burst(400, 0, 0, 5, 1);
  r.burst(400, 1, 0, 5, 1);
  r.run_until(800);
  EXPECT_EQ(r.nth(C::kRd, 2).cycle, 400u);
  EXPECT_EQ(r.nth(C::kRd, 3).cycle - r.nth(C::kRd, 2).cycle, r.cfg.timing[tCCD_S]);
}

TEST(HbmTiming, tCCD_L_ColumnToColumnSameGroup) {
  Rig r(small_config());
  open_two_groups(r);
  r.burst(400, 0, 0, 5, 1);
  r.burst(400, 0, 0, 5, 2);
  r.run_until(800);
  EXPECT_EQ(r.nth(C::kRd, 3).cycle - r.nth(C::kRd, 2).cycle, r.cfg.timing[tCCD_L]);
}

TEST(HbmTiming, tRRD_S_ActToActOtherGroup) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.burst(1, 1, 0, 5, 0);
  r.run_until(500);
  EXPECT_EQ(r.nth(C::kAct, 1).cycle - r.nth(C::kAct, 0).cycle, r.cfg.timing[tRRD_S]);
}

TEST(HbmTiming, tRRD_L_ActToActSameGroup) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.burst(1, 0, 1, 5, 0);
  r.run_until(500);
  EXPECT_EQ(r.nth(C::kAct, 1).cycle - r.nth(C::kAct, 0).cycle, r.cfg.timing[tRRD_L]);
}

TEST(HbmTiming, tFAW_FifthActivateWaitsForTheWindow) {
  // ACTs at 1, 6, 11, 16 (tRRD_S); the fifth could go at max(16 + tRRD_S, 1 + tRRD_L)
  // = 21 but the window holds it to 1 + tFAW = 32.
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.burst(1, 1, 0, 5, 0);
  r.burst(1, 2, 0, 5, 0);
  r.burst(1, 3, 0, 5, 0);
  r.burst(1, 0, 1, 5, 0);
  r.run_until(500);
  const auto& t = r.cfg.timing;
  EXPECT_EQ(r.nth(C::kAct, 3).cycle - r.nth(C::kAct, 0).cycle, 3 * t[tRRD_S]);
  EXPECT_EQ(r.nth(C::kAct, 4).cycle - r.nth(C::kAct, 0).cycle, t[tFAW]);
}

TEST(HbmTiming, tWTR_WriteToRead) {
  Rig r(small_config());
  open_two_groups(r);
  r.burst(400, 0, 0, 5, 1, true);
  r.burst(400, 1, 0, 5, 1);
  r.run_until(800);
  const auto& t = r.cfg.timing;
  EXPECT_EQ(r.nth(C::kWr).cycle, 400u);
  EXPECT_EQ(r.nth(C::kRd, 2).cycle - r.nth(C::kWr).cycle, t[tCWL] + t.tBURST() + t[tWTR]);
}

TEST(HbmTiming, tRTRS_ReadToWriteBusTurnaround) {
  // The write's data (WR + tCWL) must start tRTRS after the read's data ends
  // (RD + tCL + BL/2): 17 + 2 + 2 - 5 = 16 > tCCD_S.
  Rig r(small_config());
  open_two_groups(r);
  r.burst(400, 0, 0, 5, 1);
  r.burst(400, 1, 0, 5, 1, true);
  r.run_until(800);
  const auto& t = r.cfg.timing;
  EXPECT_EQ(r.nth(C::kWr).cycle - r.nth(C::kRd, 2).cycle, t[tCL] + t.tBURST() + t[tRTRS] - t[tCWL]);
}

TEST(HbmTiming, tRFC_AllBankRefreshBlocksActivates) {
  Rig r(small_config("{refresh_mode: all_bank, tREFI: 2000}"));
  r.burst(2001, 0, 0, 5, 0);
  r.run_until(2600);
  EXPECT_EQ(r.nth(C::kRef).cycle, 2000u);
  EXPECT_EQ(r.nth(C::kAct).cycle - r.nth(C::kRef).cycle, r.cfg.timing[tRFC]);
}

TEST(HbmTiming, tRFCsb_SingleBankRefreshBlocksThatBank) {
  // tREFI 1600 over 16 banks: a REFSB every 100 cycles, the first at 100 on bank 15
  // (group 3, bank 3: of equally idle banks, the highest in the address space of
  // the mapping "row bank bank_group column").
  Rig r(small_config("{tREFI: 1600}"));
  r.burst(101, 3, 3, 5, 0);
  r.burst(101, 0, 0, 5, 0);
  r.run_until(600);
  const auto ref = r.nth(C::kRefSb);
  EXPECT_EQ(ref.cycle, 100u);
  EXPECT_EQ(ref.bank, 15u);
  // Bank 0 is not refreshing and activates on arrival; bank 15 waits tRFCsb.
  EXPECT_EQ(r.nth(C::kAct, 0).cycle, 101u);
  EXPECT_EQ(r.nth(C::kAct, 0).bank, 0u);
  EXPECT_EQ(r.nth(C::kAct, 1).bank, 15u);
  EXPECT_EQ(r.nth(C::kAct, 1).cycle - ref.cycle, r.cfg.timing[tRFCsb]);
}

std::vector<uint32_t> refsb_banks(const Rig& r, size_t n) {
  std::vector<uint32_t> banks;
  for (const auto& c : r.log())
    if (c.cmd == C::kRefSb && banks.size() < n) banks.push_back(c.bank);
  return banks;
}

TEST(HbmRefreshChoice, IdleBanksFromTheTopOfTheAddressSpaceDown) {
  // "row bank bank_group column": bank is the more significant field, so the
  // highest addresses are bank 3 of groups 3, 2, 1, 0 (flat 15, 11, 7, 3), then bank 2.
  Rig r(small_config("{tREFI: 1600}"));
  r.run_until(1650);
  EXPECT_EQ(refsb_banks(r, 16), (std::vector<uint32_t>{15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0}));
}

TEST(HbmRefreshChoice, AQueuedBankIsNotRefreshed) {
  // A burst for bank 15 is queued when the refresh at 100 is chosen: bank 11 goes instead.
  Rig r(small_config("{tREFI: 1600}"));
  r.burst(100, 3, 3, 5, 0);
  r.run_until(150);
  EXPECT_EQ(refsb_banks(r, 1), (std::vector<uint32_t>{11}));
}

TEST(HbmRefreshChoice, LeastRecentlyActivatedBankFirst) {
  // Closed page: banks 15 and 11 were used (and closed again) before the refresh at
  // 100; the highest bank never activated, 7, goes first. Then bank 3, and the
  // used ones after every unused bank, the one activated earlier (15, at 1) first.
  Rig r(small_config("{tREFI: 1600, page_policy: closed}"));
  r.burst(1, 3, 3, 5, 0);
  r.burst(20, 2, 3, 5, 0);
  r.run_until(1650);
  const auto order = refsb_banks(r, 16);
  ASSERT_EQ(order.size(), 16u);
  EXPECT_EQ(order[0], 7u);
  EXPECT_EQ(order[1], 3u);
  EXPECT_EQ(order[14], 15u);
  EXPECT_EQ(order[15], 11u);
}

TEST(HbmTiming, tREFI_AllBankRefreshInterval) {
  Rig r(small_config("{refresh_mode: all_bank, tREFI: 2000}"));
  r.run_until(10500);
  std::vector<uint64_t> refs;
  for (const auto& c : r.log()) {
    EXPECT_EQ(c.cmd, C::kRef);
    refs.push_back(c.cycle);
  }
  EXPECT_EQ(refs, (std::vector<uint64_t>{2000, 4000, 6000, 8000, 10000}));
}

TEST(HbmTiming, tREFI_EveryBankOncePerIntervalInSingleBankMode) {
  Rig r(small_config("{tREFI: 1600}"));
  r.run_until(3250);  // two full rounds and a bit
  std::vector<uint32_t> hits(16, 0);
  uint64_t prev = 0;
  size_t n = 0;
  for (const auto& c : r.log()) {
    ASSERT_EQ(c.cmd, C::kRefSb);
    EXPECT_EQ(c.cycle - prev, 100u);
    prev = c.cycle;
    if (n++ < 16) ++hits[c.bank];
  }
  EXPECT_EQ(n, 32u);
  for (uint32_t b = 0; b < 16; ++b) EXPECT_EQ(hits[b], 1u) << "bank " << b;
}

TEST(HbmTiming, RefreshClosesAnOpenRowFirst) {
  // All-bank refresh due at 2000 while row 5 is open: PRE at 2000, REF tRP later.
  Rig r(small_config("{refresh_mode: all_bank, tREFI: 2000}"));
  r.burst(1900, 0, 0, 5, 0);
  r.run_until(2500);
  EXPECT_EQ(r.nth(C::kPre).cycle, 2000u);
  EXPECT_EQ(r.nth(C::kRef).cycle - r.nth(C::kPre).cycle, r.cfg.timing[tRP]);
}

TEST(HbmPolicy, OpenPageKeepsTheRowForALaterHit) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.burst(300, 0, 0, 5, 1);
  r.run_until(600);
  size_t acts = 0, pres = 0;
  for (const auto& c : r.log()) acts += c.cmd == C::kAct, pres += c.cmd == C::kPre;
  EXPECT_EQ(acts, 1u);
  EXPECT_EQ(pres, 0u);
  EXPECT_EQ(r.nth(C::kRd, 1).cycle, 300u);
  EXPECT_EQ(r.mem->channel(0).row_hits(), 1u);
}

TEST(HbmPolicy, ClosedPagePrechargesAsSoonAsAllowed) {
  Rig r(small_config("{page_policy: closed}"));
  r.burst(1, 0, 0, 5, 0);
  r.burst(300, 0, 0, 5, 1);
  r.run_until(600);
  // PRE at max(ACT + tRAS, RD + tRTP) = 30; the later read activates again.
  EXPECT_EQ(r.nth(C::kPre, 0).cycle, 1 + r.cfg.timing[tRAS]);
  EXPECT_EQ(r.nth(C::kAct, 1).cycle, 300u);
  EXPECT_EQ(r.nth(C::kRd, 1).cycle, 300 + r.cfg.timing[tRCD]);
  EXPECT_EQ(r.mem->channel(0).counters().row_misses, 2u);
}

TEST(HbmPolicy, FrFcfsServesAYoungerHitBeforeAnOlderMiss) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.run_until(100);
  r.burst(200, 0, 0, 6, 0);  // older, conflicts with the open row
  r.burst(200, 0, 0, 5, 1);  // younger, hits the open row
  r.run_until(600);
  EXPECT_EQ(r.nth(C::kRd, 1).cycle, 200u);
  EXPECT_EQ(r.nth(C::kRd, 1).row, 5u);
  // The conflict's PRE waits for the hit's read: RD + tRTP.
  EXPECT_EQ(r.nth(C::kPre).cycle, 200 + r.cfg.timing[tRTP]);
  EXPECT_EQ(r.mem->channel(0).counters().row_conflicts, 1u);
}

// Hits of both kinds behind misses in one bank's queue: every hit to the open row
// goes before the misses' PRE, whichever kind and however deep in the queue (the
// scheduler keeps each kind's oldest hit, and finds the next one past the misses
// when it issues).
TEST(HbmPolicy, FrFcfsServesEveryHitOfBothKindsBeforeTheMisses) {
  Rig r(small_config());
  r.burst(1, 0, 0, 5, 0);
  r.run_until(100);
  r.burst(200, 0, 0, 6, 0);         // miss
  r.burst(200, 0, 0, 5, 1, true);   // write hit
  r.burst(200, 0, 0, 6, 1);         // miss
  r.burst(200, 0, 0, 5, 2);         // read hit
  r.burst(200, 0, 0, 6, 2, true);   // miss
  r.burst(200, 0, 0, 5, 3, true);   // write hit
  r.burst(200, 0, 0, 5, 4);         // read hit
  r.run_until(2000);
  std::vector<IssuedCommand> col;
  for (const auto& c : r.log())
    if (c.cmd == C::kRd || c.cmd == C::kWr) col.push_back(c);
  ASSERT_EQ(col.size(), 8u);
  const uint64_t pre = r.nth(C::kPre).cycle;
  for (size_t i = 1; i < 5; ++i) {  // after the first read: the four hits, then the PRE
    EXPECT_EQ(col[i].row, 5u) << i;
    EXPECT_LT(col[i].cycle, pre) << i;
  }
  for (size_t i = 5; i < 8; ++i) EXPECT_EQ(col[i].row, 6u) << i;
  // 8 bursts: the first read a miss, the first of row 6 a conflict, the rest hits.
  EXPECT_EQ(r.mem->channel(0).row_hits(), 6u);
  EXPECT_EQ(r.mem->channel(0).counters().row_conflicts, 1u);
}

TEST(HbmBackPressure, FullQueueRejectsUntilABurstIssues) {
  Rig r(small_config("{queue_entries: 4}"));
  for (uint32_t i = 0; i < 4; ++i) r.burst(1, 0, 0, 5, i);
  mem::MemRequest extra;
  extra.id = 99, extra.bytes = 32, extra.addr = 0;
  EXPECT_FALSE(r.mem->try_enqueue(extra, r.mem->clock().cycle_to_ps(0)));
  // A request spanning a full queue and an empty one is refused whole.
  EXPECT_EQ(r.mem->outstanding(), 4u);
  // The first RD leaves the queue at 1 + tRCD = 12.
  EXPECT_FALSE(r.mem->try_enqueue(extra, r.mem->clock().cycle_to_ps(11)));
  EXPECT_TRUE(r.mem->try_enqueue(extra, r.mem->clock().cycle_to_ps(12)));
}

TEST(HbmRequests, LargeUnalignedRequestCompletesWithItsLastBurst) {
  Rig r(small_config());
  mem::MemRequest req;
  req.id = 7, req.addr = 100, req.bytes = 1000;  // bursts 3..34: 32 bursts
  ASSERT_TRUE(r.mem->try_enqueue(req, 0));
  r.run_until(5000);
  const auto done = r.completions();
  ASSERT_EQ(done.size(), 1u);
  size_t reads = 0;
  uint64_t last = 0;
  for (const auto& c : r.log())
    if (c.cmd == C::kRd) ++reads, last = c.cycle;
  EXPECT_EQ(reads, 32u);
  EXPECT_EQ(done[0].done_ps, r.mem->clock().cycle_to_ps(last + r.cfg.timing[tCL] + 2));
}

TEST(HbmRequests, BadRequestsThrowClearly) {
  Rig r(small_config());
  mem::MemRequest req;
  req.bytes = 0;
  EXPECT_THROW(r.mem->try_enqueue(req, 0), std::invalid_argument);
  req.bytes = 64, req.addr = r.cfg.capacity_bytes() - 32;
  try {
    r.mem->try_enqueue(req, 0);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("capacity"), std::string::npos) << e.what();
  }
  req.addr = 0, req.bytes = 65 * 32;  // 65 bursts in the one pseudo-channel, whose queue holds 64
  EXPECT_THROW(r.mem->try_enqueue(req, 0), std::invalid_argument);
  r.run_until(10);
  EXPECT_THROW(r.mem->advance_to(0), std::logic_error);
}

}  // namespace
}  // namespace tpusim::hbm::testing

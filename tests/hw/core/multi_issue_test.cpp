// The sequencer's bundle issue (hw/core/sequencer.cpp, docs/tensorcore.md "Issue"):
// per cycle, in program order, up to issue_per_cycle instructions with at most
// slots.<class> of each class, ending before an instruction that cannot go (a full
// queue), that depends on an earlier member (RAW / WAW on vector, mask or scalar
// registers), or after control flow. Every expected cycle below is derived by hand
// from those rules; the sinks record when each instruction reaches its unit's queue.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw/config/params.h"
#include "hw/core/sequencer.h"
#include "isa/asm/assembler.h"
#include "isa/exec/interpreter.h"

namespace {

using namespace tpusim;

struct Trace {
  std::map<uint32_t, uint64_t> issued;  // pc -> cycle it reached its unit queue
  uint64_t halt_cycle = 0;
  std::vector<hw::Issued> pushed;
};

// One core running `body`; `full(unit, cycle)` says whether that unit's queue is full.
class Harness {
 public:
  Harness(const std::string& body, const hw::SequencerParams& p,
          std::function<bool(isa::Unit, uint64_t)> full = nullptr)
      : bundle_(isa::assemble(".target chips=1 cores=1 mxus=2\n.core chip0.core0\n" + body, "multi_issue.s")),
        ref_(bundle_),
        barrier_(1),
        full_(std::move(full)) {
    env_.machine = &ref_.machine();
    env_.state = &ref_.machine().core(0, 0);
    env_.prog = &bundle_.cores.at(0);
    env_.name = "chip0.core0";
    hw::Sequencer::Sinks sinks;
    sinks.queue_full = [this](isa::Unit u, const isa::Instr&) { return full_ && full_(u, cycle_); };
    sinks.push = [this](isa::Unit, hw::Issued&& it) {
      trace_.issued[it.pc] = cycle_;
      trace_.pushed.push_back(std::move(it));
    };
    sinks.vector_matrix_drained = [] { return true; };
    seq_ = std::make_unique<hw::Sequencer>(env_, barrier_, std::move(sinks), p);
  }
  // Ticks until the sequencer halts; the halt cycle and every queue arrival.
  const Trace& run() {
    for (cycle_ = 0; !seq_->halted() && cycle_ < 1000; ++cycle_) seq_->tick(cycle_);
    EXPECT_TRUE(seq_->halted()) << seq_->blocked_on();
    EXPECT_TRUE(env_.fault.empty()) << env_.fault;
    trace_.halt_cycle = seq_->halt_cycle();
    return trace_;
  }
  hw::CoreEnv& env() { return env_; }
  hw::Sequencer& seq() { return *seq_; }

 private:
  isa::Bundle bundle_;
  exec::Interpreter ref_;
  hw::Barrier barrier_;
  hw::CoreEnv env_;
  std::function<bool(isa::Unit, uint64_t)> full_;
  std::unique_ptr<hw::Sequencer> seq_;
  uint64_t cycle_ = 0;
  Trace trace_;
};

hw::SequencerParams vliw(int width) {
  hw::SequencerParams p;
  p.issue_per_cycle = width;
  p.slots = {2, 1, 1, 1, 1, 1, 2};  // scalar, sync, dma, vector load, vector store, vector ALU, matrix
  return p;
}

// Stream 0 forks stream 1 and runs `stream0` then halts; stream 1 issues `vadds`
// vadds (one a cycle) and then raises flag `flag` by 1.
std::string fork_vadds_then_raise(const std::string& stream0, int vadds, int flag) {
  std::string prog = "  fork a\n" + stream0 + "  halt\na:\n";
  for (int i = 0; i < vadds; ++i) prog += "  vadd v1, v1, v1\n";
  return prog + "  fadd f" + std::to_string(flag) + ", 1\n  halt\n";
}

// Four independent groups {vld, vadd, mmul, mpop}: every register distinct, none
// written twice. Width 8: a group fills one bundle (vld, vector ALU, 2 matrix) and
// the next group's vld finds the load slot taken, so group g issues in cycle g and
// the halt (scalar) joins the last bundle: halt at cycle 3. Width 2: two
// instructions per cycle, 17 instructions -> halt at cycle ceil(17 / 2) - 1 = 8.
// Width 1: the old single issue, halt at cycle 16.
const char* kIndependent = R"(  vld v0, [s0 + 0]
  vadd v8, v20, v21
  mmul mxu0, v22
  mpop v12, mxu1
  vld v1, [s0 + 4096]
  vadd v9, v20, v21
  mmul mxu1, v22
  mpop v13, mxu0
  vld v2, [s0 + 8192]
  vadd v10, v20, v21
  mmul mxu0, v22
  mpop v14, mxu1
  vld v3, [s0 + 12288]
  vadd v11, v20, v21
  mmul mxu1, v22
  mpop v15, mxu0
  halt
)";

TEST(MultiIssue, IndependentMixIssuesOneGroupPerCycleAtWidth8) {
  Harness h(kIndependent, vliw(8));
  const Trace& t = h.run();
  for (uint32_t pc = 0; pc < 16; ++pc) EXPECT_EQ(t.issued.at(pc), pc / 4) << "pc " << pc;
  EXPECT_EQ(t.halt_cycle, 3u);
  EXPECT_EQ(h.seq().counters().get("bundles"), 4u);
  EXPECT_EQ(h.seq().counters().get("instructions"), 17u);
}

TEST(MultiIssue, WidthCapsTheBundle) {
  Harness two(kIndependent, vliw(2));
  const Trace& t2 = two.run();
  for (uint32_t pc = 0; pc < 16; ++pc) EXPECT_EQ(t2.issued.at(pc), pc / 2) << "pc " << pc;
  EXPECT_EQ(t2.halt_cycle, 8u);
  Harness one(kIndependent, vliw(1));
  const Trace& t1 = one.run();
  for (uint32_t pc = 0; pc < 16; ++pc) EXPECT_EQ(t1.issued.at(pc), pc) << "pc " << pc;
  EXPECT_EQ(t1.halt_cycle, 16u);
}

// Three vlds need three bundles (one load slot); the vadds beside them go along.
TEST(MultiIssue, OneInstructionPerSlotClass) {
  Harness h(R"(  vld v0, [s0 + 0]
  vld v1, [s0 + 4096]
  vadd v8, v20, v21
  vld v2, [s0 + 8192]
  vst v20, [s0 + 16384]
  vst v21, [s0 + 20480]
  halt
)",
            vliw(8));
  const Trace& t = h.run();
  // {vld v0} {vld v1, vadd} {vld v2, vst v20} {vst v21, halt}
  EXPECT_EQ(t.issued.at(0), 0u);
  EXPECT_EQ(t.issued.at(1), 1u);
  EXPECT_EQ(t.issued.at(2), 1u);
  EXPECT_EQ(t.issued.at(3), 2u);
  EXPECT_EQ(t.issued.at(4), 2u);
  EXPECT_EQ(t.issued.at(5), 3u);
  EXPECT_EQ(t.halt_cycle, 3u);
}

// A read of a register an earlier member writes (RAW), or a second write (WAW),
// starts a new bundle; reading first and writing after (WAR) shares one.
TEST(MultiIssue, ADependentPairDoesNotDualIssue) {
  Harness raw("  vld v1, [s0 + 0]\n  vadd v2, v1, v1\n  halt\n", vliw(8));
  EXPECT_EQ(raw.run().issued.at(1), 1u);
  Harness waw("  vld v1, [s0 + 0]\n  vadd v1, v3, v3\n  halt\n", vliw(8));
  EXPECT_EQ(waw.run().issued.at(1), 1u);
  Harness mask("  vcmp.lt m1, v2, v3\n  vld v4, [s0 + 0], mask=m1\n  halt\n", vliw(8));
  EXPECT_EQ(mask.run().issued.at(1), 1u);
  Harness pop("  mpop v5, mxu0\n  mpop.add v5, mxu1\n  halt\n", vliw(8));  // an accumulation chain
  EXPECT_EQ(pop.run().issued.at(1), 1u);
  Harness war("  vadd v2, v1, v1\n  vld v1, [s0 + 0]\n  halt\n", vliw(8));
  const Trace& t = war.run();
  EXPECT_EQ(t.issued.at(0), 0u);
  EXPECT_EQ(t.issued.at(1), 0u);
}

// The WAR pair above went out in one cycle: the scoreboard reservation the vadd
// made first is what the vld's check sees, so the vld may not write v1 before the
// vadd has read it, and may once the vadd retires.
TEST(MultiIssue, ScoreboardOrdersAHazardInsideOneBundle) {
  Harness h("  vadd v2, v1, v1\n  vld v1, [s0 + 0]\n  halt\n", vliw(8));
  const Trace& t = h.run();
  ASSERT_EQ(t.pushed.size(), 2u);
  const hw::Issued& vadd = t.pushed[0];
  const hw::Issued& vld = t.pushed[1];
  EXPECT_EQ(vadd.issue_cycle, vld.issue_cycle);
  EXPECT_LT(vadd.seq, vld.seq);
  EXPECT_TRUE(h.env().scoreboard.ready(vadd.use, vadd.seq));
  EXPECT_FALSE(h.env().scoreboard.ready(vld.use, vld.seq));
  h.env().scoreboard.release(vadd.use, vadd.seq);
  EXPECT_TRUE(h.env().scoreboard.ready(vld.use, vld.seq));
}

// Scalar registers: a vld addressed by a register the bundle's li writes waits a
// cycle and sees the new value; one addressed by another register joins.
TEST(MultiIssue, ScalarResultIsNotReadInItsOwnBundle) {
  Harness dep("  li s1, 4096\n  vld v0, [s1 + 0]\n  halt\n", vliw(8));
  const Trace& t = dep.run();
  EXPECT_EQ(t.issued.at(1), 1u);
  EXPECT_EQ(t.pushed.at(0).s[1], 4096);
  Harness indep("  li s1, 4096\n  vld v0, [s2 + 0]\n  halt\n", vliw(8));
  EXPECT_EQ(indep.run().issued.at(1), 0u);
}

// A branch ends its bundle; the instruction after the target starts the next.
TEST(MultiIssue, ControlFlowEndsTheBundle) {
  Harness h("  li s1, 1\n  jmp next\nnext:\n  vld v0, [s0 + 0]\n  halt\n", vliw(8));
  const Trace& t = h.run();
  EXPECT_EQ(t.issued.at(2), 1u);  // li + jmp in cycle 0
  EXPECT_EQ(t.halt_cycle, 1u);
}

// In order: an mmul whose queue is full stops the bundle, and the independent vadd
// behind it waits too. The matrix queue frees at cycle 3: {mmul, vadd, halt} then.
TEST(MultiIssue, AFullQueueStopsTheBundleInOrder) {
  Harness h("  vld v0, [s0 + 0]\n  mmul mxu0, v5\n  vadd v8, v20, v21\n  halt\n", vliw(8),
            [](isa::Unit u, uint64_t cycle) { return u == isa::Unit::kMatrix && cycle < 3; });
  const Trace& t = h.run();
  EXPECT_EQ(t.issued.at(0), 0u);
  EXPECT_EQ(t.issued.at(1), 3u);
  EXPECT_EQ(t.issued.at(2), 3u);
  EXPECT_EQ(t.halt_cycle, 3u);
  EXPECT_EQ(h.seq().counters().get("stall_queue_full_cycles"), 2u);  // cycles 1 and 2
}

// Streams: after `fork`, a cycle's bundle comes from the first stream, in turns
// starting after the one that issued last, that can issue. Single issue: cycle 0
// fork (stream 0); 1 stream 1's vadd (its turn); 2 stream 0 is blocked on f3, so
// stream 1's fadd; 3 stream 0's wait goes (f3 = 1); 4 stream 1's halt (stream 1
// stops, the core does not); 5 vld; 6 halt, the core's last stream.
TEST(MultiIssue, AForkedStreamIssuesWhileTheOtherWaits) {
  Harness h("  fork s1\n  wait f3, 1\n  vld v0, [s0 + 0]\n  halt\ns1:\n  vadd v8, v20, v21\n  fadd f3, 1\n  halt\n",
            hw::SequencerParams{});
  const Trace& t = h.run();
  EXPECT_EQ(t.issued.at(4), 1u);  // vadd
  EXPECT_EQ(t.issued.at(2), 5u);  // vld
  EXPECT_EQ(t.halt_cycle, 6u);
  EXPECT_EQ(h.seq().counters().get("forks"), 1u);
  EXPECT_EQ(h.seq().counters().get("stall_flag_cycles"), 0u);  // stream 1 issued in the cycle stream 0 was blocked
  EXPECT_EQ(h.env().state->flags[3], 1);
}

// wait.any on the chip model: stream 0 waits for f3 or f4 while stream 1 issues
// kVadds vadds and then raises f4 (cycle kVadds + 1); stream 0's wait.any goes in
// the next cycle, ftest then reads f3 low and f4 high, and the vld after them
// issues 4 cycles later (single issue, streams in turn: stream 1's halt, ftest,
// ftest). The waiting is counted on the first flag named.
TEST(MultiIssue, WaitAnyRetiresOnTheFlagThatRises) {
  constexpr int kVadds = 6;
  Harness h(fork_vadds_then_raise("  wait.any f3, 1, f4, 1\n  ftest s5, f3, 1\n  ftest s6, f4, 1\n  vld v0, [s0 + 0]\n",
                                  kVadds, 4),
            hw::SequencerParams{});
  const Trace& t = h.run();
  EXPECT_EQ(h.env().state->s[5], 0);
  EXPECT_EQ(h.env().state->s[6], 1);
  EXPECT_EQ(t.issued.at(4), kVadds + 2u + 4u);
  EXPECT_EQ(h.seq().counters().get("wait_any_second"), 1u);
  const nlohmann::json ops = h.env().profile.to_json()["ops"];
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0]["wait_cycles_by_stream_flag"], (nlohmann::json{{"s0.f3", kVadds + 1}})) << ops[0].dump();
}

// The reference's rules, in the same words: only stream 0 forks, and not while
// every other stream runs; a barrier in a forked stream faults.
TEST(MultiIssue, ForkFaultsLikeTheReference) {
  const char* bad[] = {"  fork a\n  fork a\n  fork a\n  fork a\n  halt\na:\n  wait f1, 1\n  halt\n",
                       "  fork a\n  halt\na:\n  fork b\nb:\n  halt\n", "  fork a\n  halt\na:\n  barrier\n  halt\n"};
  const char* why[] = {"fork while streams 1..3 all run", "fork from stream 1", "barrier in stream 1"};
  for (int i = 0; i < 3; ++i) {
    Harness h(bad[i], hw::SequencerParams{});
    for (uint64_t c = 0; c < 20 && h.env().fault.empty(); ++c) h.seq().tick(c);
    EXPECT_NE(h.env().fault.find(why[i]), std::string::npos) << h.env().fault;
    const isa::Bundle b = isa::assemble(std::string(".core chip0.core0\n") + bad[i], "r.s");
    exec::Interpreter ref(b);
    const exec::RunResult r = ref.run();
    EXPECT_EQ(r.status, exec::RunResult::Status::kFault);
    EXPECT_NE(r.message.find(why[i]), std::string::npos) << r.message;
  }
}

// Each fork starts the lowest idle stream: fork a -> 1, fork b -> 2; a halts,
// then fork c -> 1 again, fork d -> 3. b, c and d then wait forever, and both the
// sequencer's blocked-core report and the reference's deadlock report name the
// stream each waits in.
TEST(MultiIssue, ForksStartTheLowestIdleStream) {
  const char* prog =
      "  fork a\n  fork b\n  wait f1, 1\n  fork c\n  fork d\n  wait f9, 1\n  halt\n"
      "a:\n  fadd f1, 1\n  halt\nb:\n  wait f7, 1\n  halt\nc:\n  wait f6, 1\n  halt\nd:\n  wait f5, 1\n  halt\n";
  Harness h(prog, hw::SequencerParams{});
  for (uint64_t c = 0; c < 40 && h.env().fault.empty(); ++c) h.seq().tick(c);
  EXPECT_TRUE(h.env().fault.empty()) << h.env().fault;
  EXPECT_EQ(h.seq().counters().get("forks"), 4u);
  const std::string seq = h.seq().blocked_on();
  const isa::Bundle bundle = isa::assemble(std::string(".core chip0.core0\n") + prog, "r.s");
  exec::Interpreter ref(bundle);
  const exec::RunResult r = ref.run();
  EXPECT_EQ(r.status, exec::RunResult::Status::kDeadlock);
  for (const auto& [stream, flag] : {std::pair<int, int>{1, 6}, {2, 7}, {3, 5}}) {
    const std::regex in_seq("stream " + std::to_string(stream) + ": [^;]* waits for f" + std::to_string(flag) + " ");
    EXPECT_TRUE(std::regex_search(seq, in_seq)) << seq;
    const std::regex in_ref("stream " + std::to_string(stream) + " instruction [^\\n]* waits for f" + std::to_string(flag) + " ");
    EXPECT_TRUE(std::regex_search(r.message, in_ref)) << r.message;
  }
}

// Four streams at once: stream 0 forks three that each wait for a flag the next
// one raises, so they can only finish if all three run together (a fourth fork
// while they run faults, above).
TEST(MultiIssue, ThreeForkedStreamsRunTogether) {
  const char* prog =
      "  fork a\n  fork b\n  fork c\n  fadd f5, 1\n  wait f1, 1\n  halt\n"
      "a:\n  wait f2, 1\n  fadd f1, 1\n  halt\nb:\n  wait f3, 1\n  fadd f2, 1\n  halt\n"
      "c:\n  wait f5, 1\n  fadd f3, 1\n  halt\n";
  Harness h(prog, hw::SequencerParams{});
  h.run();
  EXPECT_TRUE(h.env().fault.empty()) << h.env().fault;
  EXPECT_EQ(h.env().state->flags[1], 1);
  const isa::Bundle b = isa::assemble(std::string(".core chip0.core0\n") + prog, "r.s");
  exec::Interpreter ref(b);
  ASSERT_TRUE(ref.run().ok());
  EXPECT_EQ(ref.machine().core(0, 0).flags[1], 1);
}

// Per-stream waits: stream 0 waits on f1 while stream 1 issues one vadd a cycle
// (one vector ALU slot a bundle) and then sets f1, so the core never stalls and
// its per-flag waits show nothing, while stream 0's own wait covers stream 1's
// K vadd cycles, from the cycle after the fork (stream 0 reaches its wait) to
// the fadd's cycle: K + 1 cycles (the fadd issues in the bundle after the last
// vadd, and the wait is checked before it in that cycle).
TEST(MultiIssue, EachStreamsFlagWaitsWhileAnotherIssues) {
  constexpr int kVadds = 20;
  Harness h(fork_vadds_then_raise("  wait f1, 1\n", kVadds, 1), hw::SequencerParams{});
  h.run();
  const nlohmann::json ops = h.env().profile.to_json()["ops"];
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_FALSE(ops[0].contains("wait_cycles_by_flag")) << ops[0].dump();
  ASSERT_TRUE(ops[0].contains("wait_cycles_by_stream_flag")) << ops[0].dump();
  EXPECT_EQ(ops[0]["wait_cycles_by_stream_flag"], (nlohmann::json{{"s0.f1", kVadds + 1}})) << ops[0].dump();
}

// The presets' values reach the sequencer, and --set overrides them.
TEST(MultiIssue, PresetParametersAndOverrides) {
  const hw::SequencerParams v3 = hw::SequencerParams::from_config(config::load_preset("v3"));
  EXPECT_EQ(v3.issue_per_cycle, 8);
  EXPECT_EQ(v3.slots[static_cast<size_t>(hw::IssueSlot::kMatrix)], 2);
  const hw::SequencerParams v5e = hw::SequencerParams::from_config(config::load_preset("v5e"));
  EXPECT_EQ(v5e.slots[static_cast<size_t>(hw::IssueSlot::kMatrix)], 4);
  const hw::SequencerParams one = hw::SequencerParams::from_config(
      config::load_preset("v3", {"core.sequencer.issue_per_cycle=1", "core.sequencer.slots.vector_load=2"}));
  EXPECT_EQ(one.issue_per_cycle, 1);
  EXPECT_EQ(one.slots[static_cast<size_t>(hw::IssueSlot::kVectorLoad)], 2);
  EXPECT_THROW(hw::SequencerParams::from_config(config::load_preset("v3", {"core.sequencer.slots.matrix=0"})),
               config::ConfigError);
}

}  // namespace

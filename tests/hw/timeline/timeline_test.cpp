// The timeline writer against the validator, and the validator against
// hand-written traces that break each of its rules.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "hw/timeline/timeline.h"

namespace tpusim::timeline {
namespace {

using nlohmann::json;

Options options(double clock_hz) {
  Options o;
  o.clock_hz = clock_hz;
  return o;
}

int count_threads_named_like(const json& doc, const std::string& prefix) {
  int n = 0;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"].get<std::string>().rfind(prefix, 0) == 0) ++n;
  return n;
}

TEST(Timeline, PipelinedSlicesSpreadOverNestingLanes) {
  Timeline tl(options(1e9));
  const TrackId mxu = tl.track("chip0", "core0.mxu0");
  // Ops of 100 cycles issued every 30 cycles: at most ceil(100/30) = 4 in flight.
  for (int i = 0; i < 10; ++i) tl.slice(mxu, "op" + std::to_string(i), 30u * i, 30u * i + 100);
  const std::string text = tl.to_json();
  EXPECT_EQ(validate(text), std::vector<std::string>{});
  EXPECT_EQ(count_threads_named_like(json::parse(text), "core0.mxu0"), 4);
}

// What the run command builds the VMEM counter and the op names from: a track's
// slices in recording order, renamed only at write time, and a counter of bytes
// on the chip's process that the validator accepts.
TEST(Timeline, SlicesOnATrackRenamesAndAByteCounter) {
  Timeline tl(options(1e9));
  const TrackId seq = tl.track("chip0", "core0.sequencer");
  const TrackId mxu = tl.track("chip0", "core0.mxu0");
  tl.slice(seq, "op 0", 0, 10);
  tl.slice(mxu, "op 0", 2, 8);
  tl.slice(seq, "op 1", 10, 25);
  const auto spans = tl.slices_on(seq);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[1].begin, 10u);
  EXPECT_EQ(spans[1].end, 25u);
  EXPECT_EQ(spans[1].name, "op 1");
  tl.counter(seq, "chip0.core0.vmem bytes in use", 0, 73728);
  tl.counter(seq, "chip0.core0.vmem bytes in use", 25, 0);
  tl.rename_slices({{"op 0", "op 0: matmul %h"}});
  EXPECT_EQ(tl.slices_on(seq)[0].name, "op 0");  // recorded names stay as the units wrote them
  const std::string text = tl.to_json();
  EXPECT_EQ(validate(text), std::vector<std::string>{});
  int renamed = 0, kept = 0, other = 0, samples = 0;
  const json doc = json::parse(text);
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") (e["name"] == "op 0: matmul %h" ? renamed : e["name"] == "op 1" ? kept : other) += 1;
    if (e["ph"] == "C" && e["name"] == "chip0.core0.vmem bytes in use") ++samples;
  }
  EXPECT_EQ(renamed, 2);  // on every track
  EXPECT_EQ(kept, 1);
  EXPECT_EQ(other, 0);
  EXPECT_EQ(samples, 2);
}

TEST(Timeline, NestedSlicesShareOneLane) {
  Timeline tl(options(1e9));
  const TrackId seq = tl.track("chip0", "core0.sequencer");
  tl.slice(seq, "outer", 0, 100);
  tl.slice(seq, "inner", 10, 20);
  tl.slice(seq, "inner2", 20, 100);
  tl.slice(seq, "next", 100, 150);
  const std::string text = tl.to_json();
  EXPECT_EQ(validate(text), std::vector<std::string>{});
  EXPECT_EQ(count_threads_named_like(json::parse(text), "core0.sequencer"), 1);
}

TEST(Timeline, TimestampsAreMicrosecondsAtTheClock) {
  Timeline tl(options(940e6));
  const TrackId t = tl.track("chip0", "core0.dma0");
  tl.slice(t, "copy", 940, 1880);  // 1 us to 2 us
  const json doc = json::parse(tl.to_json());
  bool found = false;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X") {
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 1.0);
      found = true;
    }
  EXPECT_TRUE(found);
}

TEST(Timeline, FlowsHaveBothEndsAndWindowDropsWholeFlows) {
  Options opt = options(1e9);
  opt.window_begin_cycle = 100;
  opt.window_end_cycle = 1000;
  Timeline tl(opt);
  const TrackId dma = tl.track("chip0", "core0.dma0");
  const TrackId vpu = tl.track("chip0", "core0.vpu");
  tl.slice(dma, "load x", 150, 300);
  tl.slice(vpu, "add", 300, 310);
  tl.flow(dma, 299, vpu, 300, "x");
  tl.slice(dma, "early", 0, 50);         // outside the window
  tl.flow(dma, 10, vpu, 300, "early");  // one end outside: dropped whole
  const std::string text = tl.to_json();
  EXPECT_EQ(validate(text), std::vector<std::string>{});
  int flow_events = 0, slices = 0;
  const json doc = json::parse(text);
  for (const auto& e : doc["traceEvents"]) {
    flow_events += e["ph"] == "s" || e["ph"] == "f";
    slices += e["ph"] == "X";
  }
  EXPECT_EQ(flow_events, 2);
  EXPECT_EQ(slices, 2);
}

// `tpusim run --timeline-scope`: only the processes a glob matches get events and
// names; a flow to a dropped process is dropped whole; the cap counts only what
// was kept, so one chip of a big board fits under it.
TEST(Timeline, ProcessGlobsKeepOnlyTheirChips) {
  Options opt = options(1e9);
  opt.processes = {"chip1", "chip1?"};
  Timeline tl(opt);
  std::vector<TrackId> dma;
  for (int c = 0; c < 12; ++c) dma.push_back(tl.track("chip" + std::to_string(c), "core0.dma0"));
  for (int c = 0; c < 12; ++c) {
    tl.slice(dma[c], "load", 10, 20);
    tl.counter(dma[c], "depth", 15, 2.0);
    tl.rate(dma[c], "HBM bandwidth (GB/s)", 10, 20, 4096.0);
  }
  tl.flow(dma[1], 15, dma[10], 20, "kept");
  tl.flow(dma[1], 15, dma[2], 20, "dropped");
  const std::string text = tl.to_json();
  EXPECT_EQ(validate(text), std::vector<std::string>{});
  std::set<std::string> named, with_events;
  std::map<int, std::string> pid_name;
  int flow_events = 0;
  const json doc = json::parse(text);
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") pid_name[e["pid"].get<int>()] = e["args"]["name"];
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M") {
      named.insert(pid_name.at(e["pid"].get<int>()));
      continue;
    }
    flow_events += e["ph"] == "s" || e["ph"] == "f";
    with_events.insert(pid_name.at(e["pid"].get<int>()));
  }
  const std::set<std::string> expect{"chip1", "chip10", "chip11"};
  EXPECT_EQ(named, expect);
  EXPECT_EQ(with_events, expect);
  EXPECT_EQ(flow_events, 2);
  // 3 chips x (slice + counter) + the kept flow's 2 ends; rates are written, not capped.
  EXPECT_EQ(tl.recorded_events(), 8u);
  EXPECT_EQ(tl.dropped_events(), 0u);
}

TEST(Timeline, EventCapCountsWhatItDrops) {
  Options opt = options(1e9);
  opt.max_events = 5;
  Timeline tl(opt);
  const TrackId t = tl.track("chip0", "hbm.ch0");
  for (int i = 0; i < 8; ++i) tl.counter(t, "bandwidth", i, i * 1.5);
  EXPECT_EQ(tl.recorded_events(), 5u);
  EXPECT_EQ(tl.dropped_events(), 3u);
  const json doc = json::parse(tl.to_json());
  EXPECT_EQ(doc["otherData"]["dropped_events"], 3);
  EXPECT_EQ(validate(doc.dump()), std::vector<std::string>{});
}

TEST(Timeline, WriteFailureLeavesNoFile) {
  Timeline tl(options(1e9));
  const std::string path = "/nonexistent-dir/timeline.json";
  EXPECT_THROW(tl.write(path), std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
}

// The validator itself: each rule broken once.
TEST(TimelineValidator, RejectsPartialOverlap) {
  const char* text = R"({"traceEvents":[
    {"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"chip0"}},
    {"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"u"}},
    {"name":"a","ph":"X","pid":1,"tid":1,"ts":0,"dur":10},
    {"name":"b","ph":"X","pid":1,"tid":1,"ts":5,"dur":10}]})";
  const auto problems = validate(text);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("without nesting"), std::string::npos);
}

TEST(TimelineValidator, RejectsDanglingFlowMissingNamesAndBadFields) {
  const char* text = R"({"traceEvents":[
    {"name":"a","ph":"X","pid":1,"tid":1,"ts":0,"dur":-1},
    {"name":"f","ph":"s","id":7,"pid":1,"tid":1,"ts":0},
    {"ph":"X","pid":1,"tid":1,"ts":0,"dur":1},
    {"name":"c","ph":"C","pid":1,"ts":0,"args":{"v":"high"}}]})";
  const auto problems = validate(text);
  auto has = [&](const std::string& what) {
    for (const auto& p : problems)
      if (p.find(what) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("non-negative dur"));
  EXPECT_TRUE(has("flow 7 does not have both ends"));
  EXPECT_TRUE(has("no name"));
  EXPECT_TRUE(has("is not a number"));
  EXPECT_TRUE(has("has no process_name"));
  EXPECT_TRUE(has("has no thread_name"));
}

TEST(TimelineValidator, RejectsNonJson) { EXPECT_FALSE(validate("{\"traceEvents\": [").empty()); }

}  // namespace
}  // namespace tpusim::timeline

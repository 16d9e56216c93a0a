// Proves the SystemC test plumbing: the sc_main runner really runs gtest, and a
// clocked process sees exactly the number of edges the clock period implies.
#include <gtest/gtest.h>

#include <systemc>

namespace {

struct EdgeCounter : sc_core::sc_module {
  sc_core::sc_in<bool> clk;
  int edges = 0;
  SC_HAS_PROCESS(EdgeCounter);
  explicit EdgeCounter(sc_core::sc_module_name name) : sc_module(name), clk("clk") {
    SC_METHOD(on_edge);
    sensitive << clk.pos();
    dont_initialize();
  }
  void on_edge() { ++edges; }
};

TEST(SystemCSmoke, ClockEdgesMatchPeriod) {
  sc_core::sc_clock clk("clk", 1, sc_core::SC_NS);
  EdgeCounter counter("counter");
  counter.clk(clk);
  sc_core::sc_start(100, sc_core::SC_NS);
  // Rising edges at 0, 1, ..., 99 ns.
  EXPECT_EQ(counter.edges, 100);
}

}  // namespace

// A small waveform worth looking at: an 8 x 8 per-PE MXU grid (MxuDetailed,
// Datapath::kPerPe, one PE per cycle) running two weight tiles through four
// mmuls, the second tile pushed while the first one's mmuls stream (double
// buffering), every PE's partial sum and entering activation traced to a VCD.
// scripts/wave_screenshot.sh turns it into docs/images/mxu_wave.png.
//
//   mxu_wave OUT_BASE        writes OUT_BASE.vcd
//
// Values are small integers, exact in bf16 and in every fp32 partial sum, so the
// popped results are checked against a plain triple loop; the program exits 1 on
// a mismatch. It prints the last mmul's row 7 (what the bottom PE row holds when
// the array drains) for the test to find in the VCD.
#include <cstdio>
#include <map>
#include <string>
#include <systemc>
#include <vector>

#include "hw/mxu/mxu_sc.h"

namespace {

using namespace tpusim::hw::mxu;

constexpr int kN = 8;  // R = C = 8

using Matrix = std::vector<std::vector<float>>;

Matrix weights(int tile) {
  Matrix w(kN, std::vector<float>(kN));
  for (int k = 0; k < kN; ++k)
    for (int c = 0; c < kN; ++c) w[k][c] = float((k * 3 + c * 5 + tile * 2) % 7 - 3);
  return w;
}

Matrix lhs(int mmul) {
  Matrix a(kN, std::vector<float>(kN));
  for (int m = 0; m < kN; ++m)
    for (int k = 0; k < kN; ++k) a[m][k] = float((m + 2 * k + 3 * mmul) % 5 - 2);
  return a;
}

Matrix reference(const Matrix& a, const Matrix& w) {
  Matrix out(kN, std::vector<float>(kN, 0.0f));
  for (int m = 0; m < kN; ++m)
    for (int c = 0; c < kN; ++c)
      for (int k = 0; k < kN; ++k) out[m][c] += a[m][k] * w[k][c];
  return out;
}

// Sublane s, lane l = row s, column l of an 8 x 8 matrix; lanes past the array unused.
Vreg to_vreg(const Matrix& m) {
  Vreg v;
  for (int s = 0; s < kN; ++s)
    for (int l = 0; l < kN; ++l) v.at(s, l) = m[s][l];
  return v;
}

MxuOp op(MxuOpKind kind, uint64_t tag, const Vreg& data = Vreg{}) {
  MxuOp o;
  o.kind = kind;
  o.tag = tag;
  o.data = data;
  return o;
}

}  // namespace

int sc_main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mxu_wave OUT_BASE   (writes OUT_BASE.vcd)\n");
    return 2;
  }
  MxuParams hw;
  hw.rows = hw.cols = kN;
  hw.pes_per_cycle = 1;
  hw.fixed_latency_cycles = 2;
  const sc_core::sc_time cycle(1, sc_core::SC_NS);
  sc_core::sc_clock clk("clk", cycle);
  MxuDetailed mxu("mxu0", hw, cycle, MxuDetailed::Datapath::kPerPe);
  mxu.clk(clk);
  sc_core::sc_report_handler::set_actions(sc_core::SC_INFO, sc_core::SC_DO_NOTHING);
  sc_core::sc_trace_file* tf = sc_core::sc_create_vcd_trace_file(argv[1]);
  tf->set_time_unit(100, sc_core::SC_PS);  // the clock's falling edge sits at half a cycle
  sc_core::sc_trace(tf, clk, "clk");
  mxu.trace(tf);

  // mmul i runs on tile (i < 3 ? 0 : 1); pop tag i returns mmul i.
  const int mmuls = 4;
  std::map<uint64_t, Vreg> popped;
  mxu.queue().on_pop = [&](const PoppedVreg& p) { popped[p.tag] = p.data; };
  std::string fault;
  mxu.queue().on_fault = [&](const MxuOp&, const std::string& msg) { fault = msg; };
  uint64_t tag = 100;
  mxu.submit(op(MxuOpKind::kPush, tag++, to_vreg(weights(0))));
  mxu.submit(op(MxuOpKind::kSwap, tag++));
  mxu.submit(op(MxuOpKind::kMatmul, tag++, to_vreg(lhs(0))));
  mxu.submit(op(MxuOpKind::kPush, tag++, to_vreg(weights(1))));  // staged behind the active tile
  mxu.submit(op(MxuOpKind::kMatmul, tag++, to_vreg(lhs(1))));
  mxu.submit(op(MxuOpKind::kMatmul, tag++, to_vreg(lhs(2))));
  mxu.submit(op(MxuOpKind::kPop, 0));
  mxu.submit(op(MxuOpKind::kSwap, tag++));
  mxu.submit(op(MxuOpKind::kMatmul, tag++, to_vreg(lhs(3))));
  mxu.submit(op(MxuOpKind::kPop, 1));
  mxu.submit(op(MxuOpKind::kPop, 2));
  mxu.submit(op(MxuOpKind::kPop, 3));

  for (int step = 0; step < 100 && (!mxu.idle() || popped.size() < mmuls) && fault.empty(); ++step)
    sc_core::sc_start(sc_core::sc_time(10, sc_core::SC_NS));
  sc_core::sc_start(sc_core::sc_time(4, sc_core::SC_NS));  // a few idle cycles at the end of the picture
  sc_core::sc_close_vcd_trace_file(tf);
  if (!fault.empty()) {
    std::fprintf(stderr, "mxu_wave: MXU fault: %s\n", fault.c_str());
    return 1;
  }
  if (popped.size() != mmuls) {
    std::fprintf(stderr, "mxu_wave: %zu of %d results popped\n", popped.size(), mmuls);
    return 1;
  }
  Matrix last;
  for (int i = 0; i < mmuls; ++i) {
    const Matrix want = reference(lhs(i), weights(i < 3 ? 0 : 1));
    for (int m = 0; m < kN; ++m)
      for (int c = 0; c < kN; ++c)
        if (popped[uint64_t(i)].at(m, c) != want[m][c]) {
          std::fprintf(stderr, "mxu_wave: mmul %d row %d column %d: got %g, want %g\n", i, m, c,
                       double(popped[uint64_t(i)].at(m, c)), double(want[m][c]));
          return 1;
        }
    last = want;
  }
  std::printf("cycles %llu\nlast_mmul_row7", static_cast<unsigned long long>(sc_core::sc_time_stamp() / cycle));
  for (int c = 0; c < kN; ++c) std::printf(" %g", double(last[kN - 1][c]));
  std::printf("\n");
  return 0;
}

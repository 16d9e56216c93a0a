// The MXU's systolic array as RTL would draw it: R x C processing elements (PE
// sc_modules) wired with sc_signals. Activations enter each row at the left and
// move right; partial sums start at +0.0 above row 0 and move down; each PE keeps
// two weights (double buffer) and uses the one the wavefront's bank bit names.
// A pipeline register sits after every P-th PE in both directions (P =
// pes_per_cycle) and below the last row; between registers PEs are chained
// combinationally, so a value crosses P PEs per cycle.
//
// The PE adds its product, rounded once to fp32, to the partial sum from above:
// the chain down a column is exactly the numerics contract's increasing-k order
// from +0.0. Meant for arrays up to 32 x 32 and for waveforms; the tile model
// (mxu_core.h) is the fast equivalent, and tests hold the two equal row by row
// and cycle by cycle.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <systemc>

#include "hw/mxu/mxu_params.h"

namespace tpusim::hw::mxu {

// What moves right: one bf16 LHS value with the wavefront's tag (mmul seq * 8 + row).
struct PeActivation {
  uint16_t value = 0;
  uint8_t bank = 0;
  bool valid = false;
  uint64_t tag = 0;
  bool operator==(const PeActivation& o) const {
    return value == o.value && bank == o.bank && valid == o.valid && tag == o.tag;
  }
};

// What moves down: the fp32 partial sum of one output element.
struct PePartialSum {
  float sum = 0.0f;
  bool valid = false;
  uint64_t tag = 0;
  bool operator==(const PePartialSum& o) const;  // bitwise on sum (-0.0 and NaN are distinct values)
};

std::ostream& operator<<(std::ostream& os, const PeActivation& a);
std::ostream& operator<<(std::ostream& os, const PePartialSum& p);
void sc_trace(sc_core::sc_trace_file* tf, const PeActivation& a, const std::string& name);
void sc_trace(sc_core::sc_trace_file* tf, const PePartialSum& p, const std::string& name);

class Pe : public sc_core::sc_module {
 public:
  sc_core::sc_in<bool> clk{"clk"};
  sc_core::sc_in<PeActivation> act_in{"act_in"};
  sc_core::sc_in<PePartialSum> psum_in{"psum_in"};
  sc_core::sc_out<PeActivation> act_out{"act_out"};
  sc_core::sc_out<PePartialSum> psum_out{"psum_out"};

  uint16_t weight[2] = {0, 0};  // bf16, one per bank
  float psum = 0.0f;            // the partial sum this PE last produced (traced)

  SC_HAS_PROCESS(Pe);
  Pe(sc_core::sc_module_name name, bool register_act, bool register_psum);

 private:
  PePartialSum compute(const PeActivation& a, const PePartialSum& in);
  void combinational();
  void on_clock();
  bool register_act_, register_psum_;
};

class PeGrid : public sc_core::sc_module {
 public:
  sc_core::sc_in<bool> clk{"clk"};

  PeGrid(sc_core::sc_module_name name, const MxuParams& params);

  // Driven by the MXU controller: the activation entering row r in this cycle.
  void drive_row(int r, const PeActivation& a) { act_[idx_act(r, 0)]->write(a); }
  // The bottom pipeline register of column c (what left the array last cycle).
  const PePartialSum& bottom(int c) const { return psum_[idx_psum(params_.rows, c)]->read(); }
  // Bulk load of one weight bank (R x C bf16, row-major).
  void load_weights(int bank, const std::vector<uint16_t>& w);
  Pe& pe(int r, int c) { return *pes_[static_cast<size_t>(r * params_.cols + c)]; }
  // Every PE's partial sum ("<grid>.pe_R_C.psum") and the activation entering it
  // ("<grid>.pe_R_C.act.valid", ".act.value").
  void trace(sc_core::sc_trace_file* tf);

 private:
  size_t idx_act(int r, int c) const { return static_cast<size_t>(r * (params_.cols + 1) + c); }
  size_t idx_psum(int r, int c) const { return static_cast<size_t>(r * params_.cols + c); }
  MxuParams params_;
  std::vector<std::unique_ptr<sc_core::sc_signal<PeActivation>>> act_;   // R x (C + 1)
  std::vector<std::unique_ptr<sc_core::sc_signal<PePartialSum>>> psum_;  // (R + 1) x C, row 0 = +0.0
  std::vector<std::unique_ptr<Pe>> pes_;
};

}  // namespace tpusim::hw::mxu

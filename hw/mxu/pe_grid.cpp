#include "hw/mxu/pe_grid.h"

#include <ostream>

#include "isa/numerics/fp32.h"
#include "isa/numerics/mxu.h"

namespace tpusim::hw::mxu {

bool PePartialSum::operator==(const PePartialSum& o) const {
  return num::f32_bits(sum) == num::f32_bits(o.sum) && valid == o.valid && tag == o.tag;
}

std::ostream& operator<<(std::ostream& os, const PeActivation& a) {
  return os << (a.valid ? "" : "~") << std::hex << a.value << std::dec << "@" << a.tag << "/b" << int(a.bank);
}

std::ostream& operator<<(std::ostream& os, const PePartialSum& p) {
  return os << (p.valid ? "" : "~") << p.sum << "@" << p.tag;
}

void sc_trace(sc_core::sc_trace_file* tf, const PeActivation& a, const std::string& name) {
  sc_core::sc_trace(tf, a.valid, name + ".valid");
  sc_core::sc_trace(tf, a.value, name + ".value");
}

void sc_trace(sc_core::sc_trace_file* tf, const PePartialSum& p, const std::string& name) {
  sc_core::sc_trace(tf, p.valid, name + ".valid");
  sc_core::sc_trace(tf, p.sum, name + ".sum");
}

// ---------------------------------------------------------------- PE

Pe::Pe(sc_core::sc_module_name name, bool register_act, bool register_psum)
    : sc_module(name), register_act_(register_act), register_psum_(register_psum) {
  if (!register_act_ || !register_psum_) {
    SC_METHOD(combinational);
    sensitive << act_in << psum_in;
  }
  if (register_act_ || register_psum_) {
    SC_METHOD(on_clock);
    sensitive << clk.pos();
    dont_initialize();
  }
}

PePartialSum Pe::compute(const PeActivation& a, const PePartialSum& in) {
  PePartialSum out;
  out.valid = a.valid;
  out.tag = a.tag;
  if (a.valid) {
    out.sum = num::add(in.sum, num::mxu_product(a.value, weight[a.bank & 1]));
    psum = out.sum;
  }
  return out;
}

void Pe::combinational() {
  const PeActivation a = act_in.read();
  if (!register_act_) act_out.write(a);
  if (!register_psum_) psum_out.write(compute(a, psum_in.read()));
}

// At the clock edge the inputs still hold the last cycle's values: this is the
// register at the PE's output.
void Pe::on_clock() {
  const PeActivation a = act_in.read();
  if (register_act_) act_out.write(a);
  if (register_psum_) psum_out.write(compute(a, psum_in.read()));
}

// ---------------------------------------------------------------- grid

PeGrid::PeGrid(sc_core::sc_module_name name, const MxuParams& params) : sc_module(name), params_(params) {
  const int R = params_.rows, C = params_.cols, P = params_.pes_per_cycle;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c <= C; ++c)
      act_.push_back(std::make_unique<sc_core::sc_signal<PeActivation>>(
          ("act_" + std::to_string(r) + "_" + std::to_string(c)).c_str()));
  for (int r = 0; r <= R; ++r)
    for (int c = 0; c < C; ++c)
      psum_.push_back(std::make_unique<sc_core::sc_signal<PePartialSum>>(
          ("psum_" + std::to_string(r) + "_" + std::to_string(c)).c_str()));
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      // Registers after every P-th PE; the bottom row always registers (the array's output).
      const bool reg_act = (c + 1) % P == 0;
      const bool reg_psum = (r + 1) % P == 0 || r == R - 1;
      auto pe = std::make_unique<Pe>(("pe_" + std::to_string(r) + "_" + std::to_string(c)).c_str(), reg_act, reg_psum);
      pe->clk(clk);
      pe->act_in(*act_[idx_act(r, c)]);
      pe->act_out(*act_[idx_act(r, c + 1)]);
      pe->psum_in(*psum_[idx_psum(r, c)]);
      pe->psum_out(*psum_[idx_psum(r + 1, c)]);
      pes_.push_back(std::move(pe));
    }
  }
}

void PeGrid::load_weights(int bank, const std::vector<uint16_t>& w) {
  for (size_t i = 0; i < pes_.size(); ++i) pes_[i]->weight[bank & 1] = w[i];
}

void PeGrid::trace(sc_core::sc_trace_file* tf) {
  for (int r = 0; r < params_.rows; ++r)
    for (int c = 0; c < params_.cols; ++c) {
      const std::string n = pe(r, c).name();
      sc_core::sc_trace(tf, pe(r, c).psum, n + ".psum");
      sc_trace(tf, act_[idx_act(r, c)]->read(), n + ".act");  // the activation entering the PE
    }
}

}  // namespace tpusim::hw::mxu

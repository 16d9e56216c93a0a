// What each instruction does to the architectural state, one function per unit,
// with no notion of time. The functional reference calls them in program order;
// the SystemC model calls the same functions at the cycle each unit completes the
// work, so values match bit for bit. Every function throws Fault on a runtime
// error (the caller adds core, instruction index and source line).
#pragma once

#include <cstdint>
#include <string>

#include "isa/asm/instr.h"
#include "isa/exec/state.h"

namespace tpusim::exec {

// Effective address (unsigned 32-bit register value + signed immediate).
inline int64_t effective_address(const CoreState& c, uint8_t reg, int32_t offset) {
  return static_cast<int64_t>(static_cast<uint32_t>(c.s[reg])) + offset;
}

// ---- scalar unit -----------------------------------------------------------
// ALU ops, li, ld/st (own SMEM), branches, loop, nop. Returns the next pc.
// (halt and the sync/DMA/vector/matrix classes are not scalar.)
uint32_t exec_scalar(CoreState& c, const isa::Instr& in, uint32_t pc);

// ---- vector unit -----------------------------------------------------------
// Every vector-class instruction, including vld/vst against the core's VMEM.
void exec_vector(CoreState& c, const isa::Instr& in);

// ---- matrix unit -----------------------------------------------------------
// The MXU's pieces, separately callable so a timed model can place them in time:
void mxu_push(MxuState& mxu, const VReg& src, bool transposed);  // mpush / mpush.t
void mxu_swap(MxuState& mxu, int k);  // mswap (k = 0: rows pushed, or R after mpush.t)
// Values of one mmul (8 LHS rows through the active weights); no state change.
MxuResult mxu_compute(const MxuState& mxu, const VReg& lhs);
void mxu_fifo_push(MxuState& mxu, const MxuResult& r);  // faults on overflow
MxuResult mxu_fifo_pop(MxuState& mxu);                 // faults on underflow
// mpop / mpop.add into a register.
void mxu_pop_into(MxuState& mxu, VReg& dst, bool accumulate);
// All of the above for one matrix-class instruction, in the reference order.
void exec_matrix(CoreState& c, const isa::Instr& in);
MxuState& mxu_at(CoreState& c, int index);  // faults on a bad index

// ---- DMA -------------------------------------------------------------------
// A DMA with registers read and endpoints resolved (at issue).
struct DmaPlan {
  Memory* dst = nullptr;
  Memory* src = nullptr;
  int64_t dst_addr = 0, src_addr = 0;
  uint64_t bytes = 0;  // innermost contiguous run
  int ndims = 0;
  isa::DmaDim dims[isa::kMaxDmaDims];
  CoreState* flag_core = nullptr;  // issuing core (flag=)
  int flag = -1;
  CoreState* rflag_core = nullptr;  // destination core (rflag=)
  int rflag = -1;
  uint64_t total_bytes() const;
  std::string describe() const;
};
// Resolves and range-checks every byte the DMA will touch (throws Fault).
DmaPlan plan_dma(Machine& m, CoreState& issuer, const isa::Instr& in);
// Copies all the data (each contiguous run as if through a buffer, in order of
// increasing outer indices, dim 3 outermost).
void dma_copy(const DmaPlan& p);
// The flag increments a completed DMA makes.
void dma_signal_issuer(const DmaPlan& p);
void dma_signal_destination(const DmaPlan& p);

// ---- sync ------------------------------------------------------------------
// wait / wait.sub / wait.any: may the instruction retire now?
bool sync_ready(const CoreState& c, const isa::Instr& in);
// Flag `flag` of the core >= n (a `wait`'s test; ftest's result). Faults on a bad flag.
bool flag_at_least(const CoreState& c, int flag, int32_t n);
// What a blocked wait / wait.sub / wait.any waits for, for deadlock reports:
// "f3 >= 2 (is 0)", for wait.any "f3 >= 2 (is 0) or f4 >= 1 (is 0)".
std::string wait_condition(const CoreState& c, const isa::Instr& in);
// Retires wait.sub (subtracts), fset, fadd; wait and op markers change nothing.
void exec_sync(CoreState& c, const isa::Instr& in);
// The streams' rules (docs/isa.md "Streams"), for the schedulers that run fork and
// barrier (the reference and the sequencer). fork_target: the stream that a `fork`
// in stream `stream` starts, given which of the core's isa::kStreams streams run
// (the lowest-numbered idle one after 0); faults unless stream 0 forks and one is
// idle. check_barrier: faults unless the stream may take part in a barrier.
int fork_target(int stream, const bool* runs);
void check_barrier(int stream);

// Conversions of vcvt.s32.f32 (fp32 -> int32: RNE, saturating, NaN -> 0).
int32_t fp32_to_int32(float f);

}  // namespace tpusim::exec

// Moving graph tensors between .npy arrays and simulated memory, per the bundle's
// I/O table (shared by `tpusim ref` and `tpusim run`).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/asm/instr.h"
#include "isa/exec/state.h"
#include "isa/io/npy.h"

namespace tpusim::exec {

// Dense row-major element bytes of `e` from an .npy array: float32 for f32,
// uint16 bit patterns (or float32, rounded per the contract) for bf16, int32 for
// i32. Throws std::runtime_error naming the tensor on a dtype or shape mismatch.
std::vector<uint8_t> tensor_from_npy(const io::NpyArray& a, const isa::IoEntry& e);
// bf16 is widened exactly to float32 unless raw_bf16 (then uint16 bits).
io::NpyArray tensor_to_npy(const isa::IoEntry& e, const std::vector<uint8_t>& dense, bool raw_bf16);
// Deterministic values for --random-inputs: uniform in [-1, 1) for floats (bf16
// rounded), [0, 16) for int32.
std::vector<uint8_t> random_tensor(const isa::IoEntry& e, uint64_t seed);

// Places / fetches dense element bytes at the entry's address and layout; a
// split entry's parts at their places, a copied one's whole at each (read: the first).
void write_tensor(Machine& m, const isa::IoEntry& e, const std::vector<uint8_t>& dense);
std::vector<uint8_t> read_tensor(const Machine& m, const isa::IoEntry& e);
// A copied entry promises the same tensor at every place (a data-parallel step's
// updated weights on every replica): empty if its places agree, else which place
// differs from place 0 first, and where. Other entries: empty.
std::string copies_disagree(const Machine& m, const isa::IoEntry& e);

// Writes every .const of the bundle into memory.
void load_constants(Machine& m, const isa::Bundle& b);

}  // namespace tpusim::exec

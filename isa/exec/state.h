// Architectural state of a tpusim machine: lazily paged memories with range
// checks, vector/mask registers, MXU weight staging and result FIFO, sync flags,
// and the cores and chips that hold them. No SystemC: the functional reference
// (interpreter.h) and the SystemC model both keep their state in these types.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "isa/asm/instr.h"

namespace tpusim::exec {

// A runtime fault of the simulated program (not of the simulator). The cause
// only; whoever runs the instruction adds core, index and source line.
struct Fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Byte-addressed memory allocated in 64 KiB pages on first write; unwritten bytes
// read as zero. Every access is range checked against the architectural size.
class Memory {
 public:
  static constexpr unsigned kPageBits = 16;
  static constexpr uint64_t kPageBytes = 1ull << kPageBits;

  Memory(std::string name, uint64_t size_bytes);
  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }

  // Throws Fault unless [addr, addr + n) lies inside the memory; addr may be
  // negative (a computed address below zero).
  void check(int64_t addr, uint64_t n) const;
  void read(uint64_t addr, void* dst, uint64_t n) const;  // unchecked: call check() first
  void write(uint64_t addr, const void* src, uint64_t n);
  // Zeros over [addr, addr + n) (unchecked); never-written pages stay unallocated.
  void write_zeros(uint64_t addr, uint64_t n);
  // Whether the page holding `addr` was ever written (else it reads as zeros).
  bool written(uint64_t addr) const { return page_for_read(addr >> kPageBits) != nullptr; }
  uint32_t read_u32(uint64_t addr) const;
  void write_u32(uint64_t addr, uint32_t v);
  uint64_t allocated_bytes() const { return pages_.size() * kPageBytes; }

 private:
  uint8_t* page_for_read(uint64_t page) const;  // null = never written
  uint8_t* page_for_write(uint64_t page);

  std::string name_;
  uint64_t size_;
  std::unordered_map<uint64_t, std::unique_ptr<uint8_t[]>> pages_;  // owns the pages
  // Every vld/vst and DMA beat looks its page up: a memory of up to kDensePages
  // pages (VMEM, even enlarged) indexes them directly instead of hashing; a larger
  // one (HBM) remembers the last page found.
  static constexpr uint64_t kDensePages = uint64_t{1} << 16;
  std::vector<uint8_t*> dense_;  // by page; null = never written
  mutable uint64_t last_page_ = ~uint64_t{0};
  mutable uint8_t* last_ptr_ = nullptr;
};

inline constexpr int kSublanes = isa::kSublanes;
inline constexpr int kLanes = isa::kLanes;

// 8 sublanes x 128 lanes of 32-bit patterns (fp32 or int32).
struct VReg {
  std::array<uint32_t, kSublanes * kLanes> bits{};
  uint32_t& at(int s, int l) { return bits[static_cast<size_t>(s * kLanes + l)]; }
  uint32_t at(int s, int l) const { return bits[static_cast<size_t>(s * kLanes + l)]; }
  float f(int s, int l) const;
  void set_f(int s, int l, float v);
};

struct MaskReg {
  std::array<uint8_t, kSublanes * kLanes> on{};
  bool at(int s, int l) const { return on[static_cast<size_t>(s * kLanes + l)] != 0; }
  void set(int s, int l, bool v) { on[static_cast<size_t>(s * kLanes + l)] = v ? 1 : 0; }
  bool all() const;
};

// 8 result rows of one mmul, lanes >= C are +0.0.
struct MxuResult {
  std::array<float, kSublanes * kLanes> v{};
};

// One matrix unit: R x C systolic array with a double-buffered weight stage.
struct MxuState {
  int rows = 128;  // R
  int cols = 128;  // C
  int fifo_rows = 128;
  std::vector<uint16_t> staging;  // R x C bf16, row k = reduction index
  int staging_rows = 0;           // rows pushed by mpush
  int staging_cols = 0;           // columns pushed by mpush.t
  std::vector<uint16_t> weights;  // active R x C
  int weights_k = 0;              // rows [0, weights_k) are valid
  std::deque<MxuResult> fifo;

  MxuState(int r, int c, int depth_rows);
  int fifo_rows_used() const { return static_cast<int>(fifo.size()) * kSublanes; }
};

struct CoreState {
  uint32_t chip = 0, core = 0;
  std::array<int32_t, isa::kScalarRegs> s{};
  std::array<VReg, isa::kVectorRegs> v{};
  std::array<MaskReg, isa::kMaskRegs> m{};
  std::array<int32_t, isa::kSyncFlags> flags{};
  Memory vmem, smem;
  std::vector<MxuState> mxus;

  CoreState(const isa::Target& t, uint32_t chip, uint32_t core);
  std::string name() const { return "chip" + std::to_string(chip) + ".core" + std::to_string(core); }
};

struct ChipState {
  Memory hbm, host;
  std::vector<CoreState> cores;
  ChipState(const isa::Target& t, uint32_t chip);
};

// Every chip of the target, with all cores (also those without a program).
struct Machine {
  isa::Target target;
  std::vector<ChipState> chips;

  explicit Machine(const isa::Target& t);
  CoreState& core(uint32_t chip, uint32_t core) { return chips.at(chip).cores.at(core); }
  const CoreState& core(uint32_t chip, uint32_t core) const { return chips.at(chip).cores.at(core); }
  Memory& memory(isa::Space space, uint32_t chip, uint32_t core);
  const Memory& memory(isa::Space space, uint32_t chip, uint32_t core) const;
};

}  // namespace tpusim::exec

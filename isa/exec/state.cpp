#include "isa/exec/state.h"

#include <algorithm>
#include <cstring>

#include "isa/numerics/fp32.h"

namespace tpusim::exec {

void Memory::check(int64_t addr, uint64_t n) const {
  if (addr < 0 || static_cast<uint64_t>(addr) > size_ || n > size_ - static_cast<uint64_t>(addr)) {
    throw Fault("address range [" + std::to_string(addr) + ", " + std::to_string(addr + static_cast<int64_t>(n)) +
                ") outside " + name_ + " (" + std::to_string(size_) + " bytes)");
  }
}

Memory::Memory(std::string name, uint64_t size_bytes) : name_(std::move(name)), size_(size_bytes) {
  const uint64_t pages = (size_bytes + kPageBytes - 1) >> kPageBits;
  if (pages <= kDensePages) dense_.assign(pages, nullptr);
}

uint8_t* Memory::page_for_read(uint64_t page) const {
  if (!dense_.empty()) return page < dense_.size() ? dense_[page] : nullptr;
  if (page == last_page_) return last_ptr_;
  auto it = pages_.find(page);
  if (it == pages_.end()) return nullptr;  // not remembered: a write may allocate it
  last_page_ = page;
  last_ptr_ = it->second.get();
  return last_ptr_;
}

uint8_t* Memory::page_for_write(uint64_t page) {
  if (!dense_.empty() && page < dense_.size() && dense_[page]) return dense_[page];
  if (dense_.empty() && page == last_page_) return last_ptr_;
  auto& p = pages_[page];
  if (!p) {
    p.reset(new uint8_t[kPageBytes]);
    std::memset(p.get(), 0, kPageBytes);
  }
  if (!dense_.empty() && page < dense_.size()) dense_[page] = p.get();
  last_page_ = page;
  last_ptr_ = p.get();
  return p.get();
}

namespace {
// Word at a time: every vst of a zero tile into a never-written page asks this.
bool all_zero(const uint8_t* p, uint64_t n) {
  uint64_t acc = 0;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    acc |= w;
  }
  for (; n; --n) acc |= *p++;
  return acc == 0;
}
}  // namespace

void Memory::read(uint64_t addr, void* dst, uint64_t n) const {
  auto* out = static_cast<uint8_t*>(dst);
  while (n) {
    const uint64_t page = addr >> kPageBits, off = addr & (kPageBytes - 1);
    const uint64_t chunk = std::min(n, kPageBytes - off);
    const uint8_t* p = page_for_read(page);
    if (p) std::memcpy(out, p + off, chunk);
    else std::memset(out, 0, chunk);
    out += chunk;
    addr += chunk;
    n -= chunk;
  }
}

void Memory::write(uint64_t addr, const void* src, uint64_t n) {
  const auto* in = static_cast<const uint8_t*>(src);
  while (n) {
    const uint64_t page = addr >> kPageBits, off = addr & (kPageBytes - 1);
    const uint64_t chunk = std::min(n, kPageBytes - off);
    // Zeros into a page never written change nothing: a large copy out of
    // untouched memory must not allocate gigabytes.
    uint8_t* p = page_for_read(page);
    if (p || !all_zero(in, chunk)) std::memcpy((p ? p : page_for_write(page)) + off, in, chunk);
    in += chunk;
    addr += chunk;
    n -= chunk;
  }
}

void Memory::write_zeros(uint64_t addr, uint64_t n) {
  while (n) {
    const uint64_t page = addr >> kPageBits, off = addr & (kPageBytes - 1);
    const uint64_t chunk = std::min(n, kPageBytes - off);
    if (uint8_t* p = page_for_read(page)) std::memset(p + off, 0, chunk);
    addr += chunk;
    n -= chunk;
  }
}

uint32_t Memory::read_u32(uint64_t addr) const {
  uint8_t b[4];
  read(addr, b, 4);
  return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 | static_cast<uint32_t>(b[2]) << 16 |
         static_cast<uint32_t>(b[3]) << 24;
}

void Memory::write_u32(uint64_t addr, uint32_t v) {
  const uint8_t b[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
                        static_cast<uint8_t>(v >> 24)};
  write(addr, b, 4);
}

float VReg::f(int s, int l) const { return num::f32_from_bits(at(s, l)); }
void VReg::set_f(int s, int l, float v) { at(s, l) = num::f32_bits(v); }

bool MaskReg::all() const {
  for (uint8_t b : on)
    if (!b) return false;
  return true;
}

MxuState::MxuState(int r, int c, int depth_rows)
    : rows(r),
      cols(c),
      fifo_rows(depth_rows),
      staging(static_cast<size_t>(r * c), 0),
      weights(static_cast<size_t>(r * c), 0) {}

CoreState::CoreState(const isa::Target& t, uint32_t chip_index, uint32_t core_index)
    : chip(chip_index),
      core(core_index),
      vmem("vmem of chip" + std::to_string(chip_index) + ".core" + std::to_string(core_index), t.vmem_bytes),
      smem("smem of chip" + std::to_string(chip_index) + ".core" + std::to_string(core_index), t.smem_bytes) {
  for (auto& mask : m) mask.on.fill(0);
  m[0].on.fill(1);  // m0: all true, read-only
  for (uint32_t i = 0; i < t.mxus_per_core; ++i)
    mxus.emplace_back(static_cast<int>(t.mxu_rows), static_cast<int>(t.mxu_cols), static_cast<int>(t.fifo_rows));
}

ChipState::ChipState(const isa::Target& t, uint32_t chip)
    : hbm("hbm of chip" + std::to_string(chip), t.hbm_bytes), host("host of chip" + std::to_string(chip), t.host_bytes) {
  cores.reserve(t.cores_per_chip);
  for (uint32_t c = 0; c < t.cores_per_chip; ++c) cores.emplace_back(t, chip, c);
}

Machine::Machine(const isa::Target& t) : target(t) {
  chips.reserve(t.chips);
  for (uint32_t c = 0; c < t.chips; ++c) chips.emplace_back(t, c);
}

Memory& Machine::memory(isa::Space space, uint32_t chip, uint32_t core_index) {
  ChipState& c = chips.at(chip);
  switch (space) {
    case isa::Space::kHbm: return c.hbm;
    case isa::Space::kHost: return c.host;
    case isa::Space::kVmem: return c.cores.at(core_index).vmem;
    case isa::Space::kSmem: return c.cores.at(core_index).smem;
  }
  return c.hbm;
}

const Memory& Machine::memory(isa::Space space, uint32_t chip, uint32_t core_index) const {
  return const_cast<Machine*>(this)->memory(space, chip, core_index);
}

}  // namespace tpusim::exec

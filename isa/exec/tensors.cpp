#include "isa/exec/tensors.h"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "isa/numerics/bf16.h"

namespace tpusim::exec {

using isa::Dtype;
using isa::IoEntry;

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<uint8_t> tensor_from_npy(const io::NpyArray& a, const IoEntry& e) {
  const std::string what = std::string(isa::io_kind_name(e.kind)) + " '" + e.name + "'";
  if (a.shape != e.shape)
    throw std::runtime_error(what + " expects shape " + shape_text(e.shape) + ", the file has " + shape_text(a.shape));
  const size_t n = a.elements();
  if (e.dtype == Dtype::kF32 && a.dtype == io::NpyDtype::kF32) return a.data;
  if (e.dtype == Dtype::kI32 && a.dtype == io::NpyDtype::kI32) return a.data;
  if (e.dtype == Dtype::kI32 && a.dtype == io::NpyDtype::kI64) {
    // numpy's default integer and ONNX's index type are int64; the chip holds int32
    // (the compiler narrows i64 graph tensors), so every value must fit.
    std::vector<uint8_t> out(n * 4);
    for (size_t i = 0; i < n; ++i) {
      int64_t v;
      std::memcpy(&v, a.data.data() + 8 * i, 8);
      if (v < INT32_MIN || v > INT32_MAX)
        throw std::runtime_error(what + " is i32, the file's int64 value " + std::to_string(v) + " at flat index " +
                                 std::to_string(i) + " does not fit");
      const int32_t w = static_cast<int32_t>(v);
      std::memcpy(out.data() + 4 * i, &w, 4);
    }
    return out;
  }
  if (e.dtype == Dtype::kBf16 && a.dtype == io::NpyDtype::kU16) return a.data;
  if (e.dtype == Dtype::kBf16 && a.dtype == io::NpyDtype::kF32) {
    std::vector<uint8_t> out(n * 2);
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, a.data.data() + 4 * i, 4);
      const uint16_t h = num::fp32_to_bf16(f);
      out[2 * i] = static_cast<uint8_t>(h);
      out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
    }
    return out;
  }
  throw std::runtime_error(what + " is " + isa::dtype_name(e.dtype) + ", the file holds " + io::npy_descr(a.dtype) +
                           (e.dtype == Dtype::kBf16 ? " (bf16 takes uint16 bit patterns or float32)" : ""));
}

io::NpyArray tensor_to_npy(const IoEntry& e, const std::vector<uint8_t>& dense, bool raw_bf16) {
  io::NpyArray a;
  a.shape = e.shape;
  const size_t n = e.elements();
  if (e.dtype == Dtype::kF32) {
    a.dtype = io::NpyDtype::kF32;
    a.data = dense;
  } else if (e.dtype == Dtype::kI32) {
    a.dtype = io::NpyDtype::kI32;
    a.data = dense;
  } else if (raw_bf16) {
    a.dtype = io::NpyDtype::kU16;
    a.data = dense;
  } else {
    a.dtype = io::NpyDtype::kF32;
    a.data.resize(n * 4);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = static_cast<uint16_t>(dense[2 * i] | dense[2 * i + 1] << 8);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;  // exact widening: the stored bits, unflushed
      std::memcpy(a.data.data() + 4 * i, &bits, 4);
    }
  }
  return a;
}

std::vector<uint8_t> random_tensor(const IoEntry& e, uint64_t seed) {
  uint64_t state = seed;
  for (char c : e.name) state = state * 131 + static_cast<unsigned char>(c);  // distinct per tensor
  const size_t n = e.elements();
  std::vector<uint8_t> out(n * isa::dtype_size(e.dtype));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix64(state);
    uint32_t v;
    if (e.dtype == Dtype::kI32) {
      v = static_cast<uint32_t>(r % 16);
    } else {
      // 24 random bits -> k * 2^-23 - 1, exactly representable in fp32.
      const float f = static_cast<float>(static_cast<int32_t>(r >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
      v = e.dtype == Dtype::kBf16 ? num::fp32_to_bf16(f) : num::f32_bits(f);
    }
    for (size_t b = 0; b < isa::dtype_size(e.dtype); ++b) out[i * isa::dtype_size(e.dtype) + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  return out;
}

void write_tensor(Machine& m, const IoEntry& e, const std::vector<uint8_t>& dense) {
  const size_t es = isa::dtype_size(e.dtype);
  if (dense.size() != e.elements() * es) throw std::runtime_error("tensor '" + e.name + "': wrong data size");
  if (e.spread != isa::IoSpread::kOne) {  // dense: part k (split) or the whole (copies) at place k
    const uint64_t part = e.place_bytes();
    const auto places = e.places();
    for (size_t k = 0; k < places.size(); ++k) {
      Memory& mem = m.memory(places[k].space, places[k].chip, places[k].core);
      mem.check(static_cast<int64_t>(places[k].addr), part);
      mem.write(places[k].addr, dense.data() + (e.spread == isa::IoSpread::kSplit ? k * part : 0), part);
    }
    return;
  }
  Memory& mem = m.memory(e.space, e.chip, e.core);
  mem.check(static_cast<int64_t>(e.addr), e.extent_bytes());
  if (e.strides.empty()) {
    mem.write(e.addr, dense.data(), dense.size());
    return;
  }
  const auto offs = e.element_offsets();
  for (size_t i = 0; i < offs.size(); ++i) mem.write(e.addr + offs[i], dense.data() + i * es, es);
}

std::vector<uint8_t> read_tensor(const Machine& m, const IoEntry& e) {
  const size_t es = isa::dtype_size(e.dtype);
  std::vector<uint8_t> out(e.elements() * es);
  if (e.spread == isa::IoSpread::kSplit) {  // the parts in place order
    const uint64_t part = e.place_bytes();
    const auto places = e.places();
    for (size_t k = 0; k < places.size(); ++k) {
      const Memory& mem = m.memory(places[k].space, places[k].chip, places[k].core);
      mem.check(static_cast<int64_t>(places[k].addr), part);
      mem.read(places[k].addr, out.data() + k * part, part);
    }
    return out;
  }
  const Memory& mem = m.memory(e.space, e.chip, e.core);  // copies: the first place's
  mem.check(static_cast<int64_t>(e.addr), e.extent_bytes());
  if (e.strides.empty()) {
    mem.read(e.addr, out.data(), out.size());
    return out;
  }
  const auto offs = e.element_offsets();
  for (size_t i = 0; i < offs.size(); ++i) mem.read(e.addr + offs[i], out.data() + i * es, es);
  return out;
}

std::string copies_disagree(const Machine& m, const IoEntry& e) {
  if (e.spread != isa::IoSpread::kCopies) return {};
  const uint64_t bytes = e.place_bytes();
  const size_t es = isa::dtype_size(e.dtype);
  const auto places = e.places();
  auto read_at = [&](const isa::IoPlace& p) {
    std::vector<uint8_t> v(bytes);
    const Memory& mem = m.memory(p.space, p.chip, p.core);
    mem.check(static_cast<int64_t>(p.addr), bytes);
    mem.read(p.addr, v.data(), bytes);
    return v;
  };
  auto bits = [&](const std::vector<uint8_t>& v, size_t i) {
    uint32_t b = 0;
    for (size_t k = 0; k < es; ++k) b |= static_cast<uint32_t>(v[i * es + k]) << (8 * k);
    char t[16];
    std::snprintf(t, sizeof t, "0x%0*x", static_cast<int>(2 * es), b);
    return std::string(t);
  };
  const std::vector<uint8_t> first = read_at(places[0]);
  for (size_t k = 1; k < places.size(); ++k) {
    const std::vector<uint8_t> v = read_at(places[k]);
    if (v == first) continue;
    size_t i = 0;
    while (std::memcmp(v.data() + i * es, first.data() + i * es, es) == 0) ++i;
    return std::string(isa::io_kind_name(e.kind)) + " '" + e.name + "': its copy " + std::to_string(k) + " at " +
           isa::place_text(places[k]) + " differs from copy 0 at " + isa::place_text(places[0]) + ", first at flat index " +
           std::to_string(i) + " (bits " + bits(v, i) + " against " + bits(first, i) + ")";
  }
  return {};
}

void load_constants(Machine& m, const isa::Bundle& b) {
  for (const auto& e : b.io)
    if (e.kind == isa::IoKind::kConst) write_tensor(m, e, e.data);
}

}  // namespace tpusim::exec

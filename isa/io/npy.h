// .npy files (NumPy format 1.0/2.0/3.0), the array exchange format of the CLI
// contract (shared/spec/cli.md): float32, bf16 as uint16 bit patterns, int32.
// Only little-endian, C-order arrays of a fixed set of dtypes are accepted; every
// other header is rejected with a message naming the file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tpusim::io {

// Element types the simulator exchanges; descr strings as NumPy writes them.
enum class NpyDtype { kF32, kU16, kI32, kF64, kI64, kU8 };

const char* npy_descr(NpyDtype t);      // "<f4", "<u2", ...
size_t npy_itemsize(NpyDtype t);

struct NpyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct NpyArray {
  NpyDtype dtype = NpyDtype::kF32;
  std::vector<int64_t> shape;       // empty shape = a scalar (one element)
  std::vector<uint8_t> data;        // element bytes, little-endian, C order

  size_t elements() const;
  // Typed views; the caller checks dtype first.
  template <typename T>
  T* as() { return reinterpret_cast<T*>(data.data()); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
};

// Parses an in-memory .npy image; `name` only labels error messages.
NpyArray parse_npy(const std::vector<uint8_t>& bytes, const std::string& name);
std::vector<uint8_t> serialize_npy(const NpyArray& a);

// Throws NpyError "<path>: <problem>" on any I/O or format error.
NpyArray read_npy(const std::string& path);
// Writes to "<path>.tmp.<pid>" and renames, so a reader never sees a partial file
// under the final name.
void write_npy(const std::string& path, const NpyArray& a);

// Writes a file atomically (temp name + rename); throws std::runtime_error.
void write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes);
// The same for text (JSON, graph IR, assembly), without copying it into bytes first.
void write_file_atomic(const std::string& path, const std::string& text);
// Reads a whole file; throws std::runtime_error "<path>: <strerror>".
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace tpusim::io

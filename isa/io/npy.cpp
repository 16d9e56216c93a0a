#include "isa/io/npy.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace tpusim::io {

namespace {

struct DtypeInfo {
  NpyDtype type;
  const char* descr;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {NpyDtype::kF32, "<f4", 4}, {NpyDtype::kU16, "<u2", 2}, {NpyDtype::kI32, "<i4", 4},
    {NpyDtype::kF64, "<f8", 8}, {NpyDtype::kI64, "<i8", 8}, {NpyDtype::kU8, "|u1", 1},
};

[[noreturn]] void fail(const std::string& name, const std::string& what) { throw NpyError(name + ": " + what); }

// Minimal parser for the Python dict literal of a .npy header:
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct HeaderParser {
  const std::string& s;
  const std::string& name;
  size_t i = 0;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
  }
  void expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c) fail(name, std::string("malformed .npy header: expected '") + c + "'");
    ++i;
  }
  bool peek(char c) {
    ws();
    return i < s.size() && s[i] == c;
  }
  std::string str() {
    ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) fail(name, "malformed .npy header: expected a string");
    char q = s[i++];
    size_t start = i;
    while (i < s.size() && s[i] != q) ++i;
    if (i >= s.size()) fail(name, "malformed .npy header: unterminated string");
    return s.substr(start, i++ - start);
  }
  std::string word() {
    ws();
    size_t start = i;
    while (i < s.size() && std::isalnum(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(start, i - start);
  }
  int64_t integer() {
    ws();
    size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (start == i || i - start > 15) fail(name, "malformed .npy header: bad shape entry");
    return std::stoll(s.substr(start, i - start));
  }
};

}  // namespace

const char* npy_descr(NpyDtype t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.descr;
  return "?";
}

size_t npy_itemsize(NpyDtype t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.size;
  return 0;
}

size_t NpyArray::elements() const {
  size_t n = 1;
  for (auto d : shape) n *= static_cast<size_t>(d);
  return n;
}

NpyArray parse_npy(const std::vector<uint8_t>& b, const std::string& name) {
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (b.size() < 10 || std::memcmp(b.data(), kMagic, 6) != 0) fail(name, "not a .npy file (bad magic)");
  int major = b[6];
  size_t hlen, hstart;
  if (major == 1) {
    hlen = b[8] | (size_t(b[9]) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) fail(name, "truncated .npy header");
    hlen = b[8] | (size_t(b[9]) << 8) | (size_t(b[10]) << 16) | (size_t(b[11]) << 24);
    hstart = 12;
  } else {
    fail(name, "unsupported .npy version " + std::to_string(major));
  }
  if (hlen > b.size() - hstart) fail(name, "truncated .npy header");
  std::string h(reinterpret_cast<const char*>(b.data() + hstart), hlen);
  HeaderParser p{h, name};
  NpyArray a;
  std::string descr;
  bool have_descr = false, have_shape = false, fortran = false;
  p.expect('{');
  while (!p.peek('}')) {
    std::string key = p.str();
    p.expect(':');
    if (key == "descr") {
      descr = p.str();
      have_descr = true;
    } else if (key == "fortran_order") {
      std::string w = p.word();
      if (w != "True" && w != "False") fail(name, "malformed .npy header: fortran_order");
      fortran = w == "True";
    } else if (key == "shape") {
      p.expect('(');
      while (!p.peek(')')) {
        a.shape.push_back(p.integer());
        if (a.shape.size() > 16) fail(name, "too many dimensions");
        if (!p.peek(')')) p.expect(',');
      }
      p.expect(')');
      have_shape = true;
    } else {
      fail(name, "malformed .npy header: unknown key '" + key + "'");
    }
    if (!p.peek('}')) p.expect(',');
  }
  if (!have_descr || !have_shape) fail(name, "malformed .npy header: missing descr or shape");
  if (fortran) fail(name, "Fortran-order arrays are not supported (save with np.ascontiguousarray)");
  // Single-byte types may be written with '|' or '<'; normalise.
  if (descr == "<u1") descr = "|u1";
  bool found = false;
  for (const auto& d : kDtypes)
    if (descr == d.descr) {
      a.dtype = d.type;
      found = true;
    }
  if (!found) fail(name, "unsupported dtype '" + descr + "' (float32, uint16 (bf16 bits), int32 expected)");
  size_t n = 1;
  for (auto d : a.shape) {
    if (d < 0 || (d > 0 && n > (std::numeric_limits<size_t>::max() >> 8) / static_cast<size_t>(d)))
      fail(name, "shape too large");
    n *= static_cast<size_t>(d);
  }
  size_t bytes = n * npy_itemsize(a.dtype);
  size_t dstart = hstart + hlen;
  if (b.size() - dstart < bytes)
    fail(name, "truncated data: " + std::to_string(b.size() - dstart) + " bytes, shape needs " + std::to_string(bytes));
  if (b.size() - dstart > bytes) fail(name, "trailing bytes after the array data");
  a.data.assign(b.begin() + static_cast<std::ptrdiff_t>(dstart), b.end());
  return a;
}

std::vector<uint8_t> serialize_npy(const NpyArray& a) {
  std::ostringstream h;
  h << "{'descr': '" << npy_descr(a.dtype) << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < a.shape.size(); ++i) h << (i ? ", " : "") << a.shape[i];
  if (a.shape.size() == 1) h << ",";
  h << "), }";
  std::string hs = h.str();
  // Pad with spaces so the data starts at a multiple of 64 bytes, then '\n'.
  size_t total = 10 + hs.size() + 1;
  hs.append((64 - total % 64) % 64, ' ');
  hs.push_back('\n');
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.push_back(static_cast<uint8_t>(hs.size() & 0xFF));
  out.push_back(static_cast<uint8_t>(hs.size() >> 8));
  out.insert(out.end(), hs.begin(), hs.end());
  out.insert(out.end(), a.data.begin(), a.data.end());
  return out;
}

std::vector<uint8_t> read_file(const std::string& path) {
  // An ifstream opens a directory and fails only at the first read, with a
  // message that names neither the file nor the cause.
  if (std::filesystem::is_directory(path)) throw std::runtime_error(path + ": is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": " + std::strerror(errno));
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw std::runtime_error(path + ": read error");
  return b;
}

namespace {

void write_bytes_atomic(const std::string& path, const char* data, size_t size) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
    f.write(data, static_cast<std::streamsize>(size));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": write error");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename into place: " + std::strerror(errno));
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  write_bytes_atomic(path, reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_bytes_atomic(path, text.data(), text.size());
}

NpyArray read_npy(const std::string& path) {
  std::vector<uint8_t> b;
  try {
    b = read_file(path);
  } catch (const std::runtime_error& e) {
    throw NpyError(e.what());
  }
  return parse_npy(b, path);
}

void write_npy(const std::string& path, const NpyArray& a) {
  if (a.data.size() != a.elements() * npy_itemsize(a.dtype)) throw NpyError(path + ": array data size does not match its shape");
  try {
    write_file_atomic(path, serialize_npy(a));
  } catch (const std::runtime_error& e) {
    throw NpyError(e.what());
  }
}

}  // namespace tpusim::io

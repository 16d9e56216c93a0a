// How an error message shows bad input: a control byte (a newline, a carriage
// return, a record separator, an escape) of a malformed file, key or path as \xNN,
// so that it cannot split, end or garble the one-line error that names it.
#pragma once

#include <string>

namespace tpusim::io {

inline std::string hex_byte(unsigned char u) {
  static const char kHex[] = "0123456789abcdef";
  return std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
}

// One character: itself when printable ASCII, else \xNN (a lone byte of a UTF-8
// sequence is not printable on its own).
inline std::string printable(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x20 && u < 0x7f ? std::string(1, c) : hex_byte(u);
}

// A whole message: control bytes as \xNN; UTF-8 (a path with accents) kept as is.
inline std::string one_line(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += hex_byte(u);
    else
      out += c;
  }
  return out;
}

}  // namespace tpusim::io

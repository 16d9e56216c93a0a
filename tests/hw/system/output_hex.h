// A run's output tensor as `core_run` writes it into its JSON ("outputs": hex of
// the little-endian bytes), back as fp32 values.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

inline std::vector<float> from_hex(const std::string& h) {
  std::vector<uint8_t> b(h.size() / 2);
  for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), b.size());
  return f;
}

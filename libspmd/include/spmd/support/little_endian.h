// An unsigned integer stored little-endian in `n` bytes (at most 8), as zip
// headers, .npy headers and token files store them.
#pragma once

#include <cstdint>

namespace spmd {

inline uint64_t littleEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace spmd

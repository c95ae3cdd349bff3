#include "spmd/support/text.h"

#include <charconv>
#include <cmath>

namespace spmd {

std::string floatText(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f);
  std::string s(buf, res.ptr);
  // Keep floats visibly floats: 1 -> 1.0
  if (s.find_first_of(".einf") == std::string::npos) s += ".0";
  return s;
}

}  // namespace spmd

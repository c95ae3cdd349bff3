#include "listing_lexer.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

namespace spmd {
namespace listing {

Number Cursor::number() {
  size_t start = pos();
  const std::string& s = text();
  size_t i = start;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  Number n;
  if (s.compare(i, 3, "inf") == 0 || s.compare(i, 3, "nan") == 0) {
    if (isIdentChar(i + 3 < s.size() ? s[i + 3] : '\0')) expected("a number");
    n.isFloat = true;
    bool neg = s[start] == '-';
    n.f = s[i] == 'i' ? (neg ? -1 : 1) * std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
    setPos(i + 3);
    return n;
  }
  size_t digits = i;
  while (i < s.size() && isDigit(s[i])) ++i;
  bool any = i > digits;
  if (i < s.size() && s[i] == '.') {
    n.isFloat = true;
    ++i;
    size_t frac = i;
    while (i < s.size() && isDigit(s[i])) ++i;
    any = any || i > frac;
  }
  if (!any) expected("a number");
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    n.isFloat = true;
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    size_t exp = i;
    while (i < s.size() && isDigit(s[i])) ++i;
    if (i == exp) {
      setPos(i);
      expected("digits of the exponent");
    }
  }
  if (i < s.size() && (isIdentChar(s[i]) || s[i] == '.')) {
    setPos(start);
    expected("a number");
  }
  std::string t = s.substr(start, i - start);
  errno = 0;
  if (n.isFloat) {
    n.f = std::strtod(t.c_str(), nullptr);
  } else {
    n.i = std::strtoll(t.c_str(), nullptr, 10);
    if (errno == ERANGE) failAt(start, "integer " + t + " does not fit in 64 bits");
  }
  setPos(i);
  return n;
}

}  // namespace listing
}  // namespace spmd

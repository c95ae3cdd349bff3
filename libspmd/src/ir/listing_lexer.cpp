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

std::vector<std::vector<std::string>> Cursor::flagWords() {
  std::vector<std::vector<std::string>> flags;
  skipSpaces();
  while (!atEnd() && peek() != '}') {
    const size_t at = pos_;
    std::string word = shellWord();
    if (word.size() > 2 && word.compare(0, 2, "--") == 0) {
      flags.push_back({std::move(word)});
    } else if (flags.empty() || flags.back().size() == 2) {
      failAt(at, "bad {flags: ...}: expected a flag such as --lr, got " + inQuotes(word));
    } else {
      flags.back().push_back(std::move(word));
    }
    skipSpaces();
  }
  return flags;
}

// One shell word, up to a space or '}': quoted parts ('...', where the
// printer wrote '\'' for a quote) taken as they are.
std::string Cursor::shellWord() {
  std::string word;
  while (!atEnd() && !isSpace(peek()) && peek() != '}') {
    if (peek() != '\'') {
      word += s_[pos_++];
      continue;
    }
    const size_t close = s_.find('\'', pos_ + 1);
    if (close == std::string::npos) fail("unterminated quote in {flags: ...}");
    word += s_.substr(pos_ + 1, close - pos_ - 1);
    pos_ = close + 1;
    if (lookingAt("\\'")) {
      word += '\'';
      pos_ += 2;
    }
  }
  return word;
}

}  // namespace listing
}  // namespace spmd

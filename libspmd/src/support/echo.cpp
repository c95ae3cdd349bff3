#include "spmd/support/echo.h"

#include <cstdio>

namespace spmd {
namespace {

// Appends `c`, escaped if it would break the line or the terminal.
void appendPrintable(std::string& out, char c) {
  const auto u = static_cast<unsigned char>(c);
  if (c == '\n') {
    out += "\\n";
  } else if (c == '\t') {
    out += "\\t";
  } else if (c == '\r') {
    out += "\\r";
  } else if (u < 0x20 || u == 0x7f) {
    char buf[5];
    std::snprintf(buf, sizeof buf, "\\x%02x", u);
    out += buf;
  } else {
    out += c;
  }
}

std::string escapedPrefix(const std::string& text, size_t limit) {
  std::string out;
  const size_t n = text.size() < limit ? text.size() : limit;
  out.reserve(n + 3);
  for (size_t i = 0; i < n; ++i) appendPrintable(out, text[i]);
  if (text.size() > limit) out += "...";
  return out;
}

}  // namespace

std::string echo(const std::string& text, size_t limit) { return escapedPrefix(text, limit); }

std::string oneLine(const std::string& text, size_t limit) { return escapedPrefix(text, limit); }

}  // namespace spmd

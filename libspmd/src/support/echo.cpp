#include "spmd/support/echo.h"

#include <cstdint>
#include <cstdio>

namespace spmd {
namespace {

void appendByte(std::string& out, unsigned char u) {
  char buf[5];
  std::snprintf(buf, sizeof buf, "\\x%02x", u);
  out += buf;
}

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
    appendByte(out, u);
  } else {
    out += c;
  }
}

// The length of the well-formed UTF-8 sequence at text[i] (2 to 4 bytes), or
// 0 where the bytes there are not one (a stray continuation byte, an overlong
// form, a surrogate, a sequence cut short).
size_t multiByteLength(const std::string& text, size_t i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  size_t n = 0;
  uint32_t code = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2, code = lead & 0x1Fu;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3, code = lead & 0x0Fu;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4, code = lead & 0x07u;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xC0u) != 0x80u) return 0;
    code = (code << 6) | (b & 0x3Fu);
  }
  if (n == 3 && (code < 0x800 || (code >= 0xD800 && code <= 0xDFFF))) return 0;
  if (n == 4 && (code < 0x10000 || code > 0x10FFFF)) return 0;
  return n;
}

// The first `limit` bytes of `text` as valid UTF-8 on one line: characters
// kept whole (never cut in the middle), control characters and bytes that
// are not UTF-8 (a file name in Latin-1, binary read as text) escaped.
std::string escapedPrefix(const std::string& text, size_t limit) {
  std::string out;
  const size_t n = text.size() < limit ? text.size() : limit;
  out.reserve(n + 3);
  size_t i = 0;
  while (i < n) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u < 0x80) {
      appendPrintable(out, text[i]);
      ++i;
    } else if (const size_t len = multiByteLength(text, i); len == 0) {
      appendByte(out, u);
      ++i;
    } else if (i + len > n) {
      break;  // the limit falls inside this character
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  if (i < text.size()) out += "...";
  return out;
}

}  // namespace

std::string echo(const std::string& text, size_t limit) { return escapedPrefix(text, limit); }

std::string oneLine(const std::string& text, size_t limit) { return escapedPrefix(text, limit); }

}  // namespace spmd

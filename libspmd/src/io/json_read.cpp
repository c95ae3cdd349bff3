#include "json_read.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/echo.h"

#include <cmath>
#include <cstdlib>

namespace spmd {
namespace {

// Where a scan stands in the text, counted as nlohmann counts (1-based).
struct Position {
  size_t line = 1, column = 0;
  void advance(char c) {
    if (c == '\n') {
      ++line;
      column = 0;
    } else {
      ++column;
    }
  }
};

[[noreturn]] void invalid(const std::string& what, const Position& at) {
  throw Diagnostic("", "invalid JSON: " + what + " at line " + std::to_string(at.line) + ", column " +
                           std::to_string(at.column));
}

bool startsNumber(char c) { return c == '-' || (c >= '0' && c <= '9'); }
bool inNumber(char c) { return startsNumber(c) || c == '+' || c == '.' || c == 'e' || c == 'E'; }

// Skips a string whose opening quote is at text[i]; returns the index of its
// closing quote (or text.size() when it has none: the parser reports that).
size_t skipString(const std::string& text, size_t i, Position& at) {
  const size_t start = i;
  at.advance(text[i++]);
  while (i < text.size() && text[i] != '"') {
    if (text[i] == '\\' && i + 1 < text.size()) at.advance(text[i++]);
    at.advance(text[i++]);
    if (i - start > kMaxJsonString) invalid("a string longer than " + std::to_string(kMaxJsonString) + " characters", at);
  }
  if (i < text.size()) at.advance(text[i]);
  return i;
}

// A number that JSON allows but a double cannot hold (1e999) is refused here,
// with its place; nlohmann would throw an exception without one.
size_t checkNumber(const std::string& text, size_t i, Position& at) {
  Position start = at;
  start.advance(text[i]);
  size_t end = i;
  while (end < text.size() && inNumber(text[end])) at.advance(text[end++]);
  const std::string token = text.substr(i, end - i);
  const double value = std::strtod(token.c_str(), nullptr);
  if (std::isinf(value)) invalid("number " + echo(token, 24) + " is out of range", start);
  return end - 1;
}

// The bounds nlohmann does not check, tested before it parses.
void checkBounds(const std::string& text) {
  Position at;
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      i = skipString(text, i, at);
      continue;
    }
    if (startsNumber(c)) {
      i = checkNumber(text, i, at);
      continue;
    }
    at.advance(c);
    if ((c == '[' || c == '{') && ++depth > kMaxJsonDepth) {
      invalid("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels", at);
    }
    if ((c == ']' || c == '}') && depth > 0) --depth;
  }
}

}  // namespace

nlohmann::json parseJson(const std::string& text) {
  checkBounds(text);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 11: ..."
    const std::string what = e.what();
    const size_t at = what.find("] ");
    throw Diagnostic("", "invalid JSON: " + echo(at == std::string::npos ? what : what.substr(at + 2), 200));
  }
}

std::string briefJson(const nlohmann::json& j) {
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return echo(j.dump(), kEchoLimit);
}

}  // namespace spmd

// The listing's lexical level, shared by the parser (parser.cpp): a cursor
// over one line that reads words, names, strings and numbers and names
// LINE:COL in every error. Private to libspmd/src/ir.
#pragma once

#include "spmd/support/diagnostic.h"

#include <cstdint>
#include <string>
#include <vector>

namespace spmd {
namespace listing {

inline bool isSpace(char c) { return c == ' ' || c == '\t'; }
inline bool isDigit(char c) { return c >= '0' && c <= '9'; }
inline bool isIdentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || isDigit(c) || c == '_';
}
// Characters of a bare value name (%conv1.weight); others are quoted (%"a b").
inline bool isNameChar(char c) { return isIdentChar(c) || c == '.' || c == '-'; }

inline std::string inQuotes(const std::string& s) { return "'" + s + "'"; }

// How a list element or scalar constant was spelled.
struct Number {
  bool isFloat = false;
  int64_t i = 0;
  double f = 0.0;
};

// A cursor over one line; `lineNo` and columns are 1-based in messages.
// A blank line or a `//` comment, which the parser skips.
inline bool isCommentLine(const std::string& line) {
  size_t i = 0;
  while (i < line.size() && (isSpace(line[i]) || line[i] == '\r')) ++i;
  return i == line.size() || line.compare(i, 2, "//") == 0;
}

class Cursor {
 public:
  Cursor(const std::string& line, int lineNo) : s_(line), line_(lineNo) {}

  [[noreturn]] void failAt(size_t pos, const std::string& what) const {
    throw Diagnostic(std::to_string(line_) + ":" + std::to_string(pos + 1), what);
  }
  [[noreturn]] void fail(const std::string& what) const { failAt(pos_, what); }

  // What the cursor is looking at, for "expected X, got Y" messages.
  std::string found() const {
    if (atEnd()) return "end of line";
    size_t end = pos_;
    while (end < s_.size() && !isSpace(s_[end]) && end - pos_ < 20) ++end;
    if (end == pos_) end = pos_ + 1;
    return inQuotes(s_.substr(pos_, end - pos_));
  }
  [[noreturn]] void expected(const std::string& what) const { fail("expected " + what + ", got " + found()); }

  bool atEnd() const { return pos_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
  size_t pos() const { return pos_; }
  void setPos(size_t p) { pos_ = p; }
  const std::string& text() const { return s_; }
  void skipSpaces() {
    while (!atEnd() && isSpace(s_[pos_])) ++pos_;
  }
  bool lookingAt(const std::string& t) const { return s_.compare(pos_, t.size(), t) == 0; }
  bool consume(const std::string& t) {
    if (!lookingAt(t)) return false;
    pos_ += t.size();
    return true;
  }
  void expect(const std::string& t) {
    if (!consume(t)) expected(inQuotes(t));
  }
  // A keyword: `t` followed by a non-identifier character.
  bool consumeWord(const std::string& t) {
    if (!lookingAt(t) || isIdentChar(peek(t.size()))) return false;
    pos_ += t.size();
    return true;
  }
  std::string ident() {
    size_t start = pos_;
    while (!atEnd() && isIdentChar(s_[pos_])) ++pos_;
    return s_.substr(start, pos_ - start);
  }
  // A double-quoted string with printer.cpp's escapes; the cursor is on '"'.
  std::string str() {
    size_t start = pos_;
    expect("\"");
    std::string out;
    while (true) {
      if (atEnd()) failAt(start, "unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (atEnd()) failAt(start, "unterminated string");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'x': {
          auto hex = [&](char h) -> int {
            if (isDigit(h)) return h - '0';
            if (h >= 'a' && h <= 'f') return h - 'a' + 10;
            if (h >= 'A' && h <= 'F') return h - 'A' + 10;
            return -1;
          };
          int hi = hex(peek()), lo = hex(peek(1));
          if (hi < 0 || lo < 0) fail("expected two hex digits after \\x");
          pos_ += 2;
          out += static_cast<char>(hi * 16 + lo);
          break;
        }
        default: failAt(pos_ - 2, std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  // An int or a float as printer.cpp writes them (floats always have '.',
  // an exponent, inf or nan).
  Number number();

  // The words of {flags: ...} up to its '}' (not consumed), grouped per flag
  // ({"--lr", "0.1"}, {"--cudagraphs"}): shell words, 'quoted' where
  // printFlags quoted them.
  std::vector<std::vector<std::string>> flagWords();

 private:
  std::string shellWord();

  const std::string& s_;
  size_t pos_ = 0;
  int line_;
};

}  // namespace listing
}  // namespace spmd

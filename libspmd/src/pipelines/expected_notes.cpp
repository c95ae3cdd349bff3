#include "spmd/pipelines/expected_notes.h"

#include "spmd/ir/parser.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>

namespace spmd {
namespace {

const std::string kDirective = "expected-note";
const std::string kLinePrefix = " at line ";

// The line a note points at: the N of "... at line N" in its `where`; 0 when none.
int lineOfNote(const Diagnostic& note) {
  const std::string& where = note.where();
  const size_t at = where.rfind(kLinePrefix);
  if (at == std::string::npos) return 0;
  const std::string digits = where.substr(at + kLinePrefix.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::atoi(digits.c_str());
}

// "{{text}}" at `pos` of `line`; throws naming the column when malformed.
std::string bracedText(const std::string& line, size_t pos, int lineNo) {
  const size_t open = line.find("{{", pos);
  const size_t close = open == std::string::npos ? std::string::npos : line.find("}}", open + 2);
  if (open == std::string::npos || close == std::string::npos || line.find_first_not_of(' ', pos) != open) {
    throw Diagnostic(std::to_string(lineNo) + ":" + std::to_string(pos + 1),
                     "expected '{{text}}' after " + kDirective);
  }
  return line.substr(open + 2, close - open - 2);
}

// The target line of "@+N", "@-N", "@*" or nothing at `pos`; advances `pos`.
int targetLine(const std::string& line, size_t& pos, int lineNo) {
  if (pos >= line.size() || line[pos] != '@') return lineNo;
  if (line.compare(pos, 2, "@*") == 0) {
    pos += 2;
    return 0;
  }
  const char sign = pos + 1 < line.size() ? line[pos + 1] : ' ';
  const size_t digits = pos + 2;
  size_t end = digits;
  while (end < line.size() && std::isdigit(static_cast<unsigned char>(line[end]))) ++end;
  if ((sign != '+' && sign != '-') || end == digits || end - digits > 6) {
    throw Diagnostic(std::to_string(lineNo) + ":" + std::to_string(pos + 1), "expected '@+N', '@-N' or '@*'");
  }
  const int offset = std::atoi(line.substr(digits, end - digits).c_str());
  pos = end;
  return sign == '+' ? lineNo + offset : lineNo - offset;
}

}  // namespace

std::vector<ExpectedNote> parseExpectedNotes(const std::string& text) {
  std::vector<ExpectedNote> expected;
  size_t start = 0;
  int lineNo = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    ++lineNo;
    // A comment that starts with the directive: prose may mention it.
    const size_t comment = line.find("//");
    const size_t at = comment == std::string::npos ? std::string::npos : line.find_first_not_of(' ', comment + 2);
    if (at == std::string::npos || line.compare(at, kDirective.size(), kDirective) != 0) continue;
    size_t pos = at + kDirective.size();
    const int target = targetLine(line, pos, lineNo);
    expected.push_back({target, bracedText(line, pos, lineNo), lineNo});
  }
  return expected;
}

void markListingLines(Graph& graph, const std::string& text) {
  if (!looksLikeListing(text)) {
    throw Diagnostic("--verify-diagnostics", "expected notes are read from a listing, and this input is not one");
  }
  const std::vector<int> lines = listingNodeLines(text);
  size_t i = 0;
  for (const Node* n : snapshot(graph.nodes())) {
    if (i < lines.size()) graph.metaOf(*n).source = "line " + std::to_string(lines[i++]);
  }
}

std::vector<std::string> unmetNoteExpectations(const std::vector<ExpectedNote>& expected,
                                               const std::vector<Diagnostic>& notes) {
  std::vector<bool> met(expected.size(), false);
  std::multimap<int, std::string> problems;  // by line, for a stable order
  for (const Diagnostic& note : notes) {
    const int line = lineOfNote(note);
    bool found = false;
    for (size_t i = 0; i < expected.size() && !found; ++i) {
      const bool here = expected[i].line == 0 || expected[i].line == line;
      if (!met[i] && here && note.message().find(expected[i].text) != std::string::npos) met[i] = found = true;
    }
    if (!found) problems.emplace(line, "note not expected: " + note.message());
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!met[i]) problems.emplace(expected[i].commentLine, "expected note not given: " + expected[i].text);
  }
  std::vector<std::string> out;
  for (const auto& [line, what] : problems) out.push_back((line ? std::to_string(line) : std::string("*")) + ": " + what);
  return out;
}

}  // namespace spmd

// The Python source line of a traced or scripted node, and of a failure the
// TorchScript interpreter reports: where diagnostics and node metadata point.
#include "torchscript_internal.h"

#include <sstream>
#include <string>
#include <vector>

namespace spmd {
namespace torchscript_detail {
bool isLibraryFile(const std::string& file) { return file.find("/torch/") != std::string::npos; }

std::string baseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

namespace {

// The Python source range a (possibly deserialized) range was generated from.
c10::optional<jit::SourceRange> originalRange(const jit::SourceRange& range) {
  if (auto original = range.findSourceRangeThatGenerated()) return original;
  if (range.file_line_col()) return range;
  return c10::nullopt;
}


// torch.jit.trace records each op's Python stack as the text of its source
// range, one "path(line): function" per frame, innermost first: the first
// frame outside torch is the user's line.
std::string userFrameInTracedStack(const jit::SourceRange& range) {
  if (!range.source()) return "";
  std::istringstream lines(range.source()->text_str().str());
  std::string line;
  while (std::getline(lines, line)) {
    size_t close = line.rfind("): ");
    size_t open = close == std::string::npos ? std::string::npos : line.rfind('(', close);
    if (open == std::string::npos || open == 0) continue;
    const std::string path = line.substr(0, open), number = line.substr(open + 1, close - open - 1);
    if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!isLibraryFile(path)) return baseName(path) + ":" + number;
  }
  return "";
}

}  // namespace

// Of `frames` (innermost first), the innermost one in the user's code, else
// the innermost one with a known Python line.
c10::optional<jit::SourceRange> preferredSource(const std::vector<jit::SourceRange>& frames) {
  c10::optional<jit::SourceRange> fallback;
  for (const auto& frame : frames) {
    auto original = originalRange(frame);
    if (!original || std::get<0>(*original->file_line_col()).empty()) continue;
    if (!isLibraryFile(std::get<0>(*original->file_line_col()))) return original;
    if (!fallback) fallback = original;
  }
  return fallback;
}

// "model.py:12" for a node whose Python source is known, else "".
std::string sourceOf(const jit::Node* n) {
  std::vector<jit::SourceRange> frames{n->sourceRange()};
  if (auto callstack = n->callstack()) {
    auto calls = (*callstack)->vec();
    for (auto it = calls.rbegin(); it != calls.rend(); ++it) frames.push_back(std::get<1>(*it));
  }
  auto range = preferredSource(frames);
  if (!range) return "";
  auto flc = range->file_line_col();
  if (isLibraryFile(std::get<0>(*flc))) {
    std::string traced = userFrameInTracedStack(*range);
    if (!traced.empty()) return traced;
  }
  return baseName(std::get<0>(*flc)) + ":" + std::to_string(std::get<1>(*flc));
}

std::string describe(const jit::Node* n) {
  std::string src = sourceOf(n);
  return src.empty() ? std::string(n->kind().toQualString()) : src;
}

// The TorchScript interpreter reports a failing op with both tracebacks; the
// user needs the innermost line of their own code and the error's last line.
Diagnostic forwardFailure(const std::string& report) {
  std::istringstream lines(report);
  std::string line, lastLine, where = "forward";
  bool original = false;
  while (std::getline(lines, line)) {
    if (line.find("original code") != std::string::npos) original = true;
    size_t file = line.find("File \"");
    size_t lineNo = line.find("\", line ");
    if (original && file != std::string::npos && lineNo != std::string::npos) {
      std::string path = line.substr(file + 6, lineNo - file - 6);
      if (!isLibraryFile(path)) {
        std::string number = line.substr(lineNo + 8);
        number = number.substr(0, number.find_first_not_of("0123456789"));
        where = path.substr(path.find_last_of('/') + 1) + ":" + number;
      }
    }
    if (line.find_first_not_of(" ") != std::string::npos) lastLine = line;
  }
  size_t start = lastLine.find_first_not_of(" ");
  lastLine = start == std::string::npos ? report : lastLine.substr(start);
  return Diagnostic(where, "running forward on the given input shapes failed: " + lastLine);
}

}  // namespace torchscript_detail
}  // namespace spmd

// One-line user-facing errors: every stage reports bad input as
// "<tool>: error: <file>: <where>: <what>" and exits 1.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace spmd {

// A problem with the user's input. `where` is a JSON pointer, a node, or a
// Python source line; `file` is filled in by whoever knows the file name.
class Diagnostic : public std::runtime_error {
 public:
  Diagnostic(std::string where, std::string what)
      : std::runtime_error(what), where_(std::move(where)), what_(what) {}

  const std::string& where() const { return where_; }
  const std::string& message() const { return what_; }
  const std::string& file() const { return file_; }
  Diagnostic& inFile(std::string file) {
    if (file_.empty()) file_ = std::move(file);
    return *this;
  }

  // "<file>: <where>: <what>", leaving out the empty parts.
  std::string format() const;

 private:
  std::string where_;
  std::string what_;
  std::string file_;
};

// Where notes go: what a pass or stage did not do and why. Every stage and
// pass reports through one engine, which the tool prints as
// "<tool>: note: <file>: <where>: <what>" (see support/tool.h); errors are
// thrown as Diagnostic instead. Without a handler, notes are kept in notes()
// (what tests read).
class DiagnosticEngine {
 public:
  using Handler = std::function<void(const Diagnostic& note)>;

  DiagnosticEngine() = default;
  explicit DiagnosticEngine(Handler handler) : handler_(std::move(handler)) {}

  // Names the file in every later note.
  void setFile(std::string file) { file_ = std::move(file); }
  void note(std::string where, std::string what);
  void note(std::string what) { note("", std::move(what)); }
  const std::vector<Diagnostic>& notes() const { return notes_; }

 private:
  Handler handler_;
  std::string file_;
  std::vector<Diagnostic> notes_;
};

}  // namespace spmd

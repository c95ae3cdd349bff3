// One-line user-facing errors: every stage reports bad input as
// "<tool>: error: <file>: <where>: <what>" and exits 1.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace spmd

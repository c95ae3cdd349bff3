// Writing a stage's output without ever leaving a partial file, and the
// name diagnostics give a path. Below io/load.h and io/artifact.h, which both
// write through it.
#pragma once

#include <cstddef>
#include <string>

namespace spmd {

// The display name diagnostics use for `path`.
std::string displayNameOf(const std::string& path);

// An output written to a temporary file beside `path` and renamed into place
// by commit(), so that a failure never leaves a partial output; a temporary
// not committed is removed. "-" writes to stdout as it goes. A symbolic
// link is written through (its target replaced so, the link kept); an
// existing character device (/dev/null) or a FIFO with a reader is written
// in place, as it goes; any other target that is not a regular file (a
// directory, a socket, a FIFO nobody reads) is refused.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path);  // throws Diagnostic naming `path`
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t size);  // throws Diagnostic naming `path`
  void commit();                              // throws Diagnostic naming `path`

 private:
  [[noreturn]] void fail();
  std::string path_;    // as the user named it
  std::string target_;  // the regular file written (a link's target), through temp_
  std::string temp_;
  int fd_ = -1;
  bool inPlace_ = false;  // a device or FIFO, written directly
  bool committed_ = false;
};

// A temporary name beside `target` for this process (`tag` and the pid after
// the target's own name), cut so that it fits NAME_MAX wherever the
// target's name does: a legal 255-byte name gets a temporary too.
std::string temporaryBeside(const std::string& target, const std::string& tag);

// `content` to `path` through an OutputFile.
void writeOutput(const std::string& path, const std::string& content);

}  // namespace spmd

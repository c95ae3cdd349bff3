// Reading any stage's input: a TorchScript module, a JSON graph dump, a
// listing (ir/parser.h) or an artifact, from a file or stdin, told apart by
// content (zip magic, '{', or a first line starting with `graph`); and
// writing a stage's output without ever leaving a partial file.
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

enum class InputFormat { TorchScript, Json, Artifact, Listing };

struct Artifact;
class MappedFile;

struct LoadedGraph {
  Graph graph;
  InputFormat format = InputFormat::Json;
  std::string displayName;  // the path, or "<stdin>"
  std::shared_ptr<Artifact> artifact;  // set when the input was an artifact
};

// A stage's input: a regular file is mapped, so that a model or an artifact
// of hundreds of megabytes is read through the page cache and never copied
// whole into the heap; stdin, a pipe or a FIFO is read whole.
class InputBytes {
 public:
  // `path` "-" reads stdin. Throws Diagnostic naming the display name.
  explicit InputBytes(const std::string& path);
  std::string_view view() const;
  // The mapping of a regular file (null for stdin): tensors over it keep it alive.
  const std::shared_ptr<MappedFile>& mapping() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::string read_;
};

// `path` "-" reads stdin. Throws Diagnostic carrying the display name.
// The graph is not verified here: callers verify (and may list all problems).
LoadedGraph loadGraph(const std::string& path, const std::vector<InputSpec>& specs);
// The same on content already read (`displayName` names it in diagnostics).
// An artifact's tensors are views of `mapping` when the bytes lie in it, else copies.
LoadedGraph loadGraphFrom(std::string_view bytes, const std::string& displayName, const std::vector<InputSpec>& specs,
                          const std::shared_ptr<MappedFile>& mapping = nullptr);
// The bytes of `path` ("-" reads stdin); throws Diagnostic naming the file.
std::string readInput(const std::string& path);

// Throws Diagnostic (where "", no file) when `path` is a directory.
void refuseDirectory(const std::string& path);

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

// `content` to `path` through an OutputFile.
void writeOutput(const std::string& path, const std::string& content);

}  // namespace spmd

// Reading any stage's input: a torch.export program (.pt2), a TorchScript module, a JSON graph dump, a
// listing (ir/parser.h) or an artifact, from a file or stdin, told apart by
// content (zip magic and members, '{', or a first line starting with `graph`). Outputs
// are written through io/output_file.h, which this header includes.
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/io/output_file.h"
#include "spmd/ir/graph.h"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

enum class InputFormat { TorchScript, ExportedProgram, Json, Artifact, Listing };

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

}  // namespace spmd

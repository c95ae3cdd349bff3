// Reading any stage's input: a TorchScript module, a JSON graph dump, a
// listing (ir/parser.h) or an artifact, from a file or stdin, told apart by
// content (zip magic, '{', or a first line starting with `graph`).
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"

#include <memory>
#include <string>
#include <vector>

namespace spmd {

enum class InputFormat { TorchScript, Json, Artifact, Listing };

struct Artifact;

struct LoadedGraph {
  Graph graph;
  InputFormat format = InputFormat::Json;
  std::string displayName;  // the path, or "<stdin>"
  std::shared_ptr<Artifact> artifact;  // set when the input was an artifact
};

// `path` "-" reads stdin. Throws Diagnostic carrying the display name.
// The graph is not verified here: callers verify (and may list all problems).
LoadedGraph loadGraph(const std::string& path, const std::vector<InputSpec>& specs);
// The same on content already read (`displayName` names it in diagnostics).
LoadedGraph loadGraphFrom(const std::string& bytes, const std::string& displayName, const std::vector<InputSpec>& specs);
// The bytes of `path` ("-" reads stdin); throws Diagnostic naming the file.
std::string readInput(const std::string& path);

// Throws Diagnostic (where "", no file) when `path` is a directory.
void refuseDirectory(const std::string& path);

// The display name diagnostics use for `path`.
std::string displayNameOf(const std::string& path);

// Writes `content` to `path` ("-" is stdout) through a temporary file and a
// rename, so that a failure never leaves a partial output.
void writeOutput(const std::string& path, const std::string& content);

}  // namespace spmd

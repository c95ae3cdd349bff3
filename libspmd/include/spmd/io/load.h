// Reading any stage's input: a TorchScript module or a JSON graph dump, from
// a file or stdin, told apart by content (zip magic or '{').
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"

#include <string>
#include <vector>

namespace spmd {

enum class InputFormat { TorchScript, Json };

struct LoadedGraph {
  Graph graph;
  InputFormat format = InputFormat::Json;
  std::string displayName;  // the path, or "<stdin>"
};

// `path` "-" reads stdin. Throws Diagnostic carrying the display name.
// The graph is not verified here: callers verify (and may list all problems).
LoadedGraph loadGraph(const std::string& path, const std::vector<InputSpec>& specs);

// The display name diagnostics use for `path`.
std::string displayNameOf(const std::string& path);

// Writes `content` to `path` ("-" is stdout) through a temporary file and a
// rename, so that a failure never leaves a partial output.
void writeOutput(const std::string& path, const std::string& content);

}  // namespace spmd

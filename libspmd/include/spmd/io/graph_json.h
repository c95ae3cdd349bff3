// The JSON graph dump (schemas/graph.schema.json): "format": "spmd-graph".
// Writing is canonical, so load-then-write reproduces a dump byte for byte.
#pragma once

#include "spmd/ir/graph.h"

#include <string>

namespace spmd {

constexpr int kGraphFormatVersion = 1;

std::string writeGraphJson(const Graph& graph);

// Throws Diagnostic whose `where` is the JSON pointer of the first problem.
// Checks structure and references; operator schemas and shapes are the
// verifier's business.
Graph readGraphJson(const std::string& text);

}  // namespace spmd

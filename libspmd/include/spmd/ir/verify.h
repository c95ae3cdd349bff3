// The graph verifier: runs after parsing and after every pass.
//
// Checks that values are defined before use and only once, that every call
// resolves to an operator schema in the linked LibTorch (or libspmd's spmd
// library) with the right number and kinds of arguments, and that the dtype
// and shape recorded for each output are what the operator produces. Shapes
// come from running each op on LibTorch's meta device, carrying the meta
// tensors (with their strides) from node to node; an op that has no meta
// kernel in this LibTorch is run on zero-filled CPU tensors instead.
#pragma once

#include "spmd/ir/graph.h"

#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace spmd {

struct Problem {
  std::string where;  // JSON pointer into the graph's dump: "/nodes/12/args/0"
  std::string what;
};

std::vector<Problem> verifyGraph(const Graph& graph);

// Each value's meta tensor as the verifier computes it, with the strides
// the ops give it (indexed by ValueId; undefined where a node was rejected).
std::vector<at::Tensor> metaValues(const Graph& graph);

// Throws a Diagnostic for the first problem, if any.
void verifyGraphOrThrow(const Graph& graph);

}  // namespace spmd

// The reference interpreter: executes a graph node by node through LibTorch's
// dispatcher, on whatever device its input tensors live on. Tests use it as
// the semantics every later lowering must reproduce.
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <string>
#include <vector>

namespace spmd {

class Collectives;

struct RunResult {
  std::vector<at::Tensor> outputs;               // the graph's outputs, in order
  std::map<std::string, at::Tensor> updates;     // new values of updated state, by input name
};

class Interpreter {
 public:
  // Binds every node to its operator once; throws Diagnostic for an unknown op.
  explicit Interpreter(const Graph& graph);

  // `inputs` holds a tensor for every graph input, by name. With
  // `collectives`, communication nodes run across ranks through it; without,
  // they run their one-rank kernels (the identity).
  RunResult run(const std::map<std::string, at::Tensor>& inputs, Collectives* collectives = nullptr) const;

 private:
  const Graph& graph_;
  std::vector<c10::OperatorHandle> ops_;
  std::vector<std::vector<ValueId>> releaseAfter_;  // values whose last use is node i
};

}  // namespace spmd

// The reference interpreter: executes a graph node by node through LibTorch's
// dispatcher, on whatever device its input tensors live on. Tests use it as
// the semantics every later lowering must reproduce.
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
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
  // Keep: every node writes fresh tensors and inputs are only read (the
  // reference semantics). Reuse: _foreach ops whose first list dies at the
  // node run in place over it, and spmd::fused_adam over its parameters,
  // moments and steps (an optimizer's state and parameters updated where
  // they live); the inputs named by overwrittenInputs() are written.
  enum class Buffers { Keep, Reuse };

  // Binds every node to its operator once; throws Diagnostic for an unknown op.
  explicit Interpreter(const Graph& graph, Buffers buffers = Buffers::Keep);

  // `inputs` holds a tensor for every graph input, by name. With
  // `collectives`, communication nodes run across ranks through it; without,
  // they run their one-rank kernels (the identity).
  // `afterNode`, if given, is called after each node is issued (profiling).
  RunResult run(const std::map<std::string, at::Tensor>& inputs, Collectives* collectives = nullptr,
                const std::function<void(const Node&)>& afterNode = {}) const;

  // With Buffers::Reuse: the inputs a run writes over, and how many nodes run
  // in place. Each such input must own its storage (share it with no other input).
  const std::vector<std::string>& overwrittenInputs() const { return overwritten_; }
  size_t inPlaceNodes() const {
    size_t n = 0;
    for (const auto& op : inPlace_) n += op.has_value();
    return n;
  }
  // With Buffers::Reuse: the collectives that work in their input, which
  // dies there (across ranks: reduced in it; on one rank: it is the result).
  size_t collectivesInPlace() const { return static_cast<size_t>(std::count(reusesInput_.begin(), reusesInput_.end(), true)); }

 private:
  void planInPlace(const std::vector<int>& lastUse);

  const Graph& graph_;
  std::vector<c10::OperatorHandle> ops_;
  std::vector<std::vector<ValueId>> releaseAfter_;  // values whose last use is node i
  struct InPlaceCall {
    c10::OperatorHandle op;             // the node's in-place variant
    std::vector<size_t> writtenLists;   // the list arguments it writes: the node's results, in order
  };
  std::vector<std::optional<InPlaceCall>> inPlace_;  // for node i, when it runs in place
  std::vector<std::string> overwritten_;
  std::vector<bool> reusesInput_;  // collective node i may reduce in its input
};

}  // namespace spmd

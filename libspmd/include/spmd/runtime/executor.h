// Running one iteration's graph as a training step, eagerly through the
// interpreter or, on CUDA with --cudagraphs, captured once into a CUDA graph
// and replayed.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/runtime/interpreter.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace spmd {

class Collectives;
struct CapturedStep;

using TensorMap = std::map<std::string, at::Tensor>;

class StepExecutor {
 public:
  // `capture`: after `eagerSteps` eager steps (which also let NCCL and
  // cuBLAS set themselves up), capture the step and replay it from then on.
  StepExecutor(Graph graph, bool capture, int eagerSteps = 2);
  ~StepExecutor();
  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  // One step: reads parameters, buffers and state from `state` and the data
  // inputs from `data`, and leaves the updated values in `state`. The step
  // writes over state tensors (optimizer updates run in place, and always
  // once captured): `state` must be the caller's own. Returns the graph's
  // outputs (the loss first; a replay rewrites the same tensors).
  // `afterNode`: see Interpreter::run; given, the step runs eagerly.
  std::vector<at::Tensor> run(TensorMap& state, const TensorMap& data, Collectives* comm,
                              const std::function<void(const Node&)>& afterNode = {});

  bool captured() const { return captured_ != nullptr; }

 private:
  std::vector<at::Tensor> runEagerly(TensorMap& state, const TensorMap& data, Collectives* comm,
                        const std::function<void(const Node&)>& afterNode = {});
  void capture(TensorMap& state, const TensorMap& data, Collectives* comm);
  void separateOverwrittenState(TensorMap& state) const;
  void rebindCapturedState(TensorMap& state) const;

  Graph graph_;
  Interpreter interpreter_;
  bool capture_;
  int eagerSteps_;
  int stepsRun_ = 0;
  std::unique_ptr<CapturedStep> captured_;
};

}  // namespace spmd

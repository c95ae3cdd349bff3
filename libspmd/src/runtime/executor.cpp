#include "spmd/runtime/executor.h"

#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#ifdef SPMD_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <set>

namespace spmd {

struct CapturedStep {
#ifdef SPMD_WITH_CUDA
  at::cuda::CUDAGraph graph;
#endif
  TensorMap staticData;  // the data inputs the graph reads: refilled each step
  TensorMap staticState;  // the state tensors the graph reads and writes in place
  std::vector<at::Tensor> outputs;  // the graph's outputs, rewritten by each replay
};

StepExecutor::StepExecutor(Graph graph, bool capture, int eagerSteps)
    : graph_(std::move(graph)),
      interpreter_(graph_, Interpreter::Buffers::Reuse),
      capture_(capture),
      eagerSteps_(eagerSteps) {}

StepExecutor::~StepExecutor() = default;

std::vector<at::Tensor> StepExecutor::run(TensorMap& state, const TensorMap& data, Collectives* comm,
                             const std::function<void(const Node&)>& afterNode) {
  ++stepsRun_;
  if (afterNode) return runEagerly(state, data, comm, afterNode);
  if (captured_) {
    for (auto& [name, t] : captured_->staticData) t.copy_(data.at(name));
    rebindCapturedState(state);
#ifdef SPMD_WITH_CUDA
    captured_->graph.replay();
#endif
    return captured_->outputs;
  }
  if (!capture_ || stepsRun_ <= eagerSteps_) return runEagerly(state, data, comm);
  capture(state, data, comm);
#ifdef SPMD_WITH_CUDA
  captured_->graph.replay();
#endif
  return captured_->outputs;
}

// Another iteration's graph (run eagerly between replays: a checkpoint's
// cleanup and the setup after it) may have left new tensors in `state`:
// their values go into the tensors the captured graph reads, which become
// the state again.
void StepExecutor::rebindCapturedState(TensorMap& state) const {
  for (auto& [name, fixed] : captured_->staticState) {
    at::Tensor& current = state.at(name);
    if (current.is_same(fixed)) continue;
    fixed.copy_(current);
    current = fixed;
  }
}

// The interpreter writes over some state inputs: none of them may share its
// storage with another input (an earlier step may have left one tensor under
// two names, or an artifact two names on one storage).
void StepExecutor::separateOverwrittenState(TensorMap& state) const {
  if (interpreter_.overwrittenInputs().empty()) return;
  std::map<const void*, int> users;  // by storage: views of one buffer count too
  for (const auto& [name, t] : state) ++users[t.storage().unsafeGetStorageImpl()];
  for (const std::string& name : interpreter_.overwrittenInputs()) {
    at::Tensor& t = state.at(name);
    int& n = users[t.storage().unsafeGetStorageImpl()];
    if (n > 1) {
      --n;
      t = t.clone();
    }
  }
}

std::vector<at::Tensor> StepExecutor::runEagerly(TensorMap& state, const TensorMap& data, Collectives* comm,
                                    const std::function<void(const Node&)>& afterNode) {
  separateOverwrittenState(state);
  TensorMap inputs = state;
  for (const auto& [name, t] : data) inputs[name] = t;
  RunResult result = interpreter_.run(inputs, comm, afterNode);
  for (auto& [name, t] : result.updates) state[name] = std::move(t);
  return result.outputs;
}

void StepExecutor::capture(TensorMap& state, const TensorMap& data, Collectives* comm) {
#ifdef SPMD_WITH_CUDA
  auto step = std::make_unique<CapturedStep>();
  // The graph reads and writes fixed addresses: every state tensor gets
  // storage of its own (an eager step may have left two names on one).
  std::set<const void*> seen;
  for (auto& [name, t] : state) {
    if (!seen.insert(t.data_ptr()).second) t = t.clone();
  }
  for (const auto& [name, t] : data) step->staticData[name] = t.clone();
  TensorMap inputs = state;
  for (const auto& [name, t] : step->staticData) inputs[name] = t;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  side.synchronize();
  c10::cuda::getCurrentCUDAStream().synchronize();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    // Thread-local: NCCL's watchdog thread keeps polling its events meanwhile.
    step->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    RunResult result = interpreter_.run(inputs, comm);
    // Updates whose new value is another input's old value go first, before
    // that input is overwritten.
    std::vector<std::pair<std::string, at::Tensor>> ordered;
    for (const auto& u : graph_.updates()) {
      if (graph_.inputOf(u.value)) {
        const std::string& name = graph_.value(u.input).name;
        ordered.emplace_back(name, result.updates.at(name));
      }
    }
    for (const auto& u : graph_.updates()) {
      if (!graph_.inputOf(u.value)) {
        const std::string& name = graph_.value(u.input).name;
        ordered.emplace_back(name, result.updates.at(name));
      }
    }
    for (auto& [name, t] : ordered) {
      if (!t.is_same(state.at(name))) state.at(name).copy_(t);
    }
    step->outputs = result.outputs;
    step->graph.capture_end();
    step->staticState = state;
  }
  c10::cuda::getCurrentCUDAStream().synchronize();
  captured_ = std::move(step);
#else
  (void)state;
  (void)data;
  (void)comm;
  throw Diagnostic("--cudagraphs", "this build of spmd has no CUDA support");
#endif
}

}  // namespace spmd

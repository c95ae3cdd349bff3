#include "spmd/runtime/run_state.h"

#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

namespace spmd {

TensorMap placeState(const Artifact& artifact, const at::Device& device) {
  const Graph& g = artifact.graph;
  TensorMap state;
  for (const auto& in : g.inputs()) {
    if (isPerStepInput(in.kind)) continue;
    const std::string& name = g.value(in.value).name;
    auto it = artifact.state.find(name);
    if (it == artifact.state.end()) throw Diagnostic("'" + name + "'", "the artifact holds no value for this input");
    const at::Tensor& initial = it->second;
    state[name] = artifact.zeroState.count(name) ? at::zeros(initial.sizes(), initial.options().device(device))
                                                 : initial.to(initial.options().device(device), false, /*copy=*/true);
  }
  return state;
}

}  // namespace spmd

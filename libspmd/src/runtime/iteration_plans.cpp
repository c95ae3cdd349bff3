#include "iteration_plans.h"

#include "spmd/ops/op_traits.h"

#include <iostream>

namespace spmd {

IterationPlans::IterationPlans(const Graph& g, bool cudagraphs, bool lead) : unrolled_(g), cudagraphs_(cudagraphs) {
  if (!cudagraphs) return;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (syncsWithHost(g.nodes()[i].op)) {
      if (lead) {
        std::cerr << "spmd-run: note: /nodes/" << i << ": " << g.nodes()[i].qualifiedName()
                  << " waits for a result on the host; the step runs without CUDA graphs\n";
      }
      cudagraphs_ = false;
      break;
    }
  }
}

StepExecutor& IterationPlans::at(Iteration it) {
  auto& slot = plans_[it];
  if (!slot) slot = std::make_unique<StepExecutor>(graphForIteration(unrolled_, it), cudagraphs_ && it == Iteration::Middle);
  return *slot;
}

}  // namespace spmd

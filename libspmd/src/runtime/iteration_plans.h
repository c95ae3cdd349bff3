// The step executor each kind of iteration (first, middle, last) of an
// unrolled graph runs, bound on first use.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/ir/iter_graph.h"
#include "spmd/runtime/executor.h"

#include <map>
#include <memory>

namespace spmd {

class IterationPlans {
 public:
  // With `cudagraphs`, the main iteration (the one that repeats) is captured
  // unless a node waits for a result on the host; `lead` (rank 0) notes
  // that on stderr.
  IterationPlans(const Graph& g, bool cudagraphs, bool lead);

  StepExecutor& at(Iteration it);

 private:
  const Graph& unrolled_;
  bool cudagraphs_;
  std::map<Iteration, std::unique_ptr<StepExecutor>> plans_;
};

}  // namespace spmd

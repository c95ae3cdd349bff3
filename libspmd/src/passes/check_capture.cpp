// check-capture: with --cudagraphs, finds the nodes a CUDA graph cannot hold
// (kernels that wait for a result on the host) and notes each, since
// spmd-run then runs that step eagerly. Changes nothing in the graph.
#include "spmd/passes/pass.h"
#include "spmd/ops/op_traits.h"

namespace spmd {

bool runCheckCapture(Graph& g, const PipelineOptions& options) {
  if (!options.lower.cudagraphs || !options.notes) return false;
  if (options.lower.device != "cuda") {
    options.notes->push_back("--cudagraphs: CUDA graphs need --device cuda; the step runs eagerly");
    return false;
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (syncsWithHost(n.op)) {
      options.notes->push_back("/nodes/" + std::to_string(i) + ": " + n.qualifiedName() +
                               " waits for a result on the host; spmd-run runs the step without CUDA graphs");
    }
  }
  return false;
}


}  // namespace spmd

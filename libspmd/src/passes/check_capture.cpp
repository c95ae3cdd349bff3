// check-capture: with --cudagraphs, finds the nodes a CUDA graph cannot hold
// (kernels that wait for a result on the host) and notes each, since
// spmd-run then runs that step eagerly. Changes nothing in the graph.
#include "spmd/passes/pass.h"
#include "spmd/runtime/executor.h"

namespace spmd {

bool runCheckCapture(Graph& g, const PipelineOptions& options) {
  if (!options.lower.cudagraphs || !options.notes) return false;
  if (options.lower.device != "cuda") {
    options.notes->push_back("--cudagraphs: CUDA graphs need --device cuda; the step runs eagerly");
    return false;
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    std::string why;
    if (!capturable(g.nodes()[i], why)) {
      options.notes->push_back("/nodes/" + std::to_string(i) + ": " + why + "; spmd-run runs the step without CUDA graphs");
    }
  }
  return false;
}

const std::vector<std::string>& lowerPipeline() {
  static const std::vector<std::string> names = {"capturable-adam", "embedding-grad", "fuse-optimizer", "check-capture"};
  return names;
}

}  // namespace spmd

#include "spmd/pipelines/pipelines.h"

#include "spmd/io/load.h"
#include "spmd/ir/verify.h"
#include "spmd/support/diagnostic.h"

namespace spmd {

std::vector<std::string> expandPipeline(const PipelineOptions&) { return {"autodiff", "grad-sync", "optimizer"}; }

std::vector<std::string> splitPipeline(const PipelineOptions&) { return {"grad-sync", "bucket"}; }

std::vector<std::string> unrollPipeline(const PipelineOptions&) { return {"unroll"}; }

std::vector<std::string> lowerPipeline(const PipelineOptions&) {
  return {"capturable-adam", "embedding-grad", "fuse-optimizer", "check-capture"};
}

void runStage(LoadedGraph& loaded, const std::vector<std::string>& names, const PipelineOptions& options,
              const DebugOptions& debug) {
  try {
    verifyGraphOrThrow(loaded.graph);
    runPasses(loaded.graph, names, options, debug);
  } catch (Diagnostic& d) {
    throw d.inFile(loaded.displayName);
  }
}

}  // namespace spmd

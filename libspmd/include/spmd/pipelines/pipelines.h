// Which passes each stage runs, in one place: a stage's options become a
// pass list here (as XLA's compiler driver assembles its pipelines), and the
// stage front ends call runStage() on what they loaded.
#pragma once

#include "spmd/passes/pass.h"

#include <string>
#include <vector>

namespace spmd {

struct LoadedGraph;

// spmd-expand: autodiff, grad-sync, optimizer.
std::vector<std::string> expandPipeline(const PipelineOptions& options);
// spmd-expand --eval-step: eval-mode, match-attention, autocast: the forward
// graph as model.eval() runs it, the loss its only output.
std::vector<std::string> evalPipeline(const PipelineOptions& options);
// spmd-split: grad-sync (for dumps that lack it), bucket.
std::vector<std::string> splitPipeline(const PipelineOptions& options);
// spmd-unroll: unroll.
std::vector<std::string> unrollPipeline(const PipelineOptions& options);
// spmd-lower: adam-to-capturable-foreach (cuda), embedding-grad (cuda with CUDA graphs),
// optimizer-to-foreach (unless --no-fuse), check-capture (with --cudagraphs).
std::vector<std::string> lowerPipeline(const PipelineOptions& options);

// A stage's work on its loaded input: verify (unless `verifyInput` is false:
// the graph came from the stage before in the same process), run `names`, and
// name the input file in any diagnostic.
void runStage(LoadedGraph& loaded, const std::vector<std::string>& names, const PipelineOptions& options,
              const DebugOptions& debug, bool verifyInput = true);

}  // namespace spmd

// Each stage's flags, recorded in the graph it writes (Graph::flags()): the
// command-line words that make the same step, from the options the stage
// ran with. spmd-inspect shows them; spmd-compile's stages record the same
// words as the stage tools, so its artifact stays the shell pipeline's.
#pragma once

#include "spmd/passes/pass.h"
#include "spmd/pipelines/stages.h"

#include <string>
#include <vector>

namespace spmd {

class Graph;

// The flags of `stage` that change the step, with the values `options` hold:
// what the stage always reads (the optimizer's hyperparameters, bucket caps,
// --iters, --device, the attention kernel), defaults included, and the rest
// where set. `evalStep`: spmd-expand --eval-step, whose step has no optimizer.
std::vector<std::vector<std::string>> stageFlagWords(const PipelineOptions& options, Stage stage, bool evalStep);

// Records them in `g`, after what earlier stages recorded; a flag recorded
// before (the stage run again) gives way to the new value.
void recordStageFlags(Graph& g, const PipelineOptions& options, Stage stage, bool evalStep = false);

}  // namespace spmd

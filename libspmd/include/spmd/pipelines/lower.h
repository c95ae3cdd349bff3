// spmd-lower (first version): a verified graph, every node bound to its
// dispatcher kernel, and all the tensors it needs, packed into an artifact.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/pipelines/pipelines.h"

namespace spmd {

// Binds every node (an op this LibTorch lacks is a Diagnostic), loads the
// parameters and buffers the graph's weights reference, and starts optimizer
// state at zero where the weights file has none, as torch.optim does.
// The lowering passes (lowerPipeline()) run first, with notes and debug
// output as every stage's passes.
Artifact lowerGraph(Graph graph, const PipelineOptions& options, const DebugOptions& debug = {});
// With the default lowering for `device` (what spmd-run does with a graph).
Artifact lowerGraph(Graph graph, const std::string& device);

// What spmd-run runs: the artifact `loaded` holds, or the graph it holds
// lowered for `device` (the graph is moved out of `loaded`); a lowering
// error names the loaded file.
Artifact artifactOf(LoadedGraph& loaded, const std::string& device);

}  // namespace spmd

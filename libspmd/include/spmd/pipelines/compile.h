// The whole pipeline in one process: what `spmd-expand | spmd-split |
// spmd-unroll | spmd-lower` does, over one in-memory graph, each stage given
// the options its own tool would parse, so that the artifact is the one the
// shell pipeline writes from the same flags. spmd-compile's library half;
// tests call it to pay LibTorch's start-up once.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/io/load.h"
#include "spmd/passes/pass.h"
#include "spmd/pipelines/stages.h"

#include <functional>
#include <string>
#include <vector>

namespace spmd {

struct CompileOptions {
  // Every stage's options in one (the union of the stages' flags); each stage
  // gets only its own groups (stageOptions()).
  PipelineOptions pipeline;
  DebugOptions debug;
  // Stop after this stage (Lower: run them all).
  Stage last = Stage::Lower;
  // Verify the graph between stages too (spmd-compile --verify-each); the
  // passes' own verification (after every pass that changed it) always runs.
  bool verifyEach = false;
  // The forward-only evaluation step instead of the train step (spmd-expand
  // --eval-step): expand runs evalPipeline(), split and unroll nothing.
  bool evalStep = false;
  // Called with each stage's graph after the stage ran (Expand, Split,
  // Unroll); may write it out.
  std::function<void(Stage, const Graph&)> afterStage;
};

// The options `stage`'s tool would hold after parsing the same flags: the
// groups it does not parse left at their defaults.
PipelineOptions stageOptions(const PipelineOptions& all, Stage stage);

// Runs the stages on `loaded` (its graph is moved into the artifact when the
// last stage is Lower; else it holds the last stage's graph and the returned
// artifact is empty). Diagnostics name the loaded file. With debug.dumpDir
// set, each stage's per-pass listings go to DIR/<stage>/.
Artifact compileGraph(LoadedGraph& loaded, const CompileOptions& options);

}  // namespace spmd

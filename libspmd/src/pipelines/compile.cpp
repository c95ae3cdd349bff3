#include "spmd/pipelines/compile.h"

#include "spmd/pipelines/lower.h"
#include "spmd/pipelines/pipelines.h"
#include "spmd/pipelines/recorded_flags.h"
#include "spmd/support/diagnostic.h"

#include <sys/stat.h>

namespace spmd {

namespace {

constexpr Stage kStages[] = {Stage::Expand, Stage::Split, Stage::Unroll, Stage::Lower};

std::vector<std::string> passesOf(Stage stage, const PipelineOptions& options, bool evalStep) {
  if (evalStep && stage != Stage::Lower) return stage == Stage::Expand ? evalPipeline(options) : std::vector<std::string>{};
  switch (stage) {
    case Stage::Expand: return expandPipeline(options);
    case Stage::Split: return splitPipeline(options);
    case Stage::Unroll: return unrollPipeline(options);
    case Stage::Lower: return lowerPipeline(options);
  }
  return {};
}

// --dump-dir DIR: each stage's listings in DIR/<stage>/, as that stage's
// tool would number them in its own --dump-dir.
DebugOptions stageDebug(const DebugOptions& debug, Stage stage) {
  DebugOptions d = debug;
  if (!d.dumpDir.empty()) {
    ::mkdir(d.dumpDir.c_str(), 0777);
    d.dumpDir += std::string("/") + stageName(stage);
  }
  return d;
}

}  // namespace

PipelineOptions stageOptions(const PipelineOptions& all, Stage stage) {
  PipelineOptions o;
  o.diagnostics = all.diagnostics;
  o.buffers = all.buffers;
  switch (stage) {
    case Stage::Expand:  // spmd-expand's optimizer, --grad-reduce, precision and training flags
      o.optimizer = all.optimizer;
      o.gradReduce = all.gradReduce;
      o.reduceDtype = all.reduceDtype;
      o.autocast = all.autocast;
      o.training = all.training;
      break;
    case Stage::Split:  // spmd-split's bucket flags and --grad-reduce
      o.buckets = all.buckets;
      o.gradReduce = all.gradReduce;
      break;
    case Stage::Unroll:
      o.unroll = all.unroll;
      break;
    case Stage::Lower:
      o.lower = all.lower;
      break;
  }
  return o;
}

Artifact compileGraph(LoadedGraph& loaded, const CompileOptions& options) {
  for (Stage stage : kStages) {
    const PipelineOptions stageOpts = stageOptions(options.pipeline, stage);
    const DebugOptions debug = stageDebug(options.debug, stage);
    // The first stage verifies what it read; later ones take what the passes
    // before left verified, unless asked to look again.
    const bool verifyInput = stage == Stage::Expand || options.verifyEach;
    // The evaluation step runs no split or unroll passes: the tools' pipeline
    // for it (spmd-expand --eval-step | spmd-lower) has neither stage.
    if (!options.evalStep || stage == Stage::Expand || stage == Stage::Lower) {
      recordStageFlags(loaded.graph, stageOpts, stage, options.evalStep);
    }
    if (stage == Stage::Lower) {
      try {
        return lowerGraph(std::move(loaded.graph), stageOpts, debug);
      } catch (Diagnostic& d) {
        throw d.inFile(loaded.displayName);
      }
    }
    runStage(loaded, passesOf(stage, stageOpts, options.evalStep), stageOpts, debug, verifyInput);
    if (options.afterStage) options.afterStage(stage, loaded.graph);
    if (stage == options.last) break;
  }
  return {};
}

}  // namespace spmd

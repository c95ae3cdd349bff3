// Passes over the graph: a registry by name (behind --list-passes,
// --print-ir-after-all and --dump-dir) and a runner that verifies the graph
// after every pass, as MLIR's pass manager does.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/passes/options.h"

#include <ostream>
#include <string>
#include <vector>

namespace spmd {

struct PassInfo {
  const char* name;
  const char* summary;
  // Returns whether the graph changed. Throws Diagnostic for bad input.
  bool (*run)(Graph& graph, const PipelineOptions& options);
};

const std::vector<PassInfo>& registeredPasses();
const PassInfo& findPass(const std::string& name);  // throws std::logic_error

struct DebugOptions {
  bool printIrAfterAll = false;  // listing after each pass on `log`
  std::string dumpDir;           // NNNN.after_<pass>.txt per pass when set
  std::ostream* log = nullptr;
};

// Runs the named passes in order, verifying after each; a pass that leaves
// an invalid graph is an internal error (std::logic_error).
void runPasses(Graph& graph, const std::vector<std::string>& names, const PipelineOptions& options,
               const DebugOptions& debug);

// A stage's work on its loaded input: verify, run `names`, and name the
// input file in any diagnostic.
struct LoadedGraph;
void runStage(LoadedGraph& loaded, const std::vector<std::string>& names, const PipelineOptions& options,
              const DebugOptions& debug);

// What spmd-expand runs: autodiff, grad-sync, optimizer.
const std::vector<std::string>& expandPipeline();

// "name  summary" per registered pass, for --list-passes.
std::string listPasses();

// The passes themselves, one file each under src/passes/.
bool runAutodiff(Graph& graph, const PipelineOptions& options);
bool runGradSync(Graph& graph, const PipelineOptions& options);
bool runOptimizer(Graph& graph, const PipelineOptions& options);
bool runBucket(Graph& graph, const PipelineOptions& options);

// What spmd-split runs: grad-sync (for dumps that lack it), bucket.
const std::vector<std::string>& splitPipeline();

bool runUnroll(Graph& graph, const PipelineOptions& options);
bool runFuseOptimizer(Graph& graph, const PipelineOptions& options);
bool runCheckCapture(Graph& graph, const PipelineOptions& options);
bool runEmbeddingGrad(Graph& graph, const PipelineOptions& options);
bool runCapturableAdam(Graph& graph, const PipelineOptions& options);
// What spmd-lower runs: capturable-adam, embedding-grad, fuse-optimizer, check-capture.
const std::vector<std::string>& lowerPipeline();
// What spmd-unroll runs: unroll.
const std::vector<std::string>& unrollPipeline();

}  // namespace spmd

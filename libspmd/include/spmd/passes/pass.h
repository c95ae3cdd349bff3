// Passes over the graph: the interface every pass implements, a registry by
// name (behind --list-passes, --passes, --print-ir-after and --dump-dir),
// and the manager that runs a list of them, verifying the graph after each
// pass that changed it, as MLIR's pass manager does. Which passes a stage
// runs is decided in pipelines/pipelines.cpp, not here or in the passes.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/passes/options.h"

#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace spmd {

class DiagnosticEngine;

// One pass: a class in one file under src/passes/, holding its own options.
class Pass {
 public:
  virtual ~Pass() = default;
  // Returns whether the graph changed. Throws Diagnostic for bad input;
  // notes what it did not do, and why, on `diagnostics`.
  virtual bool run(Graph& graph, DiagnosticEngine& diagnostics) = 0;
};

struct PassInfo {
  const char* name;
  const char* summary;
  // The pass, configured with its own part of a stage's options.
  std::unique_ptr<Pass> (*create)(const PipelineOptions& options);
};

const std::vector<PassInfo>& registeredPasses();
const PassInfo* findPass(const std::string& name);  // nullptr when there is none

// The pass manager's debugging aids, as mlir-opt's: listings after passes,
// one file per pass, and the time each pass took.
struct DebugOptions {
  bool printIrAfterAll = false;          // --print-ir-after-all: listing after each pass on `log`
  std::vector<std::string> printIrAfter; // --print-ir-after=PASS: listing after these passes
  std::string dumpDir;                   // --dump-dir: NNNN.after_<pass>.txt per pass when set
  bool timePasses = false;               // --time-passes: a table of pass times on `log`
  std::ostream* log = nullptr;
};

// Runs the named passes in order. A pass that reports a change is followed
// by the verifier; one that leaves an invalid graph is an internal error
// (std::logic_error). An unknown name is a Diagnostic. Notes go to
// `options.diagnostics` (dropped when it is null).
void runPasses(Graph& graph, const std::vector<std::string>& names, const PipelineOptions& options,
               const DebugOptions& debug);

// "name  summary" per registered pass, for --list-passes.
std::string listPasses();

// The passes' factories, one file each under src/passes/.
std::unique_ptr<Pass> createAttentionPass(const PipelineOptions& options);
std::unique_ptr<Pass> createAutocastPass(const PipelineOptions& options);
std::unique_ptr<Pass> createAutodiffPass(const PipelineOptions& options);
std::unique_ptr<Pass> createGradSyncPass(const PipelineOptions& options);
std::unique_ptr<Pass> createMicroBatchesPass(const PipelineOptions& options);
std::unique_ptr<Pass> createOptimizerPass(const PipelineOptions& options);
std::unique_ptr<Pass> createBucketPass(const PipelineOptions& options);
std::unique_ptr<Pass> createUnrollPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseAttentionPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFusedAdamPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseOptimizerPass(const PipelineOptions& options);
std::unique_ptr<Pass> createCheckCapturePass(const PipelineOptions& options);
std::unique_ptr<Pass> createEmbeddingGradPass(const PipelineOptions& options);
std::unique_ptr<Pass> createCapturableAdamPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFusePointwisePass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseDropoutPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseRowsPass(const PipelineOptions& options);
std::unique_ptr<Pass> createSliceGradsPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseCrossEntropyPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseLayerNormPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseColumnSumPass(const PipelineOptions& options);
std::unique_ptr<Pass> createLinearReluPass(const PipelineOptions& options);
std::unique_ptr<Pass> createCatViewsPass(const PipelineOptions& options);
std::unique_ptr<Pass> createEagerBatchNormPass(const PipelineOptions& options);
std::unique_ptr<Pass> createDcePass(const PipelineOptions& options);
std::unique_ptr<Pass> createCsePass(const PipelineOptions& options);

}  // namespace spmd

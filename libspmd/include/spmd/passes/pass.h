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

// A count a pass keeps of what it did, as MLIR's pass statistics:
// {"LayerNorm(s) as spmd::layer_norm", 3}.
struct PassStatistic {
  std::string what;
  int64_t value = 0;
};

// One pass: a class in one file under src/passes/, holding its own options.
class Pass {
 public:
  virtual ~Pass() = default;
  // Returns whether the graph changed. Throws Diagnostic for bad input;
  // notes what it did not do, and why, on `diagnostics`. What it did goes
  // into its statistics (count()), which the pass manager reports.
  virtual bool run(Graph& graph, DiagnosticEngine& diagnostics) = 0;
  // In the order each was first counted.
  const std::vector<PassStatistic>& statistics() const { return statistics_; }

 protected:
  // Adds `by` to the statistic `what`, made at 0 on its first count (so
  // count(what, 0) reports a 0).
  void count(const std::string& what, int64_t by = 1);

 private:
  std::vector<PassStatistic> statistics_;
};

struct PassInfo {
  const char* name;
  const char* summary;
  // The pass, configured with its own part of a stage's options.
  std::unique_ptr<Pass> (*create)(const PipelineOptions& options);
  // The name it had before, still taken by --passes and --print-ir-after for
  // one release (nullptr when none).
  const char* formerName = nullptr;
};

const std::vector<PassInfo>& registeredPasses();
// The pass of that name, or of that former name; nullptr when there is none.
const PassInfo* findPass(const std::string& name);

// What one pass of a run counted.
struct PassStatistics {
  std::string pass;
  std::vector<PassStatistic> statistics;
};

// The pass manager's debugging aids, as mlir-opt's: listings after passes,
// one file per pass, and the time each pass took.
struct DebugOptions {
  bool printIrAfterAll = false;          // --print-ir-after-all: listing after each pass on `log`
  std::vector<std::string> printIrAfter; // --print-ir-after=PASS: listing after these passes
  std::string dumpDir;                   // --dump-dir: NNNN.after_<pass>.txt per pass when set
  bool timePasses = false;               // --time-passes: a table of pass times on `log`
  bool passStatistics = false;           // --pass-statistics: each pass's counts on `log`
  std::ostream* log = nullptr;
};

// Runs the named passes in order. A pass that reports a change is followed
// by the verifier; one that leaves an invalid graph is an internal error
// (std::logic_error). An unknown name is a Diagnostic. Notes go to
// `options.diagnostics` (dropped when it is null): after each pass that
// counted something other than 0, one note "<pass>: <value> <what>, ...".
// Returns every pass's statistics, in the order the passes ran.
std::vector<PassStatistics> runPasses(Graph& graph, const std::vector<std::string>& names,
                                      const PipelineOptions& options, const DebugOptions& debug);

// The --pass-statistics table: each pass, then "  <value>  <what>" per statistic.
std::string printPassStatistics(const std::vector<PassStatistics>& report);

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
std::unique_ptr<Pass> createShardPass(const PipelineOptions& options);
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
std::unique_ptr<Pass> createAlignGemmsPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseCrossEntropyPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseLayerNormPass(const PipelineOptions& options);
std::unique_ptr<Pass> createFuseColumnSumPass(const PipelineOptions& options);
std::unique_ptr<Pass> createLinearReluPass(const PipelineOptions& options);
std::unique_ptr<Pass> createCatViewsPass(const PipelineOptions& options);
std::unique_ptr<Pass> createPackBucketsPass(const PipelineOptions& options);
std::unique_ptr<Pass> createChannelsLastPass(const PipelineOptions& options);
std::unique_ptr<Pass> createCopiesToViewsPass(const PipelineOptions& options);
std::unique_ptr<Pass> createRepeatKvToGqaPass(const PipelineOptions& options);
std::unique_ptr<Pass> createCastBeforeViewPass(const PipelineOptions& options);
std::unique_ptr<Pass> createRecomputePointwisePass(const PipelineOptions& options);
std::unique_ptr<Pass> createStackToKernelPass(const PipelineOptions& options);
std::unique_ptr<Pass> createEvalModePass(const PipelineOptions& options);
std::unique_ptr<Pass> createEagerBatchNormPass(const PipelineOptions& options);
std::unique_ptr<Pass> createDcePass(const PipelineOptions& options);
std::unique_ptr<Pass> createCsePass(const PipelineOptions& options);

}  // namespace spmd

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

// The pass manager's debugging aids, as mlir-opt's: listings after passes,
// one file per pass, and the time each pass took.
struct DebugOptions {
  bool printIrAfterAll = false;          // --print-ir-after-all: listing after each pass on `log`
  std::vector<std::string> printIrAfter; // --print-ir-after=PASS: listing after these passes
  std::string dumpDir;                   // --dump-dir: NNNN.after_<pass>.txt per pass when set
  bool timePasses = false;               // --time-passes: a table of pass times on `log`
  std::ostream* log = nullptr;
};

// Runs the named passes in order, verifying after each; a pass that leaves
// an invalid graph is an internal error (std::logic_error).
void runPasses(Graph& graph, const std::vector<std::string>& names, const PipelineOptions& options,
               const DebugOptions& debug);

// "name  summary" per registered pass, for --list-passes.
std::string listPasses();

// The passes themselves, one file each under src/passes/.
bool runAutodiff(Graph& graph, const PipelineOptions& options);
bool runGradSync(Graph& graph, const PipelineOptions& options);
bool runOptimizer(Graph& graph, const PipelineOptions& options);
bool runBucket(Graph& graph, const PipelineOptions& options);

bool runUnroll(Graph& graph, const PipelineOptions& options);
bool runFuseOptimizer(Graph& graph, const PipelineOptions& options);
bool runCheckCapture(Graph& graph, const PipelineOptions& options);
bool runEmbeddingGrad(Graph& graph, const PipelineOptions& options);
bool runCapturableAdam(Graph& graph, const PipelineOptions& options);

}  // namespace spmd

#include "spmd/ir/printer.h"
#include "spmd/ir/verify.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace spmd {

const std::vector<PassInfo>& registeredPasses() {
  static const std::vector<PassInfo> passes = {
      {"autodiff", "reverse-mode autodiff: backward nodes and per-parameter gradients", runAutodiff},
      {"grad-sync", "one all-reduce per gradient across ranks; broadcast buffers from rank 0", runGradSync},
      {"optimizer", "the optimizer update (SGD, Adam, AdamW) as explicit nodes and state", runOptimizer},
      {"bucket", "DDP buckets: one flat all-reduce per bucket, started after its last gradient", runBucket},
      {"fuse-optimizer", "the optimizer's per-parameter element-wise ops as one _foreach call per group", runFuseOptimizer},
      {"capturable-adam", "with --device cuda: Adam as torch.optim's capturable foreach Adam (lerp; step size in the denominator)",
       runCapturableAdam},
      {"embedding-grad", "with --cudagraphs on CUDA: embedding_dense_backward as new_zeros + index_add (capturable)",
       runEmbeddingGrad},
      {"check-capture", "with --cudagraphs: notes what keeps the step out of a CUDA graph", runCheckCapture},
      {"unroll", "setup/main/cleanup iterations; the last bucket's all-reduce and update move to the next iteration", runUnroll},
  };
  return passes;
}

const PassInfo& findPass(const std::string& name) {
  for (const auto& p : registeredPasses()) {
    if (name == p.name) return p;
  }
  throw std::logic_error("no pass named " + name);
}

std::string listPasses() {
  std::string out;
  for (const auto& p : registeredPasses()) {
    std::string name = p.name;
    out += "  " + name + std::string(name.size() < 16 ? 16 - name.size() : 1, ' ') + p.summary + "\n";
  }
  return out;
}

namespace {

void dumpAfter(const Graph& graph, const std::string& pass, size_t index, const DebugOptions& debug) {
  const std::string listing = printListing(graph);
  if (debug.printIrAfterAll && debug.log) *debug.log << "// ----- IR after " << pass << " ----- //\n" << listing;
  if (debug.dumpDir.empty()) return;
  ::mkdir(debug.dumpDir.c_str(), 0777);
  char prefix[24];
  std::snprintf(prefix, sizeof prefix, "%04zu", index);
  const std::string path = debug.dumpDir + "/" + prefix + ".after_" + pass + ".txt";
  std::ofstream out(path);
  out << listing;
  if (!out) throw Diagnostic("--dump-dir", "cannot write " + path);
}

}  // namespace

void runPasses(Graph& graph, const std::vector<std::string>& names, const PipelineOptions& options,
               const DebugOptions& debug) {
  for (size_t i = 0; i < names.size(); ++i) {
    const PassInfo& pass = findPass(names[i]);
    pass.run(graph, options);
    auto problems = verifyGraph(graph);
    if (!problems.empty()) {
      throw std::logic_error(std::string("internal error: the graph is invalid after pass ") + pass.name + ": " +
                             problems[0].where + ": " + problems[0].what);
    }
    dumpAfter(graph, pass.name, i, debug);
  }
}

}  // namespace spmd

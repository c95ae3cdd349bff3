#include "spmd/ir/printer.h"
#include "spmd/ir/verify.h"
#include "spmd/ops/meta.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/phase_times.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace spmd {

const std::vector<PassInfo>& registeredPasses() {
  static const std::vector<PassInfo> passes = {
      {"attention", "a model's own attention (matmul, scale, mask, softmax, matmul) as one spmd::attention node",
       createAttentionPass},
      {"autocast", "torch.autocast's policy for one device type as explicit casts (spmd-expand --autocast)",
       createAutocastPass},
      {"autodiff", "reverse-mode autodiff: backward nodes and per-parameter gradients", createAutodiffPass},
      {"micro-batches", "gradient accumulation: forward and backward on N slices of the data, gradients summed (--micro-batches)",
       createMicroBatchesPass},
      {"grad-sync", "one all-reduce per gradient across ranks; broadcast buffers from rank 0", createGradSyncPass},
      {"optimizer", "the optimizer update (SGD, Adam, AdamW) as explicit nodes and state", createOptimizerPass},
      {"bucket", "DDP buckets: one flat all-reduce per bucket, started after its last gradient", createBucketPass},
      {"fuse-attention", "spmd::attention and its backward as ATen's fused attention kernel; spmd-lower runs it for --device cuda",
       createFuseAttentionPass},
      {"fused-adam", "Adam/AdamW as torch.optim's fused kernel (spmd::fused_adam); spmd-lower runs it for --device cuda",
       createFusedAdamPass},
      {"fuse-optimizer", "the optimizer's per-parameter element-wise ops as one _foreach call per group",
       createFuseOptimizerPass},
      {"capturable-adam", "Adam as torch.optim's capturable foreach Adam (lerp; step size in the denominator); spmd-lower runs it for --device cuda",
       createCapturableAdamPass},
      {"embedding-grad", "embedding_dense_backward as new_zeros + index_add, which a CUDA graph can hold; spmd-lower runs it for --cudagraphs on CUDA",
       createEmbeddingGradPass},
      {"fuse-cross-entropy", "log_softmax + nll_loss and their backward as spmd::cross_entropy(_backward), generated kernels; spmd-lower runs it for --device cuda",
       createFuseCrossEntropyPass},
      {"fuse-layer-norm", "native_layer_norm and its backward as spmd::layer_norm(_backward), generated kernels with the casts and residual gradient around them; spmd-lower runs it for --device cuda",
       createFuseLayerNormPass},
      {"fuse-column-sum", "sums over every dimension but the last (bias gradients) as spmd::column_sum, generated kernels; spmd-lower runs it for --device cuda",
       createFuseColumnSumPass},
      {"linear-relu", "a ReLU after a Linear as _addmm_activation, the ReLU in the GEMM's epilogue; spmd-lower runs it for --device cuda",
       createLinearReluPass},
      {"cat-views", "a cat of reshaped [..., H, D] tensors (attention's q/k/v gradient) reads them itself, without their copies; spmd-lower runs it for --device cuda",
       createCatViewsPass},
      {"eager-batch-norm", "training-mode BatchNorm and its backward through ATen's choice of kernels (cuDNN where eager uses it); spmd-lower runs it for --device cuda",
       createEagerBatchNormPass},
      {"slice-grads", "a sum of slice gradients that split a dimension (cat's backward into a slice's) as one cat; a whole-dimension slice gradient as its input; spmd-lower runs it",
       createSliceGradsPass},
      {"fuse-dropout", "dropout's mask drawn inside the generated kernels that use it (spmd::dropout_seed, spmd::dropout_mul), never stored; spmd-lower runs it for --device cuda",
       createFuseDropoutPass},
      {"fuse-rows", "reductions over the last dimension (softmax, RMSNorm, sums) with the element-wise ops around them as one spmd::fused row kernel each; spmd-lower runs it for --device cuda",
       createFuseRowsPass},
      {"fuse-pointwise", "chains of element-wise ops as one spmd::fused node each (a generated kernel); spmd-lower runs it for --device cuda",
       createFusePointwisePass},
      {"check-capture", "notes what keeps the step out of a CUDA graph; spmd-lower runs it for --cudagraphs on CUDA", createCheckCapturePass},
      {"unroll", "setup/main/cleanup iterations; the last bucket's all-reduce and update move to the next iteration",
       createUnrollPass},
      {"cse", "a node computing what an earlier one did (same op, values, constants and place in the step) reads the earlier's results; not for random ops or collectives",
       createCsePass},
      {"dce", "nodes whose results reach no output, state update or gradient record removed; the pipelines run it after the rewriting passes",
       createDcePass},
  };
  return passes;
}

const PassInfo* findPass(const std::string& name) {
  for (const auto& p : registeredPasses()) {
    if (name == p.name) return &p;
  }
  return nullptr;
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

bool printsAfter(const std::string& pass, const DebugOptions& debug) {
  return debug.printIrAfterAll ||
         std::find(debug.printIrAfter.begin(), debug.printIrAfter.end(), pass) != debug.printIrAfter.end();
}

void dumpAfter(const Graph& graph, const std::string& pass, size_t index, const DebugOptions& debug) {
  const bool print = printsAfter(pass, debug) && debug.log;
  if (!print && debug.dumpDir.empty()) return;
  const std::string listing = printListing(graph);
  if (print) *debug.log << "// ----- IR after " << pass << " ----- //\n" << listing;
  if (debug.dumpDir.empty()) return;
  ::mkdir(debug.dumpDir.c_str(), 0777);
  char prefix[24];
  std::snprintf(prefix, sizeof prefix, "%04zu", index);
  const std::string path = debug.dumpDir + "/" + prefix + ".after_" + pass + ".txt";
  std::ofstream out(path);
  out << listing;
  if (!out) throw Diagnostic("--dump-dir", "cannot write " + path);
}

void verifyAfter(const Graph& graph, const std::string& pass) {
  auto problems = verifyGraph(graph);
  if (!problems.empty()) {
    throw std::logic_error("internal error: the graph is invalid after pass " + pass + ": " + problems[0].where + ": " +
                           problems[0].what);
  }
}

}  // namespace

void runPasses(Graph& graph, const std::vector<std::string>& names, const PipelineOptions& options,
               const DebugOptions& debug) {
  const MetaFallbackScope metaFallback;  // the builders' shape inference, once for all passes
  DiagnosticEngine dropped;
  DiagnosticEngine& diagnostics = options.diagnostics ? *options.diagnostics : dropped;
  if (debug.timePasses) enablePhaseTimes();
  for (size_t i = 0; i < names.size(); ++i) {
    const PassInfo* info = findPass(names[i]);
    if (!info) throw Diagnostic("--passes", "no pass named '" + names[i] + "' (--list-passes lists them)");
    std::unique_ptr<Pass> pass = info->create(options);
    bool changed = false;
    {
      TimedPhase phase(info->name);
      changed = pass->run(graph, diagnostics);
      if (!changed) phase.rename(std::string(info->name) + " (no change)");
    }
    // Printed before it is verified, so that an invalid graph can be read.
    dumpAfter(graph, info->name, i, debug);
    if (changed) {
      TimedPhase phase(std::string("verify after ") + info->name);
      verifyAfter(graph, info->name);
    }
  }
}

}  // namespace spmd

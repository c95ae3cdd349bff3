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
      {"match-attention", "a model's own attention (matmul, scale, mask, softmax, matmul) as one spmd::attention node",
       createAttentionPass, "attention"},
      {"autocast", "torch.autocast's policy for one device type as explicit casts (spmd-expand --autocast)",
       createAutocastPass},
      {"eval-mode", "a forward graph as model.eval() runs it: BatchNorm on its running statistics, dropout off, no state updates, the loss the only output (spmd-expand --eval-step)",
       createEvalModePass},
      {"autodiff", "reverse-mode autodiff: backward nodes and per-parameter gradients", createAutodiffPass},
      {"micro-batches", "gradient accumulation: forward and backward on N slices of the data, gradients summed (--micro-batches)",
       createMicroBatchesPass},
      {"grad-sync", "one all-reduce per gradient across ranks; broadcast buffers from rank 0", createGradSyncPass},
      {"optimizer", "the optimizer update (SGD, Adam, AdamW) as explicit nodes and state", createOptimizerPass},
      {"bucket", "DDP buckets: one flat all-reduce per bucket, started after its last gradient", createBucketPass},
      {"shard", "ZeRO: each bucket reduce-scattered, the optimizer on this rank's dim-0 shards, the updates all-gathered",
       createShardPass},
      {"attention-to-fused-kernel", "spmd::attention and its backward as ATen's fused attention kernel; spmd-lower runs it for --device cuda",
       createFuseAttentionPass, "fuse-attention"},
      {"adam-to-fused-kernel", "Adam/AdamW as torch.optim's fused kernel (spmd::fused_adam); spmd-lower runs it for --device cuda",
       createFusedAdamPass, "fused-adam"},
      {"optimizer-to-foreach", "the optimizer's per-parameter element-wise ops as one _foreach call per group",
       createFuseOptimizerPass, "fuse-optimizer"},
      {"adam-to-capturable-foreach", "Adam as torch.optim's capturable foreach Adam (lerp; step size in the denominator); spmd-lower runs it for --device cuda",
       createCapturableAdamPass, "capturable-adam"},
      {"embedding-grad", "embedding_dense_backward as new_zeros + index_add, which a CUDA graph can hold; spmd-lower runs it for --cudagraphs on CUDA",
       createEmbeddingGradPass},
      {"cross-entropy-to-kernel", "log_softmax + nll_loss and their backward as spmd::cross_entropy(_backward), generated kernels; spmd-lower runs it for --device cuda",
       createFuseCrossEntropyPass, "fuse-cross-entropy"},
      {"layer-norm-to-kernel", "native_layer_norm and its backward as spmd::layer_norm(_backward), generated kernels with the casts and residual gradient around them; spmd-lower runs it for --device cuda",
       createFuseLayerNormPass, "fuse-layer-norm"},
      {"column-sum-to-kernel", "sums over every dimension but the last (bias gradients) as spmd::column_sum, generated kernels; spmd-lower runs it for --device cuda",
       createFuseColumnSumPass, "fuse-column-sum"},
      {"relu-to-gemm-epilogue", "a ReLU after a Linear as _addmm_activation, the ReLU in the GEMM's epilogue; spmd-lower runs it for --device cuda",
       createLinearReluPass, "linear-relu"},
      {"cat-views", "a cat of reshaped [..., H, D] tensors (attention's q/k/v gradient) reads them itself, without their copies; spmd-lower runs it for --device cuda",
       createCatViewsPass},
      {"pack-buckets", "a bucket's cat of upcast 16-bit gradients as spmd::flat_cat, which reads them in 16 bits and writes each once; spmd-lower runs it for --device cuda",
       createPackBucketsPass},
      {"channels-last", "2-D convolutions and their backward read their tensors in channels-last order (cuDNN's NHWC kernels, no transposes), converted once where first read; spmd-lower runs it for --device cuda (--memory-format)",
       createChannelsLastPass},
      {"copies-to-views", "contiguous copies of views that a stack or cuDNN attention could read in place (nn.MultiheadAttention's q/k/v and their gradients) as views; spmd-lower runs it for --device cuda",
       createCopiesToViewsPass},
      {"repeat-kv-to-gqa", "k and v repeated to q's heads before cuDNN's attention (transformers' repeat_kv) read as grouped-query heads, their gradients' sums the kernel's; spmd-lower runs it for --device cuda",
       createRepeatKvToGqaPass},
      {"cast-before-view", "a 16-bit cast of a reshape that nothing else reads made before the reshape, so the kernel that made the value writes it cast; spmd-lower runs it for --device cuda",
       createCastBeforeViewPass},
      {"recompute-pointwise", "an element-wise result of the forward that the backward reads computed again in the backward from what its region read, when that keeps fewer bytes; spmd-lower runs it for --device cuda",
       createRecomputePointwisePass},
      {"eager-batch-norm", "training-mode BatchNorm and its backward through ATen's choice of kernels (cuDNN where eager uses it); spmd-lower runs it for --device cuda",
       createEagerBatchNormPass},
      {"align-gemms", "GEMMs (mm, linear) whose operands cuBLAS would read with a leading dimension that is not a multiple of 16 bytes on zero-padded operands; spmd-lower runs it for CUDA",
       createAlignGemmsPass},
      {"slice-grads", "a sum of slice gradients that split a dimension (cat's backward into a slice's) as one cat; a whole-dimension slice gradient as its input; a chain of select gradients that fill a dimension (rotary embeddings' backward) as one stack; spmd-lower runs it",
       createSliceGradsPass},
      {"dropout-mask-in-kernel", "dropout's mask drawn inside the generated kernels that use it (spmd::dropout_seed, spmd::dropout_mul), never stored; spmd-lower runs it for --device cuda",
       createFuseDropoutPass, "fuse-dropout"},
      {"fuse-rows", "reductions over the last dimension (softmax, RMSNorm, sums) with the element-wise ops around them as one spmd::fused row kernel each; spmd-lower runs it for --device cuda",
       createFuseRowsPass},
      {"fuse-pointwise", "chains of element-wise ops as one spmd::fused node each (a generated kernel); spmd-lower runs it for --device cuda",
       createFusePointwisePass},
      {"stack-to-kernel", "a stack of two generated kernels' results along a new last dimension (rotary embeddings) as one generated kernel writing the pairs, with a 16-bit cast after it; spmd-lower runs it for --device cuda",
       createStackToKernelPass},
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
    if (name == p.name || (p.formerName && name == p.formerName)) return &p;
  }
  return nullptr;
}

void Pass::count(const std::string& what, int64_t by) {
  for (PassStatistic& s : statistics_) {
    if (s.what == what) {
      s.value += by;
      return;
    }
  }
  statistics_.push_back({what, by});
}

std::string printPassStatistics(const std::vector<PassStatistics>& report) {
  std::string out = "// ----- pass statistics ----- //\n";
  for (const PassStatistics& p : report) {
    out += p.pass + "\n";
    for (const PassStatistic& s : p.statistics) out += "  " + std::to_string(s.value) + "  " + s.what + "\n";
  }
  return out;
}

std::string listPasses() {
  size_t width = 0;
  for (const auto& p : registeredPasses()) width = std::max(width, std::string(p.name).size());
  std::string out;
  for (const auto& p : registeredPasses()) {
    const std::string name = p.name;
    const std::string former = p.formerName ? std::string(" (formerly ") + p.formerName + ")" : "";
    out += "  " + name + std::string(width + 2 - name.size(), ' ') + p.summary + former + "\n";
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

// "<pass>: 3 LayerNorm(s) as spmd::layer_norm, 0 cast(s) taken in" when
// the pass counted anything but 0; "" otherwise.
std::string summaryOf(const PassStatistics& p) {
  bool any = false;
  std::string text;
  for (const PassStatistic& s : p.statistics) {
    any = any || s.value != 0;
    text += (text.empty() ? "" : ", ") + std::to_string(s.value) + " " + s.what;
  }
  return any ? p.pass + ": " + text : "";
}

void verifyAfter(const Graph& graph, const std::string& pass) {
  auto problems = verifyGraph(graph);
  if (!problems.empty()) {
    throw std::logic_error("internal error: the graph is invalid after pass " + pass + ": " + problems[0].where + ": " +
                           problems[0].what);
  }
}

}  // namespace

std::vector<PassStatistics> runPasses(Graph& graph, const std::vector<std::string>& names,
                                      const PipelineOptions& options, const DebugOptions& debug) {
  const MetaFallbackScope metaFallback;  // the builders' shape inference, once for all passes
  DiagnosticEngine dropped;
  DiagnosticEngine& diagnostics = options.diagnostics ? *options.diagnostics : dropped;
  if (debug.timePasses) enablePhaseTimes();
  std::vector<PassStatistics> report;
  for (size_t i = 0; i < names.size(); ++i) {
    const PassInfo* info = findPass(names[i]);
    if (!info) throw Diagnostic("--passes", "no pass named '" + names[i] + "' (--list-passes lists them)");
    if (names[i] != info->name) {
      diagnostics.note("--passes", "pass '" + names[i] + "' is now called '" + info->name +
                                       "'; the old name is taken until the next release");
    }
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
    report.push_back({info->name, pass->statistics()});
    const std::string summary = summaryOf(report.back());
    if (!summary.empty()) diagnostics.note(summary);
  }
  if (debug.passStatistics && debug.log) *debug.log << printPassStatistics(report);
  return report;
}

}  // namespace spmd

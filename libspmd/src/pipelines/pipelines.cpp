#include "spmd/pipelines/pipelines.h"

#include "spmd/io/load.h"
#include "spmd/io/weights.h"
#include "spmd/ir/verify.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/phase_times.h"

namespace spmd {
namespace {

// The weights file's buffers, read when a pass first asks (most stages
// never do). A file that cannot be read leaves every buffer unknown: the
// passes that ask only miss an optimisation, and the stage that needs the
// values (spmd-run) reports the file.
class WeightsBufferValues final : public BufferValues {
 public:
  explicit WeightsBufferValues(WeightsRef ref) : ref_(std::move(ref)) {}

  const at::Tensor* find(const std::string& name) override {
    if (!loaded_) {
      loaded_ = true;
      try {
        if (!ref_.file.empty()) values_ = loadWeights(ref_);
      } catch (const std::exception&) {  // Diagnostic, or c10::Error from a torch.save file
        values_.clear();
      }
    }
    auto it = values_.find(name);
    return it == values_.end() ? nullptr : &it->second;
  }

 private:
  WeightsRef ref_;
  bool loaded_ = false;
  std::map<std::string, at::Tensor> values_;
};

}  // namespace

// The rewriting passes leave the nodes they no longer read; dce follows
// those that leave some, before a pass that counts readers sees them.
std::vector<std::string> expandPipeline(const PipelineOptions& options) {
  std::vector<std::string> names = {"match-attention", "dce"};
  if (options.autocast.enabled) names.push_back("autocast");
  for (const char* name : {"autodiff", "dce"}) names.push_back(name);
  if (options.training.microBatches > 1) names.push_back("micro-batches");
  for (const char* name : {"grad-sync", "optimizer", "cse", "dce"}) names.push_back(name);
  return names;
}

std::vector<std::string> evalPipeline(const PipelineOptions& options) {
  std::vector<std::string> names = {"eval-mode", "match-attention", "dce"};
  if (options.autocast.enabled) names.push_back("autocast");
  for (const char* name : {"cse", "dce"}) names.push_back(name);
  return names;
}

std::vector<std::string> splitPipeline(const PipelineOptions& options) {
  if (options.buckets.shard == ShardMode::None) return {"grad-sync", "bucket"};
  return {"grad-sync", "bucket", "shard", "dce"};
}

std::vector<std::string> unrollPipeline(const PipelineOptions&) { return {"unroll"}; }

std::vector<std::string> lowerPipeline(const PipelineOptions& options) {
  const LowerOptions& o = options.lower;
  const bool cuda = o.device == "cuda";
  std::vector<std::string> names = {"slice-grads"};
  if (cuda) names.push_back("attention-to-fused-kernel");
  if (cuda) names.push_back("dce");
  if (cuda) names.push_back("repeat-kv-to-gqa");
  if (cuda) names.push_back("dce");
  if (cuda) names.push_back("eager-batch-norm");
  if (cuda) names.push_back("channels-last");
  if (cuda) names.push_back("cat-views");
  if (cuda) names.push_back("copies-to-views");
  if (cuda) names.push_back("dce");
  if (cuda && o.generateKernels) names.push_back("cast-before-view");
  if (cuda && o.generateKernels) names.push_back("dce");
  if (cuda && o.fuse) names.push_back("relu-to-gemm-epilogue");
  if (cuda && o.generateKernels) names.push_back("cross-entropy-to-kernel");
  if (cuda && o.generateKernels) names.push_back("layer-norm-to-kernel");
  if (cuda && o.generateKernels) names.push_back("column-sum-to-kernel");
  if (cuda && o.fuse) names.push_back("adam-to-fused-kernel");
  if (cuda && o.fuse) names.push_back("dce");
  if (cuda) names.push_back("adam-to-capturable-foreach");
  if (cuda) names.push_back("dce");
  if (cuda && o.cudagraphs) names.push_back("embedding-grad");
  if (o.fuse) names.push_back("optimizer-to-foreach");
  if (cuda) names.push_back("align-gemms");
  if (cuda) names.push_back("pack-buckets");
  if (cuda) names.push_back("dce");
  if (cuda && o.fuse && o.generateKernels) names.push_back("dropout-mask-in-kernel");
  if (cuda && o.fuse && o.generateKernels) names.push_back("recompute-pointwise");
  if (cuda && o.fuse && o.generateKernels) names.push_back("dce");
  if (cuda && o.fuse && o.generateKernels) names.push_back("fuse-rows");
  if (cuda && o.fuse && o.generateKernels) names.push_back("fuse-pointwise");
  if (cuda && o.fuse && o.generateKernels) names.push_back("stack-to-kernel");
  for (const char* name : {"cse", "dce"}) names.push_back(name);
  if (cuda && o.cudagraphs) names.push_back("check-capture");
  return names;
}

void runStage(LoadedGraph& loaded, const std::vector<std::string>& names, const PipelineOptions& options,
              const DebugOptions& debug, bool verifyInput) {
  if (options.diagnostics) options.diagnostics->setFile(loaded.displayName);
  try {
    if (verifyInput) {
      TimedPhase phase("verify input");
      verifyGraphOrThrow(loaded.graph);
    }
    WeightsBufferValues buffers(loaded.graph.weights());
    PipelineOptions withBuffers = options;
    if (!withBuffers.buffers) withBuffers.buffers = &buffers;
    runPasses(loaded.graph, names, withBuffers, debug);
  } catch (Diagnostic& d) {
    throw d.inFile(loaded.displayName);
  }
}

}  // namespace spmd

// Options of the passes, one struct per concern. A stage's options are all
// of them together (PipelineOptions); each pass is created with its own part
// (see passes/pass.h).
#pragma once

#include "spmd/ir/training.h"

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace spmd {

class DiagnosticEngine;

// The values of a graph's buffers, for passes that recognise a constant one
// (the causal mask a model keeps as a buffer). runStage reads them from the
// graph's weights file, on first use.
class BufferValues {
 public:
  virtual ~BufferValues() = default;
  // The value of buffer input `name`, or nullptr where it cannot be read.
  virtual const at::Tensor* find(const std::string& name) = 0;
};

enum class OptimizerKind { Sgd, Adam, AdamW };

// torch.optim's hyperparameters, with its defaults (AdamW's weight decay
// default, 1e-2, is applied by `optimizerDefaults`).
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::Adam;
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double weightDecay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;
};

enum class GradReduce { Mean, Sum };

// DDPOptimizer's bucketing (spmd-split).
struct BucketOptions {
  double capMb = 25.0;       // --bucket-cap-mb
  double firstCapMb = 1.0;   // --first-bucket-cap-mb
  std::vector<std::string> ignored;  // --ignore-param: never bucketed, never synced
  int64_t worldSize = 0;             // --world-size: recorded in the graph (0: any)
  ShardMode shard = ShardMode::None; // --shard (needs a world size)
};

// IterGraphModule's unrolling (spmd-unroll).
struct UnrollOptions {
  int iters = 10;    // --iters: spmd-run's step count for the artifact
  bool move = true;  // --no-move: unroll without moving work across iterations
};

// torch.autocast (spmd-expand --autocast DEVICE:DTYPE).
struct AutocastOptions {
  bool enabled = false;
  std::string device = "cuda";                        // "cuda" or "cpu": whose policy
  c10::ScalarType dtype = c10::ScalarType::BFloat16;  // the lower precision type
};

// The lowering passes (spmd-lower).
struct LowerOptions {
  std::string device = "cpu";  // --device
  bool cudagraphs = false;     // --cudagraphs
  bool fuse = true;            // --no-fuse: keep the optimizer's per-parameter ops
  bool generateKernels = true; // --no-generated-kernels: no dropout-mask-in-kernel, fuse-rows, fuse-pointwise, cross-entropy-to-kernel, layer-norm-to-kernel, column-sum-to-kernel or gemm attention on CUDA
  // --attention-kernel: ATen's fused attention kernel for spmd::attention on
  // CUDA: auto (by dtype and head size), efficient, flash, cudnn, or math.
  std::string attentionKernel = "auto";
  // --memory-format: convolutions' layout on CUDA: auto (channels-last for a
  // graph of 2 or more 2-D convolutions), channels-last, or contiguous.
  std::string memoryFormat = "auto";
};

struct PipelineOptions {
  OptimizerOptions optimizer;
  GradReduce gradReduce = GradReduce::Mean;  // DDP averages; _spmd summed
  // --reduce-dtype: the dtype gradients cross ranks in (cast there and back,
  // as DDP's bf16/fp16 compression hooks do); Undefined: their own.
  c10::ScalarType reduceDtype = c10::ScalarType::Undefined;
  AutocastOptions autocast;
  // --lr-schedule, --clip-grad-norm, --micro-batches (spmd-expand): the
  // optimizer, clip-grad-norm and micro-batches passes build them and record
  // them in the graph's training config.
  TrainingConfig training;
  BucketOptions buckets;
  UnrollOptions unroll;
  LowerOptions lower;
  // The buffers' values, or nullptr: passes then treat every buffer as unknown.
  BufferValues* buffers = nullptr;
  // Where passes say what they did not do and why (printed by the tool as
  // "TOOL: note: FILE: WHERE: WHAT"), or nullptr to drop the notes.
  DiagnosticEngine* diagnostics = nullptr;
};

std::string optimizerName(OptimizerKind kind);
bool parseOptimizerKind(const std::string& name, OptimizerKind& kind);

// Rejects what torch.optim rejects, with its wording; throws Diagnostic.
void validateOptimizer(const OptimizerOptions& options);

}  // namespace spmd

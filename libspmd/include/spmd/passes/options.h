// Options of the passes, one struct per concern, gathered in PipelineOptions
// so that every pass has the same signature.
#pragma once

#include <string>

namespace spmd {

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

struct PipelineOptions {
  OptimizerOptions optimizer;
  GradReduce gradReduce = GradReduce::Mean;  // DDP averages; _spmd summed
};

std::string optimizerName(OptimizerKind kind);
bool parseOptimizerKind(const std::string& name, OptimizerKind& kind);

// Rejects what torch.optim rejects, with its wording; throws Diagnostic.
void validateOptimizer(const OptimizerOptions& options);

}  // namespace spmd

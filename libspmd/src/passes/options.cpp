#include "spmd/passes/options.h"

#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

namespace spmd {

std::string optimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Sgd: return "sgd";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::AdamW: return "adamw";
  }
  return "?";
}

bool parseOptimizerKind(const std::string& name, OptimizerKind& kind) {
  for (OptimizerKind k : {OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::AdamW}) {
    if (name == optimizerName(k)) {
      kind = k;
      return true;
    }
  }
  return false;
}

void validateOptimizer(const OptimizerOptions& o) {
  auto reject = [](const std::string& flag, const std::string& what) { throw Diagnostic(flag, what); };
  if (!(o.lr >= 0.0)) reject("--lr", "Invalid learning rate: " + floatText(o.lr));
  if (!(o.weightDecay >= 0.0)) reject("--weight-decay", "Invalid weight_decay value: " + floatText(o.weightDecay));
  if (o.kind == OptimizerKind::Sgd) {
    if (!(o.momentum >= 0.0)) reject("--momentum", "Invalid momentum value: " + floatText(o.momentum));
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
      reject("--nesterov", "Nesterov momentum requires a momentum and zero dampening");
    }
    return;
  }
  if (!(o.eps >= 0.0)) reject("--eps", "Invalid epsilon value: " + floatText(o.eps));
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0)) reject("--betas", "Invalid beta parameter at index 0: " + floatText(o.beta1));
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0)) reject("--betas", "Invalid beta parameter at index 1: " + floatText(o.beta2));
}

}  // namespace spmd

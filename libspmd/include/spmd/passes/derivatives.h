// Reverse-mode derivative rules, one per differentiable forward op. Each rule
// emits the ATen ops PyTorch's own derivatives use (derivatives.yaml):
// threshold_backward for relu, native_layer_norm_backward, convolution_backward,
// and so on, plus sum_to_size where broadcasting must be undone.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/ir/builder.h"

#include <functional>
#include <string>
#include <vector>

namespace spmd {

// A gradient flowing into one input value of a forward node.
struct Contribution {
  ValueId input;
  ValueId grad;
};

struct RuleInput {
  GraphBuilder& b;
  const Node& node;
  const std::vector<ValueId>& grads;          // per node output; kNoValue where no gradient flows
  std::function<bool(ValueId)> needsGrad;     // whether an input value takes a gradient
};

struct DerivativeRule {
  std::vector<Contribution> (*backward)(RuleInput&);
  // Why this call cannot be differentiated ("" when it can), for rules that
  // hold only for some arguments (dropout with p > 0 in training, say).
  std::string (*unsupported)(const Node&) = nullptr;
};

// The rule for `node`'s op and overload, or nullptr.
const DerivativeRule* findDerivative(const Node& node);

// Every op with a rule, "aten::add.Tensor" style, sorted.
std::vector<std::string> differentiableOps();

// "" when `node` can be differentiated (it has a rule, or a rewrite into
// ops that have rules applies to it), else why not.
std::string whyNotDifferentiable(const Node& node);

// Rewrites forward calls whose backward needs values the call does not
// return into the forms that return them (layer_norm -> native_layer_norm,
// max_pool2d -> max_pool2d_with_indices, cross_entropy_loss -> _log_softmax +
// nll_loss_forward). Appends the replacement through `b`, keeping the
// original output value ids; returns false (appending nothing) when `node`
// needs no rewrite.
bool rewriteForBackward(GraphBuilder& b, const Node& node);

}  // namespace spmd

// fuse-cross-entropy (spmd-lower runs it for --device cuda, with generated
// kernels): the four ATen ops of a cross-entropy loss and its backward,
//
//   %lp = aten::_log_softmax(%x, 1, False)
//   %loss, %total = aten::nll_loss_forward(%lp, %t, None, reduction, ignore_index)
//   %glp = aten::nll_loss_backward(%g, %lp, %t, None, reduction, ignore_index, %total)
//   %gx = aten::_log_softmax_backward_data(%glp, %lp, 1, torch.float32)
//
// become spmd::cross_entropy (loss, total weight and each row's log-sum-exp)
// and spmd::cross_entropy_backward, one generated kernel each: the log
// probabilities, as big as the logits, are never written, and the backward
// reads the logits once. Where the loss's gradient is ones_like(loss), the
// train step's seed, both become one spmd::cross_entropy_with_grad where the
// forward stands: the logits are read once in all, and their gradient is
// made with the loss. Taken: fp32 logits [rows, classes], the classes'
// dimension last, no class weights, reduction mean or sum, log_softmax's
// result read by nothing else. The values keep their names.
#include "spmd/ir/builder.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace spmd {
namespace {

struct CrossEntropy {
  const Node* logSoftmax = nullptr;
  const Node* loss = nullptr;              // nll_loss_forward
  const Node* lossBackward = nullptr;      // nll_loss_backward, if the graph differentiates the loss
  const Node* logSoftmaxBackward = nullptr;
};

bool isValue(const Arg& a, ValueId v) { return a.kind == Arg::Kind::Value && a.value == v; }

// Whether `n`'s arguments from `first` on are the loss's target, weights,
// reduction and ignore index (nll_loss_backward's start at 2, the forward's at 1).
bool sameLoss(const Node& n, size_t first, const Node& loss) {
  if (n.args.size() < first + 4) return false;
  for (size_t k = 1; k < 5; ++k) {
    const Arg &a = n.args[first + k - 1], &b = loss.args[k];
    if (a.kind != b.kind || a.value != b.value || a.i != b.i) return false;
  }
  return true;
}

// The cross entropy that log_softmax `f` starts, or why it is not one this
// pass takes (nullopt why: not a cross entropy at all, nothing to say).
std::optional<CrossEntropy> match(const Graph& g, const Node& f, std::string& why) {
  const ValueId lp = f.outputs[0];
  CrossEntropy ce;
  ce.logSoftmax = &f;
  for (const Node* u : g.users(lp)) {
    if (u->op == "aten::nll_loss_forward" && isValue(u->args[0], lp)) ce.loss = u;
  }
  if (!ce.loss) return std::nullopt;
  const Value& x = g.value(f.args[0].value);
  const int64_t dim = f.args[1].i;
  const Arg &weight = ce.loss->args[2], &reduction = ce.loss->args[3];
  if (x.dtype != c10::ScalarType::Float || x.shape.size() != 2 || (dim != 1 && dim != -1) || f.args[2].b) {
    why = "the logits are not fp32 [rows, classes] with log_softmax over the classes";
    return std::nullopt;
  }
  if (weight.kind != Arg::Kind::None || reduction.kind != Arg::Kind::Int || (reduction.i != 1 && reduction.i != 2)) {
    why = "class weights, or a reduction other than mean or sum";
    return std::nullopt;
  }
  for (const Node* u : g.users(lp)) {
    if (u == ce.loss) continue;
    if (u->op == "aten::nll_loss_backward" && !ce.lossBackward && isValue(u->args[1], lp) && sameLoss(*u, 2, *ce.loss) &&
        isValue(u->args[6], ce.loss->outputs[1])) {
      ce.lossBackward = u;
    } else if (u->op == "aten::_log_softmax_backward_data" && !ce.logSoftmaxBackward && isValue(u->args[1], lp) &&
               u->args[2].i == dim) {
      ce.logSoftmaxBackward = u;
    } else {
      why = "the log probabilities have another reader (" + u->qualifiedName() + ")";
      return std::nullopt;
    }
  }
  const bool backward = ce.lossBackward && ce.logSoftmaxBackward;
  if ((ce.lossBackward || ce.logSoftmaxBackward) &&
      (!backward || !isValue(ce.logSoftmaxBackward->args[0], ce.lossBackward->outputs[0]) ||
       g.users(ce.lossBackward->outputs[0]).size() != 1)) {
    why = "its backward is not nll_loss_backward read only by _log_softmax_backward_data";
    return std::nullopt;
  }
  const auto& outs = g.outputs();
  if (std::find(outs.begin(), outs.end(), lp) != outs.end()) {
    why = "the log probabilities are an output of the graph";
    return std::nullopt;
  }
  return ce;
}

// Puts `op(args)` where `old` stands, defining old's values again (same ids
// and names) as its first results.
std::vector<ValueId> replaceWith(Graph& g, const Node& old, const std::string& op, std::vector<Arg> args,
                                 const std::string& base) {
  const size_t at = g.indexOf(old);
  const Node& before = g.nodes()[at - 1];  // old reads what an earlier node made: `at` > 0
  GraphBuilder b(g);
  b.setMeta(old.meta);
  const std::vector<ValueId> preset = old.outputs;
  g.extract(old);
  b.setInsertionPointAfter(before);
  return b.callMulti(op, std::move(args), base, preset);
}

// The loss's incoming gradient when it is ones_like(loss) read only by the
// backward (a train step's seed), else nullptr.
const Node* onesSeed(const Graph& g, const CrossEntropy& ce) {
  const Arg& grad = ce.lossBackward->args[0];
  const Node* seed = grad.kind == Arg::Kind::Value ? g.producer(grad.value) : nullptr;
  if (!seed || seed->op != "aten::ones_like" || !isValue(seed->args[0], ce.loss->outputs[0]) ||
      g.users(grad.value).size() != 1) {
    return nullptr;
  }
  for (size_t k = 1; k < seed->args.size(); ++k) {
    if (seed->args[k].kind != Arg::Kind::None) return nullptr;  // a dtype, layout, device or format of its own
  }
  const auto& outs = g.outputs();
  return std::find(outs.begin(), outs.end(), grad.value) == outs.end() ? seed : nullptr;
}

// Forward and backward as one node where the loss's forward stands: the
// logits' gradient is made with the loss, from the row the forward reads.
void fuseWithGrad(Graph& g, const CrossEntropy& ce, const Node& seed) {
  const std::vector<Arg> args = {ce.logSoftmax->args[0], ce.loss->args[1], ce.loss->args[3], ce.loss->args[4],
                                 Arg::ofFloat(1.0)};
  const std::vector<ValueId> outputs = {ce.loss->outputs[0], ce.loss->outputs[1], ce.logSoftmaxBackward->outputs[0]};
  g.extract(*ce.logSoftmaxBackward);
  g.erase(*ce.lossBackward);
  g.erase(seed);
  GraphBuilder b(g);
  b.setMeta(ce.loss->meta);
  b.replace(*ce.loss, "spmd::cross_entropy_with_grad", args, outputs);
  g.erase(*ce.logSoftmax);
}

void fuse(Graph& g, const CrossEntropy& ce) {
  if (ce.lossBackward) {
    if (const Node* seed = onesSeed(g, ce)) return fuseWithGrad(g, ce, *seed);
  }
  const Arg logits = ce.logSoftmax->args[0], target = ce.loss->args[1];
  const Arg reduction = ce.loss->args[3], ignoreIndex = ce.loss->args[4];
  const std::vector<ValueId> forward =
      replaceWith(g, *ce.loss, "spmd::cross_entropy", {logits, target, reduction, ignoreIndex}, "cross_entropy");
  if (ce.lossBackward) {
    const Arg grad = ce.lossBackward->args[0];
    replaceWith(g, *ce.logSoftmaxBackward, "spmd::cross_entropy_backward",
                {grad, logits, target, Arg::tensor(forward[2]), Arg::tensor(forward[1]), reduction, ignoreIndex},
                "cross_entropy_backward");
    g.erase(*ce.lossBackward);
  }
  g.erase(*ce.logSoftmax);
}

class FuseCrossEntropyPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    std::vector<CrossEntropy> found;
    for (const Node& n : g.nodes()) {
      if (n.op != "aten::_log_softmax") continue;
      std::string why;
      if (auto ce = match(g, n, why)) {
        found.push_back(*ce);
      } else if (!why.empty()) {
        diagnostics.note(n.qualifiedName() + (n.meta.source.empty() ? "" : " at " + n.meta.source),
                         "fuse-cross-entropy: not fused: " + why);
      }
    }
    for (const CrossEntropy& ce : found) fuse(g, ce);
    if (!found.empty()) {
      diagnostics.note("fuse-cross-entropy: " + std::to_string(found.size()) +
                       " log_softmax + nll_loss pair(s) as generated kernels");
    }
    return !found.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseCrossEntropyPass(const PipelineOptions&) {
  return std::make_unique<FuseCrossEntropyPass>();
}

}  // namespace spmd

// autodiff: reverse-mode differentiation of a forward graph whose first
// output is the scalar loss.
//
// Appends the backward nodes (role "backward", each carrying the source line
// of the forward node it differentiates) and records one Gradient per
// parameter that requires one and reaches the loss. Forward calls whose
// backward needs saved results are first rewritten to the forms that return
// them. Integer values and frozen parameters get no gradient; fan-out
// accumulates with aten::add. Does not reduce gradients across ranks
// (grad-sync) or update parameters (optimizer).
#include "spmd/ir/builder.h"
#include "spmd/passes/derivatives.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include "spmd/ir/printer.h"

#include <map>
#include <stdexcept>
#include <set>

namespace spmd {
namespace {

bool isFloating(const Value& v) { return c10::isFloatingType(v.dtype); }

// Ops whose results take only the shape, dtype or device of their tensor
// arguments: nothing flows back through them.
bool createsFreshTensor(const Node& n) {
  static const std::set<std::string> ops = {"aten::new_full", "aten::new_zeros", "aten::new_ones", "aten::new_empty",
                                            "aten::zeros_like", "aten::ones_like", "aten::full_like",
                                            "aten::empty_like", "aten::rand_like", "aten::randn_like"};
  return ops.count(n.op) > 0;
}

// Which values depend on a trainable parameter, and which feed the loss.
struct Activity {
  std::vector<bool> requiresGrad;
  std::vector<bool> reachesLoss;

  bool active(const Node& n) const {
    for (ValueId o : n.outputs) {
      if (o != kNoValue && o < static_cast<ValueId>(requiresGrad.size()) && requiresGrad[o] && reachesLoss[o]) return true;
    }
    return false;
  }
};

Activity analyse(const Graph& g, ValueId loss) {
  Activity a{std::vector<bool>(g.numValues(), false), std::vector<bool>(g.numValues(), false)};
  for (const auto& in : g.inputs()) {
    a.requiresGrad[in.value] = in.kind == InputKind::Parameter && in.requiresGrad && isFloating(g.value(in.value));
  }
  for (const Node& n : g.nodes()) {
    bool any = false;
    if (!createsFreshTensor(n)) forEachTensorArg(n, [&](ValueId v) { any = any || a.requiresGrad[v]; });
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId o = n.outputs[k];
      if (o == kNoValue) continue;
      // broadcast_tensors' k-th result depends on its k-th input only.
      bool depends = n.qualifiedName() == "aten::broadcast_tensors" ? a.requiresGrad[n.args[0].values.at(k)] : any;
      a.requiresGrad[o] = depends && isFloating(g.value(o));
    }
  }
  a.reachesLoss[loss] = true;
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    bool reaches = false;
    for (ValueId o : it->outputs) reaches = reaches || (o != kNoValue && a.reachesLoss[o]);
    if (reaches) forEachTensorArg(*it, [&](ValueId v) { a.reachesLoss[v] = true; });
  }
  return a;
}

ValueId checkedLoss(const Graph& g) {
  if (g.outputs().empty()) {
    throw Diagnostic("/outputs", "the forward returns nothing; spmd-expand needs the loss as its first output");
  }
  ValueId loss = g.outputs()[0];
  const Value& v = g.value(loss);
  if (!v.shape.empty() || !isFloating(v)) {
    throw Diagnostic("/outputs/0", "the loss must be a floating-point scalar, got %" + v.name + ": " + typeText(v));
  }
  if (!g.gradients().empty()) throw Diagnostic("/gradients", "the graph already has gradients: it is a train step");
  return loss;
}

// Every active node must be differentiable; all that are not are reported
// together, each with its source line. After the forward rewrites every
// active node needs a rule of its own (a rewrite that did not apply, e.g.
// cross-entropy over more than 2 dimensions, leaves the composite op).
void requireRules(const Graph& g, const Activity& activity, bool rewritten) {
  std::vector<std::string> missing;
  for (const Node& n : g.nodes()) {
    if (!activity.active(n)) continue;
    std::string why = whyNotDifferentiable(n);
    if (why.empty() && rewritten && !findDerivative(n)) why = "not supported for these arguments";
    if (why.empty()) continue;
    missing.push_back(n.qualifiedName() + (n.meta.source.empty() ? "" : " at " + n.meta.source) + " (" + why + ")");
  }
  if (missing.empty()) return;
  std::string list;
  for (size_t i = 0; i < missing.size(); ++i) list += (i ? "; " : "") + missing[i];
  throw Diagnostic("", "cannot differentiate the path from the parameters to the loss: " + list);
}

// Rewrites active nodes whose backward needs saved results; marks every
// forward node's role.
void prepareForward(Graph& g, const Activity& activity) {
  GraphBuilder b(g);
  const std::vector<const Node*> forward = snapshot(g.nodes());
  for (size_t i = 0; i < forward.size(); ++i) {
    const Node& n = *forward[i];
    NodeMeta& meta = g.metaOf(n);
    if (meta.role == NodeRole::Unknown) meta.role = NodeRole::Forward;
    b.setMeta(meta);
    if (!activity.active(n)) continue;
    // The rewrite rebuilds the node in its place from parts.
    const Node* next = i + 1 < forward.size() ? forward[i + 1] : nullptr;
    Node original = g.extract(n);
    if (next) {
      b.setInsertionPoint(*next);
    } else {
      b.setInsertionPointToEnd();
    }
    if (rewriteForBackward(b, original)) continue;
    if (next) {
      g.insertBefore(*next, std::move(original));
    } else {
      g.addNode(std::move(original));
    }
  }
}

void accumulate(GraphBuilder& b, std::map<ValueId, ValueId>& grads, ValueId input, ValueId grad) {
  auto it = grads.find(input);
  if (it == grads.end()) {
    grads.emplace(input, grad);
  } else {
    it->second = b.add(it->second, grad);
  }
}

void appendBackward(Graph& g, const Activity& activity, ValueId loss) {
  const size_t forwardCount = g.nodes().size();
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", NodeRole::Backward, -1, -1, IterationTag::Every});
  std::map<ValueId, ValueId> grads;
  grads[loss] = b.call("aten::ones_like", {Arg::tensor(loss), Arg::none(), Arg::none(), Arg::none(), Arg::none(), Arg::none()},
                       "grad_loss");
  auto needsGrad = [&](ValueId v) { return v < static_cast<ValueId>(activity.requiresGrad.size()) && activity.requiresGrad[v]; };
  for (size_t i = forwardCount; i-- > 0;) {
    const Node node = g.nodes()[i];  // a copy: appending may reallocate the node list
    if (!activity.active(node)) continue;
    std::vector<ValueId> outGrads;
    bool any = false;
    for (ValueId o : node.outputs) {
      auto it = o == kNoValue ? grads.end() : grads.find(o);
      outGrads.push_back(it == grads.end() ? kNoValue : it->second);
      any = any || it != grads.end();
    }
    if (!any) continue;
    b.setMeta(NodeMeta{node.meta.source, NodeRole::Backward, -1, -1, IterationTag::Every});
    const DerivativeRule* rule = findDerivative(node);
    if (!rule) throw std::logic_error("autodiff: no rule for " + node.qualifiedName() + " after the forward rewrites");
    RuleInput input{b, node, outGrads, needsGrad};
    for (const Contribution& c : rule->backward(input)) {
      if (needsGrad(c.input)) accumulate(b, grads, c.input, c.grad);
    }
  }
  for (const auto& in : g.inputs()) {
    auto it = grads.find(in.value);
    if (in.kind == InputKind::Parameter && it != grads.end()) g.addGradient(Gradient{in.value, it->second});
  }
}


class AutodiffPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override;
};

}  // namespace

std::unique_ptr<Pass> createAutodiffPass(const PipelineOptions&) { return std::make_unique<AutodiffPass>(); }

bool AutodiffPass::run(Graph& g, DiagnosticEngine&) {
  const ValueId loss = checkedLoss(g);
  const Activity activity = analyse(g, loss);
  requireRules(g, activity, false);
  prepareForward(g, activity);
  const Activity rewritten = analyse(g, loss);  // again: rewrites added values
  requireRules(g, rewritten, true);
  appendBackward(g, rewritten, loss);
  eliminateDeadNodes(g);  // backward results no gradient needed
  return true;  // the backward's seed at least
}

}  // namespace spmd

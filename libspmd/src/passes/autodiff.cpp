// autodiff: reverse-mode differentiation of a forward graph whose first
// output is the scalar loss.
//
// Appends the backward nodes (role "backward", each carrying the source line
// of the forward node it differentiates) and records one Gradient per
// parameter that requires one and reaches the loss. Each op's backward is
// the one LibTorch's autograd runs (passes/derivatives.h); a forward call
// whose backward reads results it does not return is replaced by the calls
// it is made of. Integer values and frozen parameters get no gradient;
// fan-out accumulates with aten::add, one gradient at a time in the order
// eager's engine adds them: the last reader's first. A composite op whose
// backward gives one input gradients along two paths (rms_norm) is replaced
// by its parts first, so that each part's gradient is added in its turn.
// With --micro-batches N it differentiates loss / N (the micro-batches pass
// then repeats forward and backward). Does not reduce gradients across
// ranks (grad-sync) or update parameters (optimizer).
#include "spmd/ir/builder.h"
#include "spmd/ir/printer.h"
#include "spmd/passes/derivatives.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <map>
#include <stdexcept>
#include <set>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName broadcast_tensors = OpName::known("aten::broadcast_tensors");
};
const Ops& ops() { return opTable<Ops>(); }

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

  // The values of `calls` (a composite's parts, in program order, that took
  // its place): each depends on a parameter where an argument does, and
  // feeds the loss where a later reader's result does.
  void extend(const Graph& g, const std::vector<const Node*>& calls);
};

void Activity::extend(const Graph& g, const std::vector<const Node*>& calls) {
  requiresGrad.resize(g.numValues(), false);
  reachesLoss.resize(g.numValues(), false);
  for (const Node* n : calls) {
    bool any = false;
    if (!createsFreshTensor(*n)) forEachTensorArg(*n, [&](ValueId v) { any = any || requiresGrad[v]; });
    for (ValueId o : n->outputs) {
      if (o != kNoValue) requiresGrad[o] = any && isFloating(g.value(o));
    }
  }
  for (auto it = calls.rbegin(); it != calls.rend(); ++it) {
    for (ValueId o : (*it)->outputs) {
      if (o == kNoValue || reachesLoss[o]) continue;
      for (const Node* reader : g.users(o)) {
        for (ValueId r : reader->outputs) reachesLoss[o] = reachesLoss[o] || (r != kNoValue && reachesLoss[r]);
      }
      reachesLoss[o] = reachesLoss[o] || g.readBeyondNodes(o);
    }
  }
}

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
      bool depends = n.is(ops().broadcast_tensors) ? a.requiresGrad[n.args[0].values.at(k)] : any;
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

void accumulate(GraphBuilder& b, std::map<ValueId, ValueId>& grads, ValueId input, ValueId grad) {
  auto it = grads.find(input);
  if (it == grads.end()) {
    grads.emplace(input, grad);
  } else {
    it->second = b.add(it->second, grad);
  }
}

std::string describeNode(const Node& n, const std::string& why) {
  return n.qualifiedName() + (n.meta.source.empty() ? "" : " at " + n.meta.source) + " (" + why + ")";
}

std::string joined(const std::vector<std::string>& items) {
  std::string list;
  for (size_t i = 0; i < items.size(); ++i) list += (i ? "; " : "") + items[i];
  return list;
}

// Why gradient flow stops at a node whose input needs one: its results had
// gradients but LibTorch gave the input none (histc), or its results that
// reach the loss are not floating point (argmax). "" when it does not stop
// there (nodes upstream of a stop get no gradient to pass on).
std::string whereFlowStops(const Graph& g, const Node& n, const Activity& activity, const std::set<ValueId>& received,
                           bool hadGradients) {
  std::vector<ValueId> starved;
  forEachTensorArg(n, [&](ValueId v) {
    if (activity.requiresGrad[v] && !received.count(v)) starved.push_back(v);
  });
  if (starved.empty()) return "";
  bool reaches = false, floating = false;
  for (ValueId o : n.outputs) {
    if (o == kNoValue || !activity.reachesLoss[o]) continue;
    reaches = true;
    floating = floating || isFloating(g.value(o));
  }
  if (!reaches || createsFreshTensor(n) || (floating && !hadGradients)) return "";
  return floating ? "LibTorch's autograd gives %" + g.value(starved[0]).name + " no gradient"
                  : "its results are not floating point, so no gradient flows back";
}

// Each active forward node, last first, adds its backward for the gradients
// of its outputs; LibTorch's autograd supplies each op's formula
// (passes/derivatives.h). Nodes LibTorch cannot differentiate are reported
// together, each with its source line, as are the nodes where the flow to
// a parameter that reaches the loss but gets no gradient stops.
void appendBackward(Graph& g, Activity activity, ValueId loss) {
  Differentiator differentiator(g);
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", NodeRole::Backward, -1, -1, IterationTag::Every});
  std::map<ValueId, ValueId> grads;
  grads[loss] = b.call("aten::ones_like", {Arg::tensor(loss), Arg::none(), Arg::none(), Arg::none(), Arg::none(), Arg::none()},
                       "grad_loss");
  auto needsGrad = [&](ValueId v) { return v < static_cast<ValueId>(activity.requiresGrad.size()) && activity.requiresGrad[v]; };
  std::vector<std::string> failures, stops;
  std::vector<const Node*> forward = snapshot(g.nodes());  // taken from the back: the last node first
  while (!forward.empty()) {
    const Node& node = *forward.back();
    forward.pop_back();
    if (node.meta.role == NodeRole::Unknown) g.metaOf(node).role = NodeRole::Forward;
    const Node before = node;  // differentiating may replace the node
    std::set<ValueId> received;
    std::vector<ValueId> outGrads;
    bool any = false;
    for (ValueId o : node.outputs) {
      auto found = o == kNoValue ? grads.end() : grads.find(o);
      outGrads.push_back(found == grads.end() ? kNoValue : found->second);
      any = any || found != grads.end();
    }
    if (activity.active(node) && any) {
      const NodeMeta backwardMeta{node.meta.source, NodeRole::Backward, -1, -1, IterationTag::Every};
      try {
        const std::vector<const Node*> parts = differentiator.decomposeIfInputReadTwice(node, outGrads, needsGrad);
        if (!parts.empty()) {  // `node` is gone; its parts are differentiated one by one, the last first
          activity.extend(g, parts);
          forward.insert(forward.end(), parts.begin(), parts.end());
          continue;
        }
        for (const Contribution& c : differentiator.differentiate(node, outGrads, needsGrad, backwardMeta)) {
          if (!needsGrad(c.input)) continue;
          accumulate(b, grads, c.input, c.grad);
          received.insert(c.input);
        }
      } catch (const Diagnostic& d) {
        failures.push_back(d.message());
        continue;
      }
    }
    std::string stop = whereFlowStops(g, before, activity, received, any);
    if (!stop.empty()) stops.insert(stops.begin(), describeNode(before, stop));
  }
  if (!failures.empty()) {
    throw Diagnostic("", "cannot differentiate the path from the parameters to the loss: " + joined(failures));
  }
  std::vector<std::string> starved;
  for (const auto& in : g.inputs()) {
    auto found = grads.find(in.value);
    if (in.kind != InputKind::Parameter) continue;
    if (found != grads.end()) {
      g.addGradient(Gradient{in.value, found->second});
    } else if (activity.requiresGrad[in.value] && activity.reachesLoss[in.value]) {
      starved.push_back(g.value(in.value).name);
    }
  }
  if (!starved.empty() && !stops.empty()) {
    std::string names;
    for (const auto& n : starved) names += (names.empty() ? "" : ", ") + n;
    throw Diagnostic("", "cannot differentiate the path from the parameters to the loss: " + joined(stops) +
                             "; parameters that reach the loss without a gradient: " + names);
  }
}

// With micro-batches the loss differentiated (and returned) is the
// model's loss divided by their number, as nanoGPT's loop divides it.
ValueId scaledLoss(Graph& g, ValueId loss, int64_t microBatches) {
  if (microBatches == 1) return loss;
  GraphBuilder b(g);
  const Node* made = g.producer(loss);
  b.setMeta(NodeMeta{made ? made->meta.source : "", NodeRole::Forward, -1, -1, IterationTag::Every});
  const ValueId scaled = b.call("aten::div.Scalar", {Arg::tensor(loss), Arg::ofInt(microBatches)}, g.value(loss).name + ".scaled");
  g.outputs()[0] = scaled;
  return scaled;
}

class AutodiffPass final : public Pass {
 public:
  explicit AutodiffPass(int64_t microBatches) : microBatches_(microBatches) {}
  bool run(Graph& g, DiagnosticEngine&) override;

 private:
  int64_t microBatches_;
};

}  // namespace

std::unique_ptr<Pass> createAutodiffPass(const PipelineOptions& options) {
  return std::make_unique<AutodiffPass>(options.training.microBatches);
}

bool AutodiffPass::run(Graph& g, DiagnosticEngine&) {
  const ValueId loss = scaledLoss(g, checkedLoss(g), microBatches_);
  const Activity activity = analyse(g, loss);
  appendBackward(g, activity, loss);  // backward results no gradient needs are left to dce
  return true;  // the backward's seed at least
}

}  // namespace spmd

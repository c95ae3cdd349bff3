// eval-mode (spmd-expand --eval-step): a forward graph as model.eval() runs
// it, for the validation loss. BatchNorm normalises with its running
// statistics and leaves them as they are; dropout (and the dropout of fused
// attention and of recurrent layers) is off; the only output is the loss.
//
//   %y, %mean, %invstd, %rm', %rv' = spmd::batch_norm_train(%x, %w, %b, %rm, %rv, 0.1, 1e-05)
//     -> %y = aten::batch_norm(%x, %w, %b, %rm, %rv, False, 0.1, 1e-05, True)
//   %d = aten::dropout(%h, 0.1, True)            -> %h read where %d was
//   aten::scaled_dot_product_attention(..., 0.1, ...) -> dropout_p 0.0
//   aten::lstm(..., dropout, True, ...)          -> train False
//
// aten::batch_norm with training False is what eager PyTorch calls in eval
// mode, so the loss is eager's, bit for bit on the CPU. Every state update
// (running statistics, num_batches_tracked) is dropped: evaluating changes
// no buffer.
#include "spmd/ir/builder.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <vector>

namespace spmd {
namespace {

bool constantArg(const Node& n, size_t i, Arg::Kind kind) { return i < n.args.size() && n.args[i].kind == kind; }

// spmd::batch_norm_train -> aten::batch_norm(training=False); its other
// results (batch statistics, new running statistics) are read by nothing
// once the updates are gone, and dce erases the node.
bool runningStatistics(Graph& g, const Node& n) {
  if (n.qualifiedName() != "spmd::batch_norm_train" || n.args.size() != 7) return false;
  GraphBuilder b(g);
  b.setInsertionPoint(n);
  b.setMeta(n.meta);
  std::vector<Arg> args(n.args.begin(), n.args.begin() + 5);
  args.push_back(Arg::ofBool(false));
  args.push_back(n.args[5]);
  args.push_back(n.args[6]);
  args.push_back(Arg::ofBool(true));
  const ValueId y = b.call("aten::batch_norm", args, g.value(n.outputs[0]).name);
  g.replaceAllUsesWith(n.outputs[0], y);
  return true;
}

// Dropout that eval mode turns off: the op's input where its result was.
bool dropoutOff(Graph& g, const Node& n) {
  const std::string op = n.qualifiedName();
  const bool plain = op == "aten::dropout" || op == "aten::feature_dropout" || op == "aten::alpha_dropout" ||
                     op == "aten::feature_alpha_dropout" || op == "aten::native_dropout";
  if (!plain || n.args.empty() || n.args[0].kind != Arg::Kind::Value) return false;
  g.replaceAllUsesWith(n.outputs[0], n.args[0].value);
  return true;
}

// Dropout inside another op: SDPA's dropout_p, a recurrent layer's train flag.
bool innerDropoutOff(Graph& g, const Node& n) {
  const std::string op = n.qualifiedName();
  if (op == "aten::scaled_dot_product_attention" && constantArg(n, 4, Arg::Kind::Float) && n.args[4].f != 0.0) {
    g.constantArg(n, 4).f = 0.0;
    return true;
  }
  // lstm/gru/rnn_*(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
  const bool recurrent = op == "aten::lstm.input" || op == "aten::gru.input" || op == "aten::rnn_tanh.input" ||
                         op == "aten::rnn_relu.input";
  if (recurrent && constantArg(n, 6, Arg::Kind::Bool) && n.args[6].b) {
    g.constantArg(n, 6).b = false;
    return true;
  }
  return false;
}

class EvalModePass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    if (!g.gradients().empty()) {
      throw Diagnostic("/gradients", "eval-mode takes a forward graph (spmd-expand's input), not a train step");
    }
    if (g.outputs().empty()) throw Diagnostic("/outputs", "the graph has no output: its first output is the loss");
    std::vector<const Node*> nodes;
    for (const Node& n : g.nodes()) nodes.push_back(&n);
    for (const Node* n : nodes) {
      if (runningStatistics(g, *n)) count("BatchNorm(s) on running statistics");
      else if (dropoutOff(g, *n)) count("dropout(s) off");
      else if (innerDropoutOff(g, *n)) count("attention or recurrent dropout(s) off");
    }
    count("state update(s) dropped", static_cast<int64_t>(g.updates().size()));
    count("output(s) after the loss dropped", static_cast<int64_t>(g.outputs().size() - 1));
    g.updates().clear();
    g.outputs().resize(1);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createEvalModePass(const PipelineOptions&) { return std::make_unique<EvalModePass>(); }

}  // namespace spmd

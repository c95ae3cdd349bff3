// cross-entropy-to-kernel (spmd-lower runs it for --device cuda, with generated
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
// result read by nothing else. bf16 or f16 logits are taken in the form
// autocast records, the log probabilities cast to fp32 for nll_loss and
// nll_loss's gradient cast back:
//
//   %lp = aten::_log_softmax(%x, 1, False)                 (bf16)
//   %lpf = aten::_to_copy(%lp, torch.float32, ...)
//   ... nll_loss_forward and nll_loss_backward read %lpf ...
//   %glp16 = aten::_to_copy(%glp, torch.bfloat16, ...)
//   %gx = aten::_log_softmax_backward_data(%glp16, %lp, 1, torch.bfloat16)
//
// The casts go with the ops; the kernels round the log probabilities to
// bf16 where the graph held them so. The values keep their names.
//
// Then fp32 logits that are views of an exact upcast of bf16 or f16 ones (a
// model's logits.float(), autocast's cast of the loss's input), whose
// gradient is cast back to that type after views, are read as they are:
// spmd::cross_entropy_with_grad becomes its .upcast overload on the 16-bit
// logits, which computes what the fp32 op does on their values and writes
// the gradient in the 16-bit type, rounded once as the cast rounded it. The
// fp32 logits and gradient (each twice the 16-bit ones) are never written.
#include "cast_match.h"
#include "cast_views.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName nll_loss_backward = OpName::known("aten::nll_loss_backward");
  OpName _log_softmax_backward_data = OpName::known("aten::_log_softmax_backward_data");
  OpName nll_loss_forward = OpName::known("aten::nll_loss_forward");
  OpName ones_like = OpName::known("aten::ones_like");
};
const Ops& ops() { return opTable<Ops>(); }

struct CrossEntropy {
  const Node* logSoftmax = nullptr;
  const Node* upcast = nullptr;            // autocast's: log probabilities to fp32 for nll_loss
  const Node* loss = nullptr;              // nll_loss_forward
  const Node* lossBackward = nullptr;      // nll_loss_backward, if the graph differentiates the loss
  const Node* downcast = nullptr;          // autocast's: nll_loss's gradient back to the logits' type
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

// The cast of half-precision log probabilities `lp` to fp32 that autocast
// puts before nll_loss (its fp32 policy), or nullptr.
const Node* upcastOf(const Graph& g, ValueId lp) {
  for (const Node* u : g.users(lp)) {
    if (isCastTo(*u, c10::ScalarType::Float)) return u;
  }
  return nullptr;
}

// Takes `u`, a reader of the log probabilities (`lp` in the logits' type,
// `probs` what nll_loss reads), into `ce` as the loss's backward or
// log_softmax's; false for any other reader.
bool takeBackwardReader(CrossEntropy& ce, const Node& u, ValueId lp, ValueId probs, int64_t dim) {
  if (u.is(ops().nll_loss_backward) && !ce.lossBackward && isValue(u.args[1], probs) &&
      sameLoss(u, 2, *ce.loss) && isValue(u.args[6], ce.loss->outputs[1])) {
    ce.lossBackward = &u;
    return true;
  }
  if (u.is(ops()._log_softmax_backward_data) && !ce.logSoftmaxBackward && isValue(u.args[1], lp) &&
      u.args[2].i == dim) {
    ce.logSoftmaxBackward = &u;
    return true;
  }
  return false;
}

// Whether the loss's backward feeds log_softmax's and nothing else, through
// a cast back to `logits` where the logits are not fp32.
bool backwardChains(const Graph& g, CrossEntropy& ce, c10::ScalarType logits) {
  ValueId grad = ce.lossBackward->outputs[0];
  if (logits != c10::ScalarType::Float) {
    const Node* cast = g.soleReader(grad);
    if (!cast || !isCastTo(*cast, logits)) return false;
    ce.downcast = cast;
    grad = cast->outputs[0];
  }
  return g.soleReader(grad) == ce.logSoftmaxBackward && isValue(ce.logSoftmaxBackward->args[0], grad);
}

// The cross entropy that log_softmax `f` starts, or why it is not one this
// pass takes (nullopt why: not a cross entropy at all, nothing to say).
// fp32 logits: nll_loss reads log_softmax's result. bf16 or f16 logits (the
// form autocast records): nll_loss reads it cast to fp32, and
// log_softmax's backward reads nll_loss's gradient cast back.
std::optional<CrossEntropy> match(const Graph& g, const Node& f, std::string& why) {
  const ValueId lp = f.outputs[0];
  const Value& x = g.value(f.args[0].value);
  const bool half = x.dtype == c10::ScalarType::BFloat16 || x.dtype == c10::ScalarType::Half;
  CrossEntropy ce;
  ce.logSoftmax = &f;
  ce.upcast = half ? upcastOf(g, lp) : nullptr;
  if (half && !ce.upcast) return std::nullopt;
  const ValueId probs = ce.upcast ? ce.upcast->outputs[0] : lp;
  for (const Node* u : g.users(probs)) {
    if (u->is(ops().nll_loss_forward) && isValue(u->args[0], probs)) ce.loss = u;
  }
  if (!ce.loss) return std::nullopt;
  const int64_t dim = f.args[1].i;
  const Arg &weight = ce.loss->args[2], &reduction = ce.loss->args[3];
  if ((x.dtype != c10::ScalarType::Float && !half) || x.shape.size() != 2 || (dim != 1 && dim != -1) || f.args[2].b) {
    why = "the logits are not fp32, bf16 or f16 [rows, classes] with log_softmax over the classes";
    return std::nullopt;
  }
  if (weight.kind != Arg::Kind::None || reduction.kind != Arg::Kind::Int || (reduction.i != 1 && reduction.i != 2)) {
    why = "class weights, or a reduction other than mean or sum";
    return std::nullopt;
  }
  std::vector<const Node*> readers = g.users(lp);
  if (probs != lp) {
    const std::vector<const Node*> more = g.users(probs);
    readers.insert(readers.end(), more.begin(), more.end());
  }
  for (const Node* u : readers) {
    if (u == ce.loss || u == ce.upcast || takeBackwardReader(ce, *u, lp, probs, dim)) continue;
    why = "the log probabilities have another reader (" + u->qualifiedName() + ")";
    return std::nullopt;
  }
  const bool backward = ce.lossBackward && ce.logSoftmaxBackward;
  if ((ce.lossBackward || ce.logSoftmaxBackward) && (!backward || !backwardChains(g, ce, x.dtype))) {
    why = "its backward is not nll_loss_backward read only by _log_softmax_backward_data";
    return std::nullopt;
  }
  if (g.readBeyondNodes(lp) || g.readBeyondNodes(probs)) {
    why = "the log probabilities are read beyond the nodes (an output of the graph)";
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
  if (!seed || !seed->is(ops().ones_like) || !isValue(seed->args[0], ce.loss->outputs[0]) ||
      !g.hasOneReader(grad.value)) {
    return nullptr;
  }
  for (size_t k = 1; k < seed->args.size(); ++k) {
    if (seed->args[k].kind != Arg::Kind::None) return nullptr;  // a dtype, layout, device or format of its own
  }
  return seed;
}

// Erases the casts (if any) and log_softmax once the ops reading them are gone.
void eraseForward(Graph& g, const CrossEntropy& ce) {
  if (ce.upcast) g.erase(*ce.upcast);
  g.erase(*ce.logSoftmax);
}

// Forward and backward as one node where the loss's forward stands: the
// logits' gradient is made with the loss, from the row the forward reads.
void fuseWithGrad(Graph& g, const CrossEntropy& ce, const Node& seed) {
  const std::vector<Arg> args = {ce.logSoftmax->args[0], ce.loss->args[1], ce.loss->args[3], ce.loss->args[4],
                                 Arg::ofFloat(1.0)};
  const std::vector<ValueId> outputs = {ce.loss->outputs[0], ce.loss->outputs[1], ce.logSoftmaxBackward->outputs[0]};
  g.extract(*ce.logSoftmaxBackward);
  if (ce.downcast) g.erase(*ce.downcast);
  g.erase(*ce.lossBackward);
  g.erase(seed);
  GraphBuilder b(g);
  b.setMeta(ce.loss->meta);
  b.replace(*ce.loss, "spmd::cross_entropy_with_grad", args, outputs);
  eraseForward(g, ce);
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
    if (ce.downcast) g.erase(*ce.downcast);
    g.erase(*ce.lossBackward);
  }
  eraseForward(g, ce);
}

// Rooted at the log_softmax: the loss and its backward found from there.
class CrossEntropyToKernel final : public RewritePattern {
 public:
  CrossEntropyToKernel() : RewritePattern("cross-entropy-to-kernel", {"aten::_log_softmax"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& logSoftmax) override {
    std::string why;
    const std::optional<CrossEntropy> ce = match(g, logSoftmax, why);
    if (!ce) return why.empty() ? MatchResult::skip() : MatchResult::failure(why);
    fuse(g, *ce);
    return MatchResult::success();
  }
};

// The fp32 logits an exact upcast makes, through views; nullptr where they are not.
const Node* upcastUnderViews(const Graph& g, ValueId logits) {
  const Node* p = g.producer(logits);
  while (p && isDtypeFreeView(*p)) p = g.producer(p->args[0].value);
  return p && isExactUpcast(g, *p) ? p : nullptr;
}

// Rooted at spmd::cross_entropy_with_grad over fp32 logits: its .upcast
// overload on the 16-bit logits those were cast from (see the top).
class UpcastLogitsInKernel final : public RewritePattern {
 public:
  UpcastLogitsInKernel() : RewritePattern("upcast-logits-in-kernel", {"spmd::cross_entropy_with_grad"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& ce) override {
    const ValueId logits = ce.args[0].value;
    const Node* upcast = g.value(logits).dtype == c10::ScalarType::Float ? upcastUnderViews(g, logits) : nullptr;
    if (!upcast) return MatchResult::skip();
    const c10::ScalarType narrow = inputDtype(g, *upcast);
    const std::optional<CastAfterViews> back = castAfterViews(g, ce.outputs[2]);
    if (!back || g.value(back->cast->outputs[0]).dtype != narrow) {
      return MatchResult::failure("the logits are cast up, but their gradient is not cast back to their type");
    }
    GraphBuilder b(g);
    b.setMeta(ce.meta);
    b.setInsertionPoint(ce);
    std::vector<Arg> args = ce.args;
    args[0] = Arg::tensor(readThroughUpcast(b, logits));
    b.setMeta(ce.meta);
    const std::string name = g.value(ce.outputs[0]).name;  // a copy, as calls add values
    const std::vector<ValueId> out = b.callMulti("spmd::cross_entropy_with_grad.upcast", args, name);
    castAfterViewsOf(b, *back, out[2]);
    g.replaceAllUsesWith(ce.outputs[0], out[0]);
    g.replaceAllUsesWith(ce.outputs[1], out[1]);
    g.erase(ce);
    return MatchResult::success();
  }

 private:
  static c10::ScalarType inputDtype(const Graph& g, const Node& upcast) {
    const Arg& in = upcast.args[0];
    return g.value(in.kind == Arg::Kind::Value ? in.value : in.values[0]).dtype;
  }
};

class FuseCrossEntropyPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    CrossEntropyToKernel pattern;
    const int fused = applyPatternsNotingFailures(g, {&pattern},
                                                  diagnostics, "cross-entropy-to-kernel: not fused: ").total();
    count("log_softmax + nll_loss pair(s) as generated kernels", fused);
    UpcastLogitsInKernel upcast;
    const int read16 =
        applyPatternsNotingFailures(g, {&upcast}, diagnostics, "cross-entropy-to-kernel: logits left in fp32: ").total();
    if (read16 > 0) count("losses reading 16-bit logits and writing their gradient so", read16);
    return fused + read16 > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseCrossEntropyPass(const PipelineOptions&) {
  return std::make_unique<FuseCrossEntropyPass>();
}

}  // namespace spmd

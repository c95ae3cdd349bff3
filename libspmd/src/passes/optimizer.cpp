// optimizer: the parameter update of torch.optim's SGD, Adam and AdamW as
// explicit nodes (role "optimizer"), with torch.optim's formulas, in its
// order of operations.
//
// Reads each gradient's reduced value (or the gradient itself when grad-sync
// did not run). Optimizer state becomes graph inputs of kind "state", all
// starting at zero as torch.optim's lazily created state does, and the new
// parameter and state values become state updates:
//   Adam/AdamW: <param>.step (f32[]), <param>.exp_avg, <param>.exp_avg_sq
//               and, with amsgrad, <param>.max_exp_avg_sq
//   SGD with momentum: <param>.momentum_buffer, and one sgd.step counter
//               that makes the first step take the gradient itself as the
//               buffer, as torch.optim does.
// Parameters without a gradient are left alone, as torch.optim skips them.
//
// With an lr schedule the learning rate is the graph input "lr" (f64[],
// kind schedule) that spmd-run sets per step, and the formulas read it as a
// tensor (SGD's add(alpha=-lr) becomes a mul and a sub: one more rounding).
// With --clip-grad-norm the reduced gradients are first clipped to the
// global norm (passes/clip_grad_norm.h), which becomes the second output.
#include "spmd/ir/builder.h"
#include "spmd/passes/clip_grad_norm.h"
#include "spmd/ir/optimizer_state.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>

namespace spmd {
namespace {

ValueId stateInput(Graph& g, const std::string& name, c10::ScalarType dtype, std::vector<int64_t> shape) {
  return g.addInput(Value{g.freshName(name), dtype, std::move(shape)}, InputKind::State);
}

ValueId zeroDimLike(GraphBuilder& b, ValueId like, double fill, c10::ScalarType dtype) {
  return b.call("aten::full_like", {Arg::tensor(like), Arg::ofFloat(fill), dtypeArg(dtype), Arg::none(), Arg::none(),
                                    Arg::none(), Arg::none()});
}

ValueId addScalar(GraphBuilder& b, ValueId a, double s) {
  return b.call("aten::add.Scalar", {Arg::tensor(a), Arg::ofFloat(s), Arg::ofInt(1)});
}

// What the update reads: the learning rate as a constant or the schedule's
// input, and each parameter's (clipped) reduced gradient.
struct UpdateInputs {
  ValueId lr = kNoValue;  // the "lr" input, or kNoValue for the constant
  std::map<ValueId, ValueId> gradient;  // by parameter
};

void adam(Graph& g, GraphBuilder& b, const Gradient& grad, const OptimizerOptions& o, const UpdateInputs& in) {
  const Value p = g.value(grad.parameter);
  ValueId param = grad.parameter;
  ValueId gv = in.gradient.at(grad.parameter);
  ValueId step = stateInput(g, optimizerStateName(p.name, OptimizerState::Step), c10::ScalarType::Float, {});
  ValueId expAvg = stateInput(g, optimizerStateName(p.name, OptimizerState::ExpAvg), p.dtype, p.shape);
  ValueId expAvgSq = stateInput(g, optimizerStateName(p.name, OptimizerState::ExpAvgSq), p.dtype, p.shape);
  ValueId maxExpAvgSq = o.amsgrad ? stateInput(g, optimizerStateName(p.name, OptimizerState::MaxExpAvgSq), p.dtype, p.shape) : kNoValue;

  ValueId step1 = b.call("aten::add.Scalar", {Arg::tensor(step), Arg::ofInt(1), Arg::ofInt(1)}, "step");
  if (o.kind == OptimizerKind::AdamW && in.lr != kNoValue) {
    // param.mul_(1 - lr * weight_decay), the factor in float64 as Python's
    if (o.weightDecay != 0.0) {
      ValueId decay = b.call("aten::rsub.Scalar", {Arg::tensor(b.mulScalar(in.lr, o.weightDecay)), Arg::ofInt(1), Arg::ofInt(1)},
                             "decay");
      param = b.mul(param, decay);
    }
  } else if (o.kind == OptimizerKind::AdamW) {
    param = b.mulScalar(param, 1.0 - o.lr * o.weightDecay);
  } else if (o.weightDecay != 0.0) {
    gv = b.add(gv, param, o.weightDecay);
  }
  // exp_avg.lerp_(grad, 1 - beta1), as torch.optim's single-tensor and
  // foreach Adam and AdamW write it (not mul + add, which rounds otherwise)
  ValueId m = b.call("aten::lerp.Scalar", {Arg::tensor(expAvg), Arg::tensor(gv), Arg::ofFloat(1.0 - o.beta1)});
  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
  ValueId v = b.call("aten::addcmul", {Arg::tensor(b.mulScalar(expAvgSq, o.beta2)), Arg::tensor(gv), Arg::tensor(gv),
                                       Arg::ofFloat(1.0 - o.beta2)});
  // Bias corrections in float64, as Python computes them from step.item().
  ValueId stepF64 = b.cast(step1, c10::ScalarType::Double);
  auto oneMinusPow = [&](double beta) {
    ValueId pw = b.call("aten::pow.Scalar", {Arg::ofFloat(beta), Arg::tensor(stepF64)});
    return b.call("aten::rsub.Scalar", {Arg::tensor(pw), Arg::ofInt(1), Arg::ofInt(1)}, "bias_correction");
  };
  ValueId bc1 = oneMinusPow(o.beta1);
  ValueId bc2Sqrt = b.call("aten::sqrt", {Arg::tensor(oneMinusPow(o.beta2))});
  ValueId lr = in.lr != kNoValue ? in.lr : zeroDimLike(b, bc1, o.lr, c10::ScalarType::Double);
  ValueId negStepSize = b.neg(b.call("aten::div.Tensor", {Arg::tensor(lr), Arg::tensor(bc1)}));
  ValueId second = v;
  if (o.amsgrad) second = b.call("aten::maximum", {Arg::tensor(maxExpAvgSq), Arg::tensor(v)});
  // denom = (second.sqrt() / bias_correction2_sqrt).add_(eps)
  ValueId denom = b.call("aten::div.Tensor", {Arg::tensor(b.call("aten::sqrt", {Arg::tensor(second)})), Arg::tensor(bc2Sqrt)});
  denom = addScalar(b, denom, o.eps);
  // param.addcdiv_(exp_avg, denom, value=-step_size): value * exp_avg first, as the kernel does
  ValueId scaled = b.mul(m, negStepSize);
  ValueId updated = b.call("aten::addcdiv", {Arg::tensor(param), Arg::tensor(scaled), Arg::tensor(denom), Arg::ofInt(1)},
                           p.name + ".new");
  g.addUpdate({grad.parameter, updated});
  g.addUpdate({step, step1});
  g.addUpdate({expAvg, m});
  g.addUpdate({expAvgSq, v});
  if (o.amsgrad) g.addUpdate({maxExpAvgSq, second});
}

void sgd(Graph& g, GraphBuilder& b, const Gradient& grad, const OptimizerOptions& o, ValueId firstStep,
         const UpdateInputs& in) {
  const Value p = g.value(grad.parameter);
  ValueId dp = in.gradient.at(grad.parameter);
  if (o.weightDecay != 0.0) dp = b.add(dp, grad.parameter, o.weightDecay);
  if (o.momentum != 0.0) {
    ValueId buf = stateInput(g, optimizerStateName(p.name, OptimizerState::MomentumBuffer), p.dtype, p.shape);
    // buf.mul_(momentum).add_(d_p, alpha=1 - dampening), or d_p itself on the first step
    ValueId blended = b.add(b.mulScalar(buf, o.momentum), dp, 1.0 - o.dampening);
    ValueId newBuf = b.call("aten::where.self", {Arg::tensor(firstStep), Arg::tensor(dp), Arg::tensor(blended)},
                            p.name + ".momentum");
    g.addUpdate({buf, newBuf});
    dp = o.nesterov ? b.add(dp, newBuf, o.momentum) : newBuf;
  }
  if (in.lr == kNoValue) {
    g.addUpdate({grad.parameter, b.add(grad.parameter, dp, -o.lr)});
  } else {
    ValueId step = b.mul(dp, in.lr);
    g.addUpdate({grad.parameter, b.call("aten::sub.Tensor", {Arg::tensor(grad.parameter), Arg::tensor(step), Arg::ofInt(1)},
                                        p.name + ".new")});
  }
}

// The gradients in the order of the parameter inputs (the module's).
std::vector<Gradient> inParameterOrder(std::vector<Gradient> grads, const Graph& g) {
  std::map<ValueId, size_t> position;
  for (size_t i = 0; i < g.inputs().size(); ++i) position[g.inputs()[i].value] = i;
  std::stable_sort(grads.begin(), grads.end(), [&](const Gradient& a, const Gradient& b) {
    return position[a.parameter] < position[b.parameter];
  });
  return grads;
}

UpdateInputs updateInputs(Graph& g, GraphBuilder& b, const std::vector<Gradient>& gradients, const TrainingConfig& t) {
  UpdateInputs in;
  if (t.scheduled) {
    if (g.findValue("lr")) throw Diagnostic("--lr-schedule", "the graph has a value named 'lr' already, the name of the rate's input");
    in.lr = g.addInput(Value{"lr", c10::ScalarType::Double, {}}, InputKind::Schedule);
    g.training().scheduled = true;
    g.training().schedule = t.schedule;
  }
  auto reducedOf = [](const Gradient& grad) { return grad.reduced != kNoValue ? grad.reduced : grad.value; };
  for (const Gradient& grad : gradients) in.gradient[grad.parameter] = reducedOf(grad);
  if (t.clips() && !gradients.empty()) {
    const std::vector<Gradient> ordered = inParameterOrder(gradients, g);
    std::vector<ValueId> reduced;
    for (const Gradient& grad : ordered) reduced.push_back(reducedOf(grad));
    ClippedGradients c = clipGradNorm(b, reduced, t.clipMaxNorm, t.clipNormType);
    for (size_t i = 0; i < ordered.size(); ++i) in.gradient[ordered[i].parameter] = c.clipped[i];
    g.outputs().insert(g.outputs().begin() + 1, c.totalNorm);
    g.training().clipMaxNorm = t.clipMaxNorm;
    g.training().clipNormType = t.clipNormType;
  }
  return in;
}

}  // namespace

namespace {

class OptimizerPass final : public Pass {
 public:
  OptimizerPass(OptimizerOptions options, TrainingConfig training) : options_(options), training_(training) {}
  bool run(Graph& g, DiagnosticEngine&) override;

 private:
  OptimizerOptions options_;
  TrainingConfig training_;
};

}  // namespace

std::unique_ptr<Pass> createOptimizerPass(const PipelineOptions& options) {
  return std::make_unique<OptimizerPass>(options.optimizer, options.training);
}

bool OptimizerPass::run(Graph& g, DiagnosticEngine&) {
  const OptimizerOptions& o = options_;
  validateOptimizer(o);
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", NodeRole::Optimizer, -1, -1, IterationTag::Every});
  const std::vector<Gradient> gradients = g.gradients();
  if (g.outputs().empty()) throw Diagnostic("/outputs", "the step has no loss output");
  const UpdateInputs in = updateInputs(g, b, gradients, training_);
  if (o.kind == OptimizerKind::Sgd) {
    ValueId firstStep = kNoValue;
    if (o.momentum != 0.0 && !gradients.empty()) {
      ValueId step = stateInput(g, "sgd.step", c10::ScalarType::Float, {});
      firstStep = b.call("aten::eq.Scalar", {Arg::tensor(step), Arg::ofInt(0)}, "first_step");
      g.addUpdate({step, b.call("aten::add.Scalar", {Arg::tensor(step), Arg::ofInt(1), Arg::ofInt(1)}, "step")});
    }
    for (const Gradient& grad : gradients) sgd(g, b, grad, o, firstStep, in);
  } else {
    for (const Gradient& grad : gradients) adam(g, b, grad, o, in);
  }
  return !gradients.empty();
}

}  // namespace spmd

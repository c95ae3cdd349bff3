// adam-to-capturable-foreach (spmd-lower runs it for --device cuda): Adam's update as torch.optim's
// capturable foreach Adam computes it, which reads and writes each tensor
// fewer times:
//   param + (exp_avg * -step_size) / denom   ->  param + exp_avg / denom'
//     with denom' = sqrt(v) / (bias_correction2_sqrt * -step_size) + eps / -step_size
// (the step size, a device tensor, goes into the denominator's two 0-dim
// factors instead of a pass of its own over exp_avg). The values agree with
// the CPU lowering's to rounding, not bit for bit. The first moment is
// lerp(exp_avg, grad, 1 - beta1) already, as the optimizer pass writes it.
// The CPU lowering keeps the optimizer pass's formulas, the parity oracle's.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <optional>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName mul_Tensor = OpName::known("aten::mul.Tensor");
  OpName add_Scalar = OpName::known("aten::add.Scalar");
  OpName div_Tensor = OpName::known("aten::div.Tensor");
  OpName neg = OpName::known("aten::neg");
  OpName full_like = OpName::known("aten::full_like");
};
const Ops& ops() { return opTable<Ops>(); }

double scalarOf(const Arg& a) { return a.kind == Arg::Kind::Int ? static_cast<double>(a.i) : a.f; }
bool isScalar(const Arg& a) { return a.kind == Arg::Kind::Int || a.kind == Arg::Kind::Float; }

// The optimizer node making `v` when it is `op` and `v` has no other reader.
const Node* soleUse(const Graph& g, ValueId v, OpName op) {
  const Node* n = g.producer(v);
  if (!n || !g.hasOneReader(v)) return nullptr;
  return n->is(op) && n->meta.role == NodeRole::Optimizer ? n : nullptr;
}

struct StepSizeMatch {
  const Node* addcdiv;   // addcdiv(param, scaled, denom, 1)
  const Node* scaled;    // mul.Tensor(exp_avg, n)
  const Node* denom;     // add.Scalar(quotient, eps, 1)
  const Node* quotient;  // div.Tensor(sqrt_v, c)
};

// What the pattern reads of the graph.
class AdamMatcher {
 public:
  explicit AdamMatcher(const Graph& g) : g_(g) {}

  // param.addcdiv(exp_avg * n, sqrt(v) / c + eps, 1), with n = -step_size
  // and c = bias_correction2_sqrt both 0-dim.
  std::optional<StepSizeMatch> matchStepSize(const Node& addcdiv) const {
    if (addcdiv.meta.role != NodeRole::Optimizer || addcdiv.args.size() != 4 ||
        addcdiv.args[1].kind != Arg::Kind::Value || addcdiv.args[2].kind != Arg::Kind::Value ||
        !isScalar(addcdiv.args[3]) || scalarOf(addcdiv.args[3]) != 1.0) {
      return std::nullopt;
    }
    const Node* scaled = soleUse(g_, addcdiv.args[1].value, ops().mul_Tensor);
    const Node* denom = soleUse(g_, addcdiv.args[2].value, ops().add_Scalar);
    if (!scaled || !denom || !isScalar(denom->args[1]) || !isScalar(denom->args[2]) || scalarOf(denom->args[2]) != 1.0) {
      return std::nullopt;
    }
    const Node* quotient = soleUse(g_, denom->args[0].value, ops().div_Tensor);
    if (!quotient || !g_.value(scaled->args[1].value).shape.empty() || !g_.value(quotient->args[1].value).shape.empty() ||
        !isNonZeroStepSize(scaled->args[1].value)) {
      return std::nullopt;
    }
    return StepSizeMatch{&addcdiv, scaled, denom, quotient};
  }

 private:
  // n = -(full_like(_, lr) / bias_correction1) with lr != 0: the rewrite
  // divides by n, and with lr = 0 would turn 0 / 0 into NaN where the plain
  // formula adds 0.
  bool isNonZeroStepSize(ValueId n) const {
    auto producer = [&](ValueId v, OpName op) -> const Node* {
      const Node* p = g_.producer(v);
      return p && p->is(op) && !p->args.empty() && p->args[0].kind == Arg::Kind::Value ? p : nullptr;
    };
    const Node* neg = producer(n, ops().neg);
    const Node* div = neg ? producer(neg->args[0].value, ops().div_Tensor) : nullptr;
    const Node* lr = div ? producer(div->args[0].value, ops().full_like) : nullptr;
    return lr && lr->args.size() > 1 && isScalar(lr->args[1]) && scalarOf(lr->args[1]) != 0.0;
  }

  const Graph& g_;
};

void rewriteStepSize(Graph& g, const StepSizeMatch& m) {
  GraphBuilder b(g);
  b.setInsertionPoint(*m.addcdiv);
  b.setMeta(m.addcdiv->meta);
  const ValueId n = m.scaled->args[1].value, c = m.quotient->args[1].value;
  const ValueId k = b.call("aten::mul.Tensor", {Arg::tensor(c), Arg::tensor(n)}, "denom_scale");
  const ValueId q = b.call("aten::div.Tensor", {m.quotient->args[0], Arg::tensor(k)}, "denom");
  const ValueId eps = b.call("aten::full_like", {Arg::tensor(n), m.denom->args[1], dtypeArg(g.value(n).dtype), Arg::none(),
                                                 Arg::none(), Arg::none(), Arg::none()},
                             "eps");
  const ValueId epsScaled = b.call("aten::div.Tensor", {Arg::tensor(eps), Arg::tensor(n)}, "eps_scaled");
  const ValueId d = b.call("aten::add.Tensor", {Arg::tensor(q), Arg::tensor(epsScaled), Arg::ofInt(1)}, "denom");
  const std::vector<Arg> args = {m.addcdiv->args[0], m.scaled->args[0], Arg::tensor(d), Arg::ofInt(1)};
  b.replace(*m.addcdiv, "aten::addcdiv", args);
}

// The matched nodes the rewrite no longer reads (the old denominator) are
// left to dce, so that the new values are named beside
// them as they always were.
class StepSizePattern final : public RewritePattern {
 public:
  StepSizePattern() : RewritePattern("step-size-in-denominator", {"aten::addcdiv"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& addcdiv) override {
    const std::optional<StepSizeMatch> m = AdamMatcher(g).matchStepSize(addcdiv);
    if (!m) return MatchResult::skip();
    rewriteStepSize(g, *m);
    return MatchResult::success();
  }
};

class CapturableAdamPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override;
};

}  // namespace

std::unique_ptr<Pass> createCapturableAdamPass(const PipelineOptions&) { return std::make_unique<CapturableAdamPass>(); }

bool CapturableAdamPass::run(Graph& g, DiagnosticEngine&) {
  StepSizePattern stepSizes;
  const RewriteCounts applied = applyPatternsGreedily(g, {&stepSizes}, nullptr);
  count("parameter update(s) with the step size in the denominator", applied.applied[0]);
  return applied.total() > 0;
}

}  // namespace spmd

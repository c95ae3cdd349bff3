// capturable-adam: with --device cuda, Adam's update as torch.optim's
// capturable foreach Adam computes it, which reads and writes each tensor
// fewer times:
//   exp_avg * beta1 + grad * (1 - beta1)     ->  lerp(exp_avg, grad, 1 - beta1)
//   param + (exp_avg * -step_size) / denom   ->  param + exp_avg / denom'
//     with denom' = sqrt(v) / (bias_correction2_sqrt * -step_size) + eps / -step_size
// (the step size, a device tensor, goes into the denominator's two 0-dim
// factors instead of a pass of its own over exp_avg). The values agree with
// the CPU lowering's to rounding, not bit for bit; torch.optim's own foreach
// Adam uses lerp on LibTorch 2. The CPU lowering keeps LibTorch 1.13's
// single-tensor formulas, the parity oracle.
#include "spmd/passes/pass.h"

#include <map>
#include <set>

namespace spmd {
namespace {

struct Producers {
  std::map<ValueId, size_t> node;  // value -> the node index that makes it
  std::map<ValueId, int> readers;  // value -> node arguments, outputs and updates that read it

  explicit Producers(const Graph& g) {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      forEachTensorArg(g.nodes()[i], [&](ValueId v) { ++readers[v]; });
      for (ValueId o : g.nodes()[i].outputs) {
        if (o != kNoValue) node[o] = i;
      }
    }
    for (ValueId v : g.outputs()) ++readers[v];
    for (const auto& u : g.updates()) ++readers[u.value];
  }

  // The node making `v` when it is `op` and `v` has no other reader.
  const Node* soleUse(const Graph& g, ValueId v, const char* op) const {
    auto it = node.find(v);
    if (it == node.end() || readers.count(v) == 0 || readers.at(v) != 1) return nullptr;
    const Node& n = g.nodes()[it->second];
    return n.qualifiedName() == op && n.meta.role == NodeRole::Optimizer ? &n : nullptr;
  }
};

double scalarOf(const Arg& a) { return a.kind == Arg::Kind::Int ? static_cast<double>(a.i) : a.f; }
bool isScalar(const Arg& a) { return a.kind == Arg::Kind::Int || a.kind == Arg::Kind::Float; }

ValueId emit(Graph& g, const NodeMeta& meta, const std::string& op, const std::string& overload, std::vector<Arg> args,
             Value type, ValueId preset = kNoValue) {
  const ValueId out = preset != kNoValue ? preset : g.addValue(std::move(type));
  Node n;
  n.op = op;
  n.overload = overload;
  n.args = std::move(args);
  n.outputs = {out};
  n.meta = meta;
  g.addNode(std::move(n));
  return out;
}

Value like(Graph& g, ValueId v, const std::string& base) {
  const Value& t = g.value(v);
  return {g.freshName(base), t.dtype, t.shape};
}

Arg dtypeOf(const Graph& g, ValueId v) {
  Arg a;
  a.kind = Arg::Kind::DType;
  a.i = static_cast<int64_t>(g.value(v).dtype);
  return a;
}

struct LerpMatch {
  Node add;     // add.Tensor(mul, grad, 1 - beta1)
  Arg expAvg;   // the mul's exp_avg
};

struct StepSizeMatch {
  Node addcdiv;   // addcdiv(param, scaled, denom, 1)
  Node scaled;    // mul.Tensor(exp_avg, n)
  Node denom;     // add.Scalar(quotient, eps, 1)
  Node quotient;  // div.Tensor(sqrt_v, c)
};

class Rewriter {
 public:
  explicit Rewriter(Graph& g) : g_(g), uses_(g) {}

  // exp_avg.mul(beta1).add(grad, alpha=1 - beta1), the new value of an
  // exp_avg state input.
  void matchLerp(size_t i) {
    const Node& add = g_.nodes()[i];
    if (add.qualifiedName() != "aten::add.Tensor" || add.meta.role != NodeRole::Optimizer || add.args.size() != 3 ||
        !isScalar(add.args[2]) || add.args[0].kind != Arg::Kind::Value) {
      return;
    }
    const Node* mul = uses_.soleUse(g_, add.args[0].value, "aten::mul.Scalar");
    if (!mul || mul->args[0].kind != Arg::Kind::Value || !isScalar(mul->args[1]) ||
        scalarOf(add.args[2]) != 1.0 - scalarOf(mul->args[1]) || !updatesExpAvg(add.outputs[0])) {
      return;
    }
    dropped_.insert(uses_.node.at(add.args[0].value));
    lerps_[i] = {add, mul->args[0]};
  }

  // param.addcdiv(exp_avg * n, sqrt(v) / c + eps, 1), with n = -step_size
  // and c = bias_correction2_sqrt both 0-dim.
  void matchStepSize(size_t i) {
    const Node& addcdiv = g_.nodes()[i];
    if (addcdiv.qualifiedName() != "aten::addcdiv" || addcdiv.meta.role != NodeRole::Optimizer || addcdiv.args.size() != 4 ||
        addcdiv.args[1].kind != Arg::Kind::Value || addcdiv.args[2].kind != Arg::Kind::Value ||
        !isScalar(addcdiv.args[3]) || scalarOf(addcdiv.args[3]) != 1.0) {
      return;
    }
    const Node* scaled = uses_.soleUse(g_, addcdiv.args[1].value, "aten::mul.Tensor");
    const Node* denom = uses_.soleUse(g_, addcdiv.args[2].value, "aten::add.Scalar");
    if (!scaled || !denom || !isScalar(denom->args[1]) || !isScalar(denom->args[2]) || scalarOf(denom->args[2]) != 1.0) {
      return;
    }
    const Node* quotient = uses_.soleUse(g_, denom->args[0].value, "aten::div.Tensor");
    if (!quotient || !g_.value(scaled->args[1].value).shape.empty() || !g_.value(quotient->args[1].value).shape.empty() ||
        !isNonZeroStepSize(scaled->args[1].value)) {
      return;
    }
    for (ValueId v : {addcdiv.args[1].value, addcdiv.args[2].value, denom->args[0].value}) dropped_.insert(uses_.node.at(v));
    steps_[i] = {addcdiv, *scaled, *denom, *quotient};
  }

  // Rebuilds the node list with the matches replaced; returns their count.
  size_t apply() {
    std::vector<Node> old = g_.takeNodes();
    for (size_t i = 0; i < old.size(); ++i) {
      if (lerps_.count(i)) {
        emitLerp(lerps_.at(i));
      } else if (steps_.count(i)) {
        emitStepSize(steps_.at(i));
      } else if (!dropped_.count(i)) {
        g_.addNode(std::move(old[i]));
      }
    }
    return lerps_.size() + steps_.size();
  }

  std::string summary() const {
    return std::to_string(lerps_.size()) + " first-moment updates as lerp, " + std::to_string(steps_.size()) +
           " parameter updates with the step size in the denominator";
  }

 private:
  // n = -(full_like(_, lr) / bias_correction1) with lr != 0: the rewrite
  // divides by n, and with lr = 0 would turn 0 / 0 into NaN where the plain
  // formula adds 0.
  bool isNonZeroStepSize(ValueId n) const {
    auto producer = [&](ValueId v, const char* op) -> const Node* {
      auto it = uses_.node.find(v);
      if (it == uses_.node.end()) return nullptr;
      const Node& p = g_.nodes()[it->second];
      return p.qualifiedName() == op && !p.args.empty() && p.args[0].kind == Arg::Kind::Value ? &p : nullptr;
    };
    const Node* neg = producer(n, "aten::neg");
    const Node* div = neg ? producer(neg->args[0].value, "aten::div.Tensor") : nullptr;
    const Node* lr = div ? producer(div->args[0].value, "aten::full_like") : nullptr;
    return lr && lr->args.size() > 1 && isScalar(lr->args[1]) && scalarOf(lr->args[1]) != 0.0;
  }

  bool updatesExpAvg(ValueId v) const {
    const std::string suffix = ".exp_avg";
    for (const auto& u : g_.updates()) {
      const std::string& name = g_.value(u.input).name;
      if (u.value == v && name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return true;
      }
    }
    return false;
  }

  void emitLerp(const LerpMatch& m) {
    emit(g_, m.add.meta, "aten::lerp", "Scalar", {m.expAvg, m.add.args[1], m.add.args[2]}, {}, m.add.outputs[0]);
  }

  void emitStepSize(const StepSizeMatch& m) {
    const NodeMeta& meta = m.addcdiv.meta;
    const ValueId n = m.scaled.args[1].value, c = m.quotient.args[1].value;
    const ValueId k = emit(g_, meta, "aten::mul", "Tensor", {Arg::tensor(c), Arg::tensor(n)}, like(g_, n, "denom_scale"));
    const ValueId q =
        emit(g_, meta, "aten::div", "Tensor", {m.quotient.args[0], Arg::tensor(k)}, like(g_, m.quotient.outputs[0], "denom"));
    const ValueId eps = emit(g_, meta, "aten::full_like", "",
                             {Arg::tensor(n), m.denom.args[1], dtypeOf(g_, n), Arg::none(), Arg::none(), Arg::none(), Arg::none()},
                             like(g_, n, "eps"));
    const ValueId epsScaled =
        emit(g_, meta, "aten::div", "Tensor", {Arg::tensor(eps), Arg::tensor(n)}, like(g_, n, "eps_scaled"));
    const ValueId d = emit(g_, meta, "aten::add", "Tensor", {Arg::tensor(q), Arg::tensor(epsScaled), Arg::ofInt(1)},
                           like(g_, m.denom.outputs[0], "denom"));
    emit(g_, meta, "aten::addcdiv", "", {m.addcdiv.args[0], m.scaled.args[0], Arg::tensor(d), Arg::ofInt(1)}, {},
         m.addcdiv.outputs[0]);
  }

  Graph& g_;
  Producers uses_;
  std::set<size_t> dropped_;
  std::map<size_t, LerpMatch> lerps_;
  std::map<size_t, StepSizeMatch> steps_;
};

}  // namespace

bool runCapturableAdam(Graph& g, const PipelineOptions& options) {
  if (options.lower.device != "cuda") return false;
  Rewriter rewriter(g);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    rewriter.matchLerp(i);
    rewriter.matchStepSize(i);
  }
  const size_t rewritten = rewriter.apply();
  if (rewritten > 0 && options.notes) {
    options.notes->push_back("capturable-adam: " + rewriter.summary() +
                             ", as torch.optim's capturable foreach Adam computes them (equal to the CPU lowering's to "
                             "rounding)");
  }
  return rewritten > 0;
}

}  // namespace spmd

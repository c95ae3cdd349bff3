// adam-to-fused-kernel (spmd-lower runs it for --device cuda): the optimizer pass's
// per-parameter Adam/AdamW updates become spmd::fused_adam calls, torch.optim's
// fused implementation (ATen's _fused_adam_/_fused_adamw_: one multi-tensor
// kernel reads each parameter, gradient and moment once), one call per group
// of parameters updated at the same point (bucket and iteration tag), put
// where its last input is ready. The hyperparameters are read back from the
// update's own constants (beta1 from its bias correction, lr from the step size,
// ...), which the optimizer pass wrote. In a step sharded by spmd-split --shard
// optimizer|gradients the update is of this rank's shard of the parameter,
// and the all-gather reads the call's result. A parameter whose update has another
// shape (amsgrad, an exported step's optimizer) keeps its per-parameter ops,
// and a note says so. Values agree with the foreach form to rounding. The learning rate is a constant of the call, or, for a
// scheduled rate (the graph input lr), the tensor of spmd::fused_adam.tensor_lr.
#include "spmd/ir/builder.h"
#include "spmd/ir/optimizer_state.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName mul_Tensor = OpName::known("aten::mul.Tensor");
  OpName rsub_Scalar = OpName::known("aten::rsub.Scalar");
  OpName mul_Scalar = OpName::known("aten::mul.Scalar");
  OpName add_Scalar = OpName::known("aten::add.Scalar");
  OpName add_Tensor = OpName::known("aten::add.Tensor");
  OpName addcmul = OpName::known("aten::addcmul");
  OpName addcdiv = OpName::known("aten::addcdiv");
  OpName neg = OpName::known("aten::neg");
  OpName div_Tensor = OpName::known("aten::div.Tensor");
  OpName full_like = OpName::known("aten::full_like");
  OpName lerp_Scalar = OpName::known("aten::lerp.Scalar");
  OpName pow_Scalar = OpName::known("aten::pow.Scalar");
};
const Ops& ops() { return opTable<Ops>(); }

struct Hyper {
  bool adamw = false;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
  ValueId lrInput = kNoValue;  // the scheduled rate, when lr is not a constant
  auto key() const { return std::make_tuple(adamw, lr, beta1, beta2, eps, weightDecay, lrInput); }
};

// One parameter's update as the optimizer pass wrote it.
struct Update {
  ValueId param, grad, expAvg, expAvgSq, step;           // inputs
  ValueId newParam, newExpAvg, newExpAvgSq, newStep;     // updated values
  const Node* last;                                      // the parameter's addcdiv
  Hyper hyper;
};

double scalar(const Arg& a) { return a.kind == Arg::Kind::Int ? static_cast<double>(a.i) : a.f; }
bool isValue(const Arg& a, ValueId v) { return a.kind == Arg::Kind::Value && a.value == v; }

const Node* producedBy(const Graph& g, ValueId v, OpName op) {
  const Node* n = g.producer(v);
  return n && n->is(op) ? n : nullptr;
}

std::optional<ValueId> updateOf(const Graph& g, ValueId input) {
  for (const StateUpdate& u : g.updates()) {
    if (u.input == input) return u.value;
  }
  return std::nullopt;
}

std::optional<ValueId> stateOf(const Graph& g, const std::string& param, OptimizerState s) {
  return g.findValue(optimizerStateName(param, s));
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b)); }

// beta from a bias correction 1 - beta ** step (rsub(pow.Scalar(beta, step),
// 1)), where `bc` is one; the exact constant the optimizer pass was given.
std::optional<double> biasCorrectionBeta(const Graph& g, const Arg& bc) {
  if (bc.kind != Arg::Kind::Value) return std::nullopt;
  const Node* rsub = producedBy(g, bc.value, ops().rsub_Scalar);
  const Node* pow = rsub && rsub->args[0].kind == Arg::Kind::Value ? producedBy(g, rsub->args[0].value, ops().pow_Scalar)
                                                                   : nullptr;
  if (!pow || scalar(rsub->args[1]) != 1.0 || pow->args[0].kind == Arg::Kind::Value) return std::nullopt;
  return scalar(pow->args[0]);
}

// The scheduled rate: the schedule input lr, or, in work spmd-unroll moved,
// the state input that carries it from the previous iteration (f64[]).
bool isRateInput(const Graph& g, ValueId v) {
  const GraphInput* in = g.inputOf(v);
  const Value& value = g.value(v);
  return in && (in->kind == InputKind::Schedule || in->kind == InputKind::State) &&
         value.dtype == c10::ScalarType::Double && value.shape.empty();
}

// AdamW's decay under a schedule, param * (1 - lr * wd): wd, else nullopt.
std::optional<double> scheduledDecay(const Graph& g, ValueId decayed, ValueId param, ValueId lr) {
  const Node* mul = producedBy(g, decayed, ops().mul_Tensor);
  if (lr == kNoValue || !mul || !isValue(mul->args[0], param) || mul->args[1].kind != Arg::Kind::Value) return std::nullopt;
  const Node* rsub = producedBy(g, mul->args[1].value, ops().rsub_Scalar);
  const Node* lrWd = rsub ? producedBy(g, rsub->args[0].value, ops().mul_Scalar) : nullptr;
  if (!lrWd || !isValue(lrWd->args[0], lr) || scalar(rsub->args[1]) != 1.0) return std::nullopt;
  return scalar(lrWd->args[1]);
}

// In a step sharded by spmd-split --shard optimizer|gradients: this rank's
// shard of `input`, which the optimizer updates (spmd::shard of its padded
// rows, reshaped), and the update the all-gather reads (an addcdiv). nullopt
// where there is none.
std::optional<std::pair<ValueId, ValueId>> shardUpdate(const Graph& g, ValueId input) {
  static const OpName kShard = OpName::known("spmd::shard");
  static const OpName kReshape = OpName::known("aten::reshape");
  static const OpName kPad = OpName::known("aten::constant_pad_nd");
  for (const Node& n : g.nodes()) {
    if (!n.is(kShard)) continue;
    ValueId from = n.args[0].value;
    for (const Node* p = g.producer(from); p && (p->is(kReshape) || p->is(kPad)); p = g.producer(from)) from = p->args[0].value;
    if (from != input) continue;
    ValueId shard = n.outputs[0];
    if (const Node* reader = g.soleReader(shard); reader && reader->is(kReshape)) shard = reader->outputs[0];
    // The parameter's addcdiv reads the shard, or AdamW's decay of it.
    for (const Node* reader : g.users(shard)) {
      const Node* decayed = reader->outputs.size() == 1 ? g.soleReader(reader->outputs[0]) : nullptr;
      for (const Node* upd : {reader, decayed}) {
        if (upd && upd->is(ops().addcdiv)) return std::pair{shard, upd->outputs[0]};
      }
    }
  }
  return std::nullopt;
}

// Reads `input`'s Adam update back; nullopt where it is not the optimizer pass's.
std::optional<Update> matchUpdate(const Graph& g, ValueId input) {
  const std::string& name = g.value(input).name;
  if (stateOf(g, name, OptimizerState::MaxExpAvgSq)) return std::nullopt;  // amsgrad
  Update u{};
  const auto m0 = stateOf(g, name, OptimizerState::ExpAvg), v0 = stateOf(g, name, OptimizerState::ExpAvgSq),
             s0 = stateOf(g, name, OptimizerState::Step);
  std::optional<std::pair<ValueId, ValueId>> p1;
  if (const auto whole = updateOf(g, input); whole && producedBy(g, *whole, ops().addcdiv)) p1 = std::pair{input, *whole};
  if (!p1) p1 = shardUpdate(g, input);
  if (!m0 || !v0 || !s0 || !p1) return std::nullopt;
  const ValueId param = p1->first;  // the value the update reads: the input, or this rank's shard of it
  u.param = param;
  u.expAvg = *m0, u.expAvgSq = *v0, u.step = *s0, u.newParam = p1->second;
  const auto m1 = updateOf(g, *m0), v1 = updateOf(g, *v0), s1 = updateOf(g, *s0);
  if (!m1 || !v1 || !s1) return std::nullopt;
  u.newExpAvg = *m1, u.newExpAvgSq = *v1, u.newStep = *s1;
  // step + 1
  const Node* inc = producedBy(g, *s1, ops().add_Scalar);
  if (!inc || !isValue(inc->args[0], *s0) || scalar(inc->args[1]) != 1.0) return std::nullopt;
  // exp_avg.lerp(grad, 1 - beta1); beta1 itself from the bias correction below
  const Node* m = producedBy(g, *m1, ops().lerp_Scalar);
  if (!m || !isValue(m->args[0], *m0) || m->args[1].kind != Arg::Kind::Value) return std::nullopt;
  ValueId grad = m->args[1].value;
  // exp_avg_sq * beta2 + grad * grad * (1 - beta2)
  const Node* v = producedBy(g, *v1, ops().addcmul);
  const Node* vScaled = v ? producedBy(g, v->args[0].value, ops().mul_Scalar) : nullptr;
  if (!vScaled || !isValue(vScaled->args[0], *v0) || !isValue(v->args[1], grad) || !isValue(v->args[2], grad)) {
    return std::nullopt;
  }
  u.hyper.beta2 = scalar(vScaled->args[1]);
  // param' = base + (exp_avg' * -step_size) / (sqrt(v') / bc2 + eps)
  const Node* upd = producedBy(g, u.newParam, ops().addcdiv);
  if (!upd) return std::nullopt;
  u.last = upd;
  const Node* scaled = producedBy(g, upd->args[1].value, ops().mul_Tensor);
  const Node* denom = producedBy(g, upd->args[2].value, ops().add_Scalar);
  if (!scaled || !isValue(scaled->args[0], *m1) || !denom) return std::nullopt;
  u.hyper.eps = scalar(denom->args[1]);
  const Node* neg = producedBy(g, scaled->args[1].value, ops().neg);
  const Node* div = neg ? producedBy(g, neg->args[0].value, ops().div_Tensor) : nullptr;
  if (!div) return std::nullopt;
  const std::optional<double> beta1 = biasCorrectionBeta(g, div->args[1]);
  if (!beta1) return std::nullopt;
  u.hyper.beta1 = *beta1;
  if (const Node* lr = producedBy(g, div->args[0].value, ops().full_like)) {
    u.hyper.lr = scalar(lr->args[1]);
  } else if (isRateInput(g, div->args[0].value)) {
    u.hyper.lrInput = div->args[0].value;
  } else {
    return std::nullopt;
  }
  if (isValue(upd->args[0], param)) {
    u.hyper.adamw = false;
  } else if (const Node* decay = producedBy(g, upd->args[0].value, ops().mul_Scalar);
             decay && isValue(decay->args[0], param) && u.hyper.lrInput == kNoValue) {
    u.hyper.adamw = true;
    u.hyper.weightDecay = (1.0 - scalar(decay->args[1])) / u.hyper.lr;
  } else if (std::optional<double> wd = scheduledDecay(g, upd->args[0].value, param, u.hyper.lrInput)) {
    u.hyper.adamw = true;
    u.hyper.weightDecay = *wd;
  } else {
    return std::nullopt;
  }
  // Adam's weight decay: grad + param * wd
  if (const Node* wd = producedBy(g, grad, ops().add_Tensor); wd && !u.hyper.adamw && isValue(wd->args[1], param)) {
    u.hyper.weightDecay = scalar(wd->args[2]);
    grad = wd->args[0].value;
  }
  u.grad = grad;
  if (!close(scalar(m->args[2]), 1.0 - u.hyper.beta1) || !close(scalar(v->args[3]), 1.0 - u.hyper.beta2)) {
    return std::nullopt;
  }
  return u;
}

// Where a group's call goes: after the last node making one of its inputs.
const Node* lastProducer(const Graph& g, const std::vector<Update>& group) {
  const Node* last = nullptr;
  for (const Update& u : group) {
    for (ValueId v : {u.param, u.grad, u.expAvg, u.expAvgSq, u.step}) {
      const Node* n = g.producer(v);
      if (n && (!last || g.indexOf(*n) > g.indexOf(*last))) last = n;
    }
  }
  return last;
}

// The optimizer nodes computing the group's new values from its inputs: what
// the call replaces (they die once their results are read no more).
std::set<const Node*> updateNodes(const Graph& g, const std::vector<Update>& group) {
  std::set<ValueId> inputs;
  std::vector<ValueId> work;
  for (const Update& u : group) {
    inputs.insert({u.param, u.grad, u.expAvg, u.expAvgSq, u.step});
    work.insert(work.end(), {u.newParam, u.newExpAvg, u.newExpAvgSq, u.newStep});
  }
  std::set<const Node*> nodes;
  while (!work.empty()) {
    const ValueId v = work.back();
    work.pop_back();
    const Node* n = inputs.count(v) ? nullptr : g.producer(v);
    if (!n || n->meta.role != NodeRole::Optimizer || !nodes.insert(n).second) continue;
    forEachTensorArg(*n, [&](ValueId a) { work.push_back(a); });
  }
  return nodes;
}

// Whether every node reading the group's new values, other than the update's
// own nodes, comes after the call's place `after`: then those reads can take
// the call's results. In a step spmd-unroll moved, the next forward reads the
// new parameters; elsewhere only state updates do.
bool readersFollow(const Graph& g, const std::vector<Update>& group, const Node* after) {
  const std::set<const Node*> own = updateNodes(g, group);
  const size_t place = after ? g.indexOf(*after) : 0;
  for (const Update& u : group) {
    for (ValueId v : {u.newParam, u.newExpAvg, u.newExpAvgSq, u.newStep}) {
      for (const Node* reader : g.users(v)) {
        if (!own.count(reader) && after && g.indexOf(*reader) <= place) return false;
      }
    }
  }
  return true;
}

// Every read of `from` outside the nodes the call replaced (later nodes,
// graph outputs, state updates) takes `to`. The replaced nodes keep reading
// each other's values: some read a new value (the bias correction reads the
// new step) and may stand before the call, which could not define it for
// them. Dead now, they are dce's to remove.
void redirectReads(Graph& g, ValueId from, ValueId to, const std::set<const Node*>& replaced) {
  g.replaceUsesWith(from, to, [&](const Node& n) { return !replaced.count(&n); });
  for (ValueId& out : g.outputs()) {
    if (out == from) out = to;
  }
  for (StateUpdate& u : g.updates()) {
    if (u.value == from) u.value = to;
  }
}

void emit(Graph& g, const std::vector<Update>& group) {
  const std::set<const Node*> replaced = updateNodes(g, group);
  GraphBuilder b(g);
  const Node* after = lastProducer(g, group);
  if (after) {
    b.setInsertionPointAfter(*after);
  } else if (!g.nodes().empty()) {
    b.setInsertionPoint(g.nodes().front());
  }
  b.setMeta(group.front().last->meta);
  auto list = [&](ValueId Update::*field) {
    Arg a;
    a.kind = Arg::Kind::Values;
    for (const Update& u : group) a.values.push_back(u.*field);
    return a;
  };
  const Hyper& h = group.front().hyper;
  const bool scheduled = h.lrInput != kNoValue;
  const std::vector<ValueId> out = b.callMulti(
      scheduled ? "spmd::fused_adam.tensor_lr" : "spmd::fused_adam",
      {list(&Update::param), list(&Update::grad), list(&Update::expAvg), list(&Update::expAvgSq), list(&Update::step),
       scheduled ? Arg::tensor(h.lrInput) : Arg::ofFloat(h.lr), Arg::ofFloat(h.beta1), Arg::ofFloat(h.beta2),
       Arg::ofFloat(h.weightDecay), Arg::ofFloat(h.eps), Arg::ofBool(h.adamw)},
      "adam");
  // Every read of a new value (state updates, graph outputs, the nodes after
  // the call) takes the call's; the per-parameter nodes die.
  const size_t n = group.size();
  for (size_t k = 0; k < n; ++k) {
    const Update& u = group[k];
    for (auto [old, i] : {std::pair{u.newParam, k}, {u.newExpAvg, n + k}, {u.newExpAvgSq, 2 * n + k},
                          {u.newStep, 3 * n + k}}) {
      redirectReads(g, old, out[i], replaced);
    }
  }
}

class FusedAdamPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    std::vector<Update> updates;
    std::vector<std::string> left;
    for (const GraphInput& in : g.inputs()) {
      if (in.kind != InputKind::Parameter || !stateOf(g, g.value(in.value).name, OptimizerState::ExpAvg)) continue;
      if (std::optional<Update> u = matchUpdate(g, in.value)) {
        updates.push_back(*u);
      } else {
        left.push_back(g.value(in.value).name);
      }
    }
    if (updates.empty()) return false;
    // Groups: the same point of the step (the update's bucket and iteration tag) and hyperparameters.
    std::map<std::tuple<int, int, std::tuple<bool, double, double, double, double, double, ValueId>>, std::vector<Update>> groups;
    for (const Update& u : updates) {
      groups[{u.last->meta.bucket, static_cast<int>(u.last->meta.iteration), u.hyper.key()}].push_back(u);
    }
    size_t fused = 0;
    for (auto& [key, group] : groups) {
      if (!readersFollow(g, group, lastProducer(g, group))) {
        for (const Update& u : group) left.push_back(g.value(u.param).name);
        continue;
      }
      emit(g, group);
      fused += group.size();
    }
    count("parameters' updates fused", fused);
    count("spmd::fused_adam call(s)", static_cast<int64_t>(groups.size()));
    if (!left.empty()) {
      diagnostics.note("adam-to-fused-kernel: kept per parameter: " + std::to_string(left.size()) + " (" + left.front() +
                       (left.size() > 1 ? ", ..." : "") + ")");
    }
    return fused > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createFusedAdamPass(const PipelineOptions&) { return std::make_unique<FusedAdamPass>(); }

}  // namespace spmd

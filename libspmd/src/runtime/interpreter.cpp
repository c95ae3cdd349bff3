#include "spmd/runtime/interpreter.h"

#include "spmd/analysis/memory_plan.h"
#include "spmd/runtime/collectives.h"
#include "spmd/runtime/errors.h"
#include "spmd/ir/boxing.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ops/op_traits.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

namespace spmd {
namespace {

// Which values a node may write over (Buffers::Reuse).
class ReusePlanner {
 public:
  ReusePlanner(const Graph& g, const std::vector<c10::OperatorHandle>& ops, const std::vector<int>& lastUse)
      : g_(g), ops_(ops), lastUse_(lastUse) {
    for (const auto& u : g.updates()) updated_.insert(u.input);
  }

  bool isInput(ValueId v) const { return g_.inputOf(v) != nullptr; }

  // `v` dies at node i: node i reads it once (in no other argument) and no
  // later node, output or state update reads it.
  bool diesAt(ValueId v, size_t i) const {
    if (lastUse_[v] != static_cast<int>(i)) return false;
    int reads = 0;
    forEachTensorArg(g_.nodes()[i], [&](ValueId u) { reads += u == v; });
    return reads == 1;
  }

  // `v` has storage no other value shares: a fresh result of an ATen op (not
  // a view, nor an op that sometimes returns its input), or a parameter,
  // buffer or state input that the step replaces anyway.
  bool ownsStorage(ValueId v) const {
    if (const GraphInput* in = g_.inputOf(v)) {
      return !isPerStepInput(in->kind) && updated_.count(v) > 0;
    }
    const Node* producer = g_.producer(v);
    if (!producer) return false;
    const std::string& op = producer->op;
    // spmd::fused_adam's results are its own copies, or (in place) inputs
    // that owned theirs; so are a collective's (runNode below).
    const bool fresh = op.rfind("aten::", 0) == 0 || hasTrait(op, OpTrait::OwnResults) || isCollective(op);
    if (!fresh || mayCopyOrAlias(op) || hasTrait(op, OpTrait::ViewOfFirstArgument)) return false;
    const auto& returns = ops_[g_.indexOf(*producer)].schema().returns();
    const auto& outs = producer->outputs;
    const size_t output = static_cast<size_t>(std::find(outs.begin(), outs.end(), v) - outs.begin());
    const size_t r = returns.size() == 1 ? 0 : output;
    return r < returns.size() && !returns[r].alias_info();
  }

  // A collective may work in its input when that dies there and owns its
  // storage: a fresh tensor (a bucket's flattened gradients), or a state
  // input the step replaces (a BatchNorm's running statistics, broadcast
  // from rank 0: in place across ranks, and on one rank no copy at all).
  bool collectiveMayReuse(size_t i) const {
    const Node& node = g_.nodes()[i];
    if (node.args.empty() || node.args[0].kind != Arg::Kind::Value) return false;
    const ValueId v = node.args[0].value;
    return diesAt(v, i) && ownsStorage(v);
  }

  // The node may run in place over `lists` (the arguments its in-place form
  // writes, ops/op_traits.h) when each of their tensors dies there, owns its
  // storage and has its result's type.
  bool mayRunInPlace(size_t i, const std::vector<size_t>& lists) const {
    const Node& node = g_.nodes()[i];
    std::vector<ValueId> targets;
    for (size_t a : lists) {
      if (a >= node.args.size() || node.args[a].kind != Arg::Kind::Values) return false;
      targets.insert(targets.end(), node.args[a].values.begin(), node.args[a].values.end());
    }
    if (targets.empty() || targets.size() != node.outputs.size()) return false;
    for (size_t k = 0; k < targets.size(); ++k) {
      const ValueId v = targets[k], out = node.outputs[k];
      if (out == kNoValue || !diesAt(v, i) || !ownsStorage(v)) return false;
      if (g_.value(v).dtype != g_.value(out).dtype || g_.value(v).shape != g_.value(out).shape) return false;
    }
    return true;
  }

 private:
  const Graph& g_;
  const std::vector<c10::OperatorHandle>& ops_;
  const std::vector<int>& lastUse_;
  std::set<ValueId> updated_;
};

}  // namespace

void Interpreter::planInPlace(const std::vector<int>& lastUse) {
  const ReusePlanner planner(graph_, ops_, lastUse);
  inPlace_.assign(graph_.nodes().size(), std::nullopt);
  reusesInput_.assign(graph_.nodes().size(), false);
  for (size_t i = 0; i < graph_.nodes().size(); ++i) {
    const Node& node = graph_.nodes()[i];
    if (isCollective(node.op)) {
      reusesInput_[i] = planner.collectiveMayReuse(i);
      const ValueId first = reusesInput_[i] ? node.args[0].value : kNoValue;
      if (first != kNoValue && planner.isInput(first)) overwritten_.push_back(graph_.value(first).name);
      continue;
    }
    std::vector<size_t> lists = listsWrittenInPlace(node.op);  // ops/op_traits.h
    if (lists.empty() || !planner.mayRunInPlace(i, lists)) continue;
    auto op = c10::Dispatcher::singleton().findSchema({node.op + "_", node.overload});
    if (!op) continue;
    inPlace_[i] = InPlaceCall{*op, lists};
    for (size_t a : lists) {
      for (ValueId v : node.args[a].values) {
        if (planner.isInput(v)) overwritten_.push_back(graph_.value(v).name);
      }
    }
  }
}

Interpreter::Interpreter(const Graph& graph, Buffers buffers) : graph_(graph) {
  std::vector<int> lastUse(graph.numValues(), -1);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Node& node = graph.nodes()[i];
    auto op = findOperator(node);
    if (!op) throw Diagnostic("/nodes/" + std::to_string(i) + "/op", "unknown operator '" + node.qualifiedName() + "'");
    ops_.push_back(*op);
    for (const Arg& a : node.args) {
      if (a.kind == Arg::Kind::Value) lastUse[a.value] = static_cast<int>(i);
      for (ValueId v : a.values) {
        if (v != kNoValue) lastUse[v] = static_cast<int>(i);
      }
    }
  }
  // Outputs and updated state live to the end.
  for (ValueId v : graph.outputs()) lastUse[v] = -1;
  for (const auto& u : graph.updates()) lastUse[u.value] = -1;
  if (buffers == Buffers::Reuse) planInPlace(lastUse);
  releaseAfter_.resize(graph.nodes().size());
  for (size_t v = 0; v < lastUse.size(); ++v) {
    if (lastUse[v] >= 0) releaseAfter_[lastUse[v]].push_back(static_cast<ValueId>(v));
  }
}

RunResult Interpreter::run(const std::map<std::string, at::Tensor>& inputs, Collectives* collectives,
                           const std::function<void(const Node&)>& afterNode) const {
  std::vector<at::Tensor> env(graph_.numValues());
  for (const auto& in : graph_.inputs()) {
    const std::string& name = graph_.value(in.value).name;
    auto it = inputs.find(name);
    if (it == inputs.end()) throw Diagnostic("input '" + name + "'", "no tensor given for graph input");
    env[in.value] = it->second;
  }
  auto tensorOf = [&](ValueId v) -> at::Tensor { return env[v]; };
  for (size_t i = 0; i < graph_.nodes().size(); ++i) {
    const Node& node = graph_.nodes()[i];
    std::vector<at::Tensor> results;
    // A kernel's error names the node it ran for (collectives throw their own).
    try {
      if (collectives && isCollective(node.op)) {
        std::vector<at::Tensor> tensors;
        for (const Arg& a : node.args) {
          if (a.kind == Arg::Kind::Value) tensors.push_back(env[a.value]);
        }
        results = collectives->run(node, tensors, !reusesInput_.empty() && reusesInput_[i]);
      } else if (isCollective(node.op) && !reusesInput_.empty() && reusesInput_[i]) {
        // One rank: a collective is the identity. Its kernel copies; an
        // input that dies here and owns its storage is its result as it is.
        results = {env[node.args[0].value]};
      } else if (!inPlace_.empty() && inPlace_[i]) {
        callOperator(inPlace_[i]->op, boxArguments(node, inPlace_[i]->op.schema(), tensorOf));
        for (size_t a : inPlace_[i]->writtenLists) {
          for (ValueId v : node.args[a].values) results.push_back(env[v]);
        }
      } else {
        results = callOperator(ops_[i], boxArguments(node, ops_[i].schema(), tensorOf));
      }
    } catch (const c10::Error& e) {
      const std::string what = e.what_without_backtrace();
      throw KernelError(i, node.qualifiedName(), what.substr(0, what.find('\n')));
    }
    for (size_t k = 0; k < node.outputs.size() && k < results.size(); ++k) {
      if (node.outputs[k] != kNoValue) env[node.outputs[k]] = results[k];
    }
    for (ValueId v : releaseAfter_[i]) env[v].reset();
    if (afterNode) afterNode(node);
  }
  RunResult result;
  for (ValueId v : graph_.outputs()) result.outputs.push_back(env[v]);
  for (const auto& u : graph_.updates()) result.updates[graph_.value(u.input).name] = env[u.value];
  return result;
}

}  // namespace spmd

#include "spmd/runtime/interpreter.h"

#include "spmd/ir/memory_plan.h"
#include "spmd/runtime/collectives.h"
#include "spmd/runtime/op_call.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <set>

namespace spmd {
namespace {

// Where each value comes from: the node and output index that define it, or
// the graph input.
struct Definition {
  int node = -1;
  size_t output = 0;
  const GraphInput* input = nullptr;
};

std::vector<Definition> definitions(const Graph& g) {
  std::vector<Definition> defs(g.numValues());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const auto& outs = g.nodes()[i].outputs;
    for (size_t k = 0; k < outs.size(); ++k) {
      if (outs[k] != kNoValue) defs[outs[k]] = {static_cast<int>(i), k, nullptr};
    }
  }
  for (const auto& in : g.inputs()) defs[in.value].input = &in;
  return defs;
}

bool sameType(const Value& a, const Value& b) { return a.dtype == b.dtype && a.shape == b.shape; }

}  // namespace

// A _foreach op may write its results over its first list when every tensor
// of that list dies there: the list's values are read by this node alone and
// by no later one, and each owns its storage, being either a fresh result of
// an earlier ATen op (no view) or a parameter or state input that the step
// replaces anyway. Inputs are overwritten only if the caller said so.
void Interpreter::planInPlace(const std::vector<int>& lastUse) {
  const Graph& g = graph_;
  const auto defs = definitions(g);
  std::set<ValueId> updated;
  for (const auto& u : g.updates()) updated.insert(u.input);
  auto ownsStorage = [&](ValueId v) {
    const Definition& d = defs[v];
    if (d.input) return (d.input->kind == InputKind::Parameter || d.input->kind == InputKind::State) && updated.count(v) > 0;
    const std::string& op = d.node < 0 ? std::string() : g.nodes()[d.node].op;
    if (op.rfind("aten::", 0) != 0 || mayCopyOrAlias(op)) return false;
    const auto& returns = ops_[d.node].schema().returns();
    const size_t r = returns.size() == 1 ? 0 : d.output;
    return r < returns.size() && !returns[r].alias_info();
  };
  inPlace_.assign(g.nodes().size(), std::nullopt);
  reusesInput_.assign(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& node = g.nodes()[i];
    // A collective reduces its input where it lies when that is a fresh
    // tensor (a bucket's flattened gradients) read by nothing else.
    if (isCollective(node) && !node.args.empty() && node.args[0].kind == Arg::Kind::Value) {
      const ValueId v = node.args[0].value;
      std::map<ValueId, int> reads;
      forEachTensorArg(node, [&](ValueId u) { ++reads[u]; });
      reusesInput_[i] = !defs[v].input && lastUse[v] == static_cast<int>(i) && reads[v] == 1 && ownsStorage(v);
      continue;
    }
    if (node.op.rfind("aten::_foreach_", 0) != 0 || node.args.empty() || node.args[0].kind != Arg::Kind::Values) continue;
    const auto& targets = node.args[0].values;
    if (targets.size() != node.outputs.size()) continue;
    std::map<ValueId, int> reads;
    forEachTensorArg(node, [&](ValueId v) { ++reads[v]; });
    bool ok = true;
    for (size_t k = 0; ok && k < targets.size(); ++k) {
      const ValueId v = targets[k];
      ok = node.outputs[k] != kNoValue && lastUse[v] == static_cast<int>(i) && reads[v] == 1 && ownsStorage(v) &&
           sameType(g.value(v), g.value(node.outputs[k]));
    }
    if (!ok) continue;
    auto op = c10::Dispatcher::singleton().findSchema({node.op + "_", node.overload});
    if (!op) continue;
    inPlace_[i] = *op;
    for (ValueId v : targets) {
      if (defs[v].input) overwritten_.push_back(g.value(v).name);
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
      for (ValueId v : a.values) lastUse[v] = static_cast<int>(i);
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
    if (collectives && isCollective(node)) {
      std::vector<at::Tensor> tensors;
      for (const Arg& a : node.args) {
        if (a.kind == Arg::Kind::Value) tensors.push_back(env[a.value]);
      }
      results = collectives->run(node, tensors, !reusesInput_.empty() && reusesInput_[i]);
    } else if (!inPlace_.empty() && inPlace_[i]) {
      callOperator(*inPlace_[i], boxArguments(node, tensorOf));
      for (ValueId v : node.args[0].values) results.push_back(env[v]);
    } else {
      results = callOperator(ops_[i], boxArguments(node, tensorOf));
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

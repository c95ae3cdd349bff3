#include "spmd/runtime/interpreter.h"

#include "spmd/runtime/collectives.h"
#include "spmd/runtime/op_call.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

namespace spmd {

Interpreter::Interpreter(const Graph& graph) : graph_(graph) {
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
  releaseAfter_.resize(graph.nodes().size());
  for (size_t v = 0; v < lastUse.size(); ++v) {
    if (lastUse[v] >= 0) releaseAfter_[lastUse[v]].push_back(static_cast<ValueId>(v));
  }
}

RunResult Interpreter::run(const std::map<std::string, at::Tensor>& inputs, Collectives* collectives) const {
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
      results = collectives->run(node, tensors);
    } else {
      results = callOperator(ops_[i], boxArguments(node, tensorOf));
    }
    for (size_t k = 0; k < node.outputs.size() && k < results.size(); ++k) {
      if (node.outputs[k] != kNoValue) env[node.outputs[k]] = results[k];
    }
    for (ValueId v : releaseAfter_[i]) env[v].reset();
  }
  RunResult result;
  for (ValueId v : graph_.outputs()) result.outputs.push_back(env[v]);
  for (const auto& u : graph_.updates()) result.updates[graph_.value(u.input).name] = env[u.value];
  return result;
}

}  // namespace spmd

#include "spmd/ir/graph.h"

#include <stdexcept>

namespace spmd {

const char* inputKindName(InputKind kind) {
  switch (kind) {
    case InputKind::Data: return "data";
    case InputKind::Parameter: return "parameter";
    case InputKind::Buffer: return "buffer";
    case InputKind::State: return "state";
  }
  return "?";
}

std::optional<InputKind> parseInputKind(const std::string& name) {
  for (InputKind k : {InputKind::Data, InputKind::Parameter, InputKind::Buffer, InputKind::State}) {
    if (name == inputKindName(k)) return k;
  }
  return std::nullopt;
}

const char* nodeRoleName(NodeRole role) {
  switch (role) {
    case NodeRole::Unknown: return "";
    case NodeRole::Forward: return "forward";
    case NodeRole::Backward: return "backward";
    case NodeRole::Optimizer: return "optimizer";
    case NodeRole::Comm: return "comm";
  }
  return "?";
}

std::optional<NodeRole> parseNodeRole(const std::string& name) {
  for (NodeRole r : {NodeRole::Forward, NodeRole::Backward, NodeRole::Optimizer, NodeRole::Comm}) {
    if (name == nodeRoleName(r)) return r;
  }
  return std::nullopt;
}

const char* iterationTagName(IterationTag tag) {
  switch (tag) {
    case IterationTag::Every: return "";
    case IterationTag::FromPrevious: return "previous";
    case IterationTag::LastOnly: return "last";
  }
  return "?";
}

std::optional<IterationTag> parseIterationTag(const std::string& name) {
  for (IterationTag t : {IterationTag::FromPrevious, IterationTag::LastOnly}) {
    if (name == iterationTagName(t)) return t;
  }
  return std::nullopt;
}

const char* argKindName(Arg::Kind kind) {
  switch (kind) {
    case Arg::Kind::Value: return "value";
    case Arg::Kind::Values: return "values";
    case Arg::Kind::None: return "none";
    case Arg::Kind::Int: return "int";
    case Arg::Kind::Float: return "float";
    case Arg::Kind::Bool: return "bool";
    case Arg::Kind::Str: return "str";
    case Arg::Kind::Ints: return "ints";
    case Arg::Kind::Floats: return "floats";
    case Arg::Kind::Bools: return "bools";
    case Arg::Kind::DType: return "dtype";
    case Arg::Kind::Layout: return "layout";
    case Arg::Kind::MemoryFormat: return "memory_format";
    case Arg::Kind::Device: return "device";
  }
  return "?";
}

std::string Node::qualifiedName() const {
  return overload.empty() ? op : op + "." + overload;
}

ValueId Graph::addValue(Value value) {
  if (byName_.count(value.name)) {
    throw std::logic_error("duplicate value name '" + value.name + "'");
  }
  ValueId id = static_cast<ValueId>(values_.size());
  byName_.emplace(value.name, id);
  values_.push_back(std::move(value));
  return id;
}

ValueId Graph::addInput(Value value, InputKind kind, bool requiresGrad) {
  ValueId id = addValue(std::move(value));
  inputs_.push_back(GraphInput{id, kind, requiresGrad});
  return id;
}

Node& Graph::addNode(Node node) {
  nodes_.push_back(std::move(node));
  return nodes_.back();
}

std::optional<ValueId> Graph::findValue(const std::string& name) const {
  auto it = byName_.find(name);
  if (it == byName_.end()) return std::nullopt;
  return it->second;
}

const GraphInput* Graph::inputOf(ValueId v) const {
  for (const auto& in : inputs_) {
    if (in.value == v) return &in;
  }
  return nullptr;
}

std::vector<Node> Graph::takeNodes() {
  std::vector<Node> nodes = std::move(nodes_);
  nodes_.clear();
  return nodes;
}

std::string Graph::freshName(const std::string& base) {
  if (!byName_.count(base)) return base;
  int& next = nextSuffix_[base];
  std::string name;
  do {
    name = base + "_" + std::to_string(++next);
  } while (byName_.count(name));
  return name;
}

bool eliminateDeadNodes(Graph& graph) {
  std::vector<bool> live(graph.numValues(), false);
  for (ValueId v : graph.outputs()) live[v] = true;
  for (const auto& u : graph.updates()) live[u.value] = true;
  for (const auto& g : graph.gradients()) {
    live[g.value] = true;
    if (g.reduced != kNoValue) live[g.reduced] = true;
  }
  std::vector<Node> nodes = graph.takeNodes();
  std::vector<bool> keep(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    for (ValueId out : nodes[i].outputs) keep[i] = keep[i] || (out != kNoValue && live[out]);
    if (!keep[i]) continue;
    for (const Arg& a : nodes[i].args) {
      if (a.kind == Arg::Kind::Value) live[a.value] = true;
      for (ValueId v : a.values) live[v] = true;
    }
  }
  bool removed = false;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (keep[i]) {
      graph.addNode(std::move(nodes[i]));
    } else {
      removed = true;
    }
  }
  return removed;
}

int64_t numel(const Value& v) {
  int64_t n = 1;
  for (int64_t d : v.shape) n *= d;
  return n;
}

int64_t bytes(const Value& v) {
  return numel(v) * static_cast<int64_t>(c10::elementSize(v.dtype));
}

}  // namespace spmd

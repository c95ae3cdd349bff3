#include "spmd/ir/graph.h"

#include <algorithm>
#include <stdexcept>

namespace spmd {

const char* inputKindName(InputKind kind) {
  switch (kind) {
    case InputKind::Data: return "data";
    case InputKind::Parameter: return "parameter";
    case InputKind::Buffer: return "buffer";
    case InputKind::State: return "state";
    case InputKind::Schedule: return "schedule";
  }
  return "?";
}

std::optional<InputKind> parseInputKind(const std::string& name) {
  for (InputKind k : {InputKind::Data, InputKind::Parameter, InputKind::Buffer, InputKind::State, InputKind::Schedule}) {
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

std::vector<const Node*> snapshot(const NodeList& nodes) {
  std::vector<const Node*> out;
  out.reserve(nodes.size());
  for (const Node& n : nodes) out.push_back(&n);
  return out;
}

Graph::Graph(const Graph& other)
    : values_(other.values_),
      byName_(other.byName_),
      inputs_(other.inputs_),
      outputs_(other.outputs_),
      updates_(other.updates_),
      gradients_(other.gradients_),
      buckets_(other.buckets_),
      weights_(other.weights_),
      iters_(other.iters_),
      training_(other.training_),
      flags_(other.flags_),
      nextSuffix_(other.nextSuffix_) {
  nodes_.reserve(other.nodes_.size());
  for (const auto& n : other.nodes_) nodes_.push_back(std::make_unique<Node>(*n));
  rebuildLinks();
}

Graph& Graph::operator=(const Graph& other) {
  if (this != &other) *this = Graph(other);
  return *this;
}

ValueId Graph::addValue(Value value) {
  if (byName_.count(value.name)) {
    throw std::logic_error("duplicate value name '" + value.name + "'");
  }
  ValueId id = static_cast<ValueId>(values_.size());
  byName_.emplace(value.name, id);
  values_.push_back(std::move(value));
  producer_.push_back(nullptr);
  users_.emplace_back();
  return id;
}

ValueId Graph::addInput(Value value, InputKind kind, bool requiresGrad) {
  ValueId id = addValue(std::move(value));
  inputs_.push_back(GraphInput{id, kind, requiresGrad});
  return id;
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

std::string Graph::freshName(const std::string& base) {
  if (!byName_.count(base)) return base;
  int& next = nextSuffix_[base];
  std::string name;
  do {
    name = base + "_" + std::to_string(++next);
  } while (byName_.count(name));
  return name;
}

// ---- nodes ------------------------------------------------------------------

size_t Graph::indexOf(const Node& node) const {
  if (positionsStale_) {
    position_.clear();
    for (size_t i = 0; i < nodes_.size(); ++i) position_.emplace(nodes_[i].get(), i);
    positionsStale_ = false;
  }
  auto it = position_.find(&node);
  if (it == position_.end()) throw std::logic_error("Graph::indexOf: " + node.qualifiedName() + " is not in the graph");
  return it->second;
}

size_t Graph::positionForEdit(const Node& node) const {
  if (!positionsStale_) return indexOf(node);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].get() == &node) return i;
  }
  throw std::logic_error("Graph: " + node.qualifiedName() + " is not in the graph");
}

const Node& Graph::insertAt(size_t position, Node node) {
  auto owned = std::make_unique<Node>(std::move(node));
  const Node& added = *owned;
  for (ValueId o : added.outputs) {
    if (o == kNoValue) continue;
    if (o < 0 || static_cast<size_t>(o) >= values_.size()) throw std::logic_error("Graph: node output is no value");
    if (producer_[o]) throw std::logic_error("Graph: '" + values_[o].name + "' has a producer already");
  }
  forEachTensorArg(added, [&](ValueId v) {
    if (v < 0 || static_cast<size_t>(v) >= values_.size()) throw std::logic_error("Graph: node argument is no value");
  });
  owned->name_ = OpName::of(owned->op, owned->overload);
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(position), std::move(owned));
  link(added);
  positionsStale_ = true;
  if (listener_) listener_->nodeInserted(added);
  return added;
}

const Node& Graph::addNode(Node node) { return insertAt(nodes_.size(), std::move(node)); }

const Node& Graph::insertBefore(const Node& anchor, Node node) { return insertAt(positionForEdit(anchor), std::move(node)); }

const Node& Graph::insertAfter(const Node& anchor, Node node) {
  return insertAt(positionForEdit(anchor) + 1, std::move(node));
}

void Graph::erase(const Node& node) {
  for (ValueId o : node.outputs) {
    if (o != kNoValue && !users_[o].empty()) {
      throw std::logic_error("Graph::erase: '" + values_[o].name + "' is still read by " +
                             users_[o].front()->qualifiedName());
    }
  }
  const size_t at = positionForEdit(node);
  if (listener_) listener_->nodeErased(node);
  unlink(node);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(at));
  positionsStale_ = true;
}

Node Graph::extract(const Node& node) {
  const size_t at = positionForEdit(node);
  if (listener_) listener_->nodeErased(node);
  std::unique_ptr<Node> removed = std::move(nodes_[at]);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(at));
  unlink(*removed);
  positionsStale_ = true;
  removed->name_ = OpName();  // out of the graph, its op may change
  return std::move(*removed);
}

const Node& Graph::replaceNode(const Node& old, Node replacement) {
  const size_t at = positionForEdit(old);
  // The replacement's readers are the old node's.
  const Node removed = extract(old);
  for (ValueId o : removed.outputs) {
    const bool kept = std::find(replacement.outputs.begin(), replacement.outputs.end(), o) != replacement.outputs.end();
    if (o != kNoValue && !kept && !users_[o].empty()) {
      throw std::logic_error("Graph::replaceNode: '" + values_[o].name + "' is still read");
    }
  }
  return insertAt(at, std::move(replacement));
}

GraphListener* Graph::setListener(GraphListener* listener) {
  GraphListener* previous = listener_;
  listener_ = listener;
  return previous;
}

void Graph::reorder(const std::vector<const Node*>& order) {
  // Checked first: a bad order leaves the graph as it was.
  std::unordered_map<const Node*, size_t> at;
  for (size_t i = 0; i < nodes_.size(); ++i) at.emplace(nodes_[i].get(), i);
  std::vector<bool> taken(nodes_.size(), false);
  for (const Node* n : order) {
    auto it = at.find(n);
    if (order.size() != nodes_.size() || it == at.end() || taken[it->second]) {
      throw std::logic_error("Graph::reorder: not a permutation of the nodes");
    }
    taken[it->second] = true;
  }
  std::vector<std::unique_ptr<Node>> reordered;
  reordered.reserve(order.size());
  for (const Node* n : order) reordered.push_back(std::move(nodes_[at.at(n)]));
  nodes_ = std::move(reordered);
  positionsStale_ = true;
}

// ---- def-use ----------------------------------------------------------------

void Graph::link(const Node& node) {
  for (ValueId o : node.outputs) {
    if (o != kNoValue) producer_[o] = &node;
  }
  forEachTensorArg(node, [&](ValueId v) { users_[v].push_back(&node); });
}

void Graph::unlink(const Node& node) {
  for (ValueId o : node.outputs) {
    if (o != kNoValue && producer_[o] == &node) producer_[o] = nullptr;
  }
  forEachTensorArg(node, [&](ValueId v) {
    auto& readers = users_[v];
    readers.erase(std::find(readers.begin(), readers.end(), &node));  // one entry per argument
  });
}

void Graph::rebuildLinks() {
  producer_.assign(values_.size(), nullptr);
  users_.assign(values_.size(), {});
  for (const auto& n : nodes_) link(*n);
  positionsStale_ = true;
}

const Node* Graph::producer(ValueId v) const { return producer_.at(v); }

std::vector<const Node*> Graph::users(ValueId v) const {
  std::vector<const Node*> readers = users_.at(v);
  std::sort(readers.begin(), readers.end(), [&](const Node* a, const Node* b) { return indexOf(*a) < indexOf(*b); });
  readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
  return readers;
}

bool Graph::isGraphOutput(ValueId v) const { return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end(); }

const Node* Graph::soleReader(ValueId v) const {
  const std::vector<const Node*>& reads = users_.at(v);  // one entry per argument
  if (reads.size() != 1 || readBeyondNodes(v)) return nullptr;
  return reads[0];
}

bool Graph::readBeyondNodes(ValueId v) const {
  if (isGraphOutput(v)) return true;
  for (const StateUpdate& u : updates_) {
    if (u.value == v) return true;
  }
  for (const Gradient& gr : gradients_) {
    if (gr.value == v || gr.reduced == v) return true;
  }
  return false;
}

void Graph::replaceUsesWith(ValueId from, ValueId to, const std::function<bool(const Node&)>& where) {
  if (from == to) return;
  for (const Node* reader : users(from)) {
    if (where && !where(*reader)) continue;
    Node& n = mutableNode(*reader);
    unlink(n);
    forEachTensorArg(n, [&](ValueId& v) {
      if (v == from) v = to;
    });
    link(n);
  }
}

void Graph::replaceAllUsesWith(ValueId from, ValueId to) {
  replaceUsesWith(from, to, nullptr);
  for (ValueId& v : outputs_) {
    if (v == from) v = to;
  }
  for (StateUpdate& u : updates_) {
    if (u.value == from) u.value = to;
  }
}

void Graph::setArg(const Node& node, size_t index, Arg arg) {
  Node& n = mutableNode(node);
  unlink(n);
  n.args.at(index) = std::move(arg);
  link(n);
}

Arg& Graph::constantArg(const Node& node, size_t index) {
  Arg& a = mutableNode(node).args.at(index);
  if (a.kind == Arg::Kind::Value || a.kind == Arg::Kind::Values) {
    throw std::logic_error("Graph::constantArg: argument " + std::to_string(index) + " of " + node.qualifiedName() +
                           " is a tensor");
  }
  return a;
}

bool eliminateDeadNodes(Graph& graph) {
  std::vector<bool> live(graph.numValues(), false);
  for (ValueId v : graph.outputs()) live[v] = true;
  for (const auto& u : graph.updates()) live[u.value] = true;
  for (const auto& g : graph.gradients()) {
    live[g.value] = true;
    if (g.reduced != kNoValue) live[g.reduced] = true;
  }
  // Last to first, so that a node's readers are gone when it is looked at.
  std::vector<const Node*> dead;
  for (auto it = graph.nodes().rbegin(); it != graph.nodes().rend(); ++it) {
    const Node& n = *it;
    bool keep = false;
    for (ValueId out : n.outputs) keep = keep || (out != kNoValue && live[out]);
    if (!keep) {
      dead.push_back(&n);
      continue;
    }
    forEachTensorArg(n, [&](ValueId v) { live[v] = true; });
  }
  for (const Node* n : dead) graph.erase(*n);
  return !dead.empty();
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

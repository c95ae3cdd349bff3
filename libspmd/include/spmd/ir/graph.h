// The spmd graph: an SSA graph of ATen (and spmd) operator calls with static
// shapes, in the spirit of torch.fx. Values are numbered; nodes refer to them
// by id. Kept free of ATen headers so that most of the project compiles fast.
#pragma once

#include "spmd/ir/op_name.h"
#include "spmd/ir/training.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

namespace spmd {

using ValueId = int32_t;
// In Node::outputs: a result the op leaves undefined (a backward op's output
// masked off by its output_mask).
constexpr ValueId kNoValue = -1;

struct Value {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
};

// Data: per-step inputs from spmd-run's --data; Schedule: per-step scalars
// spmd-run computes from the graph's training config (the learning rate).
enum class InputKind { Data, Parameter, Buffer, State, Schedule };
const char* inputKindName(InputKind kind);
// Inputs that take a new value every step (not kept in the run's state).
inline bool isPerStepInput(InputKind kind) { return kind == InputKind::Data || kind == InputKind::Schedule; }
std::optional<InputKind> parseInputKind(const std::string& name);

struct GraphInput {
  ValueId value = -1;
  InputKind kind = InputKind::Data;
  // Parameters only: false for parameters that take no gradient.
  bool requiresGrad = true;
};

// One argument of an operator call, in the order of the operator's schema.
// Constants are kept typed so that the verifier can check them against the
// schema and the interpreter can box them without guessing.
struct Arg {
  enum class Kind {
    Value,         // a tensor value
    Values,        // a list of tensor values (aten::cat); in a Tensor?[]
                   // (aten::index) kNoValue marks an absent element
    None,          // an absent optional
    Int,
    Float,
    Bool,
    Str,
    Ints,
    Floats,
    Bools,
    DType,         // i holds the c10::ScalarType
    Layout,        // i holds the c10::Layout
    MemoryFormat,  // i holds the c10::MemoryFormat
    Device,        // s holds the device string ("cpu", "cuda:0")
  };
  Kind kind = Kind::None;
  ValueId value = -1;
  std::vector<ValueId> values;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<bool> bools;

  static Arg tensor(ValueId v) { Arg a; a.kind = Kind::Value; a.value = v; return a; }
  static Arg none() { return Arg{}; }
  static Arg ofInt(int64_t v) { Arg a; a.kind = Kind::Int; a.i = v; return a; }
  static Arg ofFloat(double v) { Arg a; a.kind = Kind::Float; a.f = v; return a; }
  static Arg ofBool(bool v) { Arg a; a.kind = Kind::Bool; a.b = v; return a; }
};
const char* argKindName(Arg::Kind kind);

// What a node does in the train step (printed as role=...).
enum class NodeRole : uint8_t { Unknown, Forward, Backward, Optimizer, Comm };
const char* nodeRoleName(NodeRole role);  // "forward", ...; "" for Unknown
std::optional<NodeRole> parseNodeRole(const std::string& name);

// Which iterations of an unrolled graph run a node (see ir/iter_graph.h).
enum class IterationTag : uint8_t {
  Every,         // every iteration (printed as nothing)
  FromPrevious,  // "previous": work moved from the previous iteration
  LastOnly,      // "last": the moved work's share of the last iteration
};
const char* iterationTagName(IterationTag tag);  // "", "previous", "last"
std::optional<IterationTag> parseIterationTag(const std::string& name);

// Where a node came from and what later stages decided about it.
struct NodeMeta {
  std::string source;  // "model.py:12" when known
  NodeRole role = NodeRole::Unknown;
  int bucket = -1;
  int partition = -1;
  IterationTag iteration = IterationTag::Every;
};

struct Node {
  std::string op;        // fully qualified: "aten::add"
  std::string overload;  // "Tensor", or empty for the default overload
  std::vector<Arg> args;
  std::vector<ValueId> outputs;
  NodeMeta meta;

  // "aten::add.Tensor", or "aten::relu" for the default overload.
  std::string qualifiedName() const;
  // The same, interned (ir/op_name.h): O(1) for a node in a graph, which
  // interns it when the node is added.
  OpName name() const { return name_.valid() ? name_ : OpName::of(op, overload); }
  bool is(OpName op) const { return name() == op; }

 private:
  friend class Graph;
  OpName name_;  // set by the graph that holds the node
};

// A buffer (or other state input) whose value after the step is `value`:
// in-place updates such as BatchNorm's running statistics made explicit.
struct StateUpdate {
  ValueId input = -1;
  ValueId value = -1;
};

// Marks `value` as the gradient of the parameter input `parameter` on this
// rank (what spmd-split buckets), and `reduced` as that gradient after the
// reduction across ranks (what the optimizer reads), once grad-sync made it.
struct Gradient {
  ValueId parameter = -1;
  ValueId value = -1;
  ValueId reduced = kNoValue;
};

// One DDP bucket: parameters whose gradients are reduced together, in one
// flat all-reduce. Buckets are numbered in forward order.
struct Bucket {
  std::vector<ValueId> parameters;
  int64_t bytes = 0;
};

// Where parameter and buffer values live: weights are referenced, not inlined.
struct WeightsRef {
  WeightsRef() = default;
  WeightsRef(std::string file, std::string format) : file(std::move(file)), format(std::move(format)) {}

  std::string file;    // as written: absolute, or relative (see baseDir)
  std::string format;  // "torchscript"
  // The directory of the JSON dump or listing that named `file` ("" for
  // stdin, TorchScript, artifacts): a relative `file` is looked for there
  // first, then in the working directory. Never written out.
  std::string baseDir;
};

// The nodes of a graph in program order, as a read-only random-access range
// of `const Node&`. Positions shift when nodes are inserted or erased; a
// `const Node&` (or pointer) stays valid until its node is erased.
class NodeList {
 public:
  using Storage = std::vector<std::unique_ptr<Node>>;
  class iterator {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = Node;
    using difference_type = std::ptrdiff_t;
    using pointer = const Node*;
    using reference = const Node&;
    iterator() = default;
    explicit iterator(Storage::const_iterator it) : it_(it) {}
    reference operator*() const { return **it_; }
    pointer operator->() const { return it_->get(); }
    reference operator[](difference_type n) const { return *it_[n]; }
    iterator& operator++() { ++it_; return *this; }
    iterator operator++(int) { iterator t = *this; ++it_; return t; }
    iterator& operator--() { --it_; return *this; }
    iterator operator--(int) { iterator t = *this; --it_; return t; }
    iterator& operator+=(difference_type n) { it_ += n; return *this; }
    iterator& operator-=(difference_type n) { it_ -= n; return *this; }
    iterator operator+(difference_type n) const { return iterator(it_ + n); }
    iterator operator-(difference_type n) const { return iterator(it_ - n); }
    difference_type operator-(const iterator& o) const { return it_ - o.it_; }
    bool operator==(const iterator& o) const { return it_ == o.it_; }
    bool operator!=(const iterator& o) const { return it_ != o.it_; }
    bool operator<(const iterator& o) const { return it_ < o.it_; }

   private:
    Storage::const_iterator it_;
  };
  using const_iterator = iterator;
  using reverse_iterator = std::reverse_iterator<iterator>;

  explicit NodeList(const Storage& nodes) : nodes_(&nodes) {}
  size_t size() const { return nodes_->size(); }
  bool empty() const { return nodes_->empty(); }
  const Node& operator[](size_t i) const { return *(*nodes_)[i]; }
  const Node& front() const { return *nodes_->front(); }
  const Node& back() const { return *nodes_->back(); }
  iterator begin() const { return iterator(nodes_->begin()); }
  iterator end() const { return iterator(nodes_->end()); }
  reverse_iterator rbegin() const { return reverse_iterator(end()); }
  reverse_iterator rend() const { return reverse_iterator(begin()); }

 private:
  const Storage* nodes_;
};

// The nodes as pointers, for loops that change the graph as they go (a
// NodeList's iterators do not survive insertion or erasure).
std::vector<const Node*> snapshot(const NodeList& nodes);

// Told of nodes added to and removed from a graph while it listens
// (Graph::setListener): what a rewrite driver needs to keep a worklist.
class GraphListener {
 public:
  virtual ~GraphListener() = default;
  virtual void nodeInserted(const Node& node) = 0;
  // Before the node goes: its address is not valid after the call.
  virtual void nodeErased(const Node& node) = 0;
};

// The graph owns its values and nodes and keeps, for every value, the node
// that produces it and the nodes that read it, as torch.fx and TorchScript
// do. Nodes are read through `nodes()` and changed only through the graph,
// so that those links stay true. A rewrite in the style of TorchScript's
// ir.h, replacing `%y = aten::mul.Scalar(%x, 2)` by an add of %x to itself:
//
//   before:  %y: f32[4] = aten::mul.Scalar(%x, 2)
//            %z: f32[4] = aten::relu(%y)
//
//   GraphBuilder b(g);
//   b.setInsertionPoint(mul);                     // new nodes go before `mul`
//   ValueId sum = b.call("aten::add.Tensor", {Arg::tensor(x), Arg::tensor(x), Arg::ofInt(1)});
//   g.replaceAllUsesWith(y, sum);                 // relu now reads %add
//   g.erase(mul);                                 // %y has no reader left
//
//   after:   %add: f32[4] = aten::add.Tensor(%x, %x, 1)
//            %z: f32[4] = aten::relu(%add)
//
// To swap a node for another that defines the same values (same names),
// use replaceNode() or GraphBuilder::replace().
class Graph {
 public:
  Graph() = default;
  Graph(const Graph& other);
  Graph& operator=(const Graph& other);
  Graph(Graph&&) noexcept = default;
  Graph& operator=(Graph&&) noexcept = default;

  ValueId addValue(Value value);
  ValueId addInput(Value value, InputKind kind, bool requiresGrad = true);
  void addOutput(ValueId v) { outputs_.push_back(v); }
  void addUpdate(StateUpdate u) { updates_.push_back(u); }
  void addGradient(Gradient g) { gradients_.push_back(g); }
  std::vector<Gradient>& gradients() { return gradients_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  void setBuckets(std::vector<Bucket> b) { buckets_ = std::move(b); }

  const Value& value(ValueId id) const { return values_.at(id); }
  Value& value(ValueId id) { return values_.at(id); }
  size_t numValues() const { return values_.size(); }
  std::optional<ValueId> findValue(const std::string& name) const;

  const std::vector<GraphInput>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  std::vector<ValueId>& outputs() { return outputs_; }
  const std::vector<StateUpdate>& updates() const { return updates_; }
  std::vector<StateUpdate>& updates() { return updates_; }
  const std::vector<Gradient>& gradients() const { return gradients_; }
  // The graph input that defines `v`, or nullptr.
  const GraphInput* inputOf(ValueId v) const;
  const WeightsRef& weights() const { return weights_; }
  void setWeights(WeightsRef w) { weights_ = std::move(w); }
  // spmd-unroll's iteration count (0: not unrolled). See ir/iter_graph.h.
  int iters() const { return iters_; }
  void setIters(int n) { iters_ = n; }
  // The step's schedule, clipping and micro-batches (ir/training.h).
  const TrainingConfig& training() const { return training_; }
  TrainingConfig& training() { return training_; }
  // The stages' flags that made the step, each as its command-line words
  // ({"--lr", "0.001"}, {"--cudagraphs"}), in the stages' order; each stage
  // records its own (pipelines/recorded_flags.h). A record of how the step
  // was made, not part of what it computes.
  const std::vector<std::vector<std::string>>& flags() const { return flags_; }
  void setFlags(std::vector<std::vector<std::string>> flags) { flags_ = std::move(flags); }

  // A value name not used yet, derived from `base` the way FX does
  // (relu, relu_1, relu_2, ...).
  std::string freshName(const std::string& base);

  // ---- nodes ------------------------------------------------------------
  NodeList nodes() const { return NodeList(nodes_); }
  // Its place in program order (O(1) while the graph is not changed).
  size_t indexOf(const Node& node) const;

  // Appends, or inserts before/after `anchor`; returns the node in the graph.
  // Its outputs must not have a producer already (std::logic_error).
  const Node& addNode(Node node);
  const Node& insertBefore(const Node& anchor, Node node);
  const Node& insertAfter(const Node& anchor, Node node);
  // Removes `node`; none of its outputs may still be read by a node.
  void erase(const Node& node);
  // `replacement` takes the place of `old`. Outputs of `old` that it does
  // not define again must have no readers left.
  const Node& replaceNode(const Node& old, Node replacement);
  // Removes `node` and returns it, leaving the readers of its outputs in
  // place: for rewrites that rebuild a node from parts, the last of which
  // defines its values again. Until then those values have no producer
  // (verify() rejects that).
  Node extract(const Node& node);
  // Puts the nodes in `order`, a permutation of nodes().
  void reorder(const std::vector<const Node*>& order);
  // The listener told of insertions and removals from now on (nullptr: none);
  // returns the one it replaces. A copy of the graph has none.
  GraphListener* setListener(GraphListener* listener);

  // ---- def-use ----------------------------------------------------------
  // The node producing `v`, or nullptr for graph inputs (and orphans).
  const Node* producer(ValueId v) const;
  // The nodes reading `v`, each once, in program order.
  std::vector<const Node*> users(ValueId v) const;
  // Whether `v` is read beyond the nodes: a graph output, the new value of a
  // state update, or a gradient record's value (a fusion must keep it).
  bool readBeyondNodes(ValueId v) const;
  // Whether `v` is one of the graph's outputs.
  bool isGraphOutput(ValueId v) const;
  // The node reading `v` when that is the only read of `v` of any kind: one
  // argument of one node (a node reading it twice reads it twice), and no
  // graph output, state update or gradient record. nullptr otherwise. What
  // a rewrite asks before it folds `v` away into its reader or producer.
  const Node* soleReader(ValueId v) const;
  bool hasOneReader(ValueId v) const { return soleReader(v) != nullptr; }
  // Every read of `from` becomes a read of `to`: node arguments, graph
  // outputs and the new values of state updates. Gradient records are
  // annotations, not reads, and stay.
  void replaceAllUsesWith(ValueId from, ValueId to);
  // Only the node arguments of nodes for which `where(node)` holds.
  void replaceUsesWith(ValueId from, ValueId to, const std::function<bool(const Node&)>& where);
  // Sets one argument of `node`.
  void setArg(const Node& node, size_t index, Arg arg);
  // Node metadata is free to change: it takes part in no def-use link.
  NodeMeta& metaOf(const Node& node) { return mutableNode(node).meta; }
  // Constant arguments are free to change too; `index` must not be a tensor.
  Arg& constantArg(const Node& node, size_t index);

 private:
  Node& mutableNode(const Node& node) { return const_cast<Node&>(node); }
  const Node& insertAt(size_t position, Node node);
  void link(const Node& node);
  void unlink(const Node& node);
  void rebuildLinks();

  std::vector<Value> values_;
  std::map<std::string, ValueId> byName_;
  std::vector<GraphInput> inputs_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<ValueId> outputs_;
  std::vector<StateUpdate> updates_;
  std::vector<Gradient> gradients_;
  std::vector<Bucket> buckets_;
  WeightsRef weights_;
  int iters_ = 0;
  TrainingConfig training_;
  std::vector<std::vector<std::string>> flags_;
  std::map<std::string, int> nextSuffix_;
  // Def-use links, by value id: one users_ entry per argument that reads it.
  std::vector<const Node*> producer_;
  std::vector<std::vector<const Node*>> users_;
  // One node's position for a mutation: from indexOf's cache when it is
  // current, else by a scan, so that a pass erasing nodes one by one does
  // not rebuild the cache after each (a quadratic cost: 0.4 s of
  // spmd-lower's fuse-optimizer for GPT's 2594 optimizer nodes).
  size_t positionForEdit(const Node& node) const;
  // indexOf's cache, rebuilt after the node order changes.
  mutable std::unordered_map<const Node*, size_t> position_;
  mutable bool positionsStale_ = true;
  GraphListener* listener_ = nullptr;
};

// Removes nodes none of whose outputs reaches a graph output, a state update
// or a gradient record. Returns whether any node was removed.
bool eliminateDeadNodes(Graph& graph);

// Calls f(ValueId) (or f(ValueId&) on a mutable node) for every tensor the
// node reads, single values and list elements alike, in argument order; the
// absent elements of a Tensor?[] list are skipped.
template <typename NodeT, typename F>
void forEachTensorArg(NodeT& node, F&& f) {
  for (auto& a : node.args) {
    if (a.kind == Arg::Kind::Value) f(a.value);
    for (auto& v : a.values) {
      if (v != kNoValue) f(v);
    }
  }
}

// Element size in bytes, numel and total bytes of a value.
int64_t numel(const Value& v);
int64_t bytes(const Value& v);

}  // namespace spmd

// The spmd graph: an SSA graph of ATen (and spmd) operator calls with static
// shapes, in the spirit of torch.fx. Values are numbered; nodes refer to them
// by id. Kept free of ATen headers so that most of the project compiles fast.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
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

enum class InputKind { Data, Parameter, Buffer, State };
const char* inputKindName(InputKind kind);
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
    Values,        // a list of tensor values (aten::cat)
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
  std::string file;    // as given by the user, resolved against cwd
  std::string format;  // "torchscript"
};

class Graph {
 public:
  ValueId addValue(Value value);
  ValueId addInput(Value value, InputKind kind, bool requiresGrad = true);
  Node& addNode(Node node);
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
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::vector<StateUpdate>& updates() const { return updates_; }
  std::vector<StateUpdate>& updates() { return updates_; }
  const std::vector<Gradient>& gradients() const { return gradients_; }
  std::vector<ValueId>& outputs() { return outputs_; }
  // The graph input that defines `v`, or nullptr.
  const GraphInput* inputOf(ValueId v) const;
  // Moves the nodes out, leaving none: passes that rewrite node by node
  // take them and add back what they keep.
  std::vector<Node> takeNodes();
  const WeightsRef& weights() const { return weights_; }
  void setWeights(WeightsRef w) { weights_ = std::move(w); }
  // spmd-unroll's iteration count (0: not unrolled). See ir/iter_graph.h.
  int iters() const { return iters_; }
  void setIters(int n) { iters_ = n; }

  // A value name not used yet, derived from `base` the way FX does
  // (relu, relu_1, relu_2, ...).
  std::string freshName(const std::string& base);

 private:
  std::vector<Value> values_;
  std::map<std::string, ValueId> byName_;
  std::vector<GraphInput> inputs_;
  std::vector<Node> nodes_;
  std::vector<ValueId> outputs_;
  std::vector<StateUpdate> updates_;
  std::vector<Gradient> gradients_;
  std::vector<Bucket> buckets_;
  WeightsRef weights_;
  int iters_ = 0;
  std::map<std::string, int> nextSuffix_;
};

// Removes nodes none of whose outputs reaches a graph output, a state update
// or a gradient record. Returns whether any node was removed.
bool eliminateDeadNodes(Graph& graph);

// Calls f(ValueId) (or f(ValueId&) on a mutable node) for every tensor the
// node reads, single values and list elements alike, in argument order.
template <typename NodeT, typename F>
void forEachTensorArg(NodeT& node, F&& f) {
  for (auto& a : node.args) {
    if (a.kind == Arg::Kind::Value) f(a.value);
    for (auto& v : a.values) f(v);
  }
}

// Element size in bytes, numel and total bytes of a value.
int64_t numel(const Value& v);
int64_t bytes(const Value& v);

}  // namespace spmd

// Adding typed nodes to a graph at an insertion point: each new node's output
// dtypes and shapes come from running its op on LibTorch's meta device, so
// passes never work out shapes by hand.
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace spmd {

class GraphBuilder {
 public:
  explicit GraphBuilder(Graph& graph) : graph_(graph) {}

  // Where new nodes go: before `node` (each new node after the previous new
  // one), after `node`, or at the end (the default).
  void setInsertionPoint(const Node& node) { insertBefore_ = &node; }
  void setInsertionPointAfter(const Node& node);
  void setInsertionPointToEnd() { insertBefore_ = nullptr; }

  // Metadata stamped on every node added from now on.
  void setMeta(NodeMeta meta) { meta_ = std::move(meta); }
  const NodeMeta& meta() const { return meta_; }

  // Appends `op` ("aten::add.Tensor") called on `args`; returns one value per
  // result (kNoValue for results the op leaves undefined). Output names are
  // `base` (default: the op's name) made unique. Throws std::logic_error when
  // the op rejects the arguments: a bug in the pass, not in the user's input.
  // `preset` gives existing value ids for the first results (kNoValue: make
  // a fresh one) that no node produces any more.
  std::vector<ValueId> callMulti(const std::string& op, std::vector<Arg> args, const std::string& base = "",
                                 const std::vector<ValueId>& preset = {});
  ValueId call(const std::string& op, std::vector<Arg> args, const std::string& base = "");
  // Puts `op(args)` in the place of `old`, defining the same values (same
  // names); the results must have their types. Readers are untouched.
  void replace(const Node& old, const std::string& op, std::vector<Arg> args);
  // The same, defining `outputs` instead (kNoValue: a fresh value): values
  // of a node that a fusion removed first (whose producer is gone), so that
  // their readers read the new node. Outputs of `old` not among them must
  // have no readers left.
  void replace(const Node& old, const std::string& op, std::vector<Arg> args, const std::vector<ValueId>& outputs);

  // References into the graph: valid until the next value is added.
  const Value& value(ValueId v) const { return graph_.value(v); }
  // A copy: a reference would dangle once the next value is added.
  std::vector<int64_t> shape(ValueId v) const { return graph_.value(v).shape; }
  Graph& graph() { return graph_; }

  // Frequently used forms.
  ValueId add(ValueId a, ValueId b, double alpha = 1.0);
  ValueId mul(ValueId a, ValueId b);
  ValueId mulScalar(ValueId a, double s);
  ValueId neg(ValueId a);
  ValueId reshape(ValueId a, const std::vector<int64_t>& shape);
  ValueId transpose(ValueId a, int64_t d0, int64_t d1);
  // Sums `a` down to `shape` (undoing broadcasting); `a` itself if it fits.
  ValueId sumTo(ValueId a, const std::vector<int64_t>& shape);
  ValueId zerosLike(ValueId a);
  // aten::_to_copy(a, dtype): what tensor.to(dtype) records.
  ValueId cast(ValueId a, c10::ScalarType dtype, const std::string& base = "");

 private:
  at::Tensor metaOf(ValueId v);
  Node typedNode(const std::string& op, std::vector<Arg> args, const std::string& base,
                 const std::vector<ValueId>& preset);

  Graph& graph_;
  NodeMeta meta_;
  const Node* insertBefore_ = nullptr;  // nullptr: at the end
  std::unordered_map<ValueId, at::Tensor> metaCache_;  // results with their real strides
};

Arg intsArg(std::vector<int64_t> v);
Arg boolsArg(std::vector<bool> v);
Arg strArg(std::string s);
Arg dtypeArg(c10::ScalarType t);

}  // namespace spmd

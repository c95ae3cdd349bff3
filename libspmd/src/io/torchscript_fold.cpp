// Folding what a traced forward computes from shapes into constants (the
// tracer records aten::size, arithmetic on sizes and 0-dim tensor forms of
// them, all static here), and the dtypes that follow from the constants.
#include "torchscript_internal.h"

#include "spmd/ir/boxing.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ops/meta.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>

namespace spmd {
namespace torchscript_detail {

bool ShapeFolder::folds(const jit::Node* n) { return computesOnlyScalars(n) || foldsToShapeTensor(n); }

// Nodes that make only numbers, lists of numbers or the tensor form of a
// number (aten::size, arithmetic on sizes, prim::NumToTensor): the tracer
// records what the module computed from shapes, which are static here.
bool ShapeFolder::computesOnlyScalars(const jit::Node* n) {
  if (n->outputs().empty()) return false;
  if (n->kind() == c10::prim::NumToTensor) return true;
  for (const jit::Value* out : n->outputs()) {
    if (!isScalarType(out->type())) return false;
  }
  return true;
}

bool ShapeFolder::isScalarType(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::NumberType: return true;
    case c10::TypeKind::ListType:
    case c10::TypeKind::TupleType:
      for (const c10::TypePtr& t : type->containedTypes()) {
        if (!isScalarType(t)) return false;
      }
      return true;
    default: return false;
  }
}

// Tensor arithmetic on numbers from shapes (swin's padding, W % window
// as 0-dim tensors): an op whose tensor arguments all fold, that has at
// least one (factories, random ones among them, are not folded), and
// whose results are 0-dim tensors or numbers.
bool ShapeFolder::readsOnlyShapeTensors(const jit::Node* n) {
  if (!n->kind().is_aten() || n->outputs().empty()) return false;
  bool anyTensor = false;
  for (const jit::Value* in : n->inputs()) {
    if (in->type()->kind() != c10::TypeKind::TensorType) continue;
    anyTensor = true;
    if (!isShapeTensor(in)) return false;
  }
  if (!anyTensor) return false;
  for (const jit::Value* out : n->outputs()) {
    auto type = out->type()->cast<c10::TensorType>();
    const bool scalarTensor = type && type->dim() && *type->dim() == 0;
    if (!scalarTensor && !isScalarType(out->type())) return false;
  }
  return true;
}

bool ShapeFolder::isShapeTensor(const jit::Value* v) {
  if (values_.count(v)) return false;  // a tensor of the graph
  auto folded = value(v);
  return folded && folded->isTensor() && folded->toTensor().dim() == 0;
}

bool ShapeFolder::foldsToShapeTensor(const jit::Node* n) {
  if (!readsOnlyShapeTensors(n)) return false;
  for (const jit::Value* out : n->outputs()) {
    if (!value(out)) return false;
  }
  return true;
}

// The value `v` holds when it is a constant, a list literal of constants
// (how traces spell int[]) or computed from shapes and constants alone:
// sizes come from the graph's static shapes, the rest runs through the
// node's own JIT operation.
c10::optional<c10::IValue> ShapeFolder::value(const jit::Value* v) {
  if (auto c = jit::toIValue(v)) return c;
  auto known = folded_.find(v);
  if (known != folded_.end()) return known->second;
  const jit::Node* n = v->node();
  c10::optional<c10::IValue> result;
  if (n->kind() == c10::prim::ListConstruct) {
    result = foldedList(n);
  } else if (n->kind() == c10::prim::NumToTensor) {
    if (auto number = value(n->input())) result = c10::IValue(c10::scalar_to_tensor(number->toScalar()));
  } else if (n->kind() == c10::aten::size && values_.count(n->inputs()[0])) {
    const auto& shape = graph_.value(values_.at(n->inputs()[0])).shape;
    if (n->inputs().size() == 1) {
      result = c10::IValue(shape);
    } else if (auto dim = value(n->inputs()[1])) {
      int64_t d = dim->toInt();
      if (d < 0) d += static_cast<int64_t>(shape.size());
      if (d >= 0 && d < static_cast<int64_t>(shape.size())) result = c10::IValue(shape[d]);
    }
  } else if ((computesOnlyScalars(n) || readsOnlyShapeTensors(n)) && n->maybeOperator()) {
    result = runScalarNode(n, v);
  }
  if (result) folded_[v] = *result;
  return result;
}

c10::optional<c10::IValue> ShapeFolder::runScalarNode(const jit::Node* n, const jit::Value* v) {
  jit::Stack stack;
  for (const jit::Value* in : n->inputs()) {
    auto c = value(in);
    if (!c) return c10::nullopt;
    stack.push_back(*c);
  }
  try {
    n->getOperation()(stack);
  } catch (const std::exception&) {
    return c10::nullopt;
  }
  for (size_t k = 0; k < n->outputs().size() && k < stack.size(); ++k) folded_[n->outputs()[k]] = stack[k];
  auto it = folded_.find(v);
  return it == folded_.end() ? c10::nullopt : c10::optional<c10::IValue>(it->second);
}

c10::optional<c10::IValue> ShapeFolder::foldedList(const jit::Node* n) {
  std::vector<c10::IValue> items;
  for (const jit::Value* item : n->inputs()) {
    auto c = value(item);
    if (!c) return c10::nullopt;
    items.push_back(*c);
  }
  auto all = [&](bool (c10::IValue::*is)() const) {
    return std::all_of(items.begin(), items.end(), [&](const c10::IValue& i) { return (i.*is)(); });
  };
  if (all(&c10::IValue::isInt)) {
    std::vector<int64_t> ints;
    for (const auto& i : items) ints.push_back(i.toInt());
    return c10::IValue(ints);
  }
  if (all(&c10::IValue::isDouble)) {
    std::vector<double> floats;
    for (const auto& i : items) floats.push_back(i.toDouble());
    return c10::IValue(floats);
  }
  if (all(&c10::IValue::isBool)) {
    c10::List<bool> bools;
    for (const auto& i : items) bools.push_back(i.toBool());
    return c10::IValue(bools);
  }
  return c10::nullopt;
}

// The tracer typed 0-dim arithmetic on Python numbers as the re-traced
// module computed it, where the numbers were 0-dim double tensors; with
// the numbers given their promoted dtypes (scalarTensor), dtypes follow
// from the ops themselves on the meta device.
void retypeFromConstants(Graph& graph) {
  MetaFallbackScope metaFallback;
  std::unordered_map<ValueId, at::Tensor> meta;
  auto metaOf = [&](ValueId v) {
    auto it = meta.find(v);
    return it != meta.end() ? it->second : metaTensorOf(graph.value(v));
  };
  for (const Node& n : graph.nodes()) {
    auto op = findOperator(n);
    if (!op) continue;
    std::vector<at::Tensor> results;
    try {
      results = inferNodeOnMeta(n, *op, metaOf);
    } catch (const std::exception&) {
      continue;  // the verifier reports it
    }
    for (size_t k = 0; k < results.size() && k < n.outputs.size(); ++k) {
      if (n.outputs[k] == kNoValue || !results[k].defined()) continue;
      Value& v = graph.value(n.outputs[k]);
      if (v.shape == results[k].sizes().vec()) v.dtype = results[k].scalar_type();
      meta[n.outputs[k]] = results[k];
    }
  }
}

}  // namespace torchscript_detail
}  // namespace spmd

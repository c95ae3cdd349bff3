// Converting the traced TorchScript graph into an spmd graph: one node per
// ATen call, constants as arguments, in-place updates made functional.
#include "torchscript_internal.h"

#include "spmd/ir/boxing.h"
#include "spmd/ir/builder.h"
#include "spmd/ops/dispatch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace spmd {
namespace torchscript_detail {
namespace {

// ---- converting the traced graph ------------------------------------------

bool isViewOp(const std::string& op) {
  static const std::set<std::string> views = {
      "aten::view", "aten::reshape", "aten::expand", "aten::slice", "aten::select", "aten::transpose",
      "aten::t", "aten::permute", "aten::squeeze", "aten::unsqueeze", "aten::flatten", "aten::as_strided",
      "aten::split", "aten::chunk", "aten::narrow", "aten::diagonal", "aten::unflatten", "aten::detach",
      "aten::alias", "aten::unbind", "aten::view_as", "aten::expand_as"};
  return views.count(op) > 0;
}

class Converter {
 public:
  Converter(Graph& graph, const std::string& fileName) : graph_(graph), fileName_(fileName) {}

  void bindInput(const jit::Value* v, ValueId id) { values_[v] = id; }

  void convert(const jit::Graph& traced) {
    for (const jit::Node* n : traced.nodes()) convertNode(n);
    for (const jit::Value* out : traced.outputs()) addOutputs(out);
  }

  // Buffers written in place: their latest values become StateUpdates.
  void recordUpdates(const std::vector<std::pair<const jit::Value*, ValueId>>& stateInputs) {
    for (const auto& [jv, input] : stateInputs) {
      ValueId latest = values_.at(jv);
      if (latest != input) graph_.addUpdate(StateUpdate{input, latest});
    }
  }

 private:
  void convertNode(const jit::Node* n) {
    const std::string kind = n->kind().toQualString();
    if (n->kind() == c10::prim::Constant || n->kind() == c10::prim::ListConstruct ||
        n->kind() == c10::prim::TupleConstruct || n->kind() == c10::prim::ListUnpack) {
      return;  // read where they are used
    }
    if (folder_.folds(n)) return;  // folded where used (ShapeFolder)
    const c10::FunctionSchema* schema = n->maybeSchema();
    const bool known = n->kind().is_aten() || kind.rfind("spmd::", 0) == 0;
    if (!schema || !known) {
      throw Diagnostic(describe(n), "unsupported operation '" + kind + "' in the traced forward");
    }
    if (kind == "aten::batch_norm" && isTrainingBatchNorm(n)) {
      convertTrainingBatchNorm(n);
      return;
    }
    if (kind == "aten::_convolution") {
      convertConvolution(n);
      return;
    }
    if (kind == "aten::repeat_interleave" && schema->overload_name() == "self_int") {
      convertRepeatInterleave(n);
      return;
    }
    const bool inPlace = schema->is_mutable() && kind.back() == '_';
    Node node;
    node.op = kind;
    node.overload = schema->overload_name();
    node.meta.source = sourceOf(n);
    if (inPlace) std::tie(node.op, node.overload) = outOfPlaceForm(n, *schema);
    if (n->inputs().size() != schema->arguments().size()) {
      throw Diagnostic(describe(n), kind + ": traced call has " + std::to_string(n->inputs().size()) +
                                        " arguments, the schema " +
                                        std::to_string(schema->arguments().size()));
    }
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      node.args.push_back(convertArg(n, schema->arguments()[i], n->inputs()[i]));
    }
    std::vector<const jit::Value*> outs;
    for (const jit::Value* out : n->outputs()) {
      if (out->type()->kind() == c10::TypeKind::ListType) {
        for (const jit::Value* item : unpackedItems(n, out)) outs.push_back(item);
      } else {
        outs.push_back(out);
      }
    }
    for (const jit::Value* out : outs) node.outputs.push_back(addTensorValue(n, out));
    const Node& added = graph_.addNode(std::move(node));
    if (inPlace) {
      writeBack(n, n->inputs()[0], added.outputs[0]);
    } else if (isViewOp(kind) && !added.args.empty() && added.args[0].kind == Arg::Kind::Value) {
      for (size_t k = 0; k < outs.size(); ++k) views_.record(outs[k], n->inputs()[0], added, k);
    }
  }

  // x.add_(y) made functional: x's value becomes x + y. Where x is a view
  // (of a view ...) of a base, the base takes the new elements too, and
  // every other view of that base is read again from the new base, as
  // LibTorch's functionalization does; later readers see the new values.
  void writeBack(const jit::Node* n, const jit::Value* target, ValueId updated) {
    values_[target] = updated;
    const jit::Value* written = target;
    ValueId value = updated;
    while (const ViewTable::View* view = views_.find(written)) {
      value = viewInverse(graph_, sourceOf(n), describe(n), *view, values_.at(view->base), value);
      written = view->base;
      values_[written] = value;
    }
    refreshViews(n, written);
  }

  // Views of `base` taken before it changed read it again.
  void refreshViews(const jit::Node* n, const jit::Value* base) {
    for (const auto& [view, info] : views_.of(base)) {
      Node again = info.node;
      again.args[0] = Arg::tensor(values_.at(base));
      GraphBuilder b(graph_);
      b.setMeta(NodeMeta{sourceOf(n)});
      const auto outputs = b.callMulti(again.qualifiedName(), again.args);
      values_[view] = outputs.at(info.index);
      refreshViews(n, view);
    }
  }

  // aten::repeat_interleave(x, repeats: int, dim, output_size) as
  // x.unsqueeze(dim + 1).expand(..., repeats, ...).reshape(...): the same
  // elements, where LibTorch's own decomposition gathers with an index
  // tensor whose length its meta kernels cannot know (the traced shape
  // would not be checked), and whose backward is an index_add.
  void convertRepeatInterleave(const jit::Node* n) {
    auto repeats = jit::toIValue(n->inputs()[1]);
    auto dim = jit::toIValue(n->inputs()[2]);
    if (!repeats || !repeats->isInt() || !dim || !dim->isInt()) {
      throw Diagnostic(describe(n), "aten::repeat_interleave: only a constant repeat count along a given dimension is supported");
    }
    const ValueId x = values_.at(n->inputs()[0]);
    std::vector<int64_t> shape = graph_.value(x).shape;
    const int64_t rank = static_cast<int64_t>(shape.size());
    int64_t d = dim->toInt();
    if (d < -rank || d >= rank) throw Diagnostic(describe(n), "aten::repeat_interleave: dimension out of range");
    d = d < 0 ? d + rank : d;
    GraphBuilder b(graph_);
    b.setMeta(NodeMeta{sourceOf(n)});
    const ValueId unsqueezed = b.call("aten::unsqueeze", {Arg::tensor(x), Arg::ofInt(d + 1)});
    std::vector<int64_t> expanded = shape;
    expanded.insert(expanded.begin() + d + 1, repeats->toInt());
    const ValueId spread = b.call("aten::expand", {Arg::tensor(unsqueezed), intsArg(expanded), Arg::ofBool(false)});
    shape[d] *= repeats->toInt();
    values_[n->outputs()[0]] = b.call("aten::reshape", {Arg::tensor(spread), intsArg(shape)});
  }

  bool isTrainingBatchNorm(const jit::Node* n) {
    auto training = jit::toIValue(n->inputs()[5]);
    return training && training->isBool() && training->toBool() &&
           n->inputs()[3]->type()->kind() != c10::TypeKind::NoneType;
  }

  // aten::batch_norm(input, weight, bias, running_mean, running_var, training,
  // momentum, eps, cudnn_enabled) in training mode writes its running stats;
  // spmd::batch_norm_train returns them instead.
  void convertTrainingBatchNorm(const jit::Node* n) {
    const auto& schema = n->schema();
    Node node;
    node.op = "spmd::batch_norm_train";
    node.meta.source = sourceOf(n);
    for (int i : {0, 1, 2, 3, 4, 6, 7}) {
      node.args.push_back(convertArg(n, schema.arguments()[i], n->inputs()[i]));
    }
    // Copies: newValue() may move the graph's values.
    const Value input = graph_.value(node.args[0].value);
    const Value stat = graph_.value(node.args[3].value);
    const int64_t channels = input.shape.size() > 1 ? input.shape[1] : 0;
    node.outputs.push_back(newValue("batch_norm", input.dtype, input.shape));
    node.outputs.push_back(newValue("save_mean", input.dtype, {channels}));
    node.outputs.push_back(newValue("save_invstd", input.dtype, {channels}));
    node.outputs.push_back(newValue("running_mean", stat.dtype, stat.shape));
    node.outputs.push_back(newValue("running_var", stat.dtype, stat.shape));
    values_[n->output()] = node.outputs[0];
    values_[n->inputs()[3]] = node.outputs[3];
    values_[n->inputs()[4]] = node.outputs[4];
    graph_.addNode(std::move(node));
  }

  // LibTorch's tracer records conv1d/2d/3d as their internal
  // aten::_convolution; give the user's op back (aten::convolution for
  // transposed ones), which computes the same through the same kernels.
  void convertConvolution(const jit::Node* n) {
    const auto& schema = n->schema();
    std::vector<Arg> args;
    for (size_t i = 0; i < n->inputs().size(); ++i) args.push_back(convertArg(n, schema.arguments()[i], n->inputs()[i]));
    Node node;
    node.meta.source = sourceOf(n);
    const size_t spatial = graph_.value(args[1].value).shape.size() - 2;
    const bool transposed = args[6].kind == Arg::Kind::Bool && args[6].b;
    std::vector<int> keep = {0, 1, 2, 3, 4, 5, 6, 7, 8};  // aten::convolution's arguments
    if (!transposed && spatial >= 1 && spatial <= 3) {
      node.op = "aten::conv" + std::to_string(spatial) + "d";
      keep = {0, 1, 2, 3, 4, 5, 8};
    } else {
      node.op = "aten::convolution";
    }
    for (int i : keep) node.args.push_back(args[i]);
    node.outputs.push_back(addTensorValue(n, n->output(), "convolution"));
    graph_.addNode(std::move(node));
  }

  // Ops returning Tensor[] (split, chunk, unbind, broadcast_tensors) are
  // traced as a list that one prim::ListUnpack takes apart; the node gets
  // the unpacked tensors as its outputs.
  std::vector<const jit::Value*> unpackedItems(const jit::Node* n, const jit::Value* list) {
    if (list->uses().size() != 1 || list->uses()[0].user->kind() != c10::prim::ListUnpack) {
      throw Diagnostic(describe(n), std::string(n->kind().toQualString()) +
                                        " returns a tensor list that is used other than by unpacking it");
    }
    auto outs = list->uses()[0].user->outputs();
    return std::vector<const jit::Value*>(outs.begin(), outs.end());
  }

  std::pair<std::string, std::string> outOfPlaceForm(const jit::Node* n, const c10::FunctionSchema& schema) {
    auto form = outOfPlaceOverload(schema);
    if (!form) {
      throw Diagnostic(describe(n), std::string("in-place operation '") + n->kind().toQualString() +
                                        "' has no out-of-place form to rewrite it to");
    }
    return *form;
  }

  ValueId newValue(const std::string& base, c10::ScalarType dtype, std::vector<int64_t> shape) {
    Value v;
    v.name = graph_.freshName(base);
    v.dtype = dtype;
    v.shape = std::move(shape);
    return graph_.addValue(std::move(v));
  }

  ValueId addTensorValue(const jit::Node* n, const jit::Value* out, std::string base = "") {
    auto type = out->type()->cast<c10::TensorType>();
    auto sizes = type ? type->sizes().concrete_sizes() : c10::nullopt;
    if (!type || !type->scalarType() || !sizes) {
      throw Diagnostic(describe(n), std::string(n->kind().toQualString()) +
                                        " produces a value that is not a tensor of known shape (" +
                                        out->type()->str() + ")");
    }
    if (base.empty()) base = n->kind().toUnqualString();
    if (!base.empty() && base.back() == '_') base.pop_back();
    if (base.size() > 1 && base[0] == '_') base = base.substr(1);
    ValueId id = newValue(base, *type->scalarType(), *sizes);
    values_[out] = id;
    producers_[id] = n->kind().toQualString();
    return id;
  }

  // torch.jit.trace records Python numbers in tensor arithmetic (x * 0.5,
  // buf.add_(1)) as 0-dim tensor constants; they become aten::scalar_tensor
  // nodes of the same value. The constant loses the tracer's "wrapped
  // number" mark, so a double, long or bool one is taken for the Python
  // number it was (a 0-dim tensor made in forward is f32 unless asked
  // otherwise) and takes part in type promotion as a number would: it gets
  // the dtype of the tensor it meets (f32 for x * 0.5, even where x is
  // 0-dim), and the default float dtype where a float meets integers.
  // One constant may meet tensors of several dtypes (T5's `max_exact` divides
  // a float tensor and is added to a long one): a node per dtype it takes.
  ValueId scalarTensor(const jit::Node* user, const jit::Value* v, const at::Tensor& t) {
    const bool pythonNumber = t.scalar_type() == c10::ScalarType::Double || t.scalar_type() == c10::ScalarType::Long ||
                              t.scalar_type() == c10::ScalarType::Bool || t.unsafeGetTensorImpl()->is_wrapped_number();
    const c10::ScalarType dtype = pythonNumber ? wrappedNumberDtype(user, v, t) : t.scalar_type();
    const auto made = scalarTensors_.find({v, dtype});
    if (made != scalarTensors_.end()) return made->second;
    ValueId id = elementTensor(user, t, dtype);
    scalarTensors_[{v, dtype}] = id;
    return id;
  }

  c10::ScalarType wrappedNumberDtype(const jit::Node* user, const jit::Value* v, const at::Tensor& t) {
    for (const jit::Value* other : user->inputs()) {
      if (other == v || !values_.count(other)) continue;
      const c10::ScalarType met = graph_.value(values_.at(other)).dtype;
      const bool floating = c10::isFloatingType(t.scalar_type());
      if (floating && !c10::isFloatingType(met)) return c10::get_default_dtype_as_scalartype();
      if (!floating && met == c10::ScalarType::Bool) return t.scalar_type();
      return met;
    }
    return t.scalar_type();
  }

  // A traced tensor constant of a few elements (an index list such as
  // `x[..., [-2], :]` traces to one) as nodes: its elements as 0-dim
  // tensors, stacked and shaped. Larger constants are refused: they are
  // weights the model should hold as buffers.
  static constexpr int64_t kMaxConstantElements = 64;

  ValueId smallConstant(const jit::Node* user, const at::Tensor& constant) {
    const at::Tensor flat = constant.contiguous().reshape({-1});
    Node stack;
    stack.op = "aten::stack";
    stack.meta.source = sourceOf(user);
    Arg elements;
    elements.kind = Arg::Kind::Values;
    for (int64_t i = 0; i < flat.numel(); ++i) {
      elements.values.push_back(elementTensor(user, flat[i], constant.scalar_type()));
    }
    stack.args.push_back(std::move(elements));
    stack.args.push_back(Arg::ofInt(0));
    ValueId stacked = newValue("constant", constant.scalar_type(), {flat.numel()});
    stack.outputs.push_back(stacked);
    graph_.addNode(std::move(stack));
    if (constant.dim() == 1) return stacked;
    Node view;
    view.op = "aten::view";
    view.meta.source = sourceOf(user);
    view.args.push_back(Arg::tensor(stacked));
    Arg shape;
    shape.kind = Arg::Kind::Ints;
    shape.ints = constant.sizes().vec();
    view.args.push_back(std::move(shape));
    ValueId shaped = newValue("constant", constant.scalar_type(), constant.sizes().vec());
    view.outputs.push_back(shaped);
    graph_.addNode(std::move(view));
    return shaped;
  }

  // One element of a constant as an aten::scalar_tensor of `dtype`.
  ValueId elementTensor(const jit::Node* user, const at::Tensor& element, c10::ScalarType dtype) {
    Node node;
    node.op = "aten::scalar_tensor";
    node.meta.source = sourceOf(user);
    node.args.push_back(scalarArg(element));
    Arg dtypeArg;
    dtypeArg.kind = Arg::Kind::DType;
    dtypeArg.i = static_cast<int64_t>(dtype);
    node.args.push_back(dtypeArg);
    node.args.push_back(Arg::none());  // layout
    node.args.push_back(Arg::none());  // device
    node.args.push_back(Arg::none());  // pin_memory
    ValueId id = newValue("scalar_tensor", dtype, {});
    node.outputs.push_back(id);
    graph_.addNode(std::move(node));
    return id;
  }

  static Arg scalarArg(const at::Tensor& t) {
    const bool integral = !c10::isFloatingType(t.scalar_type()) && t.scalar_type() != c10::ScalarType::Bool;
    return integral ? Arg::ofInt(t.item<int64_t>())
           : t.scalar_type() == c10::ScalarType::Bool ? Arg::ofBool(t.item<bool>())
                                                      : Arg::ofFloat(t.item<double>());
  }

  ValueId tensorValue(const jit::Node* n, const jit::Value* v) {
    auto it = values_.find(v);
    if (it != values_.end()) return it->second;
    if (v->node()->kind() != c10::prim::Constant) {  // a number from the shapes, as a tensor
      auto folded = folder_.value(v);
      if (folded && folded->isTensor() && folded->toTensor().dim() == 0) return scalarTensor(n, v, folded->toTensor());
    }
    if (v->node()->kind() == c10::prim::Constant) {
      auto constant = jit::toIValue(v);
      if (constant && constant->isTensor() && constant->toTensor().dim() == 0) {
        return scalarTensor(n, v, constant->toTensor());
      }
      if (constant && constant->isTensor() && constant->toTensor().numel() <= kMaxConstantElements &&
          constant->toTensor().numel() > 0) {
        auto made = constants_.find(v);
        if (made == constants_.end()) made = constants_.emplace(v, smallConstant(n, constant->toTensor())).first;
        return made->second;
      }
      const int64_t elements = constant && constant->isTensor() ? constant->toTensor().numel() : 0;
      throw Diagnostic(describe(n), std::string(n->kind().toQualString()) + " uses a tensor constant of " +
                                        std::to_string(elements) + " elements (" +
                                        (elements == 0 ? std::string("an empty one is not taken")
                                                       : "at most " + std::to_string(kMaxConstantElements) +
                                                             " are taken") +
                                        "); register it as a buffer instead");
    }
    throw Diagnostic(describe(n), std::string(n->kind().toQualString()) + " uses a value made by unsupported '" +
                                      v->node()->kind().toQualString() + "'");
  }

  Arg convertArg(const jit::Node* n, const c10::Argument& formal, const jit::Value* actual) {
    c10::TypePtr type = formal.real_type();
    if (auto opt = type->cast<c10::OptionalType>()) {
      auto constant = jit::toIValue(actual);
      if (constant && constant->isNone()) return Arg::none();
      type = opt->getElementType();
    }
    if (type->kind() == c10::TypeKind::TensorType) return Arg::tensor(tensorValue(n, actual));
    if (auto list = type->cast<c10::ListType>()) {
      c10::TypePtr element = list->getElementType();
      const bool optional = element->kind() == c10::TypeKind::OptionalType;  // Tensor?[] (aten::index)
      if (optional) element = element->castRaw<c10::OptionalType>()->getElementType();
      if (element->kind() == c10::TypeKind::TensorType) {
        if (actual->node()->kind() != c10::prim::ListConstruct) {
          throw Diagnostic(describe(n), formal.name() + ": tensor list not built by a list literal");
        }
        Arg a;
        a.kind = Arg::Kind::Values;
        for (const jit::Value* item : actual->node()->inputs()) {
          const bool absent = optional && item->type()->kind() == c10::TypeKind::NoneType;
          a.values.push_back(absent ? kNoValue : tensorValue(n, item));
        }
        return a;
      }
    }
    auto constant = folder_.value(actual);
    if (!constant) {
      throw Diagnostic(describe(n), std::string(n->kind().toQualString()) + ": argument '" + formal.name() +
                                        "' is computed at run time (" + actual->node()->kind().toQualString() +
                                        "), not a constant");
    }
    return constantArg(n, formal, *constant);
  }

  // A constant as the graph argument for `formal` (ir/boxing.h's
  // argFromIValue: a meta device, where a module traced on the meta device
  // used x.device, becomes the CPU).
  Arg constantArg(const jit::Node* n, const c10::Argument& formal, const c10::IValue& c) {
    try {
      return argFromIValue(formal, c, [&](const at::Tensor&) -> ValueId {
        throw std::invalid_argument("argument '" + formal.name() + "' is a tensor constant");
      });
    } catch (const std::invalid_argument& e) {
      throw Diagnostic(describe(n), std::string(n->kind().toQualString()) + ": " + e.what());
    }
  }

  void addOutputs(const jit::Value* out) {
    if (out->node()->kind() == c10::prim::TupleConstruct) {
      for (const jit::Value* item : out->node()->inputs()) addOutputs(item);
      return;
    }
    auto it = values_.find(out);
    if (it == values_.end()) {
      throw Diagnostic(fileName_, std::string("forward returns a value that is not a computed tensor (") +
                                      out->type()->str() + ")");
    }
    graph_.addOutput(it->second);
  }

  Graph& graph_;
  std::string fileName_;
  std::unordered_map<const jit::Value*, ValueId> values_;
  // The aten::scalar_tensor nodes made of 0-dim constants, by constant and dtype.
  std::map<std::pair<const jit::Value*, c10::ScalarType>, ValueId> scalarTensors_;
  // The nodes made of larger constants (smallConstant), by constant.
  std::unordered_map<const jit::Value*, ValueId> constants_;
  ShapeFolder folder_{graph_, values_};
  ViewTable views_;
  std::unordered_map<ValueId, std::string> producers_;
};

}  // namespace

Graph convertTrace(const jit::Graph& traced, const std::vector<InputSpec>& ordered,
                   const std::vector<NamedTensor>& state, const std::string& fileName) {
  Graph graph;
  graph.setWeights(WeightsRef{fileName, "torchscript"});
  Converter converter(graph, fileName);
  std::vector<std::pair<const jit::Value*, ValueId>> stateInputs;
  for (size_t i = 0; i < ordered.size(); ++i) {
    ValueId id = graph.addInput(Value{ordered[i].name, ordered[i].dtype, ordered[i].shape}, InputKind::Data);
    converter.bindInput(traced.inputs()[i], id);
  }
  for (size_t i = 0; i < state.size(); ++i) {
    const at::Tensor& t = state[i].tensor;
    Value v{state[i].name, t.scalar_type(), t.sizes().vec()};
    bool requiresGrad = state[i].kind == InputKind::Parameter && t.requires_grad();
    ValueId id = graph.addInput(std::move(v), state[i].kind, requiresGrad);
    const jit::Value* jv = traced.inputs()[ordered.size() + i];
    converter.bindInput(jv, id);
    stateInputs.emplace_back(jv, id);
  }
  converter.convert(traced);
  converter.recordUpdates(stateInputs);
  eliminateDeadNodes(graph);
  retypeFromConstants(graph);
  return graph;
}

}  // namespace torchscript_detail
}  // namespace spmd

#include "spmd/io/torchscript.h"

#include "spmd/ops/dtype.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/support/diagnostic.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/script.h>

#include <set>
#include <sstream>
#include <unordered_map>

namespace spmd {
namespace {

namespace jit = torch::jit;

// The Python source range a (possibly deserialized) range was generated from.
c10::optional<jit::SourceRange> originalRange(const jit::SourceRange& range) {
  if (auto original = range.findSourceRangeThatGenerated()) return original;
  if (range.file_line_col()) return range;
  return c10::nullopt;
}

bool isLibraryFile(const std::string& file) { return file.find("/torch/") != std::string::npos; }

// Of `frames` (innermost first), the innermost one in the user's code, else
// the innermost one with a known Python line.
c10::optional<jit::SourceRange> preferredSource(const std::vector<jit::SourceRange>& frames) {
  c10::optional<jit::SourceRange> fallback;
  for (const auto& frame : frames) {
    auto original = originalRange(frame);
    if (!original || std::get<0>(*original->file_line_col()).empty()) continue;
    if (!isLibraryFile(std::get<0>(*original->file_line_col()))) return original;
    if (!fallback) fallback = original;
  }
  return fallback;
}

std::string baseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// torch.jit.trace records each op's Python stack as the text of its source
// range, one "path(line): function" per frame, innermost first: the first
// frame outside torch is the user's line.
std::string userFrameInTracedStack(const jit::SourceRange& range) {
  if (!range.source()) return "";
  std::istringstream lines(range.source()->text_str().str());
  std::string line;
  while (std::getline(lines, line)) {
    size_t close = line.rfind("): ");
    size_t open = close == std::string::npos ? std::string::npos : line.rfind('(', close);
    if (open == std::string::npos || open == 0) continue;
    const std::string path = line.substr(0, open), number = line.substr(open + 1, close - open - 1);
    if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!isLibraryFile(path)) return baseName(path) + ":" + number;
  }
  return "";
}

// "model.py:12" for a node whose Python source is known, else "".
std::string sourceOf(const jit::Node* n) {
  std::vector<jit::SourceRange> frames{n->sourceRange()};
  if (auto callstack = n->callstack()) {
    auto calls = (*callstack)->vec();
    for (auto it = calls.rbegin(); it != calls.rend(); ++it) frames.push_back(std::get<1>(*it));
  }
  auto range = preferredSource(frames);
  if (!range) return "";
  auto flc = range->file_line_col();
  if (isLibraryFile(std::get<0>(*flc))) {
    std::string traced = userFrameInTracedStack(*range);
    if (!traced.empty()) return traced;
  }
  return baseName(std::get<0>(*flc)) + ":" + std::to_string(std::get<1>(*flc));
}

std::string describe(const jit::Node* n) {
  std::string src = sourceOf(n);
  return src.empty() ? std::string(n->kind().toQualString()) : src;
}

// ---- data-dependent control flow ------------------------------------------

// Ops that turn tensor contents into Python values.
bool readsTensorData(const jit::Node* n) {
  static const std::set<std::string> ops = {
      "aten::item", "aten::Bool", "aten::Int", "aten::Float", "aten::ScalarImplicit",
      "aten::IntImplicit", "aten::FloatImplicit", "aten::is_nonzero", "aten::_local_scalar_dense",
      "aten::equal", "aten::allclose", "aten::tolist", "prim::TensorToNum"};
  if (!ops.count(n->kind().toQualString())) return false;
  for (const jit::Value* in : n->inputs()) {
    if (in->type()->isSubtypeOf(*c10::TensorType::get())) return true;
  }
  return false;
}

// Marks every non-tensor value computed from tensor contents, and rejects
// prim::If / prim::Loop that branch on one: tracing would bake in one path.
void markDataDependence(const jit::Block* block, std::set<const jit::Value*>& dependent) {
  for (const jit::Node* n : block->nodes()) {
    bool fromData = readsTensorData(n);
    for (const jit::Value* in : n->inputs()) fromData = fromData || dependent.count(in);
    const bool branches = n->kind() == c10::prim::If || n->kind() == c10::prim::Loop;
    if (branches) {
      // If: input 0 is the condition. Loop: inputs 0 and 1 are trip count and condition.
      size_t controls = n->kind() == c10::prim::If ? 1 : 2;
      for (size_t i = 0; i < controls && i < n->inputs().size(); ++i) {
        if (dependent.count(n->inputs()[i])) {
          throw Diagnostic(describe(n), std::string("data-dependent control flow: ") +
                                            n->kind().toQualString() +
                                            " branches on tensor values, which a static graph cannot express");
        }
      }
    }
    for (const jit::Block* b : n->blocks()) markDataDependence(b, dependent);
    if (!fromData) continue;
    for (const jit::Value* out : n->outputs()) {
      if (!out->type()->isSubtypeOf(*c10::TensorType::get())) dependent.insert(out);
    }
  }
}

// ---- running the module under the tracer ----------------------------------

at::Tensor exampleInput(const InputSpec& spec, at::Generator& gen) {
  auto options = at::TensorOptions().dtype(spec.dtype);
  // Integer inputs are indices or targets: zeros are valid for any vocabulary.
  if (!c10::isFloatingType(spec.dtype)) return at::zeros(spec.shape, options);
  return at::randn(spec.shape, gen, options);
}

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  InputKind kind;
};

// Parameters then buffers, each tensor once under its first name, as
// named_parameters() / named_buffers() deduplicate shared tensors.
std::vector<NamedTensor> moduleState(const jit::Module& module) {
  std::vector<NamedTensor> state;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (seen.insert(p.value.unsafeGetTensorImpl()).second) {
      state.push_back({p.name, p.value, InputKind::Parameter});
    }
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    if (seen.insert(b.value.unsafeGetTensorImpl()).second) {
      state.push_back({b.name, b.value, InputKind::Buffer});
    }
  }
  return state;
}

// Records on each traced node the source line of the TorchScript frame that
// called it, preferring the innermost frame in the user's own code over
// torch.nn's library code.
void recordInterpreterSource(jit::Node* n) {
  std::vector<jit::SourceRange> frames;
  for (const auto& entry : jit::currentCallstack()) frames.push_back(entry.range);  // innermost first
  if (auto range = preferredSource(frames)) n->setSourceRange(*range);
}

std::shared_ptr<jit::Graph> traceForward(const jit::Module& module, std::shared_ptr<jit::Graph> forward,
                                         const std::vector<at::Tensor>& dataInputs,
                                         const std::vector<NamedTensor>& state) {
  jit::Stack traceInputs;
  for (const auto& t : dataInputs) traceInputs.emplace_back(t);
  for (const auto& s : state) traceInputs.emplace_back(s.tensor);

  jit::Code code(forward, "forward");
  auto run = [&](jit::Stack) {
    jit::Stack stack;
    stack.emplace_back(module._ivalue());
    for (const auto& t : dataInputs) stack.emplace_back(t);
    jit::InterpreterState(code).run(stack);
    return stack;
  };
  at::NoGradGuard noGrad;
  jit::tracer::setRecordSourceLocation(&recordInterpreterSource);
  try {
    auto traced = jit::tracer::trace(std::move(traceInputs), run,
                                     [](const at::Tensor&) { return std::string(); },
                                     /*strict=*/false, /*force_outplace=*/false);
    jit::tracer::setRecordSourceLocation([](jit::Node*) {});
    return traced.first->graph;
  } catch (...) {
    jit::tracer::setRecordSourceLocation([](jit::Node*) {});
    throw;
  }
}

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
    const bool inPlace = schema->is_mutable() && kind.back() == '_';
    Node node;
    node.op = inPlace ? kind.substr(0, kind.size() - 1) : kind;
    node.overload = schema->overload_name();
    node.meta.source = sourceOf(n);
    if (inPlace) requireOutOfPlaceForm(n, node);
    if (n->inputs().size() != schema->arguments().size()) {
      throw Diagnostic(describe(n), kind + ": traced call has " + std::to_string(n->inputs().size()) +
                                        " arguments, the schema " +
                                        std::to_string(schema->arguments().size()));
    }
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      node.args.push_back(convertArg(n, schema->arguments()[i], n->inputs()[i]));
    }
    if (inPlace) rejectViewMutation(n, node);
    for (const jit::Value* out : n->outputs()) {
      if (out->type()->kind() == c10::TypeKind::ListType) {
        for (const jit::Value* item : unpackedItems(n, out)) node.outputs.push_back(addTensorValue(n, item));
      } else {
        node.outputs.push_back(addTensorValue(n, out));
      }
    }
    if (inPlace) values_[n->inputs()[0]] = node.outputs[0];  // later readers see the update
    graph_.addNode(std::move(node));
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

  void requireOutOfPlaceForm(const jit::Node* n, const Node& node) {
    if (!c10::Dispatcher::singleton().findSchema({node.op, node.overload})) {
      throw Diagnostic(describe(n), std::string("in-place operation '") + n->kind().toQualString() +
                                        "' has no out-of-place form to rewrite it to");
    }
  }

  // Rewriting x.add_(y) as x' = x + y is only sound when nothing else
  // aliases x: reject in-place writes to views.
  void rejectViewMutation(const jit::Node* n, const Node& node) {
    if (node.args.empty() || node.args[0].kind != Arg::Kind::Value) return;
    auto producer = producers_.find(node.args[0].value);
    if (producer != producers_.end() && isViewOp(producer->second)) {
      throw Diagnostic(describe(n), std::string("in-place operation '") + n->kind().toQualString() +
                                        "' writes to a view (" + producer->second +
                                        "), which the functional graph cannot express");
    }
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
  // nodes of the same dtype and value.
  ValueId scalarTensor(const jit::Node* user, const jit::Value* v, const at::Tensor& t) {
    Node node;
    node.op = "aten::scalar_tensor";
    node.meta.source = sourceOf(user);
    const bool integral = !c10::isFloatingType(t.scalar_type()) && t.scalar_type() != c10::ScalarType::Bool;
    node.args.push_back(integral ? Arg::ofInt(t.item<int64_t>())
                        : t.scalar_type() == c10::ScalarType::Bool ? Arg::ofBool(t.item<bool>())
                                                                   : Arg::ofFloat(t.item<double>()));
    Arg dtype;
    dtype.kind = Arg::Kind::DType;
    dtype.i = static_cast<int64_t>(t.scalar_type());
    node.args.push_back(dtype);
    node.args.push_back(Arg::none());  // layout
    node.args.push_back(Arg::none());  // device
    node.args.push_back(Arg::none());  // pin_memory
    ValueId id = newValue("scalar_tensor", t.scalar_type(), {});
    node.outputs.push_back(id);
    values_[v] = id;
    graph_.addNode(std::move(node));
    return id;
  }

  ValueId tensorValue(const jit::Node* n, const jit::Value* v) {
    auto it = values_.find(v);
    if (it != values_.end()) return it->second;
    if (v->node()->kind() == c10::prim::Constant) {
      auto constant = jit::toIValue(v);
      if (constant && constant->isTensor() && constant->toTensor().dim() == 0) {
        return scalarTensor(n, v, constant->toTensor());
      }
      throw Diagnostic(describe(n), std::string(n->kind().toQualString()) +
                                        " uses a tensor constant; register it as a buffer instead");
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
      if (list->getElementType()->kind() == c10::TypeKind::TensorType) {
        if (actual->node()->kind() != c10::prim::ListConstruct) {
          throw Diagnostic(describe(n), formal.name() + ": tensor list not built by a list literal");
        }
        Arg a;
        a.kind = Arg::Kind::Values;
        for (const jit::Value* item : actual->node()->inputs()) a.values.push_back(tensorValue(n, item));
        return a;
      }
    }
    auto constant = constantValue(actual);
    if (!constant) {
      throw Diagnostic(describe(n), std::string(n->kind().toQualString()) + ": argument '" + formal.name() +
                                        "' is computed at run time (" + actual->node()->kind().toQualString() +
                                        "), not a constant");
    }
    return constantArg(n, formal, type, *constant);
  }

  // A constant, or a list literal of constants (how traces spell int[]).
  static c10::optional<c10::IValue> constantValue(const jit::Value* v) {
    if (auto c = jit::toIValue(v)) return c;
    if (v->node()->kind() != c10::prim::ListConstruct) return c10::nullopt;
    std::vector<c10::IValue> items;
    for (const jit::Value* item : v->node()->inputs()) {
      auto c = jit::toIValue(item);
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

  Arg constantArg(const jit::Node* n, const c10::Argument& formal, const c10::TypePtr& type,
                  const c10::IValue& c) {
    Arg a;
    switch (type->kind()) {
      case c10::TypeKind::ScalarTypeType: a.kind = Arg::Kind::DType; a.i = c.toInt(); return a;
      case c10::TypeKind::LayoutType: a.kind = Arg::Kind::Layout; a.i = c.toInt(); return a;
      case c10::TypeKind::MemoryFormatType: a.kind = Arg::Kind::MemoryFormat; a.i = c.toInt(); return a;
      case c10::TypeKind::DeviceObjType:
        // A module traced on the meta device names it where it used x.device.
        a.kind = Arg::Kind::Device;
        a.s = c.toDevice().is_meta() ? "cpu" : c.toDevice().str();
        return a;
      case c10::TypeKind::StringType: a.kind = Arg::Kind::Str; a.s = c.toStringRef(); return a;
      default: break;
    }
    if (c.isNone()) return Arg::none();
    if (c.isBool()) return Arg::ofBool(c.toBool());
    if (c.isInt()) return Arg::ofInt(c.toInt());
    if (c.isDouble()) return Arg::ofFloat(c.toDouble());
    if (c.isIntList()) { a.kind = Arg::Kind::Ints; a.ints = c.toIntVector(); return a; }
    if (c.isDoubleList()) { a.kind = Arg::Kind::Floats; a.floats = c.toDoubleVector(); return a; }
    if (c.isBoolList()) {
      a.kind = Arg::Kind::Bools;
      for (bool b : c.toBoolList()) a.bools.push_back(b);
      return a;
    }
    throw Diagnostic(describe(n), std::string(n->kind().toQualString()) + ": argument '" + formal.name() +
                                      "' has an unsupported constant of type " + c.tagKind());
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
  std::unordered_map<ValueId, std::string> producers_;
};

std::vector<std::string> forwardArgumentNames(const jit::Module& module) {
  std::vector<std::string> names;
  const auto& args = module.get_method("forward").function().getSchema().arguments();
  for (size_t i = 1; i < args.size(); ++i) names.push_back(args[i].name());  // 0 is self
  return names;
}

std::vector<InputSpec> orderSpecs(const std::vector<std::string>& names, const std::vector<InputSpec>& specs) {
  std::vector<InputSpec> ordered;
  for (const auto& name : names) {
    auto it = std::find_if(specs.begin(), specs.end(), [&](const InputSpec& s) { return s.name == name; });
    if (it == specs.end()) {
      throw Diagnostic("forward(" + name + ")", "missing --input spec for '" + name + "'");
    }
    ordered.push_back(*it);
  }
  for (const auto& s : specs) {
    if (std::find(names.begin(), names.end(), s.name) == names.end()) {
      throw Diagnostic("--input " + s.name, "forward has no argument '" + s.name + "'");
    }
  }
  return ordered;
}

// The TorchScript interpreter reports a failing op with both tracebacks; the
// user needs the innermost line of their own code and the error's last line.
Diagnostic forwardFailure(const std::string& report) {
  std::istringstream lines(report);
  std::string line, lastLine, where = "forward";
  bool original = false;
  while (std::getline(lines, line)) {
    if (line.find("original code") != std::string::npos) original = true;
    size_t file = line.find("File \"");
    size_t lineNo = line.find("\", line ");
    if (original && file != std::string::npos && lineNo != std::string::npos) {
      std::string path = line.substr(file + 6, lineNo - file - 6);
      if (!isLibraryFile(path)) {
        std::string number = line.substr(lineNo + 8);
        number = number.substr(0, number.find_first_not_of("0123456789"));
        where = path.substr(path.find_last_of('/') + 1) + ":" + number;
      }
    }
    if (line.find_first_not_of(" ") != std::string::npos) lastLine = line;
  }
  size_t start = lastLine.find_first_not_of(" ");
  lastLine = start == std::string::npos ? report : lastLine.substr(start);
  return Diagnostic(where, "running forward on the given input shapes failed: " + lastLine);
}

jit::Module loadModule(const std::string& bytes) {
  std::istringstream in(bytes);
  try {
    return jit::load(in);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw Diagnostic("", "not a loadable TorchScript module: " + what.substr(0, what.find('\n')));
  }
}


// The module's parameters and buffers as meta tensors (shared ones stay shared).
std::vector<NamedTensor> onMeta(const std::vector<NamedTensor>& state) {
  std::vector<NamedTensor> meta;
  for (const auto& s : state) {
    at::Tensor m = at::empty_strided(s.tensor.sizes(), s.tensor.strides(), s.tensor.options().device(at::kMeta));
    meta.push_back({s.name, m.requires_grad_(s.tensor.requires_grad()), s.kind});
  }
  return meta;
}

// Puts `to` (in moduleState's order) into the module's parameter and buffer
// slots, wherever the tensor now there (in moduleState's order) sits.
void swapModuleTensors(jit::Module& module, const std::vector<NamedTensor>& to) {
  std::map<std::string, at::Tensor> byName;
  for (const auto& t : to) byName[t.name] = t.tensor;
  std::map<const c10::TensorImpl*, at::Tensor> byImpl;
  const auto current = moduleState(module);
  for (size_t i = 0; i < current.size(); ++i) byImpl[current[i].tensor.unsafeGetTensorImpl()] = byName.at(current[i].name);
  for (auto sub : module.modules()) {
    std::vector<std::pair<std::string, at::Tensor>> slots;
    for (const auto& p : sub.named_parameters(/*recurse=*/false)) slots.emplace_back(p.name, p.value);
    for (const auto& b : sub.named_buffers(/*recurse=*/false)) slots.emplace_back(b.name, b.value);
    for (const auto& [name, t] : slots) {
      auto it = byImpl.find(t.unsafeGetTensorImpl());
      if (it != byImpl.end()) sub.setattr(name, it->second);
    }
  }
}

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
  return graph;
}

}  // namespace

Graph importTorchScript(const std::string& bytes, const std::string& fileName,
                        const std::vector<InputSpec>& specs, TraceOn traceOn) {
  ensureSpmdOpsRegistered();
  jit::Module module = loadModule(bytes);
  if (!module.find_method("forward")) throw Diagnostic("", "the module has no forward method");
  const auto ordered = orderSpecs(forwardArgumentNames(module), specs);

  auto forward = jit::toGraphFunction(module.get_method("forward").function()).graph()->copy();
  jit::Inline(*forward);
  std::set<const jit::Value*> dependent;
  markDataDependence(forward->block(), dependent);

  const auto state = moduleState(module);
  // Tracing on the meta device computes nothing, so a large model imports in
  // a moment. Where an op has no meta kernel or the trace reads a value (a
  // tensor constant, .item()), the module is traced on CPU tensors instead.
  // (LibTorch 1.13 lacks meta kernels for many ops, relu among them: there
  // most modules take the CPU path.)
  if (traceOn != TraceOn::Cpu) try {
    std::vector<at::Tensor> metaInputs;
    for (const auto& spec : ordered) metaInputs.push_back(at::zeros(spec.shape, at::TensorOptions().dtype(spec.dtype).device(at::kMeta)));
    const auto metaState = onMeta(state);
    swapModuleTensors(module, metaState);
    auto traced = traceForward(module, forward, metaInputs, metaState);
    Graph graph = convertTrace(*traced, ordered, metaState, fileName);
    swapModuleTensors(module, state);
    return graph;
  } catch (const std::exception&) {
    swapModuleTensors(module, state);
    if (traceOn == TraceOn::Meta) throw;
  }
  at::Generator gen = at::detail::createCPUGenerator(0);
  std::vector<at::Tensor> dataInputs;
  for (const auto& spec : ordered) dataInputs.push_back(exampleInput(spec, gen));
  std::shared_ptr<jit::Graph> traced;
  try {
    traced = traceForward(module, forward, dataInputs, state);
  } catch (const c10::Error& e) {
    throw forwardFailure(e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw forwardFailure(e.what());
  }
  return convertTrace(*traced, ordered, state, fileName);
}

}  // namespace spmd

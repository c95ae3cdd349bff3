#include "spmd/ir/verify.h"

#include "spmd/ir/shard_layout.h"

#include "spmd/ops/dtype.h"
#include "spmd/ir/boxing.h"
#include "spmd/ops/meta.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <sstream>

namespace spmd {
namespace {

std::string shapeText(c10::ArrayRef<int64_t> shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << "]";
  return out.str();
}

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Whether a constant or value argument fits the schema's type.
bool argFits(const Arg& a, const c10::TypePtr& formal) {
  c10::TypePtr type = formal;
  if (auto opt = type->cast<c10::OptionalType>()) {
    if (a.kind == Arg::Kind::None) return true;
    type = opt->getElementType();
  }
  using K = Arg::Kind;
  switch (type->kind()) {
    case c10::TypeKind::TensorType: return a.kind == K::Value;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: return a.kind == K::Int;
    case c10::TypeKind::FloatType: return a.kind == K::Float;
    case c10::TypeKind::NumberType: return a.kind == K::Int || a.kind == K::Float || a.kind == K::Bool;
    case c10::TypeKind::BoolType: return a.kind == K::Bool;
    case c10::TypeKind::StringType: return a.kind == K::Str;
    case c10::TypeKind::ScalarTypeType: return a.kind == K::DType;
    case c10::TypeKind::LayoutType: return a.kind == K::Layout;
    case c10::TypeKind::MemoryFormatType: return a.kind == K::MemoryFormat;
    case c10::TypeKind::DeviceObjType: return a.kind == K::Device;
    case c10::TypeKind::ListType: {
      auto elem = type->castRaw<c10::ListType>()->getElementType();
      if (auto optional = elem->cast<c10::OptionalType>()) {  // Tensor?[]: elements may be absent
        return a.kind == K::Values && optional->getElementType()->kind() == c10::TypeKind::TensorType;
      }
      const bool anyAbsent = std::find(a.values.begin(), a.values.end(), kNoValue) != a.values.end();
      switch (elem->kind()) {
        case c10::TypeKind::TensorType: return a.kind == K::Values && !anyAbsent;
        case c10::TypeKind::IntType:
        case c10::TypeKind::SymIntType: return a.kind == K::Ints;
        case c10::TypeKind::FloatType: return a.kind == K::Floats;
        case c10::TypeKind::BoolType: return a.kind == K::Bools;
        default: return false;
      }
    }
    default: return false;
  }
}

bool returnsList(const c10::FunctionSchema& schema) {
  return schema.returns().size() == 1 && schema.returns()[0].type()->kind() == c10::TypeKind::ListType;
}

class Verifier {
 public:
  explicit Verifier(const Graph& graph) : graph_(graph), defined_(graph.numValues(), false),
                                          meta_(graph.numValues()) {}

  // The meta tensors the run left for each value (after run()).
  std::vector<at::Tensor> takeMetaValues() { return std::move(meta_); }

  std::vector<Problem> run() {
    for (size_t i = 0; i < graph_.inputs().size(); ++i) defineInput(i);
    for (size_t i = 0; i < graph_.nodes().size(); ++i) checkNode(i);
    for (size_t i = 0; i < graph_.outputs().size(); ++i) {
      if (!defined_[graph_.outputs()[i]]) problem("/outputs/" + std::to_string(i), "output is not defined");
    }
    for (size_t i = 0; i < graph_.updates().size(); ++i) checkUpdate(i);
    for (size_t i = 0; i < graph_.gradients().size(); ++i) checkGradient(i);
    checkUpdatedOnce();
    checkTraining();
    return std::move(problems_);
  }

 private:
  void problem(std::string where, std::string what) { problems_.push_back({std::move(where), std::move(what)}); }

  // The training config's promises: a scheduled step reads its rate from
  // the input "lr" (f64[], kind schedule), the only such input; a clipped
  // step's second output is the norm.
  void checkTraining() {
    const TrainingConfig& t = graph_.training();
    bool sawLr = false;
    for (size_t i = 0; i < graph_.inputs().size(); ++i) {
      const GraphInput& in = graph_.inputs()[i];
      if (in.kind != InputKind::Schedule) continue;
      const Value& v = graph_.value(in.value);
      const std::string where = "/inputs/" + std::to_string(i);
      if (v.name != "lr" || v.dtype != c10::ScalarType::Double || !v.shape.empty()) {
        problem(where, "the only schedule input is lr: f64[], got %" + v.name + ": " + typeText(v));
      } else if (!t.scheduled) {
        problem(where, "a schedule input, but the graph's training config has no lr-schedule");
      }
      sawLr = true;
    }
    if (t.scheduled && !sawLr) problem("/training", "an lr-schedule, but no schedule input lr");
    if (t.clips()) {
      const auto& outs = graph_.outputs();
      if (outs.size() < 2 || !graph_.value(outs[1]).shape.empty()) {
        problem("/outputs", "clip-grad-norm: the second output must be the gradient norm, a scalar");
      }
    }
  }

  void defineInput(size_t i) {
    ValueId id = graph_.inputs()[i].value;
    defined_[id] = true;
    const Value& v = graph_.value(id);
    meta_[id] = metaTensorOf(v);
  }

  void checkNode(size_t index) {
    const Node& node = graph_.nodes()[index];
    const std::string where = "/nodes/" + std::to_string(index);
    const std::string label = node.qualifiedName() + (node.meta.source.empty() ? "" : " at " + node.meta.source);
    bool argsDefined = checkArgsDefined(node, where);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      if (node.outputs[k] != kNoValue && defined_[node.outputs[k]]) {
        problem(where + "/outputs/" + std::to_string(k), "value '" + graph_.value(node.outputs[k]).name + "' defined twice");
      }
    }
    auto op = findOperator(node);
    bool ok = argsDefined && op && checkSignature(node, op->schema(), where, label);
    if (!op) problem(where + "/op", "unknown operator '" + node.qualifiedName() + "' in this LibTorch");
    if (ok) checkShapes(node, *op, where, label);
    for (ValueId out : node.outputs) {
      if (out == kNoValue) continue;
      defined_[out] = true;
      // A node that could not be checked still gives later nodes tensors of
      // its declared types, so that one defect is reported once.
      if (!meta_[out].defined()) meta_[out] = metaTensorOf(graph_.value(out));
    }
  }

  bool checkArgsDefined(const Node& node, const std::string& where) {
    bool ok = true;
    auto check = [&](ValueId v, const std::string& at) {
      if (!defined_[v]) {
        problem(at, "value '" + graph_.value(v).name + "' is used before it is defined");
        ok = false;
      }
    };
    for (size_t i = 0; i < node.args.size(); ++i) {
      const Arg& a = node.args[i];
      std::string at = where + "/args/" + std::to_string(i);
      if (a.kind == Arg::Kind::Value) check(a.value, at + "/value");
      for (size_t k = 0; k < a.values.size(); ++k) {
        if (a.values[k] != kNoValue) check(a.values[k], at + "/values/" + std::to_string(k));
      }
    }
    return ok;
  }

  bool checkSignature(const Node& node, const c10::FunctionSchema& schema, const std::string& where,
                      const std::string& label) {
    const auto& formals = schema.arguments();
    if (node.args.size() != formals.size()) {
      problem(where + "/args", label + " takes " + std::to_string(formals.size()) + " arguments, got " +
                                   std::to_string(node.args.size()));
      return false;
    }
    bool ok = true;
    for (size_t i = 0; i < formals.size(); ++i) {
      if (!argFits(node.args[i], formals[i].real_type())) {
        problem(where + "/args/" + std::to_string(i),
                label + ": argument '" + formals[i].name() + "' must be " + formals[i].real_type()->str() +
                    ", got " + argKindName(node.args[i].kind));
        ok = false;
      }
    }
    if (!returnsList(schema) && node.outputs.size() != schema.returns().size()) {
      problem(where + "/outputs", label + " returns " + std::to_string(schema.returns().size()) +
                                      " values, the node has " + std::to_string(node.outputs.size()));
      ok = false;
    }
    return ok;
  }

  // The sizes and strides the node's tensor arguments had.
  std::string layoutsOf(const Node& node) {
    std::string text;
    for (const Arg& a : node.args) {
      if (a.kind != Arg::Kind::Value || !meta_[a.value].defined()) continue;
      const at::Tensor& t = meta_[a.value];
      text += std::string(text.empty() ? " (" : ", ") + "%" + graph_.value(a.value).name + " sizes " +
              c10::str(t.sizes()) + " strides " + c10::str(t.strides());
    }
    return text.empty() ? text : text + ")";
  }

  // A rejection that depends on the layout (a view of a non-contiguous
  // tensor: an internal error of a pass) says what the layouts were.
  void rejected(const Node& node, const std::string& where, const std::string& label, const std::string& why) {
    const bool layout = why.find("stride") != std::string::npos;
    problem(where, label + " rejects its arguments" + (layout ? layoutsOf(node) : "") + ": " + why);
  }

  void checkShapes(const Node& node, const c10::OperatorHandle& op, const std::string& where,
                   const std::string& label) {
    std::vector<at::Tensor> results;
    try {
      results = inferNodeOnMeta(node, op, [&](ValueId v) { return meta_[v]; });
    } catch (const c10::Error& e) {
      rejected(node, where, label, firstLine(e.what_without_backtrace()));
      return;
    } catch (const std::exception& e) {
      rejected(node, where, label, firstLine(e.what()));
      return;
    }
    // A Tensor[] result may be declared up to its last item the graph reads.
    const bool listPrefix = returnsList(op.schema()) && node.outputs.size() <= results.size();
    if (results.size() != node.outputs.size() && !listPrefix) {
      problem(where + "/outputs", label + " produced " + std::to_string(results.size()) + " tensors, the node has " +
                                      std::to_string(node.outputs.size()) + " outputs");
      return;
    }
    for (size_t k = 0; k < node.outputs.size(); ++k) checkOutput(node, k, results[k], where, label);
  }

  void checkOutput(const Node& node, size_t k, const at::Tensor& got, const std::string& where,
                   const std::string& label) {
    ValueId id = node.outputs[k];
    if (id == kNoValue) return;  // the graph does not use this result
    const Value& v = graph_.value(id);
    const std::string at = where + "/outputs/" + std::to_string(k);
    if (!got.defined()) {
      problem(at, label + " leaves this result undefined; the graph needs it as '" + v.name + "'");
      return;
    }
    if (got.scalar_type() != v.dtype) {
      problem(at, label + " gives dtype " + dtypeName(got.scalar_type()) + ", the graph says " + dtypeName(v.dtype));
    } else if (got.sizes() != c10::IntArrayRef(v.shape)) {
      problem(at, label + " gives shape " + shapeText(got.sizes()) + ", the graph says " + shapeText(v.shape));
    }
    // Carry what the op really produced (strides included) to later nodes:
    // views then see what eager would, and a wrong declaration is reported
    // once rather than again at every consumer.
    meta_[id] = got;
  }

  void checkUpdate(size_t i) {
    const StateUpdate& u = graph_.updates()[i];
    const std::string where = "/updates/" + std::to_string(i);
    bool isState = false;
    for (const auto& in : graph_.inputs()) {
      if (in.value == u.input) isState = in.kind == InputKind::Buffer || in.kind == InputKind::State || in.kind == InputKind::Parameter;
    }
    if (!isState) problem(where + "/input", "'" + graph_.value(u.input).name + "' is not a parameter, buffer or state input");
    if (!defined_[u.value]) problem(where + "/value", "value '" + graph_.value(u.value).name + "' is not defined");
    const Value& a = graph_.value(u.input);
    const Value& b = graph_.value(u.value);
    if (a.dtype != b.dtype || a.shape != b.shape) {
      problem(where, "update of '" + a.name + "' " + dtypeShortName(a.dtype) + shapeText(a.shape) + " with '" + b.name +
                         "' " + dtypeShortName(b.dtype) + shapeText(b.shape));
    }
  }

  void checkGradient(size_t i) {
    const Gradient& g = graph_.gradients()[i];
    const std::string where = "/gradients/" + std::to_string(i);
    const GraphInput* input = graph_.inputOf(g.parameter);
    if (!input || input->kind != InputKind::Parameter) {
      problem(where + "/parameter", "'" + graph_.value(g.parameter).name + "' is not a parameter input");
    }
    if (!defined_[g.value]) problem(where + "/value", "value '" + graph_.value(g.value).name + "' is not defined");
    if (g.reduced != kNoValue && !defined_[g.reduced]) {
      problem(where + "/reduced", "value '" + graph_.value(g.reduced).name + "' is not defined");
    }
    const Value& p = graph_.value(g.parameter);
    const Value& v = graph_.value(g.value);
    // --shard parameters: the parameter is this rank's shard of the whole
    // tensor its local gradient has the shape of.
    const bool sharded = graph_.training().shard == ShardMode::Parameters &&
                         isShardOf(p.shape, v.shape, graph_.training().worldSize);
    if (p.dtype != v.dtype || (p.shape != v.shape && !sharded)) {
      problem(where, "gradient of '" + p.name + "' " + dtypeShortName(p.dtype) + shapeText(p.shape) + " is '" + v.name +
                         "' " + dtypeShortName(v.dtype) + shapeText(v.shape));
    }
  }

  // Each input is updated once per iteration: an unrolled graph may update it
  // a second time from a node tagged "last", which replaces the first then.
  void checkUpdatedOnce() {
    std::vector<IterationTag> tag(graph_.numValues(), IterationTag::Every);
    for (size_t i = 0; i < graph_.nodes().size(); ++i) {
      const Node& n = graph_.nodes()[i];
      if (n.meta.iteration != IterationTag::Every && graph_.iters() == 0) {
        problem("/nodes/" + std::to_string(i) + "/meta/iteration", "iteration tag in a graph that is not unrolled");
      }
      for (ValueId o : n.outputs) {
        if (o != kNoValue) tag[o] = n.meta.iteration;
      }
    }
    std::map<ValueId, std::pair<int, int>> counts;  // input -> (other updates, updates from "last" nodes)
    for (size_t i = 0; i < graph_.updates().size(); ++i) {
      const StateUpdate& u = graph_.updates()[i];
      auto& [other, last] = counts[u.input];
      (tag[u.value] == IterationTag::LastOnly ? last : other) += 1;
      if (other > 1 || last > 1) problem("/updates/" + std::to_string(i), "'" + graph_.value(u.input).name + "' is updated twice");
    }
  }

  const Graph& graph_;
  std::vector<bool> defined_;
  std::vector<at::Tensor> meta_;
  std::vector<Problem> problems_;
};

}  // namespace

std::vector<Problem> verifyGraph(const Graph& graph) {
  const MetaFallbackScope metaFallback;  // once for all nodes, not per node
  return Verifier(graph).run();
}

std::vector<at::Tensor> metaValues(const Graph& graph) {
  const MetaFallbackScope metaFallback;
  Verifier verifier(graph);
  verifier.run();
  return verifier.takeMetaValues();
}

void verifyGraphOrThrow(const Graph& graph) {
  auto problems = verifyGraph(graph);
  if (!problems.empty()) throw Diagnostic(problems[0].where, problems[0].what);
}

}  // namespace spmd

// autocast (spmd-expand --autocast DEVICE:DTYPE): torch.autocast's policy for
// one device type, made explicit in the forward graph.
//
// Each node runs once under the linked LibTorch's own autocast kernels
// (ops/autocast_probe.h) on stand-ins of its inputs. The casts autocast makes
// become aten::_to_copy nodes before the node, which then reads the cast
// values, with the arguments autocast passes on (softmax gets dtype=float
// where its policy says so); a node autocast leaves alone keeps its
// arguments. An op with no autocast kernel of its own that is a composite of
// ops autocast would cast (eager mode meets those one by one) is replaced by
// the calls it is made of. Every value's dtype follows.
//
// As in eager mode: casts of trainable parameters to the lower precision
// type are made once per step and shared (autocast's weight cache), other
// casts once per use, so that their gradients are cast back and summed as
// PyTorch sums them. Parameters, buffers and optimizer state stay fp32; the
// backward of a cast, which autodiff gets from LibTorch, casts back. Runs
// before autodiff, on the forward only.
//
// One rule is not eager's: what depends on no data and no parameter (tables
// made from buffers and factories, as rotary embeddings' cos and sin) stays
// in full precision. Models compute such tables inside
// `torch.autocast(enabled=False)` (transformers' rotary embeddings), a
// region a trace does not keep; without the rule, bf16 would round the
// positions past 256 and so the tables.
#include "spmd/ir/boxing.h"
#include "spmd/ir/builder.h"
#include "spmd/ops/autocast_probe.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ops/dtype.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName spmd_attention = OpName::known("spmd::attention");
};
const Ops& ops() { return opTable<Ops>(); }

bool isCast(const RecordedCall& call) {
  const std::string& name = call.op.schema().name();
  return (name == "aten::to" || name == "aten::_to_copy") && call.results.size() == 1 && call.args[0].isTensor();
}

bool writesInPlace(const RecordedCall& call) {
  for (const c10::Argument& a : call.op.schema().arguments()) {
    if (a.alias_info() && a.alias_info()->isWrite()) return true;
  }
  return false;
}

std::string where(const Node& node) {
  return node.qualifiedName() + (node.meta.source.empty() ? "" : " at " + node.meta.source);
}

std::unordered_set<ValueId> buffers(const Graph& g) {
  std::unordered_set<ValueId> out;
  for (const GraphInput& in : g.inputs()) {
    if (in.kind == InputKind::Buffer) out.insert(in.value);
  }
  return out;
}

// Whether every tensor the node reads is in `values` (a factory reads none).
bool readsOnly(const Node& node, const std::unordered_set<ValueId>& values) {
  for (const Arg& a : node.args) {
    if (a.kind == Arg::Kind::Value && !values.count(a.value)) return false;
    if (a.kind == Arg::Kind::Values) {
      for (ValueId v : a.values) {
        if (v != kNoValue && !values.count(v)) return false;
      }
    }
  }
  return true;
}

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

class AutocastPass final : public Pass {
 public:
  explicit AutocastPass(AutocastOptions options) : options_(std::move(options)) {}
  bool run(Graph& g, DiagnosticEngine& diagnostics) override;

 private:
  at::Tensor metaOf(const Graph& g, ValueId v) {
    auto it = meta_.find(v);
    return it != meta_.end() ? it->second : metaTensorOf(g.value(v));
  }
  void retype(Graph& g, const Node& node, const std::vector<at::Tensor>& results);
  ValueId cast(GraphBuilder& b, ValueId source, c10::ScalarType dtype);
  bool rewriteWithCasts(Graph& g, const Node& node, const AutocastRun& run);
  bool replaceByCalls(Graph& g, const Node& node, const AutocastRun& run);
  bool castAttentionInputs(Graph& g, const Node& node);

  AutocastOptions options_;
  AutocastPolicy policy_;
  std::unordered_map<ValueId, at::Tensor> meta_;        // each value as the probes saw it
  std::map<std::pair<ValueId, int>, ValueId> weightCasts_;  // (parameter, dtype) -> its cast
  // The graph value of each recorded tensor of the node being rewritten.
  std::unordered_map<const c10::TensorImpl*, ValueId> valueOf_;
};

std::vector<at::Tensor> flattenResults(const std::vector<c10::IValue>& results) {
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& r : results) {
    if (r.isTensor()) {
      tensors.push_back(r.toTensor());
    } else if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorVector()) tensors.push_back(t);
    } else {
      tensors.emplace_back();
    }
  }
  return tensors;
}

// The node's outputs take the dtypes of `results` (its probe's, or its own on meta).
void AutocastPass::retype(Graph& g, const Node& node, const std::vector<at::Tensor>& results) {
  for (size_t k = 0; k < node.outputs.size() && k < results.size(); ++k) {
    const ValueId out = node.outputs[k];
    if (out == kNoValue || !results[k].defined()) continue;
    g.value(out).dtype = results[k].scalar_type();
    meta_[out] = results[k];
  }
}

ValueId AutocastPass::cast(GraphBuilder& b, ValueId source, c10::ScalarType dtype) {
  Graph& g = b.graph();
  const GraphInput* in = g.inputOf(source);
  const bool cached = in && in->kind == InputKind::Parameter && in->requiresGrad && dtype == policy_.dtype &&
                      g.value(source).dtype == c10::ScalarType::Float;
  const auto key = std::make_pair(source, static_cast<int>(dtype));
  if (cached) {
    auto it = weightCasts_.find(key);
    if (it != weightCasts_.end()) return it->second;
  }
  const std::string name = g.value(source).name + "." + dtypeShortName(dtype);
  const ValueId v = b.cast(source, dtype, name);
  if (cached) weightCasts_[key] = v;
  return v;
}

// [casts..., op]: the casts go before the node, which then calls what
// autocast passed on.
bool AutocastPass::rewriteWithCasts(Graph& g, const Node& node, const AutocastRun& run) {
  GraphBuilder b(g);
  b.setInsertionPoint(node);
  b.setMeta(node.meta);
  for (size_t i = 0; i + 1 < run.calls.size(); ++i) {
    const RecordedCall& c = run.calls[i];
    auto from = valueOf_.find(c.args[0].toTensor().unsafeGetTensorImpl());
    if (from == valueOf_.end()) throw Diagnostic(where(node), "autocast: a cast of a tensor that is not in the graph");
    const at::Tensor result = c.results[0].toTensor();
    const ValueId v = cast(b, from->second, result.scalar_type());
    valueOf_[result.unsafeGetTensorImpl()] = v;
  }
  const RecordedCall& main = run.calls.back();
  Node replacement;
  replacement.op = main.op.schema().name();
  replacement.overload = main.op.schema().overload_name();
  replacement.outputs = node.outputs;
  replacement.meta = node.meta;
  const auto& formals = main.op.schema().arguments();
  for (size_t i = 0; i < formals.size(); ++i) {
    replacement.args.push_back(argFromIValue(formals[i], main.args[i], [&](const at::Tensor& t) {
      auto it = valueOf_.find(t.unsafeGetTensorImpl());
      if (it == valueOf_.end()) throw Diagnostic(where(node), "autocast: the op read a tensor that is not in the graph");
      return it->second;
    }));
  }
  retype(g, g.replaceNode(node, std::move(replacement)), flattenResults(main.results));
  return true;
}

// A composite autocast reaches only through its parts: the node becomes
// those parts, its outputs defined by the calls that make them.
bool AutocastPass::replaceByCalls(Graph& g, const Node& node, const AutocastRun& run) {
  std::unordered_map<const c10::TensorImpl*, ValueId> outputOf;
  for (size_t k = 0; k < run.results.size() && k < node.outputs.size(); ++k) {
    if (!run.results[k].isTensor()) return false;
    outputOf[run.results[k].toTensor().unsafeGetTensorImpl()] = node.outputs[k];
  }
  for (const RecordedCall& c : run.calls) {
    if (writesInPlace(c)) return false;
  }
  retype(g, node, flattenResults(run.results));  // the calls that make them must find them typed
  const size_t at = g.indexOf(node);
  const Node* next = at + 1 < g.nodes().size() ? &g.nodes()[at + 1] : nullptr;
  const NodeMeta meta = node.meta;
  const std::string place = where(node);  // the node is gone after extract
  g.extract(node);
  GraphBuilder b(g);
  if (next) b.setInsertionPoint(*next);
  b.setMeta(meta);
  auto valueOf = [&](const at::Tensor& t) {
    auto it = valueOf_.find(t.unsafeGetTensorImpl());
    if (it == valueOf_.end()) throw Diagnostic(place, "autocast: a composite read a tensor none of its calls made");
    return it->second;
  };
  for (const RecordedCall& c : run.calls) {
    // A cast that makes one of the node's results (x.float() under autocast is
    // to -> _to_copy) is written as the call it was, defining that result.
    if (isCast(c) && !outputOf.count(c.results[0].toTensor().unsafeGetTensorImpl())) {
      const at::Tensor result = c.results[0].toTensor();
      valueOf_[result.unsafeGetTensorImpl()] = cast(b, valueOf(c.args[0].toTensor()), result.scalar_type());
      continue;
    }
    std::vector<Arg> args;
    const auto& formals = c.op.schema().arguments();
    for (size_t i = 0; i < formals.size(); ++i) args.push_back(argFromIValue(formals[i], c.args[i], valueOf));
    std::vector<at::Tensor> made;
    std::vector<ValueId> preset;
    for (const c10::IValue& r : c.results) {
      if (!r.isTensor()) break;  // presets cover the leading tensor results only
      made.push_back(r.toTensor());
      auto it = outputOf.find(made.back().unsafeGetTensorImpl());
      preset.push_back(it != outputOf.end() ? it->second : kNoValue);
      if (it != outputOf.end()) outputOf.erase(it);
    }
    const std::vector<ValueId> values = b.callMulti(qualifiedOpName(c.op.operator_name()), std::move(args), "", preset);
    for (size_t k = 0; k < made.size() && k < values.size(); ++k) {
      if (values[k] != kNoValue) valueOf_[made[k].unsafeGetTensorImpl()] = values[k];
    }
  }
  if (!outputOf.empty()) throw Diagnostic(place, "autocast: a composite's calls did not make all its results");
  return true;
}

// The dtype autocast's policy runs softmax in for scores of the lower
// precision type (fp32 on CUDA), or nullopt where it leaves softmax alone.
std::optional<c10::ScalarType> autocastSoftmaxDtype(const AutocastPolicy& policy) {
  const std::optional<c10::OperatorHandle> softmax = findOperator("aten::softmax", "int");
  if (!softmax) return std::nullopt;
  const at::Tensor scores = at::empty({2}, at::TensorOptions().device(at::kMeta).dtype(policy.dtype));
  const AutocastRun run = runUnderAutocast(*softmax, {scores, int64_t{-1}, c10::IValue()}, policy, false);
  const c10::ScalarType dtype = run.results.at(0).toTensor().scalar_type();
  if (dtype == policy.dtype) return std::nullopt;
  return dtype;
}

// Whether autocast casts F.scaled_dot_product_attention's arguments on the
// policy's device (it has a kernel for it: lower precision on CUDA and CPU).
bool autocastCastsSdpa(const AutocastPolicy& policy) {
  const std::optional<c10::OperatorHandle> sdpa = findOperator("aten::scaled_dot_product_attention", "");
  return sdpa && autocastEntry(*sdpa, policy.device) == AutocastEntry::Kernel;
}

// spmd::attention (passes/attention.cpp) written by hand stands for matmuls
// and a softmax; eager autocast casts fp32 q, k and v to the lower
// precision type for the matmuls, and so does this, and runs the softmax
// as its policy runs softmax (in fp32 on CUDA), unless the model gave
// softmax a dtype itself. As a call of F.scaled_dot_product_attention it
// gets what autocast does to that call: its fp32 tensors (an additive mask
// too) cast to the lower precision type. The rest follows inside the op.
bool AutocastPass::castAttentionInputs(Graph& g, const Node& node) {
  GraphBuilder b(g);
  b.setInsertionPoint(node);
  b.setMeta(node.meta);
  const bool sdpa = node.args[kAttentionSdpa].b;
  if (sdpa && !autocastCastsSdpa(policy_)) return false;
  bool changed = false;
  for (size_t i : {kAttentionQuery, kAttentionKey, kAttentionValue, kAttentionMask}) {
    if (node.args[i].kind != Arg::Kind::Value || (i == kAttentionMask && !sdpa)) continue;
    const ValueId v = node.args[i].value;
    if (g.value(v).dtype != c10::ScalarType::Float) continue;
    g.setArg(node, i, Arg::tensor(cast(b, v, policy_.dtype)));
    changed = true;
  }
  if (!sdpa && node.args[kAttentionSoftmaxDtype].kind == Arg::Kind::None) {
    if (const std::optional<c10::ScalarType> dtype = autocastSoftmaxDtype(policy_)) {
      g.setArg(node, kAttentionSoftmaxDtype, dtypeArg(*dtype));
      changed = true;
    }
  }
  // Its result has v's dtype (the probabilities are cast to it).
  const c10::ScalarType dtype = g.value(node.args[kAttentionValue].value).dtype;
  changed = changed || g.value(node.outputs[0]).dtype != dtype;
  g.value(node.outputs[0]).dtype = dtype;
  meta_.erase(node.outputs[0]);
  return changed;
}

bool AutocastPass::run(Graph& g, DiagnosticEngine& diagnostics) {
  if (!options_.enabled) return false;
  policy_ = AutocastPolicy{options_.device == "cpu" ? c10::DeviceType::CPU : c10::DeviceType::CUDA, options_.dtype};
  bool changed = false;
  std::unordered_set<ValueId> tables = buffers(g);  // values that depend on no data or parameter
  for (const Node* node : snapshot(g.nodes())) {
    const std::optional<c10::OperatorHandle> op = findOperator(*node);
    if (!op) continue;  // the verifier has reported it
    if (readsOnly(*node, tables)) {
      for (ValueId out : node->outputs) tables.insert(out);
      retype(g, *node, inferNodeOnMeta(*node, *op, [&](ValueId v) { return metaOf(g, v); }));
      continue;
    }
    if (node->is(ops().spmd_attention)) {
      changed = castAttentionInputs(g, *node) || changed;
      continue;
    }
    const std::vector<c10::IValue> args =
        boxArguments(*node, op->schema(), [&](ValueId v) { return metaOf(g, v); });
    const AutocastEntry entry = autocastEntry(*op, policy_.device);
    AutocastRun run;
    try {
      run = runUnderAutocast(*op, args, policy_, entry == AutocastEntry::Composite);
    } catch (const c10::Error& e) {
      throw Diagnostic(where(*node), "autocast: " + firstLine(e.what_without_backtrace()));
    }
    size_t casts = 0;
    for (const RecordedCall& c : run.calls) casts += isCast(c) ? 1 : 0;
    // A kernel of autocast's may change arguments without a cast (softmax's
    // dtype=float); ops autocast does not take, and composites none of whose
    // parts it casts, only see their results' dtypes follow.
    const bool oneCall = entry == AutocastEntry::Kernel && casts + 1 == run.calls.size() && !isCast(run.calls.back());
    if (entry == AutocastEntry::Untouched || (entry == AutocastEntry::Composite && casts == 0)) {
      retype(g, *node, flattenResults(run.results));
      continue;
    }
    valueOf_.clear();
    // The stand-ins of the node's tensor arguments are its meta inputs.
    for (size_t i = 0; i < args.size(); ++i) {
      const Arg& a = node->args[i];
      if (a.kind == Arg::Kind::Value) valueOf_[args[i].toTensor().unsafeGetTensorImpl()] = a.value;
      if (a.kind == Arg::Kind::Values) {
        const auto items = args[i].toListRef();
        for (size_t k = 0; k < a.values.size() && k < items.size(); ++k) {
          if (a.values[k] != kNoValue) valueOf_[items[k].toTensor().unsafeGetTensorImpl()] = a.values[k];
        }
      }
    }
    const bool done = oneCall ? rewriteWithCasts(g, *node, run) : replaceByCalls(g, *node, run);
    if (!done) {
      diagnostics.note(where(*node), "autocast: left in its own precision: autocast reaches it only through its "
                                     "parts, and they update in place or return non-tensors");
      retype(g, *node, inferNodeOnMeta(*node, *op, [&](ValueId v) { return metaOf(g, v); }));
      continue;
    }
    changed = true;
  }
  return changed;
}

}  // namespace

std::unique_ptr<Pass> createAutocastPass(const PipelineOptions& options) {
  return std::make_unique<AutocastPass>(options.autocast);
}

}  // namespace spmd

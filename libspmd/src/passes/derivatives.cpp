// Derivatives recorded from LibTorch's autograd (see derivatives.h).
//
// One node at a time: its op runs with autograd on meta tensors inside a
// DispatchTrace (ops/autograd_trace.h), which records the calls its forward
// is made of; torch::autograd::grad then records the backward calls PyTorch's
// formulas make. Recorded tensors are mapped back to graph values by
// identity, or, for the shallow copies autograd saves, by storage and
// geometry. The backward calls are written into the graph in order, in-place
// ones as their functional forms, writes through a view of a recorded buffer
// as as_strided_scatter on the buffer.
#include "spmd/passes/derivatives.h"

#include "spmd/ir/boxing.h"
#include "spmd/ir/builder.h"
#include "spmd/ops/autograd_trace.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ops/meta.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

namespace spmd {
namespace {

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// "aten::histc at model.py:4 (why)": what autodiff lists for each node it
// cannot differentiate.
Diagnostic nodeProblem(const Node& node, const std::string& why) {
  return Diagnostic("", node.qualifiedName() + (node.meta.source.empty() ? "" : " at " + node.meta.source) + " (" +
                            why + ")");
}

// Where a tensor's elements live: equal for a tensor and the shallow copies
// autograd saves of it (and for views that happen to cover the same
// elements, which hold the same data in a functional graph).
using Geometry = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int>;

Geometry geometryOf(const at::Tensor& t) {
  return {t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.sizes().vec(), t.strides().vec(),
          static_cast<int>(t.scalar_type())};
}

// Something per recorded tensor, found by identity or by geometry.
template <typename T>
class TensorMap {
 public:
  void bind(const at::Tensor& t, T v) {
    byImpl_[t.unsafeGetTensorImpl()] = v;
    if (t.has_storage()) byGeometry_[geometryOf(t)] = v;
  }
  // By identity only: the tensor itself (or its TensorImpl), no alias.
  std::optional<T> findExact(const at::Tensor& t) const {
    auto it = byImpl_.find(t.unsafeGetTensorImpl());
    return it == byImpl_.end() ? std::nullopt : std::optional<T>(it->second);
  }
  std::optional<T> find(const at::Tensor& t) const {
    auto it = byImpl_.find(t.unsafeGetTensorImpl());
    if (it != byImpl_.end()) return it->second;
    if (!t.has_storage()) return std::nullopt;
    auto g = byGeometry_.find(geometryOf(t));
    if (g != byGeometry_.end()) return g->second;
    return std::nullopt;
  }

 private:
  std::unordered_map<const c10::TensorImpl*, T> byImpl_;
  std::map<Geometry, T> byGeometry_;
};

void flattenTensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
  } else {
    out.emplace_back();  // a non-tensor result holds its place
  }
}

std::vector<at::Tensor> resultTensors(const std::vector<c10::IValue>& results) {
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& r : results) flattenTensors(r, tensors);
  return tensors;
}

void forEachTensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& f) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) f(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) forEachTensor(item, f);
  }
}

// Whether every result of the call is a view of an argument (schema alias
// sets without writes): such calls cost nothing to repeat.
bool isViewCall(const RecordedCall& call) {
  const auto& returns = call.op.schema().returns();
  if (returns.empty()) return false;
  for (const c10::Argument& r : returns) {
    if (!r.alias_info() || r.alias_info()->isWrite()) return false;
  }
  return true;
}

// The argument an in-place call writes (`add_`, `index_put_`), if any.
std::optional<size_t> writtenArgument(const c10::FunctionSchema& schema) {
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite()) return i;
  }
  return std::nullopt;
}

// What one run of a node's op with autograd recorded.
struct Recording {
  std::vector<std::pair<at::Tensor, ValueId>> leaves;       // one per tensor argument
  std::vector<at::Tensor> outputs;                          // one per node output
  std::vector<std::pair<at::Tensor, ValueId>> gradOutputs;  // the output gradients fed in
  std::vector<RecordedCall> forward, backward;
  std::vector<std::pair<ValueId, at::Tensor>> inputGrads;   // per leaf that required grad
  // A leaf that two or more of the op's backward steps give a gradient to.
  bool leafReadTwice = false;
};

// Writes recorded calls into the graph: the tensors they read resolve to
// graph values, the tensors they produce get new ones.
class CallWriter {
 public:
  CallWriter(Graph& g, std::unordered_map<ValueId, at::Tensor>& meta, const Node& node)
      : g_(g), b_(g), meta_(meta), node_(node) {}

  GraphBuilder& builder() { return b_; }

  // `t` names `v` from now on. A tensor with storage of its own (a leaf, a
  // fresh result) is its storage's base: writes through views of it update
  // the base, and other views read the base again.
  void bind(const at::Tensor& t, ValueId v) {
    const Storage* s = storageOf(t);
    values_.bind(t, Bound{v, s ? s->version : 0});
    if (!s && t.has_storage()) storages_[t.storage().unsafeGetStorageImpl()] = Storage{t, v, 0};
  }
  std::optional<ValueId> known(const at::Tensor& t) const {
    auto b = values_.find(t);
    return b ? std::optional<ValueId>(b->value) : std::nullopt;
  }

  // Forward calls whose results a backward call may read: reading one the
  // node did not return repeats its call (a view) in the backward.
  void offerForward(const std::vector<RecordedCall>& calls) {
    for (size_t i = 0; i < calls.size(); ++i) {
      for (const c10::IValue& r : calls[i].results) forEachTensor(r, [&](const at::Tensor& t) { forward_.bind(t, i); });
    }
    forwardCalls_ = &calls;
  }

  // Whether the backward reads a forward result that is not a view of the
  // node's arguments or results (and so must exist in the forward).
  bool readsForwardResults(const std::vector<RecordedCall>& backward) {
    TensorMap<bool> produced;
    std::function<bool(const at::Tensor&)> available = [&](const at::Tensor& t) {
      if (known(t) || produced.find(t)) return true;
      auto i = forward_.find(t);
      if (!i) return true;  // not ours to decide: resolve() reports or folds it
      const RecordedCall& call = (*forwardCalls_)[*i];
      if (!isViewCall(call)) return false;
      bool ok = true;
      for (const c10::IValue& a : call.args) forEachTensor(a, [&](const at::Tensor& x) { ok = ok && available(x); });
      return ok;
    };
    for (const RecordedCall& call : backward) {
      bool ok = true;
      for (const c10::IValue& a : call.args) forEachTensor(a, [&](const at::Tensor& t) { ok = ok && available(t); });
      if (!ok) return true;
      for (const c10::IValue& r : call.results) forEachTensor(r, [&](const at::Tensor& t) { produced.bind(t, true); });
    }
    return false;
  }

  // The calls in order. A tensor `preset` names (itself, not an alias of
  // the same geometry) keeps that value where it is made last (an in-place
  // call after the one that created it).
  void write(const std::vector<RecordedCall>& calls, const TensorMap<ValueId>& preset = {}) {
    TensorMap<size_t> lastMaker;
    for (size_t i = 0; i < calls.size(); ++i) {
      for (const at::Tensor& t : madeBy(calls[i])) lastMaker.bind(t, i);
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      TensorMap<ValueId> here;
      for (const at::Tensor& t : madeBy(calls[i])) {
        if (lastMaker.findExact(t) == std::optional<size_t>(i)) {
          if (auto v = preset.findExact(t)) here.bind(t, *v);
        }
      }
      writeCall(calls[i], here);
    }
  }

  void forgetForward() {
    forward_ = TensorMap<size_t>();
    forwardCalls_ = nullptr;
  }

  ValueId resolve(const at::Tensor& t) {
    if (auto b = values_.find(t)) {
      const Storage* s = storageOf(t);
      return s && b->version < s->version ? readAgain(t, *s) : b->value;
    }
    if (forwardCalls_) {
      if (auto i = forward_.find(t)) {
        writeCall((*forwardCalls_)[*i], {});  // a view of the node's values, repeated
        if (auto v = known(t)) return *v;
      }
    }
    // A 0-dim CPU tensor no call made: a number LibTorch wrapped.
    if (t.dim() == 0 && t.device().is_cpu()) return scalarConstant(t);
    throw std::logic_error("autodiff: a tensor LibTorch's backward of " + node_.qualifiedName() +
                           " reads is not one of the graph's values");
  }

 private:
  ValueId scalarConstant(const at::Tensor& t) {
    const bool floating = c10::isFloatingType(t.scalar_type());
    Arg value = t.scalar_type() == c10::ScalarType::Bool ? Arg::ofBool(t.item<bool>())
                : floating                               ? Arg::ofFloat(t.item<double>())
                                                         : Arg::ofInt(t.item<int64_t>());
    ValueId v = b_.call("aten::scalar_tensor", {value, dtypeArg(t.scalar_type()), Arg::none(), Arg::none(), Arg::none()});
    bind(t, v);
    return v;
  }

  // The value of a whole storage and how often recorded calls wrote it.
  struct Storage {
    at::Tensor base;
    ValueId value;
    uint64_t version;
  };
  struct Bound {
    ValueId value;
    uint64_t version;  // of its storage when bound
  };

  Storage* storageOf(const at::Tensor& t) {
    auto it = t.has_storage() ? storages_.find(t.storage().unsafeGetStorageImpl()) : storages_.end();
    return it == storages_.end() ? nullptr : &it->second;
  }

  static bool sameGeometry(const at::Tensor& a, const at::Tensor& b) {
    return a.sizes() == b.sizes() && a.strides() == b.strides() && a.storage_offset() == b.storage_offset();
  }

  // A view whose storage was written since it was bound, read from the base.
  ValueId readAgain(const at::Tensor& t, const Storage& s) {
    const ValueId v = sameGeometry(t, s.base)
                          ? s.value
                          : b_.call("aten::as_strided", {Arg::tensor(s.value), intsArg(t.sizes().vec()),
                                                         intsArg(t.strides().vec()), Arg::ofInt(t.storage_offset())});
    bind(t, v);
    return v;
  }

  // The written tensor's new value is `updated`; its storage's base takes it
  // (as_strided_scatter where the tensor is a view: LibTorch's backward of
  // as_strided copies into a view of a zeroed buffer, for one).
  void recordWrite(const at::Tensor& written, ValueId updated) {
    Storage* s = storageOf(written);
    if (!s) {
      bind(written, updated);
      return;
    }
    s->value = sameGeometry(written, s->base)
                   ? updated
                   : b_.call("aten::as_strided_scatter",
                             {Arg::tensor(s->value), Arg::tensor(updated), intsArg(written.sizes().vec()),
                              intsArg(written.strides().vec()), Arg::ofInt(written.storage_offset())});
    ++s->version;
    bind(written, updated);
  }

  void writeCall(const RecordedCall& call, const TensorMap<ValueId>& preset) {
    const c10::FunctionSchema& schema = call.op.schema();
    std::string op = qualifiedOpName(schema.operator_name());
    const auto written = writtenArgument(schema);
    if (written) op = functionalForm(schema);
    std::vector<Arg> args;
    for (size_t i = 0; i < call.args.size(); ++i) {
      try {
        args.push_back(argFromIValue(schema.arguments()[i], call.args[i], [&](const at::Tensor& t) { return resolve(t); }));
      } catch (const std::invalid_argument& e) {
        throw nodeProblem(node_, "its derivative calls " + op + ", whose " + e.what());
      }
    }
    const std::vector<at::Tensor> results = madeBy(call);
    std::vector<ValueId> keep;
    for (const at::Tensor& r : results) keep.push_back(r.defined() ? preset.findExact(r).value_or(kNoValue) : kNoValue);
    const std::vector<ValueId> outputs = b_.callMulti(op, std::move(args), "", keep);
    for (size_t k = 0; k < outputs.size() && k < results.size(); ++k) {
      if (outputs[k] == kNoValue || !results[k].defined()) continue;
      if (written) {
        recordWrite(results[k], outputs[k]);
      } else {
        bind(results[k], outputs[k]);
      }
      meta_[outputs[k]] = results[k];
    }
  }

  // What a call defines: its results, or for an in-place call the tensor it
  // writes (whose functional form returns the new value).
  static std::vector<at::Tensor> madeBy(const RecordedCall& call) {
    const auto written = writtenArgument(call.op.schema());
    return written ? std::vector<at::Tensor>{call.args[*written].toTensor()} : resultTensors(call.results);
  }

  // add_.Tensor -> add.Tensor, bernoulli_.float -> bernoulli.p: the
  // out-of-place overload that takes the same arguments; the value written
  // becomes a new value.
  std::string functionalForm(const c10::FunctionSchema& schema) const {
    if (auto functional = outOfPlaceOverload(schema)) {
      return qualifiedOpName(c10::OperatorName(functional->first, functional->second));
    }
    throw nodeProblem(node_, "its derivative writes in place with " + qualifiedOpName(schema.operator_name()) +
                                 ", which has no functional form");
  }

  Graph& g_;
  GraphBuilder b_;
  std::unordered_map<ValueId, at::Tensor>& meta_;
  const Node& node_;
  TensorMap<Bound> values_;
  std::unordered_map<const c10::StorageImpl*, Storage> storages_;
  TensorMap<size_t> forward_;
  const std::vector<RecordedCall>* forwardCalls_ = nullptr;
};

}  // namespace

struct Differentiator::State {
  explicit State(Graph& graph) : g(graph) {}

  Graph& g;
  // Every value's meta tensor with the strides the graph gives it, so that
  // the recorded calls (a reshape that views or copies) are those that run.
  std::unordered_map<ValueId, at::Tensor> meta;
  MetaFallbackScope metaFallback;  // one registration for all recordings

  // A value made after the strides were propagated and not by a recording
  // (the adds autodiff accumulates gradients with) is inferred from its
  // producer when first asked for: the sum of two gradients laid out
  // transposed is laid out transposed too, and a reshape of it copies.
  at::Tensor metaOf(ValueId v) {
    auto it = meta.find(v);
    if (it != meta.end()) return it->second;
    if (const Node* producer = g.producer(v)) inferStrides(*producer);
    it = meta.find(v);
    return it != meta.end() ? it->second : metaTensorOf(g.value(v));
  }

  void inferStrides(const Node& n) {
    auto op = findOperator(n);
    if (!op) return;
    std::vector<at::Tensor> results;
    try {
      results = inferNodeOnMeta(n, *op, [&](ValueId v) { return metaOf(v); });
    } catch (const std::exception&) {
      return;  // contiguous defaults; the verifier reports real problems
    }
    for (size_t k = 0; k < results.size() && k < n.outputs.size(); ++k) {
      if (n.outputs[k] != kNoValue && results[k].defined()) meta[n.outputs[k]] = results[k];
    }
  }

  void propagateStrides() {
    for (const Node& n : g.nodes()) inferStrides(n);
  }

  at::Tensor freshLike(ValueId v) {
    const at::Tensor m = metaOf(v);
    return at::empty_strided(m.sizes(), m.strides(), m.options());
  }

  Recording record(const Node& node, const c10::OperatorHandle& op, const std::vector<ValueId>& outGrads,
                   const std::function<bool(ValueId)>& needsGrad);
  std::vector<Contribution> emit(const Node& original, const Node& node, const Recording& rec,
                                 const NodeMeta& backwardMeta);
  void replaceByForwardCalls(const Node& original, const Node& node, const Recording& rec, CallWriter& w,
                             const TensorMap<ValueId>& results);
  std::vector<const Node*> decompose(const Node& original, const Node& node, const Recording& rec);
};

Recording Differentiator::State::record(const Node& node, const c10::OperatorHandle& op,
                                        const std::vector<ValueId>& outGrads,
                                        const std::function<bool(ValueId)>& needsGrad) {
  Recording rec;
  // Leaves and output gradients are made before recording starts: they are
  // inputs of the recording, not calls in it.
  std::vector<c10::IValue> stack = boxArguments(node, op.schema(), [&](ValueId v) {
    at::Tensor leaf = freshLike(v);
    if (needsGrad(v) && c10::isFloatingType(leaf.scalar_type())) leaf.requires_grad_(true);
    rec.leaves.emplace_back(leaf, v);
    return leaf;
  });
  std::vector<at::Tensor> gradTensors(outGrads.size());
  for (size_t k = 0; k < outGrads.size(); ++k) {
    if (outGrads[k] != kNoValue) gradTensors[k] = freshLike(outGrads[k]);
  }
  DispatchTrace trace;
  at::AutoGradMode gradMode(true);
  op.callBoxed(&stack);
  rec.forward = trace.take();
  rec.outputs = resultTensors(stack);
  std::vector<at::Tensor> outs, grads, inputs;
  for (size_t k = 0; k < outGrads.size() && k < rec.outputs.size(); ++k) {
    const at::Tensor& out = rec.outputs[k];
    if (!gradTensors[k].defined() || !out.defined() || !out.requires_grad()) continue;
    outs.push_back(out);
    grads.push_back(gradTensors[k]);
    rec.gradOutputs.emplace_back(gradTensors[k], outGrads[k]);
  }
  std::vector<ValueId> inputValues;
  for (const auto& [leaf, v] : rec.leaves) {
    if (!leaf.requires_grad()) continue;
    inputs.push_back(leaf);
    inputValues.push_back(v);
  }
  if (outs.empty() || inputs.empty()) return rec;
  rec.leafReadTwice = anyInputReadTwice(outs, inputs);
  std::vector<at::Tensor> inputGrads;
  try {
    inputGrads = torch::autograd::grad(outs, inputs, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
  } catch (const c10::Error& e) {
    throw nodeProblem(node, firstLine(e.what_without_backtrace()));
  }
  rec.backward = trace.take();
  for (size_t i = 0; i < inputGrads.size(); ++i) {
    if (inputGrads[i].defined()) rec.inputGrads.emplace_back(inputValues[i], inputGrads[i]);
  }
  return rec;
}


std::vector<Contribution> Differentiator::State::emit(const Node& original, const Node& node, const Recording& rec,
                                                      const NodeMeta& backwardMeta) {
  CallWriter w(g, meta, node);
  for (const auto& [t, v] : rec.leaves) w.bind(t, v);
  TensorMap<ValueId> results;  // the node's results, by what its op returned
  for (size_t k = 0; k < rec.outputs.size() && k < node.outputs.size(); ++k) {
    if (!rec.outputs[k].defined() || node.outputs[k] == kNoValue) continue;
    results.bind(rec.outputs[k], node.outputs[k]);
    if (!w.known(rec.outputs[k])) w.bind(rec.outputs[k], node.outputs[k]);
  }
  w.offerForward(rec.forward);
  if (w.readsForwardResults(rec.backward)) replaceByForwardCalls(original, node, rec, w, results);
  for (const auto& [t, v] : rec.gradOutputs) w.bind(t, v);
  w.builder().setInsertionPointToEnd();
  w.builder().setMeta(backwardMeta);
  w.write(rec.backward);
  std::vector<Contribution> contributions;
  for (const auto& [input, grad] : rec.inputGrads) contributions.push_back({input, w.resolve(grad)});
  return contributions;
}

// The forward calls take the node's place; those that produce what the node
// returned define its result values, so every reader stays valid. A result
// that is an argument itself (contiguous() of a contiguous tensor) gives
// way to the argument's value.
void Differentiator::State::replaceByForwardCalls(const Node& original, const Node& node, const Recording& rec,
                                                  CallWriter& w, const TensorMap<ValueId>& results) {
  const size_t position = g.indexOf(original);
  const Node* next = position + 1 < g.nodes().size() ? &g.nodes()[position + 1] : nullptr;
  g.extract(original);
  if (next) {
    w.builder().setInsertionPoint(*next);
  } else {
    w.builder().setInsertionPointToEnd();
  }
  w.builder().setMeta(node.meta);
  w.write(rec.forward, results);
  std::vector<ValueId> produced(g.numValues(), 0);
  for (const Node& n : g.nodes()) {
    for (ValueId o : n.outputs) {
      if (o != kNoValue) produced[o] = 1;
    }
  }
  for (size_t k = 0; k < rec.outputs.size() && k < node.outputs.size(); ++k) {
    const ValueId out = node.outputs[k];
    if (out == kNoValue || produced[out]) continue;
    auto now = rec.outputs[k].defined() ? w.known(rec.outputs[k]) : std::nullopt;
    if (!now || *now == out) {
      throw std::logic_error("autodiff: no recorded call of " + node.qualifiedName() + " produces result " +
                             std::to_string(k));
    }
    g.replaceAllUsesWith(out, *now);
  }
  w.forgetForward();  // everything it made now exists in the forward
}

// The node's calls in its place, as replaceByForwardCalls writes them;
// returns them in program order.
std::vector<const Node*> Differentiator::State::decompose(const Node& original, const Node& node,
                                                          const Recording& rec) {
  CallWriter w(g, meta, node);
  for (const auto& [t, v] : rec.leaves) w.bind(t, v);
  TensorMap<ValueId> results;
  for (size_t k = 0; k < rec.outputs.size() && k < node.outputs.size(); ++k) {
    if (!rec.outputs[k].defined() || node.outputs[k] == kNoValue) continue;
    results.bind(rec.outputs[k], node.outputs[k]);
    if (!w.known(rec.outputs[k])) w.bind(rec.outputs[k], node.outputs[k]);
  }
  w.offerForward(rec.forward);
  const size_t position = g.indexOf(original);
  const Node* before = position > 0 ? &g.nodes()[position - 1] : nullptr;
  const Node* next = position + 1 < g.nodes().size() ? &g.nodes()[position + 1] : nullptr;
  replaceByForwardCalls(original, node, rec, w, results);
  const size_t first = before ? g.indexOf(*before) + 1 : 0;
  const size_t end = next ? g.indexOf(*next) : g.nodes().size();
  std::vector<const Node*> calls;
  for (size_t i = first; i < end; ++i) calls.push_back(&g.nodes()[i]);
  return calls;
}

Differentiator::Differentiator(Graph& graph) : state_(std::make_unique<State>(graph)) { state_->propagateStrides(); }

Differentiator::~Differentiator() = default;

std::vector<Contribution> Differentiator::differentiate(const Node& original, const std::vector<ValueId>& outGrads,
                                                        const std::function<bool(ValueId)>& needsGrad,
                                                        const NodeMeta& backwardMeta) {
  const Node node = original;  // a copy: the original may be replaced
  auto op = findOperator(node);
  if (!op) throw nodeProblem(node, "not an operator of this LibTorch");
  const Recording rec = state_->record(node, *op, outGrads, needsGrad);
  if (rec.inputGrads.empty()) return {};
  return state_->emit(original, node, rec, backwardMeta);
}

std::vector<const Node*> Differentiator::decomposeIfInputReadTwice(const Node& original,
                                                                   const std::vector<ValueId>& outGrads,
                                                                   const std::function<bool(ValueId)>& needsGrad) {
  // Taken for the composites known to give an input two gradients whose
  // parts are element-wise ops and reductions. LSTM and GRU (their weights
  // read at every time step) are not: their parts view and transpose the
  // input, which the forward's rewriting does not yet rebuild right.
  static const std::set<std::string> taken = {"aten::rms_norm"};
  const Node node = original;
  if (!taken.count(node.op)) return {};
  auto op = findOperator(node);
  if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return {};
  const Recording rec = state_->record(node, *op, outGrads, needsGrad);
  if (!rec.leafReadTwice || rec.forward.empty()) return {};
  return state_->decompose(original, node, rec);
}

std::vector<std::string> derivativeSources() {
  std::vector<std::string> lines;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0 && name.name.rfind("spmd::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op) continue;
    // A CompositeImplicitAutograd kernel runs before autograd's, so it decides.
    const char* source = op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ? "composite"
                         : op->hasKernelForDispatchKey(c10::DispatchKey::Autograd)                 ? "autograd"
                                                                                                   : "none";
    lines.push_back(qualifiedOpName(name) + "\t" + source);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

}  // namespace spmd

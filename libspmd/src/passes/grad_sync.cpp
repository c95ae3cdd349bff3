// grad-sync: DDP's communication made explicit.
//
// Inserts one spmd::all_reduce per gradient (mean over ranks, as DDP, or sum,
// as _spmd) right after the gradient is produced, records it as the
// gradient's reduced value and makes later readers (an exported step's
// optimizer update) read it; and, as DDP's broadcast_buffers=True does, makes every buffer read
// go through spmd::broadcast from rank 0 at the start of the step. On one
// rank both are the identity. Does not bucket (spmd-split does).
#include "spmd/ir/builder.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName spmd_broadcast = OpName::known("spmd::broadcast");
};
const Ops& ops() { return opTable<Ops>(); }

// Every buffer read goes through one spmd::broadcast, put before all nodes.
void broadcastBuffers(Graph& g) {
  GraphBuilder b(g);
  if (!g.nodes().empty()) b.setInsertionPoint(g.nodes().front());
  b.setMeta(NodeMeta{"", NodeRole::Comm, -1, -1, IterationTag::Every});
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Buffer) continue;
    const ValueId synced =
        b.call("spmd::broadcast", {Arg::tensor(in.value), Arg::ofInt(0)}, g.value(in.value).name + ".synced");
    const Node* broadcast = g.producer(synced);
    g.replaceUsesWith(in.value, synced, [&](const Node& n) { return &n != broadcast; });
  }
}

// Each gradient's all-reduce goes right after the node that produces it (or
// at the end for gradients no node produces), and every reader of the local
// gradient (an exported step's optimizer) reads the reduced value.
void reduceGradients(Graph& g, GradReduce reduce, c10::ScalarType reduceDtype) {
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", NodeRole::Comm, -1, -1, IterationTag::Every});
  // By the producer's position, so that gradients made by one node are
  // reduced in the order of its outputs, as they come.
  // One all-reduce per local gradient value: of two records of one value,
  // the last gets it.
  std::map<ValueId, Gradient*> byValue;
  for (Gradient& grad : g.gradients()) {
    if (grad.reduced == kNoValue) byValue[grad.value] = &grad;
  }
  std::vector<Gradient*> pending;
  for (auto& [value, grad] : byValue) pending.push_back(grad);
  auto place = [&](const Gradient* grad) -> std::pair<size_t, size_t> {
    const Node* made = g.producer(grad->value);
    if (!made) return {g.nodes().size(), 0};
    const auto& outs = made->outputs;
    return {g.indexOf(*made), static_cast<size_t>(std::find(outs.begin(), outs.end(), grad->value) - outs.begin())};
  };
  std::stable_sort(pending.begin(), pending.end(), [&](const Gradient* x, const Gradient* y) {
    const auto px = place(x), py = place(y);
    return px < py;
  });
  std::map<const Node*, const Node*> lastReduceAfter;  // producer -> the last all_reduce put after it
  for (Gradient* grad : pending) {
    const Node* made = g.producer(grad->value);
    if (!made) {
      b.setInsertionPointToEnd();
    } else {
      auto it = lastReduceAfter.find(made);
      b.setInsertionPointAfter(it != lastReduceAfter.end() ? *it->second : *made);
    }
    const ValueId raw = grad->value;
    const std::string name = g.value(grad->parameter).name + ".grad";
    const c10::ScalarType dtype = g.value(raw).dtype;
    // --reduce-dtype: cast there and back around the all-reduce, as DDP's
    // compression hooks do (spmd-split finds the casts and casts the bucket).
    const bool recast = reduceDtype != c10::ScalarType::Undefined && reduceDtype != dtype;
    const ValueId sent = recast ? b.cast(raw, reduceDtype, name + ".sent") : raw;
    grad->reduced = b.call("spmd::all_reduce", {Arg::tensor(sent), strArg(reduce == GradReduce::Mean ? "mean" : "sum")},
                           recast ? name + ".received" : name);
    if (recast) grad->reduced = b.cast(grad->reduced, dtype, name);
    const Node* last = g.producer(grad->reduced);
    if (made) lastReduceAfter[made] = last;
    const Node* first = g.producer(recast ? sent : grad->reduced);
    g.replaceUsesWith(raw, grad->reduced, [&](const Node& n) { return &n != first; });
  }
}

}  // namespace

namespace {

bool alreadyBroadcast(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (n.is(ops().spmd_broadcast)) return true;
  }
  return false;
}

class GradSyncPass final : public Pass {
 public:
  GradSyncPass(GradReduce reduce, c10::ScalarType reduceDtype) : reduce_(reduce), reduceDtype_(reduceDtype) {}

  bool run(Graph& g, DiagnosticEngine&) override {
    const size_t before = g.nodes().size();
    if (!alreadyBroadcast(g)) broadcastBuffers(g);
    reduceGradients(g, reduce_, reduceDtype_);
    return g.nodes().size() != before;  // it only adds nodes
  }

 private:
  GradReduce reduce_;
  c10::ScalarType reduceDtype_;
};

}  // namespace

std::unique_ptr<Pass> createGradSyncPass(const PipelineOptions& options) {
  return std::make_unique<GradSyncPass>(options.gradReduce, options.reduceDtype);
}

}  // namespace spmd

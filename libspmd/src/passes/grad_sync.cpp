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

#include <map>

namespace spmd {
namespace {

void renameArgs(Node& n, const std::map<ValueId, ValueId>& renamed) {
  for (Arg& a : n.args) {
    if (a.kind == Arg::Kind::Value && renamed.count(a.value)) a.value = renamed.at(a.value);
    for (ValueId& v : a.values) {
      if (renamed.count(v)) v = renamed.at(v);
    }
  }
}

void broadcastBuffers(Graph& g) {
  std::map<ValueId, ValueId> replaced;
  std::vector<Node> nodes = g.takeNodes();
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", NodeRole::Comm, -1, -1, IterationTag::Every});
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Buffer) continue;
    replaced[in.value] = b.call("spmd::broadcast", {Arg::tensor(in.value), Arg::ofInt(0)},
                                g.value(in.value).name + ".synced");
  }
  for (Node& n : nodes) {
    renameArgs(n, replaced);
    g.addNode(std::move(n));
  }
}

// Each gradient's all-reduce goes right after the node that produces it, and
// every later reader (an exported step's optimizer) reads the reduced value.
void reduceGradients(Graph& g, GradReduce reduce) {
  std::map<ValueId, Gradient*> pending;
  for (Gradient& grad : g.gradients()) {
    if (grad.reduced == kNoValue) pending[grad.value] = &grad;
  }
  if (pending.empty()) return;
  std::map<ValueId, ValueId> reduced;
  std::vector<Node> nodes = g.takeNodes();
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", NodeRole::Comm, -1, -1, IterationTag::Every});
  auto emitReduce = [&](ValueId raw) {
    Gradient* grad = pending.at(raw);
    grad->reduced = b.call("spmd::all_reduce", {Arg::tensor(raw), strArg(reduce == GradReduce::Mean ? "mean" : "sum")},
                           g.value(grad->parameter).name + ".grad");
    reduced[raw] = grad->reduced;
  };
  for (Node& n : nodes) {
    renameArgs(n, reduced);
    std::vector<ValueId> produced = n.outputs;
    g.addNode(std::move(n));
    for (ValueId v : produced) {
      if (pending.count(v)) emitReduce(v);
    }
  }
  // Gradients that are graph inputs themselves, or produced by no node.
  for (auto& [raw, grad] : pending) {
    if (!reduced.count(raw)) emitReduce(raw);
  }
}

}  // namespace

bool alreadyBroadcast(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (n.op == "spmd::broadcast") return true;
  }
  return false;
}

bool runGradSync(Graph& g, const PipelineOptions& options) {
  if (!alreadyBroadcast(g)) broadcastBuffers(g);
  reduceGradients(g, options.gradReduce);
  return true;
}

}  // namespace spmd

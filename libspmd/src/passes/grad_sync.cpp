// grad-sync: DDP's communication made explicit.
//
// Appends one spmd::all_reduce per gradient (mean over ranks, as DDP, or sum,
// as _spmd) after the backward, and records it as the gradient's reduced
// value; and, as DDP's broadcast_buffers=True does, makes every buffer read
// go through spmd::broadcast from rank 0 at the start of the step. On one
// rank both are the identity. Does not bucket (spmd-split does).
#include "spmd/passes/builder.h"
#include "spmd/passes/pass.h"

#include <map>

namespace spmd {
namespace {

void broadcastBuffers(Graph& g) {
  std::map<ValueId, ValueId> replaced;
  std::vector<Node> nodes = g.takeNodes();
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", "comm"});
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Buffer) continue;
    replaced[in.value] = b.call("spmd::broadcast", {Arg::tensor(in.value), Arg::ofInt(0)},
                                g.value(in.value).name + ".synced");
  }
  for (Node& n : nodes) {
    for (Arg& a : n.args) {
      if (a.kind == Arg::Kind::Value && replaced.count(a.value)) a.value = replaced[a.value];
      for (ValueId& v : a.values) {
        if (replaced.count(v)) v = replaced[v];
      }
    }
    g.addNode(std::move(n));
  }
}

void reduceGradients(Graph& g, GradReduce reduce) {
  GraphBuilder b(g);
  b.setMeta(NodeMeta{"", "comm"});
  for (Gradient& grad : g.gradients()) {
    if (grad.reduced != kNoValue) continue;
    grad.reduced = b.call("spmd::all_reduce", {Arg::tensor(grad.value), strArg(reduce == GradReduce::Mean ? "mean" : "sum")},
                          g.value(grad.parameter).name + ".grad");
  }
}

}  // namespace

bool runGradSync(Graph& g, const PipelineOptions& options) {
  broadcastBuffers(g);
  reduceGradients(g, options.gradReduce);
  return true;
}

}  // namespace spmd

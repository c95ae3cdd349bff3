#include "spmd/runtime/run_state.h"

#include "spmd/ir/shard_layout.h"
#include "spmd/runtime/collectives.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

namespace spmd {

at::Tensor rankShardOf(const at::Tensor& whole, int64_t world, int rank) {
  const std::vector<int64_t> shape = shardShapeOf(whole.sizes().vec(), world);
  const int64_t rows = whole.dim() == 0 ? 1 : whole.size(0);
  const at::Tensor asRows = whole.reshape({rows, -1});
  at::Tensor shard = at::zeros({shape[0], asRows.size(1)}, whole.options());
  const int64_t first = shape[0] * rank, have = std::max<int64_t>(0, std::min(rows - first, shape[0]));
  if (have > 0) shard.narrow(0, 0, have).copy_(asRows.narrow(0, first, have));
  return shard.reshape(shape);
}

TensorMap placeState(const Artifact& artifact, const at::Device& device, int rank) {
  const Graph& g = artifact.graph;
  TensorMap state;
  for (const auto& in : g.inputs()) {
    if (isPerStepInput(in.kind)) continue;
    const Value& v = g.value(in.value);
    auto it = artifact.state.find(v.name);
    if (it == artifact.state.end()) throw Diagnostic("'" + v.name + "'", "the artifact holds no value for this input");
    at::Tensor initial = it->second;
    if (isShardOf(v.shape, initial.sizes().vec(), g.training().worldSize)) {
      initial = rankShardOf(initial, g.training().worldSize, rank);
    }
    state[v.name] = artifact.zeroState.count(v.name) ? at::zeros(v.shape, initial.options().device(device))
                                                     : initial.to(initial.options().device(device), false, /*copy=*/true);
  }
  return state;
}

TensorMap wholeParameters(const Artifact& artifact, const TensorMap& state, Collectives* comm) {
  const Graph& g = artifact.graph;
  const int64_t world = g.training().worldSize;
  TensorMap out;
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Parameter) continue;
    const Value& v = g.value(in.value);
    const at::Tensor& held = state.at(v.name);
    const std::vector<int64_t> whole = artifact.state.at(v.name).sizes().vec();
    if (!comm || !isShardOf(v.shape, whole, world)) {
      out[v.name] = held;
      continue;
    }
    Node gather;
    gather.op = "spmd::all_gather";
    gather.args = {Arg::tensor(in.value), Arg::ofInt(world), Arg::ofInt(-1)};
    const at::Tensor gathered = comm->run(gather, {held.reshape({-1})}).at(0);
    const int64_t rows = whole.empty() ? 1 : whole[0];
    out[v.name] = gathered.reshape({world * v.shape[0], -1}).narrow(0, 0, rows).reshape(whole);
  }
  return out;
}

}  // namespace spmd

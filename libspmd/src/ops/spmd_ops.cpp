#include "spmd/ops/spmd_ops.h"
#include "spmd/ops/fused_kernels.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace spmd {
namespace {

// Training-mode BatchNorm whose running statistics stay functional: the
// kernel updates copies of them and returns those, so the graph stays SSA.
// It calls the same native_batch_norm that aten::batch_norm reaches on CPU,
// so results and updated statistics equal PyTorch's bit for bit there.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> batchNormTrain(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const at::Tensor& runningMean,
    const at::Tensor& runningVar, double momentum, double eps) {
  at::Tensor mean = runningMean.clone();
  at::Tensor var = runningVar.clone();
  auto out = at::native_batch_norm(input, weight, bias, mean, var, /*training=*/true, momentum, eps);
  return {std::get<0>(out), std::get<1>(out), std::get<2>(out), mean, var};
}

// Collectives on one rank: the identity. A multi-rank runtime executes these
// nodes with its process group instead of through these kernels.
at::Tensor allReduceOneRank(const at::Tensor& self, c10::string_view reduce) {
  TORCH_CHECK(reduce == "mean" || reduce == "sum" || reduce == "max", "spmd::all_reduce: reduce must be 'mean', 'sum' or 'max'");
  return self.clone();
}

at::Tensor bucketStartOneRank(const at::Tensor& flat, c10::string_view reduce, int64_t bucket) {
  TORCH_CHECK(reduce == "mean" || reduce == "sum", "spmd::bucket_start: reduce must be 'mean' or 'sum'");
  return flat.clone();
}

// The sharded collectives on one process: the shapes a rank of `world` sees
// (what shape inference on the meta device needs), and the identity at a
// world size of 1. A run of more ranks executes them with its group.
void checkWorld(const char* op, int64_t world, int64_t rows) {
  TORCH_CHECK(world >= 1, op, ": world size must be at least 1");
  TORCH_CHECK(rows % world == 0, op, ": ", rows, " rows do not divide among ", world, " ranks");
}

at::Tensor reduceScatterOneRank(const at::Tensor& flat, c10::string_view reduce, int64_t world, int64_t bucket) {
  TORCH_CHECK(reduce == "mean" || reduce == "sum", "spmd::reduce_scatter: reduce must be 'mean' or 'sum'");
  TORCH_CHECK(flat.dim() == 1, "spmd::reduce_scatter: expected a flat tensor");
  checkWorld("spmd::reduce_scatter", world, flat.size(0));
  return flat.narrow(0, 0, flat.size(0) / world).clone();
}

at::Tensor allGatherOneRank(const at::Tensor& shard, int64_t world, int64_t bucket) {
  TORCH_CHECK(shard.dim() == 1, "spmd::all_gather: expected a flat tensor");
  checkWorld("spmd::all_gather", world, 0);
  return shard.repeat({world});
}

at::Tensor gatherWaitOneRank(const at::Tensor& inflight, int64_t bucket) { return inflight.clone(); }

at::Tensor shardOneRank(const at::Tensor& self, int64_t world) {
  TORCH_CHECK(self.dim() >= 1, "spmd::shard: expected at least one dimension");
  checkWorld("spmd::shard", world, self.size(0));
  return self.narrow(0, 0, self.size(0) / world).clone();
}

at::Tensor bucketWaitOneRank(const at::Tensor& inflight, int64_t bucket) { return inflight.clone(); }

at::Tensor broadcastOneRank(const at::Tensor& self, int64_t src) {
  TORCH_CHECK(src == 0, "spmd::broadcast: source rank ", src, " does not exist on one rank");
  return self.clone();
}

}  // namespace

void ensureSpmdOpsRegistered() {
  ensureAttentionOpsRegistered();
  ensureFusedOptimizerOpsRegistered();
  ensureFusedKernelOpsRegistered();
  ensureCrossEntropyOpsRegistered();
  ensureLayerNormOpsRegistered();
  ensureColumnSumOpsRegistered();
  ensureDropoutOpsRegistered();
  ensureFlatCatOpsRegistered();
  ensureGroupedMmOpsRegistered();
}

}  // namespace spmd

TORCH_LIBRARY(spmd, m) {
  m.def(
      "batch_norm_train(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, "
      "Tensor running_var, float momentum, float eps) -> "
      "(Tensor output, Tensor save_mean, Tensor save_invstd, Tensor new_running_mean, "
      "Tensor new_running_var)");
  m.def("all_reduce(Tensor self, str reduce) -> Tensor");
  m.def("broadcast(Tensor self, int src) -> Tensor");
  m.def("bucket_start(Tensor flat, str reduce, int bucket) -> Tensor");
  m.def("bucket_wait(Tensor inflight, int bucket) -> Tensor");
  m.def("reduce_scatter(Tensor flat, str reduce, int world, int bucket) -> Tensor");
  m.def("all_gather(Tensor shard, int world, int bucket) -> Tensor");
  m.def("shard(Tensor self, int world) -> Tensor");
  m.def("gather_start(Tensor shard, int world, int bucket) -> Tensor");
  m.def("gather_wait(Tensor inflight, int bucket) -> Tensor");
}

// Composite of differentiable ATen ops, so LibTorch autograd (the tests'
// oracle) differentiates it as it would aten::batch_norm.
TORCH_LIBRARY_IMPL(spmd, CompositeImplicitAutograd, m) {
  m.impl("batch_norm_train", &spmd::batchNormTrain);
}

TORCH_LIBRARY_IMPL(spmd, CompositeExplicitAutograd, m) {
  m.impl("all_reduce", &spmd::allReduceOneRank);
  m.impl("broadcast", &spmd::broadcastOneRank);
  m.impl("bucket_start", &spmd::bucketStartOneRank);
  m.impl("bucket_wait", &spmd::bucketWaitOneRank);
  m.impl("reduce_scatter", &spmd::reduceScatterOneRank);
  m.impl("all_gather", &spmd::allGatherOneRank);
  m.impl("shard", &spmd::shardOneRank);
  m.impl("gather_start", &spmd::allGatherOneRank);
  m.impl("gather_wait", &spmd::gatherWaitOneRank);
}

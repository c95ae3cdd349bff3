#include "spmd/runtime/shape_infer.h"

#include "spmd/runtime/op_call.h"

#include <ATen/ATen.h>

namespace spmd {

at::Tensor metaTensorOf(const Value& v) {
  return at::empty(v.shape, at::TensorOptions().dtype(v.dtype).device(at::kMeta));
}

namespace {

std::vector<at::Tensor> toMeta(const std::vector<at::Tensor>& results) {
  std::vector<at::Tensor> meta;
  meta.reserve(results.size());
  for (const at::Tensor& t : results) {
    meta.push_back(t.defined() ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta))
                               : at::Tensor());
  }
  return meta;
}

}  // namespace

std::vector<at::Tensor> inferOnMeta(const Node& node, const c10::OperatorHandle& op,
                                    const std::function<at::Tensor(ValueId)>& metaOf) {
  // Below autograd: shapes need no graph, and spmd's own ops have no
  // autograd kernel for the meta device.
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  try {
    return toMeta(callOperator(op, boxArguments(node, metaOf)));
  } catch (const std::exception&) {
    // No meta kernel (or one that reads data): zero-filled CPU tensors, valid
    // indices and probabilities for any op.
    auto onCpu = [&](ValueId v) { return at::zeros_like(metaOf(v), at::TensorOptions().device(at::kCPU)); };
    return toMeta(callOperator(op, boxArguments(node, onCpu)));
  }
}

}  // namespace spmd

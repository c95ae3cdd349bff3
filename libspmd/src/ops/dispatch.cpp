#include "spmd/ops/dispatch.h"

#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>

namespace spmd {

std::optional<c10::OperatorHandle> findOperator(const std::string& op, const std::string& overload) {
  ensureSpmdOpsRegistered();
  auto handle = c10::Dispatcher::singleton().findSchema({op, overload});
  if (!handle) return std::nullopt;
  return *handle;
}

std::vector<at::Tensor> callOperator(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
  op.callBoxed(&stack);
  std::vector<at::Tensor> results;
  results.reserve(stack.size());
  for (auto& v : stack) {
    if (v.isTensor()) {
      results.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) results.push_back(t);
    } else {
      throw std::runtime_error(op.schema().name() + " returned a non-tensor value");
    }
  }
  return results;
}

}  // namespace spmd

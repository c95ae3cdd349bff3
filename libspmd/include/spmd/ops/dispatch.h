// Binding operator names to LibTorch's dispatcher and calling them boxed.
// Knows nothing of the graph: ir/boxing.h turns graph nodes into these calls.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace spmd {

// The dispatcher's handle for `op` ("aten::add") and `overload` ("Tensor",
// or empty for the default one), if this LibTorch has it. aten ops come
// from the linked LibTorch, spmd ops from libspmd's library (ops/spmd_ops.h).
std::optional<c10::OperatorHandle> findOperator(const std::string& op, const std::string& overload);

// The out-of-place overload of an in-place op that takes the same arguments
// (add_.Tensor -> add.Tensor, bernoulli_.float -> bernoulli.p), as
// {op, overload}; nullopt when `inPlace` is not named `..._` or has none.
std::optional<std::pair<std::string, std::string>> outOfPlaceOverload(const c10::FunctionSchema& inPlace);

// Calls the operator `name` ("aten::_fused_adam_", or with an overload:
// "aten::_fused_adam_.tensor_lr") boxed, each argument taken
// from `named` by its schema name, else its default: for ATen ops whose
// argument lists differ between LibTorch versions (fused attention, fused
// Adam). Returns its results; throws c10::Error when the op is missing or an
// argument has neither.
std::vector<c10::IValue> callByArgumentName(const std::string& name, const std::map<std::string, c10::IValue>& named);

// `v` with `f` applied to each tensor it holds: a tensor, a Tensor[] or the
// present elements of a Tensor?[]; any other value as it is.
c10::IValue mapTensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f);

// "aten::add.Tensor", or "aten::relu" for the default overload.
std::string qualifiedOpName(const c10::OperatorName& name);

// Calls `op` on boxed arguments and returns the tensors it produced, list
// results flattened in order.
std::vector<at::Tensor> callOperator(const c10::OperatorHandle& op, std::vector<c10::IValue> stack);

}  // namespace spmd

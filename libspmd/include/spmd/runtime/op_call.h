// Binding graph nodes to LibTorch's dispatcher and boxing their arguments.
// Shared by the verifier (meta tensors) and the interpreter (real tensors).
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>

namespace spmd {

// The dispatcher's handle for the node's op and overload, if it has one.
// aten ops come from the linked LibTorch, spmd ops from libspmd's library.
std::optional<c10::OperatorHandle> findOperator(const Node& node);

// The node's arguments as the boxed calling convention wants them;
// `tensorOf` supplies the tensor of each referenced value.
std::vector<c10::IValue> boxArguments(const Node& node,
                                      const std::function<at::Tensor(ValueId)>& tensorOf);

// Calls `op` on boxed arguments and returns the tensors it produced.
std::vector<at::Tensor> callOperator(const c10::OperatorHandle& op, std::vector<c10::IValue> stack);

}  // namespace spmd

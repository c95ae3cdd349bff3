// Graph nodes as dispatcher calls: the operator a node names and its
// arguments boxed as the calling convention wants them. Shared by the
// verifier and builder (meta tensors) and the interpreter (real tensors).
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>

namespace spmd {

// The dispatcher's handle for the node's op and overload, if it has one.
std::optional<c10::OperatorHandle> findOperator(const Node& node);

// The node's arguments in schema order; `tensorOf` supplies the tensor of
// each referenced value.
std::vector<c10::IValue> boxArguments(const Node& node, const std::function<at::Tensor(ValueId)>& tensorOf);

// A contiguous meta tensor of the value's dtype and shape.
at::Tensor metaTensorOf(const Value& v);

// The node's results on the meta device (ops/meta.h's inferOnMeta), its
// arguments supplied by `metaOf`.
std::vector<at::Tensor> inferNodeOnMeta(const Node& node, const c10::OperatorHandle& op,
                                        const std::function<at::Tensor(ValueId)>& metaOf);

}  // namespace spmd

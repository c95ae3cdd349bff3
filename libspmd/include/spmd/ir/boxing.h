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

// The node's arguments in `schema` order (the node's op's schema); `tensorOf`
// supplies the tensor of each referenced value.
std::vector<c10::IValue> boxArguments(const Node& node, const c10::FunctionSchema& schema,
                                      const std::function<at::Tensor(ValueId)>& tensorOf);

// The inverse: the graph argument for a boxed value `v` passed as `formal`;
// `valueOf` names the graph value of each tensor (undefined tensors and
// absent list elements become None / kNoValue). A meta device becomes the
// CPU, as traced factory calls name it (spmd-lower moves devices to the
// target). Throws std::invalid_argument for values a graph cannot hold (a
// Generator, say).
Arg argFromIValue(const c10::Argument& formal, const c10::IValue& v,
                  const std::function<ValueId(const at::Tensor&)>& valueOf);

// A contiguous meta tensor of the value's dtype and shape.
at::Tensor metaTensorOf(const Value& v);

// The node's results on the meta device (ops/meta.h's inferOnMeta), its
// arguments supplied by `metaOf`.
std::vector<at::Tensor> inferNodeOnMeta(const Node& node, const c10::OperatorHandle& op,
                                        const std::function<at::Tensor(ValueId)>& metaOf);

}  // namespace spmd

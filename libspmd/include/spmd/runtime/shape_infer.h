// Shape and dtype inference by running an op on LibTorch's meta device.
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <functional>
#include <vector>

namespace spmd {

// A contiguous meta tensor of the value's dtype and shape.
at::Tensor metaTensorOf(const Value& v);

// Runs `op` for `node` on the meta tensors `metaOf` gives and returns what it
// produced, as meta tensors with the op's own strides (undefined where the op
// leaves a result undefined). Where this LibTorch has no meta kernel for the
// op (1.13 lacks some, e.g. convolution_backward), the op runs on zero-filled
// CPU tensors instead. Throws what the op throws when both fail.
std::vector<at::Tensor> inferOnMeta(const Node& node, const c10::OperatorHandle& op,
                                    const std::function<at::Tensor(ValueId)>& metaOf);

}  // namespace spmd

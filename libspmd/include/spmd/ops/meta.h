// Shape and dtype inference by running an op on LibTorch's meta device.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <vector>

namespace spmd {

// A contiguous meta tensor.
at::Tensor metaTensor(c10::ScalarType dtype, const std::vector<int64_t>& shape);

// Runs `op` on `stack` (its tensors on the meta device) and returns what it
// produced, as meta tensors with the op's own strides (undefined where the op
// leaves a result undefined). Where this LibTorch has no meta kernel for the
// op (1.13 lacks some, e.g. convolution_backward), the op runs on zero-filled
// CPU tensors instead. Throws what the op throws when both fail.
std::vector<at::Tensor> inferOnMeta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);

}  // namespace spmd

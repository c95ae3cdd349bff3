// Shape and dtype inference by running an op on LibTorch's meta device.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <vector>

namespace spmd {

// While one lives, the ops whose meta function PyTorch writes in Python, so
// that LibTorch has no meta kernel for them (layer norm, the embedding and
// its gradient, the _foreach ops), work on meta tensors all the same through
// shape functions of ours. The first
// live scope registers that fallback with the dispatcher, the last one to
// end deregisters it; scopes nested inside a live one only count. Hold one
// around any code that runs ops on meta tensors itself (inferOnMeta takes
// its own where an op needs it), and one around a loop of inferOnMeta calls
// spares a registration per call.
class MetaFallbackScope {
 public:
  MetaFallbackScope();
  ~MetaFallbackScope();
  MetaFallbackScope(const MetaFallbackScope&) = delete;
  MetaFallbackScope& operator=(const MetaFallbackScope&) = delete;

  // For as long as scopes live: `op`, an aten op that fails on meta tensors
  // for want of a meta kernel somewhere below it, runs as runMetaOnCpu does
  // instead (a program's _native_batch_norm_legit_functional, say).
  void standInOnCpu(const c10::OperatorHandle& op);
};

// Runs `op` on the boxed `stack` as its meta kernel would: on zero-filled CPU
// copies of the stack's meta tensors (a meta device argument becomes the
// CPU), leaving meta results of the CPU results' shapes and strides. In-place
// and out= results are the meta arguments they write. For ops that have no
// meta kernel in this LibTorch.
void runMetaOnCpu(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack);

// A contiguous meta tensor.
at::Tensor metaTensor(c10::ScalarType dtype, const std::vector<int64_t>& shape);

// Runs `op` on `stack` (its tensors on the meta device) and returns what it
// produced, as meta tensors with the op's own strides (undefined where the op
// leaves a result undefined). Where this LibTorch has no meta kernel for the
// op, it runs again inside a MetaFallbackScope of its own, and failing that
// on zero-filled CPU tensors.
// Throws what the op throws when all fail.
std::vector<at::Tensor> inferOnMeta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);

// The message of the last refusal on this thread to stand in zero-filled
// CPU tensors beyond the bound (support/limits.h), cleared when taken. A
// trace that failed for it would need at least as much memory on CPU
// tensors, so callers report it instead of trying those.
std::optional<std::string> takeStandInRefusal();

}  // namespace spmd

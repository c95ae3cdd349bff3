// spmd::cross_entropy and spmd::cross_entropy_backward: log_softmax over the
// classes of [rows, classes] logits followed by nll_loss (no class
// weights; reduction mean or sum), and the backward of both, as one op each
// (spmd-lower's cross-entropy-to-kernel puts them in place of the four ATen ops).
// The forward returns nll_loss's loss and total weight, and each row's
// log-sum-exp for the backward, which recomputes the softmax from the
// logits instead of reading a stored log_softmax. spmd::cross_entropy_with_grad
// is both at once for a loss whose incoming gradient is the constant
// grad_scale (the ones_like a train step's backward starts from): the loss,
// the total weight and the logits' gradient.
//
// bf16 or f16 logits stand for autocast's form of the four ops: log_softmax
// in the logits' type, cast to fp32 for nll_loss, and nll_loss's gradient
// cast back for log_softmax's backward. The log-sum-exp and the loss are
// fp32; the logits' gradient has the logits' type.
// spmd::cross_entropy_with_grad.upcast stands for the fp32 op over the
// bf16 or f16 logits cast up (a model's logits.float(), autocast's cast of
// the loss's input), its gradient cast back to the logits' type: the same
// values, without the fp32 logits and gradient in memory.
//
// CUDA runs the generated kernels (ops/cross_entropy_codegen.h, launched in
// backend/fused_kernels_cuda.cpp); the CPU kernel here is the reference they are
// tested against, the same ATen ops the pass replaced.
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace spmd {
namespace {

// The ops the pass replaced, as the unfused graph runs them: log_softmax in
// the logits' type (the backward computes it again from the logits), cast
// to fp32 for nll_loss, nll_loss's gradient cast back (casts that do
// nothing for fp32 logits).
std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyCpu(const at::Tensor& logits, const at::Tensor& target,
                                                               int64_t reduction, int64_t ignoreIndex) {
  TORCH_CHECK(logits.dim() == 2, "spmd::cross_entropy: logits must be [rows, classes]");
  const at::Tensor logProbs = at::_log_softmax(logits, 1, false).to(at::kFloat);
  auto [loss, totalWeight] = at::nll_loss_forward(logProbs, target, {}, reduction, ignoreIndex);
  return {loss, totalWeight, at::logsumexp(logits.to(at::kFloat), {1})};
}

at::Tensor crossEntropyBackwardCpu(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& target,
                                   const at::Tensor& /*lse*/, const at::Tensor& totalWeight, int64_t reduction,
                                   int64_t ignoreIndex) {
  const at::Tensor logProbs = at::_log_softmax(logits, 1, false);
  const at::Tensor gradLogProbs =
      at::nll_loss_backward(grad, logProbs.to(at::kFloat), target, {}, reduction, ignoreIndex, totalWeight);
  return at::_log_softmax_backward_data(gradLogProbs.to(logits.scalar_type()), logProbs, 1, logits.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyWithGradCpu(const at::Tensor& logits,
                                                                       const at::Tensor& target, int64_t reduction,
                                                                       int64_t ignoreIndex, double gradScale) {
  auto [loss, totalWeight, lse] = crossEntropyCpu(logits, target, reduction, ignoreIndex);
  const at::Tensor grad = at::full({}, gradScale, logits.options().dtype(at::kFloat));
  return {loss, totalWeight, crossEntropyBackwardCpu(grad, logits, target, lse, totalWeight, reduction, ignoreIndex)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyWithGradUpcastCpu(const at::Tensor& logits,
                                                                             const at::Tensor& target,
                                                                             int64_t reduction, int64_t ignoreIndex,
                                                                             double gradScale) {
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kHalf,
              "spmd::cross_entropy_with_grad.upcast: bf16 or f16 logits");
  auto [loss, totalWeight, grad] =
      crossEntropyWithGradCpu(logits.to(at::kFloat), target, reduction, ignoreIndex, gradScale);
  return {loss, totalWeight, grad.to(logits.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyMeta(const at::Tensor& logits, const at::Tensor& target,
                                                                int64_t, int64_t) {
  TORCH_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
              "spmd::cross_entropy: logits [rows, classes] and target [rows]");
  const auto f32 = logits.options().dtype(at::kFloat);
  return {at::empty({}, f32), at::empty({}, f32), at::empty({logits.size(0)}, f32)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyWithGradMeta(const at::Tensor& logits,
                                                                        const at::Tensor& target, int64_t reduction,
                                                                        int64_t ignoreIndex, double) {
  auto [loss, totalWeight, lse] = crossEntropyMeta(logits, target, reduction, ignoreIndex);
  return {loss, totalWeight, at::empty_like(logits)};
}

at::Tensor crossEntropyBackwardMeta(const at::Tensor&, const at::Tensor& logits, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, int64_t, int64_t) {
  return at::empty_like(logits);
}

}  // namespace

void ensureCrossEntropyOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) {
  m.def("cross_entropy(Tensor logits, Tensor target, int reduction, int ignore_index) "
        "-> (Tensor loss, Tensor total_weight, Tensor lse)");
  m.def("cross_entropy_backward(Tensor grad, Tensor logits, Tensor target, Tensor lse, Tensor total_weight, "
        "int reduction, int ignore_index) -> Tensor");
  m.def("cross_entropy_with_grad(Tensor logits, Tensor target, int reduction, int ignore_index, float grad_scale) "
        "-> (Tensor loss, Tensor total_weight, Tensor grad_logits)");
  m.def("cross_entropy_with_grad.upcast(Tensor logits, Tensor target, int reduction, int ignore_index, "
        "float grad_scale) -> (Tensor loss, Tensor total_weight, Tensor grad_logits)");
}

TORCH_LIBRARY_IMPL(spmd, CPU, m) {
  m.impl("cross_entropy", &spmd::crossEntropyCpu);
  m.impl("cross_entropy_backward", &spmd::crossEntropyBackwardCpu);
  m.impl("cross_entropy_with_grad", &spmd::crossEntropyWithGradCpu);
  m.impl("cross_entropy_with_grad.upcast", &spmd::crossEntropyWithGradUpcastCpu);
}

TORCH_LIBRARY_IMPL(spmd, Meta, m) {
  m.impl("cross_entropy", &spmd::crossEntropyMeta);
  m.impl("cross_entropy_backward", &spmd::crossEntropyBackwardMeta);
  m.impl("cross_entropy_with_grad", &spmd::crossEntropyWithGradMeta);
  m.impl("cross_entropy_with_grad.upcast", &spmd::crossEntropyWithGradMeta);
}

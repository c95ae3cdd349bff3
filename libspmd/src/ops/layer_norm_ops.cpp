// spmd::layer_norm and spmd::layer_norm_backward: LayerNorm over the last
// dimension with a weight and a bias, and its backward, as one op each
// (spmd-lower's layer-norm-to-kernel puts them in place of aten::native_layer_norm
// and aten::native_layer_norm_backward). The forward's `dtype` is its
// output's: bf16 where the cast autocast puts after it is fused; with a
// `residual` it normalizes input + residual and returns that sum too (the
// skip connection's add, fused; undefined without one). The
// backward's incoming gradient may be bf16 (the cast back to fp32 fused), and
// its optional `residual` is added to the input's gradient (the skip
// connection's gradient, fused); with `bf16_copy` it also returns the
// input's gradient rounded to bf16 (the cast autocast puts before the GEMM
// that reads it, fused; undefined without). mean and rstd are shaped as
// ATen's: the input's shape with the last dimension 1.
//
// CUDA runs the generated kernels (ops/layer_norm_codegen.h, launched in
// backend/reduction_kernels_cuda.cpp); the CPU kernels here are the reference they are
// tested against, the ATen ops the pass replaced.
#include "spmd/ops/spmd_ops.h"
#include "spmd/ops/op_helpers.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace spmd {
namespace {

using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Forward layerNormCpu(const at::Tensor& input, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
                     const at::Tensor& bias, double eps, at::ScalarType dtype) {
  TORCH_CHECK(input.dim() >= 1, "spmd::layer_norm: an input of at least one dimension");
  const at::Tensor sum = given(residual) ? input + *residual : at::Tensor();
  auto [out, mean, rstd] = at::native_layer_norm(given(residual) ? sum : input, {input.size(-1)}, weight, bias, eps);
  return {out.to(dtype), mean, rstd, sum};
}

using Backward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Backward layerNormBackwardCpu(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean,
                              const at::Tensor& rstd, const at::Tensor& weight,
                              const c10::optional<at::Tensor>& residual, bool bf16Copy) {
  // ATen reads only the bias's shape and options (for its gradient), which
  // are the weight's.
  auto [gradInput, gradWeight, gradBias] = at::native_layer_norm_backward(
      grad.to(input.scalar_type()), input, {input.size(-1)}, mean, rstd, weight, weight, {true, true, true});
  if (given(residual)) gradInput = gradInput + *residual;
  return {gradInput, gradWeight, gradBias, bf16Copy ? gradInput.to(at::kBFloat16) : at::Tensor()};
}

Forward layerNormMeta(const at::Tensor& input, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
                      const at::Tensor& bias, double, at::ScalarType dtype) {
  TORCH_CHECK(input.dim() >= 1 && weight.dim() == 1 && weight.size(0) == input.size(-1) &&
                  bias.sizes() == weight.sizes() && (!given(residual) || residual->sizes() == input.sizes()),
              "spmd::layer_norm: a weight and a bias of the input's last dimension, a residual of its shape");
  const auto f32 = input.options().dtype(at::kFloat);
  return {at::empty(input.sizes(), input.options().dtype(dtype)), at::empty(layerNormStatsShape(input), f32),
          at::empty(layerNormStatsShape(input), f32), given(residual) ? at::empty(input.sizes(), f32) : at::Tensor()};
}

Backward layerNormBackwardMeta(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean,
                               const at::Tensor& rstd, const at::Tensor& weight,
                               const c10::optional<at::Tensor>& residual, bool bf16Copy) {
  TORCH_CHECK(grad.sizes() == input.sizes() && mean.sizes() == rstd.sizes() && weight.dim() == 1 &&
                  weight.size(0) == input.size(-1) && (!given(residual) || residual->sizes() == input.sizes()),
              "spmd::layer_norm_backward: a gradient, and a residual, of the input's shape");
  return {at::empty_like(input), at::empty_like(weight), at::empty_like(weight),
          bf16Copy ? at::empty_like(input, input.options().dtype(at::kBFloat16)) : at::Tensor()};
}

}  // namespace

void ensureLayerNormOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) {
  m.def("layer_norm(Tensor input, Tensor? residual, Tensor weight, Tensor bias, float eps, ScalarType dtype) "
        "-> (Tensor out, Tensor mean, Tensor rstd, Tensor sum)");
  m.def("layer_norm_backward(Tensor grad, Tensor input, Tensor mean, Tensor rstd, Tensor weight, Tensor? residual, "
        "bool bf16_copy) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias, Tensor grad_input_bf16)");
}

TORCH_LIBRARY_IMPL(spmd, CPU, m) {
  m.impl("layer_norm", &spmd::layerNormCpu);
  m.impl("layer_norm_backward", &spmd::layerNormBackwardCpu);
}

TORCH_LIBRARY_IMPL(spmd, Meta, m) {
  m.impl("layer_norm", &spmd::layerNormMeta);
  m.impl("layer_norm_backward", &spmd::layerNormBackwardMeta);
}

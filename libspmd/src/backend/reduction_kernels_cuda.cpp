// spmd::layer_norm(_backward) and spmd::column_sum on CUDA: the generated
// kernels of ops/layer_norm_codegen.h and ops/column_sum_codegen.h, launched
// through the kernel cache (backend/generated_kernels.h) on the current
// stream (so a CUDA graph captures them). Compiled only into CUDA builds.
#include "spmd/backend/generated_kernels.h"

#include "spmd/ops/column_sum_codegen.h"
#include "spmd/ops/ivalue_call_args.h"
#include "spmd/ops/layer_norm_codegen.h"
#include "spmd/ops/op_helpers.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace spmd {
namespace {

// `t` contiguous, and copied where its start is not 16-byte aligned (a view
// at an odd offset): the kernels read and write rows 16 bytes (bf16: 8) at a time.
at::Tensor aligned(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

void checkRows(const char* op, const at::Tensor& input, const at::Tensor& weight) {
  TORCH_CHECK(input.is_cuda() && input.scalar_type() == at::kFloat && input.dim() >= 1 &&
                  weight.scalar_type() == at::kFloat && weight.dim() == 1 && weight.size(0) == input.size(-1),
              op, ": fp32 rows on the GPU with an fp32 weight of their length");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> layerNormCuda(const at::Tensor& input,
                                                                         const c10::optional<at::Tensor>& residual,
                                                                         const at::Tensor& weight,
                                                                         const at::Tensor& bias, double eps,
                                                                         at::ScalarType dtype) {
  constexpr const char* op = "spmd::layer_norm";
  checkRows(op, input, weight);
  TORCH_CHECK(!given(residual) || residual->sizes() == input.sizes(), op, ": a residual of the input's shape");
  const int64_t features = input.size(-1), rows = input.numel() / std::max<int64_t>(features, 1);
  const LayerNormKernelSpec spec = generatedSpec(
      op, [&] { return LayerNormKernelSpec::forCall(IValueCallArgs({input, residual, weight, bias, eps, dtype})); });
  const at::Tensor x = aligned(input), w = aligned(weight), b = aligned(bias.to(at::kFloat));
  const at::Tensor r = given(residual) ? aligned(*residual) : at::Tensor();
  at::Tensor y = at::empty(input.sizes(), input.options().dtype(dtype));
  const std::vector<int64_t> stats = layerNormStatsShape(input);
  at::Tensor mean = at::empty(stats, input.options()), rstd = at::empty(stats, input.options());
  at::Tensor sum = given(residual) ? at::empty(input.sizes(), input.options()) : at::Tensor();
  launchGenerated(op, spec, spec.launch(rows), x.device(),
                  {x.data_ptr(), r.defined() ? r.data_ptr() : nullptr, w.data_ptr(), b.data_ptr(), y.data_ptr(),
                   mean.data_ptr(), rstd.data_ptr(), sum.defined() ? sum.data_ptr() : nullptr});
  return {y, mean, rstd, sum};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> layerNormBackwardCuda(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const at::Tensor& weight, const c10::optional<at::Tensor>& residual, bool bf16Copy) {
  constexpr const char* op = "spmd::layer_norm_backward";
  checkRows(op, input, weight);
  const bool withResidual = given(residual);
  TORCH_CHECK(grad.sizes() == input.sizes() && (!withResidual || (residual->sizes() == input.sizes() &&
                                                                  residual->scalar_type() == at::kFloat)),
              op, ": a gradient, and an fp32 residual, of the input's shape");
  const int64_t features = input.size(-1), rows = input.numel() / std::max<int64_t>(features, 1);
  const LayerNormBackwardKernelSpec spec = generatedSpec(op, [&] {
    return LayerNormBackwardKernelSpec::forCall(IValueCallArgs({grad, input, mean, rstd, weight, residual, bf16Copy}));
  });
  const at::Tensor dy = aligned(grad), x = aligned(input), w = aligned(weight);
  const at::Tensor m = mean.contiguous(), r = rstd.contiguous();
  const at::Tensor add = withResidual ? aligned(*residual) : at::Tensor();
  at::Tensor dx = at::empty(input.sizes(), input.options());
  at::Tensor dx16 = bf16Copy ? at::empty(input.sizes(), input.options().dtype(at::kBFloat16)) : at::Tensor();
  const int64_t blocks = layerNormBackwardBlocks(rows);
  at::Tensor partial = at::empty({blocks, 2, features}, input.options());
  at::Tensor dw = at::empty_like(w), db = at::empty_like(w);
  launchGenerated(op, spec, spec.rowsLaunch(rows), x.device(),
                  {dy.data_ptr(), x.data_ptr(), m.data_ptr(), r.data_ptr(), w.data_ptr(),
                   withResidual ? add.data_ptr() : nullptr, dx.data_ptr(), bf16Copy ? dx16.data_ptr() : nullptr,
                   partial.data_ptr()});
  launchGenerated(op, spec, spec.paramsLaunch(rows), x.device(), {partial.data_ptr(), dw.data_ptr(), db.data_ptr()});
  return {dx, dw, db, dx16};
}

at::Tensor columnSumCuda(const at::Tensor& input, bool keepdim) {
  constexpr const char* op = "spmd::column_sum";
  TORCH_CHECK(input.is_cuda() && input.dim() >= 2, op, ": a tensor of at least two dimensions on the GPU");
  const int64_t columns = input.size(-1), rows = input.numel() / std::max<int64_t>(columns, 1);
  const ColumnSumKernelSpec spec =
      generatedSpec(op, [&] { return ColumnSumKernelSpec::forCall(IValueCallArgs({input, keepdim})); });
  const at::Tensor x = aligned(input);
  std::vector<int64_t> shape(keepdim ? static_cast<size_t>(input.dim() - 1) : 0, 1);
  shape.push_back(columns);
  at::Tensor out = at::empty(shape, input.options());
  const std::vector<KernelLaunch> launches = spec.launches(rows);
  if (launches.empty()) return out.zero_();  // no rows
  if (launches.size() == 1) {  // one kernel sums whole columns
    launchGenerated(op, spec, launches[0], x.device(), {x.data_ptr(), out.data_ptr()});
    return out;
  }
  at::Tensor partial = at::empty({columnSumParts(rows), columns}, input.options().dtype(at::kFloat));
  launchGenerated(op, spec, launches[0], x.device(), {x.data_ptr(), partial.data_ptr()});
  launchGenerated(op, spec, launches[1], x.device(), {partial.data_ptr(), out.data_ptr()});
  return out;
}

}  // namespace

void ensureReductionKernelsCudaRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_IMPL(spmd, CUDA, m) {
  m.impl("layer_norm", &spmd::layerNormCuda);
  m.impl("layer_norm_backward", &spmd::layerNormBackwardCuda);
  m.impl("column_sum", &spmd::columnSumCuda);
}

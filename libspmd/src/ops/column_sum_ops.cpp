// spmd::column_sum(Tensor x, bool keepdim): the sum over every dimension of
// x but the last, in x's dtype (a Linear bias's gradient; spmd-lower's
// column-sum-to-kernel puts it in place of aten::sum.dim_IntList over those
// dimensions). keepdim keeps them as 1s, as the sum it replaces did.
//
// CUDA runs the generated kernels (ops/column_sum_codegen.h, launched in
// backend/reduction_kernels_cuda.cpp); the CPU kernel here is the reference
// they are tested against, ATen's sum.
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <numeric>
#include <vector>

namespace spmd {
namespace {

std::vector<int64_t> leadingDims(const at::Tensor& x) {
  std::vector<int64_t> dims(static_cast<size_t>(x.dim() - 1));
  std::iota(dims.begin(), dims.end(), int64_t{0});
  return dims;
}

at::Tensor columnSumCpu(const at::Tensor& x, bool keepdim) {
  TORCH_CHECK(x.dim() >= 2, "spmd::column_sum: a tensor of at least two dimensions");
  return at::sum(x, leadingDims(x), keepdim);
}

at::Tensor columnSumMeta(const at::Tensor& x, bool keepdim) {
  TORCH_CHECK(x.dim() >= 2, "spmd::column_sum: a tensor of at least two dimensions");
  std::vector<int64_t> shape(keepdim ? static_cast<size_t>(x.dim() - 1) : 0, 1);
  shape.push_back(x.size(-1));
  return at::empty(shape, x.options());
}

}  // namespace

void ensureColumnSumOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) { m.def("column_sum(Tensor x, bool keepdim) -> Tensor"); }

TORCH_LIBRARY_IMPL(spmd, CPU, m) { m.impl("column_sum", &spmd::columnSumCpu); }

TORCH_LIBRARY_IMPL(spmd, Meta, m) { m.impl("column_sum", &spmd::columnSumMeta); }

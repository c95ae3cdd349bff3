// CUDA C for spmd::layer_norm(_backward), LayerNorm over the last dimension
// of fp32 rows [rows, features] with a weight and a bias (what
// aten::native_layer_norm and its backward compute). The forward's source
// holds one kernel, the backward's two:
//
//   spmd_layer_norm(const float* x, const RES* residual, const float* weight,
//                   const float* bias, OUT* y, float* mean, float* rstd,
//                   float* sum, long long rows)
//     per row of x, or of sum = x + residual when the source adds one (the
//     skip connection's add before a pre-LN block's LayerNorm, fused; RES
//     f32 or bf16): mean, rstd = 1 / sqrt(biased variance + eps), and
//     y = (x - mean) * rstd * weight + bias rounded to OUT (f32 or bf16:
//     the cast that autocast puts after an fp32 LayerNorm, fused).
//   spmd_layer_norm_backward(const GRAD* dy, const float* x, const float* mean,
//                            const float* rstd, const float* weight,
//                            const float* residual, float* dx, COPY* dx_copy,
//                            float* partial, long long rows)
//     dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight
//     and xhat = (x - mean) * rstd (ATen's formula), plus `residual` when the
//     source adds one (the gradient that the skip connection adds to dx,
//     fused), and dx rounded to bf16 into dx_copy when the source writes a copy
//     (the cast autocast puts before the GEMM that reads dx, fused; COPY is
//     f32 and dx_copy unused otherwise); each block also writes its rows'
//     column sums of dy * xhat and
//     dy to partial[block][0 or 1][feature].
//   spmd_layer_norm_backward_params(const float* partial, float* dweight,
//                                   float* dbias, long long blocks)
//     sums the blocks' partial sums in a fixed order: the weight's and the
//     bias's gradients.
//
// A warp takes a row at a time, held in registers, 16 bytes a load; the
// backward's blocks cover a fixed number of rows, so the sums' order (and
// their rounding) does not depend on the GPU. The source is deterministic
// and needs no headers, like the pointwise kernels' (ops/cuda_codegen.h).
#pragma once

#include "spmd/ops/kernel_spec.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace spmd {

constexpr const char* kLayerNormKernelName = "spmd_layer_norm";
constexpr const char* kLayerNormBackwardKernelName = "spmd_layer_norm_backward";
constexpr const char* kLayerNormParamsKernelName = "spmd_layer_norm_backward_params";
constexpr int kLayerNormWarps = 8;         // warps a block: rows at a time
// The backward's rows for each warp: 4 halves the partial sums that 2 wrote
// (and the params kernel's work); a further 4% on H200 after the prefetch.
constexpr int kLayerNormRowsPerWarp = 4;
// 32 warps a params block: each sums a 32nd of the blocks' partial sums.
constexpr int kLayerNormParamsThreads = 1024;
constexpr int kLayerNormParamsColumns = 32;  // features a params block sums
// A row lives in its warp's registers: at most 32 floats a lane.
constexpr int64_t kLayerNormMaxFeatures = 1024;

// Rows a backward block covers, and how many blocks (partial sums) `rows` need.
constexpr int64_t kLayerNormBackwardBlockRows = kLayerNormWarps * kLayerNormRowsPerWarp;
int64_t layerNormBackwardBlocks(int64_t rows);

// Why `features` cannot be generated ("" when it can): a multiple of 4, at
// most kLayerNormMaxFeatures.
std::string layerNormUnsupported(int64_t features);

// spmd::layer_norm's kernel: its rows' length, eps, y's dtype and the
// residual's (none: no residual). Key "layer_norm f=768 eps=1e-05 out=bf16
// res=f32" (res=none without one).
class LayerNormKernelSpec final : public KernelSpec {
 public:
  // Throws std::invalid_argument for features that layerNormUnsupported
  // refuses, a dtype other than Float and BFloat16, or an eps that is
  // negative or not finite.
  LayerNormKernelSpec(int64_t features, double eps, c10::ScalarType outDtype, std::optional<c10::ScalarType> residual);
  // spmd::layer_norm(input, residual?, weight, bias, eps, dtype): the
  // input's last dimension, eps, dtype and the residual's dtype.
  static LayerNormKernelSpec forCall(const KernelCallArgs& call);
  // One warp a row, kLayerNormWarps rows a block.
  KernelLaunch launch(int64_t rows) const;

 private:
  std::string generateSource() const override;

  int64_t features_;
  double eps_;
  c10::ScalarType out_;
  std::optional<c10::ScalarType> residual_;
};

// spmd::layer_norm_backward's kernels: the rows' length, dy's dtype,
// whether an f32 residual gradient is added to dx and whether dx is also
// written in bf16. Key "layer_norm_backward f=768 grad=bf16 res=1" (and
// " copy=bf16" after it with the copy).
class LayerNormBackwardKernelSpec final : public KernelSpec {
 public:
  // Throws std::invalid_argument as LayerNormKernelSpec's.
  LayerNormBackwardKernelSpec(int64_t features, c10::ScalarType gradDtype, bool residual, bool bf16Copy = false);
  // spmd::layer_norm_backward(grad, input, mean, rstd, weight, residual?,
  // bf16_copy): the input's last dimension, the gradient's dtype, whether
  // a residual is given, bf16_copy.
  static LayerNormBackwardKernelSpec forCall(const KernelCallArgs& call);
  // The row kernel (each block writes its partial sums:
  // layerNormBackwardBlocks(rows) of [2, features] floats), then the params
  // kernel, which sums them.
  KernelLaunch rowsLaunch(int64_t rows) const;
  KernelLaunch paramsLaunch(int64_t rows) const;

 private:
  std::string generateSource() const override;

  int64_t features_;
  c10::ScalarType grad_;
  bool residual_;
  bool bf16Copy_;
};

}  // namespace spmd

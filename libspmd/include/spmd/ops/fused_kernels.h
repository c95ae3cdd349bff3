// spmd::fused(Tensor[] inputs, str program) -> Tensor[]: a group of
// pointwise ops as one node (spmd-lower's fuse-pointwise pass), its body a
// pointwise program (ops/pointwise_program.h). On CUDA it runs as one
// generated kernel (ops/cuda_codegen.h), which the CUDA backend compiles
// and launches (backend/generated_kernels.h); on the CPU the program is
// evaluated op by op with ATen (the reference the GPU kernels are tested
// against); on the meta device it gives shapes and dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace spmd {

void ensureFusedKernelOpsRegistered();

#ifdef SPMD_WITH_CUDA
// spmd::fused_attention's "gemm" kernel (ops/attention_ops.cpp) runs its
// row softmax and the softmax's backward as generated kernels
// (ops/attention_codegen.h), over contiguous fp32 scores [..., queries,
// keys], in place, on the current stream. The CUDA backend, a layer above
// ops, launches them: it sets these while the program starts, where it is
// linked in (backend/generated_kernels.h: ensureCudaBackendRegistered).
struct AttentionSoftmaxKernels {
  void (*forward)(const at::Tensor& scores, double scale, bool causal) = nullptr;
  void (*backward)(const at::Tensor& grad, const at::Tensor& probs, double scale, bool causal) = nullptr;
};
void setAttentionSoftmaxKernels(const AttentionSoftmaxKernels& kernels);
const AttentionSoftmaxKernels& attentionSoftmaxKernels();
#endif

}  // namespace spmd

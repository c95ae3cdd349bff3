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

#include <c10/util/ArrayRef.h>

namespace at {
class Tensor;
}

namespace spmd {

void ensureFusedKernelOpsRegistered();

struct PointwiseProgram;

// The strides of each of spmd::fused's results for these inputs: the layout
// ATen's ops give the values they compute (a non-row program's results
// follow their operands' permutation, as TensorIterator's do), contiguous
// for a row program. The CPU, CUDA and meta kernels all write these.
std::vector<std::vector<int64_t>> fusedResultStrides(const PointwiseProgram& program,
                                                     c10::ArrayRef<at::Tensor> inputs);

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

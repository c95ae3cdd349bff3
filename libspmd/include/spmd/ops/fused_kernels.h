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

#include "spmd/ops/cuda_codegen.h"

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

// How spmd::fused's CUDA kernel sees a call's inputs: the iteration space
// `shape`, walked in the memory `order` of the first result's layout
// (outermost dimension first), each result's strides, each input as a view
// in that order (leading size-1 dimensions added) and the kernel signature
// those views give: an input laid out as the iteration is read as it
// stands, any other (a transpose, a select, a broadcast by expand) in place
// through its strides. spmd-lower computes it on the verifier's meta
// tensors and the CUDA backend on the real ones, so that the kernels lowering
// compiles are the ones the step launches.
struct FusedKernelLayout {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> resultStrides;
  std::vector<int64_t> order;
  std::vector<at::Tensor> views;
  std::vector<KernelTensor> signature;
};
FusedKernelLayout fusedKernelLayout(const PointwiseProgram& program, c10::ArrayRef<at::Tensor> inputs);

// Whether strides `a` and `b` lay out `sizes` alike (size-1 dimensions'
// strides do not matter).
bool sameLayout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& a, const std::vector<int64_t>& b);

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

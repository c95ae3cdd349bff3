// spmd::fused(Tensor[] inputs, str program) -> Tensor[]: a group of
// pointwise ops as one node (spmd-lower's fuse-pointwise pass), its body a
// pointwise program (ops/pointwise_program.h). On CUDA it runs as one
// generated kernel (ops/cuda_codegen.h) compiled with the CUDA toolkit's
// NVRTC and loaded through the driver API; on the CPU the
// program is evaluated op by op with ATen (the reference the GPU kernels
// are tested against); on the meta device it gives shapes and dtypes.
#pragma once

#include "spmd/ops/kernel_spec.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace c10 {
struct Device;
}

namespace spmd {

void ensureFusedKernelOpsRegistered();
#ifdef SPMD_WITH_CUDA
void ensureFusedKernelsCudaRegistered();  // ops/fused_kernels_cuda.cpp

// spmd::fused_attention's "gemm" kernel: attention's row softmax and its
// backward (ops/attention_codegen.h) over contiguous fp32 scores
// [..., queries, keys], in place, on the current stream.
void attentionSoftmaxInPlace(const at::Tensor& scores, double scale, bool causal);
void attentionSoftmaxBackwardInPlace(const at::Tensor& grad, const at::Tensor& probs, double scale, bool causal);

// Launches `launch` (one kernel of `spec`'s source, loaded once per device
// and spec key, its source compiled then unless an image of it is
// installed) on the current stream of `device`, its arguments `pointers`
// and then the launch's count. `op` names the caller in errors.
void launchGenerated(const char* op, const KernelSpec& spec, const KernelLaunch& launch, const c10::Device& device,
                     std::vector<void*> pointers);
void ensureReductionKernelsCudaRegistered();  // ops/reduction_kernels_cuda.cpp
#endif

// A generated kernel's source and its compiled code for one architecture.
struct CompiledKernel {
  std::string source;
  std::string arch;   // "sm_90"
  std::string image;  // the cubin, as NVRTC returned it
};

// Whether this build can compile and launch generated kernels (a CUDA
// LibTorch) and a GPU is present.
bool canCompileKernels();
// The current device's architecture ("sm_90"); "" without a GPU.
std::string currentKernelArch();
// Compiles `source` for the current device. Throws std::runtime_error with
// NVRTC's log on failure, or when canCompileKernels() is false.
CompiledKernel compileKernel(const std::string& source);
// Makes `kernel` the code spmd::fused launches for its source on devices of
// its architecture, so that no launch compiles it again (spmd-run installs
// an artifact's kernels before the first step).
void installCompiledKernel(const CompiledKernel& kernel);
// How many kernels launches of spmd::fused have compiled in this process,
// finding no installed image: 0 for an artifact lowered on a GPU of the
// architecture it runs on.
size_t kernelsCompiledAtLaunch();

}  // namespace spmd

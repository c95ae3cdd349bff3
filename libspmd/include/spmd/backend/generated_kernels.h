// The CUDA backend: generated kernels compiled with NVRTC for the current
// GPU, cached and launched. A kernel's spec (ops/kernel_spec.h) says what
// to compile (its source, generated on the first launch of its key) and how
// to launch it; the cache holds one module per device and spec key, and the
// images an artifact installs, by source. The CUDA ops that launch
// generated kernels live beside it (backend/fused_kernels_cuda.cpp:
// spmd::fused, cross entropy, the gemm attention's softmax;
// backend/reduction_kernels_cuda.cpp: LayerNorm, column sums). In builds
// without CUDA the functions below say there is no GPU.
#pragma once

#include "spmd/ops/kernel_spec.h"

#include <cstddef>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace c10 {
struct Device;
}

namespace spmd {

// Links the CUDA ops' implementations into the program (a static library's
// objects are linked only where something names them) and, with them, the
// gemm attention's softmax that ops/fused_kernels.h's hook calls. Every
// function of this header links them too. Nothing in builds without CUDA.
void ensureCudaBackendRegistered();

// Whether this build can compile and launch generated kernels (a CUDA
// LibTorch) and a GPU is present.
bool canCompileKernels();
// The current device's architecture ("sm_90"); "" without a GPU.
std::string currentKernelArch();
// Compiles `source` for the current device. Throws std::runtime_error with
// NVRTC's log on failure, or when canCompileKernels() is false.
CompiledKernel compileKernel(const std::string& source);
// Makes `kernel` the code launched for its source on devices of its
// architecture, so that no launch compiles it again (spmd-run installs an
// artifact's kernels before the first step).
void installCompiledKernel(const CompiledKernel& kernel);
// How many kernels launches have compiled in this process, finding no
// installed image: 0 for an artifact lowered on a GPU of the architecture
// it runs on.
size_t kernelsCompiledAtLaunch();

#ifdef SPMD_WITH_CUDA
void ensureFusedKernelsCudaRegistered();      // backend/fused_kernels_cuda.cpp
void ensureReductionKernelsCudaRegistered();  // backend/reduction_kernels_cuda.cpp

// Launches `launch` (one kernel of `spec`'s source, loaded once per device
// and spec key, its source compiled then unless an image of it is
// installed) on the current stream of `device`, its arguments `pointers`
// and then the launch's count. `op` names the caller in errors.
void launchGenerated(const char* op, const KernelSpec& spec, const KernelLaunch& launch, const c10::Device& device,
                     std::vector<void*> pointers);
// Loads (compiling where needed) kernel `name` of `spec` on `device`
// without launching it; errors are `op`'s.
void loadGenerated(const char* op, const KernelSpec& spec, const char* name, const c10::Device& device);

// spmd::fused_attention's "gemm" kernel: attention's row softmax and its
// backward (ops/attention_codegen.h) over contiguous fp32 scores
// [..., queries, keys], in place, on the current stream.
void attentionSoftmaxInPlace(const at::Tensor& scores, double scale, bool causal);
void attentionSoftmaxBackwardInPlace(const at::Tensor& grad, const at::Tensor& probs, double scale, bool causal);
#endif

}  // namespace spmd

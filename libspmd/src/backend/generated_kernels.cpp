// The CUDA backend's functions in builds without CUDA: no GPU to compile
// for. CUDA builds define them in backend/generated_kernels_cuda.cpp.
#include "spmd/backend/generated_kernels.h"

#include <stdexcept>

namespace spmd {

#ifndef SPMD_WITH_CUDA
void ensureCudaBackendRegistered() {}
bool canCompileKernels() { return false; }
std::string currentKernelArch() { return ""; }
CompiledKernel compileKernel(const std::string&) {
  throw std::runtime_error("this build has no CUDA LibTorch to compile generated kernels with");
}
void installCompiledKernel(const CompiledKernel&) {}
size_t kernelsCompiledAtLaunch() { return 0; }
#endif

}  // namespace spmd

// The CUDA backend's generated kernels (backend/generated_kernels.h): a
// spec's source compiled with the CUDA toolkit's NVRTC, loaded once per
// device and spec key through the driver API, and launched on the current
// stream, so a CUDA graph captures it. Compiled only into CUDA builds.
// (ATen's own NVRTC table, which jiterator uses, is not reachable: pip's
// LibTorch ships no definition of its struct.)
#include "spmd/backend/generated_kernels.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

namespace spmd {
namespace {

void checkDriver(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* text = nullptr;
  cuGetErrorString(r, &text);
  throw std::runtime_error(std::string(what) + ": " + (text ? text : "CUDA driver error"));
}

void checkNvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) throw std::runtime_error(std::string(what) + ": " + nvrtcGetErrorString(r));
}

// The kernels the process has: compiled images by (arch, source), as an
// artifact installs them; modules by (device, spec key), each loaded once,
// its spec's source generated on that first load only; and their functions
// by (device, spec key, kernel name).
class KernelCache {
 public:
  static KernelCache& instance() {
    static KernelCache cache;
    return cache;
  }

  void install(const CompiledKernel& k) {
    std::lock_guard<std::mutex> lock(mutex_);
    images_[{k.arch, k.source}] = k.image;
  }

  // The kernel `name` of `spec`'s source, loaded on `device`.
  CUfunction function(int device, const KernelSpec& spec, const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::tuple<int, std::string, std::string> where{device, spec.key(), name};
    auto known = functions_.find(where);
    if (known != functions_.end()) return known->second;
    auto it = modules_.find({device, spec.key()});
    if (it == modules_.end()) it = modules_.emplace(std::make_pair(device, spec.key()), load(spec.source())).first;
    CUfunction f = nullptr;
    checkDriver(cuModuleGetFunction(&f, it->second, name), "finding a generated kernel");
    return functions_[where] = f;
  }

  size_t compiledAtLaunch() {
    std::lock_guard<std::mutex> lock(mutex_);
    return compiledAtLaunch_;
  }

 private:
  // The module of `source` for the current device: its installed image, or
  // one compiled now (and counted). The caller holds the lock.
  CUmodule load(const std::string& source) {
    const std::string arch = currentKernelArch();
    auto image = images_.find({arch, source});
    if (image == images_.end()) {
      image = images_.emplace(std::make_pair(arch, source), compileKernel(source).image).first;
      ++compiledAtLaunch_;
    }
    CUmodule module = nullptr;
    checkDriver(cuModuleLoadData(&module, image->second.data()), "loading a generated kernel");
    return module;
  }

  std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::string> images_;
  std::map<std::pair<int, std::string>, CUmodule> modules_;
  std::map<std::tuple<int, std::string, std::string>, CUfunction> functions_;
  size_t compiledAtLaunch_ = 0;
};

// The driver API wants a current context; ATen's runtime calls make the
// primary one current, but only once something has run on this thread.
void ensureContext() {
  CUcontext ctx = nullptr;
  checkDriver(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) cudaFree(nullptr);
}

// The kernel `name` of `spec` on `device`, loaded (and compiled, where no
// image is installed) on its first use; errors are `op`'s.
CUfunction loadedKernel(const char* op, const KernelSpec& spec, const char* name, const at::Device& device) {
  try {
    ensureContext();
    return KernelCache::instance().function(device.index(), spec, name);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, op, ": ", e.what());
  }
  return nullptr;  // not reached: TORCH_CHECK(false) throws
}

}  // namespace

void loadGenerated(const char* op, const KernelSpec& spec, const char* name, const at::Device& device) {
  (void)loadedKernel(op, spec, name, device);
}

void launchGenerated(const char* op, const KernelSpec& spec, const KernelLaunch& launch, const at::Device& device,
                     std::vector<void*> pointers) {
  if (launch.blocks == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  CUfunction f = loadedKernel(op, spec, launch.kernel, device);
  // More than 48 KB of dynamic shared memory is opt-in, per function.
  if (launch.sharedBytes > 48 * 1024) {
    try {
      checkDriver(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.sharedBytes),
                  "asking for a generated kernel's shared memory");
    } catch (const std::exception& e) {
      TORCH_CHECK(false, op, ": ", e.what());
    }
  }
  long long count = launch.count.value_or(0);
  std::vector<void*> args;
  for (void*& p : pointers) args.push_back(&p);
  if (launch.count) args.push_back(&count);
  const CUresult launched = cuLaunchKernel(f, static_cast<unsigned int>(launch.blocks), 1, 1, launch.threads, 1, 1,
                                           static_cast<unsigned int>(launch.sharedBytes),
                                           at::cuda::getCurrentCUDAStream(), args.data(), nullptr);
  TORCH_CHECK(launched == CUDA_SUCCESS, op, ": launching ", launch.kernel, " failed (CUDA error ", launched, ")");
}

bool canCompileKernels() { return at::hasCUDA() && at::cuda::device_count() > 0; }

std::string currentKernelArch() {
  if (!canCompileKernels()) return "";
  const cudaDeviceProp* p = at::cuda::getCurrentDeviceProperties();
  return "sm_" + std::to_string(p->major) + std::to_string(p->minor);
}

CompiledKernel compileKernel(const std::string& source) {
  if (!canCompileKernels()) throw std::runtime_error("no GPU to compile generated kernels for");
  CompiledKernel k{source, currentKernelArch(), ""};
  nvrtcProgram prog = nullptr;
  checkNvrtc(nvrtcCreateProgram(&prog, source.c_str(), "spmd_fused.cu", 0, nullptr, nullptr),
             "nvrtcCreateProgram");
  const std::string archFlag = "--gpu-architecture=" + k.arch;
  // No fast math: the kernels round as ATen's do.
  const char* options[] = {archFlag.c_str(), "--std=c++17"};
  const nvrtcResult compiled = nvrtcCompileProgram(prog, 2, options);
  if (compiled != NVRTC_SUCCESS) {
    size_t size = 0;
    nvrtcGetProgramLogSize(prog, &size);
    std::string log(size, '\0');
    nvrtcGetProgramLog(prog, log.data());
    nvrtcDestroyProgram(&prog);
    throw std::runtime_error("NVRTC could not compile a generated kernel: " + log.substr(0, log.find('\n')));
  }
  size_t size = 0;
  checkNvrtc(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  k.image.resize(size);
  checkNvrtc(nvrtcGetCUBIN(prog, k.image.data()), "nvrtcGetCUBIN");
  nvrtcDestroyProgram(&prog);
  return k;
}

void installCompiledKernel(const CompiledKernel& kernel) { KernelCache::instance().install(kernel); }

size_t kernelsCompiledAtLaunch() { return KernelCache::instance().compiledAtLaunch(); }

void ensureCudaBackendRegistered() {
  // Naming them here links the CUDA ops' registrations into every program
  // that uses this file (a static library's objects are linked when named).
  ensureFusedKernelsCudaRegistered();
  ensureReductionKernelsCudaRegistered();
}

}  // namespace spmd

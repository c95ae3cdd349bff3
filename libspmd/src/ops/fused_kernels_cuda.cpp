// spmd::fused on CUDA: the generated kernel (ops/cuda_codegen.h), compiled
// with the CUDA toolkit's NVRTC, loaded once per device through the driver
// API and launched on the current stream, so a CUDA graph captures it.
// Compiled only into CUDA builds. (ATen's own NVRTC table, which jiterator
// uses, is not reachable: pip's LibTorch ships no definition of its struct.)
#include "spmd/ops/attention_codegen.h"
#include "spmd/ops/cross_entropy_codegen.h"
#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/ops/ivalue_call_args.h"
#include "spmd/ops/pointwise_program.h"
#include "op_helpers.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

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

std::vector<at::Tensor> fusedCuda(at::TensorList inputs, c10::string_view text) {
  TORCH_CHECK(!inputs.empty(), "spmd::fused: no inputs");
  std::vector<KernelTensor> sig;
  for (const at::Tensor& t : inputs) sig.push_back({t.scalar_type(), t.sizes().vec()});
  std::optional<PointwiseKernelSpec> spec;
  try {
    spec.emplace(std::string(text.data(), text.size()), sig);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "spmd::fused: bad program: ", e.what());
  }
  const PointwiseProgram& program = spec->program();
  const std::vector<int64_t> shape = broadcastShapes(sig);
  // A 0-dim CPU tensor may stand beside CUDA ones, as in ATen's own ops; it
  // is copied to the device (fuse-pointwise and fuse-rows fold the
  // importer's scalar_tensor constants, so a step's kernels see none).
  const at::Tensor* onDevice = nullptr;
  for (const at::Tensor& t : inputs) {
    if (!onDevice && t.is_cuda()) onDevice = &t;
    TORCH_CHECK(t.is_cuda() || t.dim() == 0, "spmd::fused: an input on ", t.device(), " of ", t.dim(),
                " dimensions beside CUDA tensors");
  }
  TORCH_CHECK(onDevice, "spmd::fused: no input on the GPU");
  const c10::cuda::CUDAGuard guard(onDevice->device());
  // Loaded (compiled) even when there is nothing to compute, as before the specs.
  loadedKernel("spmd::fused", *spec, spec->scalarKernelName(), onDevice->device());

  std::vector<at::Tensor> dense;
  std::vector<void*> pointers;
  for (const at::Tensor& t : inputs) {
    dense.push_back(t.is_cuda() ? t.contiguous() : t.to(onDevice->device()));
    pointers.push_back(dense.back().data_ptr());
  }
  std::vector<at::Tensor> out;
  for (size_t r = 0; r < program.results.size(); ++r) {
    out.push_back(at::empty(resultShape(program, r, shape),
                            onDevice->options().dtype(program.statements[program.results[r]].dtype)));
    pointers.push_back(out.back().data_ptr());
  }
  const int64_t numel = c10::multiply_integers(shape);
  // fuse-rows takes no rows of length 0 (whose sums and maxima would need filling in).
  TORCH_CHECK(!hasRowReductions(program) || shape.back() > 0, "spmd::fused: a row program over rows of length 0");
  if (numel == 0) return out;
  // The vector form where every operand allows 16-byte access.
  bool aligned = true;
  for (void* p : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  launchGenerated("spmd::fused", *spec, spec->launch(sms, aligned), onDevice->device(), std::move(pointers));
  return out;
}

// An attention softmax kernel over `scores` ([..., queries, keys],
// contiguous fp32), one warp a row: `launchOf` picks the forward's or the backward's.
void launchAttentionSoftmax(KernelLaunch (AttentionSoftmaxKernelSpec::*launchOf)(int64_t) const,
                            const at::Tensor& scores, std::vector<void*> pointers, double scale, bool causal) {
  TORCH_CHECK(scores.is_cuda() && scores.scalar_type() == at::kFloat && scores.is_contiguous() && scores.dim() >= 2,
              "spmd::fused_attention: the gemm kernel's scores must be contiguous fp32 on the GPU");
  const int64_t keys = scores.size(-1), rows = scores.numel() / std::max<int64_t>(keys, 1);
  const int64_t width = attentionSoftmaxWidth(scores.size(-2), keys, causal);
  for (void* p : pointers) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(p) % (4 * width) == 0, "spmd::fused_attention: the gemm kernel's scores "
                "must start ", 4 * width, "-byte aligned");
  }
  const AttentionSoftmaxKernelSpec spec = generatedSpec("spmd::fused_attention", [&] {
    return AttentionSoftmaxKernelSpec::forScores(scores.sizes().vec(), scale, causal);
  });
  launchGenerated("spmd::fused_attention", spec, (spec.*launchOf)(rows), scores.device(), std::move(pointers));
}

void checkCrossEntropyArgs(const char* op, const at::Tensor& logits, const at::Tensor& target) {
  const at::ScalarType t = logits.scalar_type();
  TORCH_CHECK(logits.is_cuda() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && logits.dim() == 2 &&
                  target.scalar_type() == at::kLong && target.dim() == 1 && target.size(0) == logits.size(0),
              op, ": fp32, bf16 or f16 logits [rows, classes] and int64 targets [rows] on the GPU");
}

// The spec of spmd::cross_entropy(_backward)'s kernels, from the call's arguments.
CrossEntropyKernelSpec crossEntropySpecFor(const at::Tensor& logits, const at::Tensor& target,
                                           std::vector<c10::IValue> call, bool backward) {
  checkCrossEntropyArgs("spmd::cross_entropy", logits, target);
  return generatedSpec("spmd::cross_entropy", [&] {
    const IValueCallArgs args(std::move(call));
    return backward ? CrossEntropyKernelSpec::forBackwardCall(args) : CrossEntropyKernelSpec::forCall(args);
  });
}

// The logits, contiguous, and 16-byte aligned where the kernels read them
// so (a view at an odd offset is copied).
at::Tensor alignedForCrossEntropy(const at::Tensor& logits) {
  at::Tensor x = logits.contiguous();
  if (crossEntropyVectorized(x.size(1), x.scalar_type()) && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) {
    x = x.clone();
  }
  return x;
}

// The per-row values (log-sum-exp, loss) are fp32 whatever the logits.
at::TensorOptions rowValues(const at::Tensor& logits) { return logits.options().dtype(at::kFloat); }

// The losses of the rows are summed by ATen (a fixed order, so the loss is
// the same from run to run), then divided by the count for the mean.
std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyCuda(const at::Tensor& logits, const at::Tensor& target,
                                                                int64_t reduction, int64_t ignoreIndex) {
  const CrossEntropyKernelSpec spec =
      crossEntropySpecFor(logits, target, {logits, target, reduction, ignoreIndex}, /*backward=*/false);
  const at::Tensor x = alignedForCrossEntropy(logits), t = target.contiguous();
  const int64_t rows = x.size(0);
  at::Tensor lse = at::empty({rows}, rowValues(x)), rowLoss = at::empty({rows}, rowValues(x));
  launchGenerated("spmd::cross_entropy", spec, spec.forwardLaunch(rows), x.device(),
                  {x.data_ptr(), t.data_ptr(), lse.data_ptr(), rowLoss.data_ptr()});
  const at::Tensor totalWeight = t.ne(ignoreIndex).sum().to(at::kFloat);
  at::Tensor loss = rowLoss.sum();
  if (reduction == 1) loss = loss / totalWeight;
  return {loss, totalWeight, lse};
}

at::Tensor crossEntropyBackwardCuda(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& target,
                                    const at::Tensor& lse, const at::Tensor& totalWeight, int64_t reduction,
                                    int64_t ignoreIndex) {
  const CrossEntropyKernelSpec spec = crossEntropySpecFor(
      logits, target, {grad, logits, target, lse, totalWeight, reduction, ignoreIndex}, /*backward=*/true);
  const at::Tensor x = alignedForCrossEntropy(logits), t = target.contiguous(), l = lse.contiguous();
  const at::Tensor g = grad.to(at::kFloat), w = totalWeight.to(at::kFloat);
  at::Tensor gx = at::empty_like(x);
  launchGenerated("spmd::cross_entropy_backward", spec, spec.backwardLaunch(x.size(0)), x.device(),
                  {x.data_ptr(), t.data_ptr(), l.data_ptr(), g.data_ptr(), w.data_ptr(), gx.data_ptr()});
  return gx;
}

// Both at once: one kernel holding each row in shared memory where the
// GPU's blocks can have that much, else the forward and the backward kernel
// of the same source (the same values).
std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyWithGradCuda(const at::Tensor& logits,
                                                                        const at::Tensor& target, int64_t reduction,
                                                                        int64_t ignoreIndex, double gradScale) {
  constexpr const char* op = "spmd::cross_entropy_with_grad";
  checkCrossEntropyArgs(op, logits, target);
  const CrossEntropyWithGradKernelSpec spec = generatedSpec(op, [&] {
    return CrossEntropyWithGradKernelSpec::forCall(IValueCallArgs({logits, target, reduction, ignoreIndex, gradScale}));
  });
  const at::Tensor x = alignedForCrossEntropy(logits), t = target.contiguous();
  const int64_t rows = x.size(0);
  const at::Tensor totalWeight = t.ne(ignoreIndex).sum().to(at::kFloat);
  at::Tensor rowLoss = at::empty({rows}, rowValues(x)), gx = at::empty_like(x);
  if (spec.fitsOneKernel(static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin))) {
    launchGenerated(op, spec, spec.withGradLaunch(rows), x.device(),
                    {x.data_ptr(), t.data_ptr(), totalWeight.data_ptr(), rowLoss.data_ptr(), gx.data_ptr()});
  } else {
    at::Tensor lse = at::empty({rows}, rowValues(x));
    const at::Tensor grad = at::full({}, gradScale, rowValues(x));
    launchGenerated(op, spec, spec.forwardLaunch(rows), x.device(),
                    {x.data_ptr(), t.data_ptr(), lse.data_ptr(), rowLoss.data_ptr()});
    launchGenerated(op, spec, spec.backwardLaunch(rows), x.device(),
                    {x.data_ptr(), t.data_ptr(), lse.data_ptr(), grad.data_ptr(), totalWeight.data_ptr(),
                     gx.data_ptr()});
  }
  at::Tensor loss = rowLoss.sum();
  if (reduction == 1) loss = loss / totalWeight;
  return {loss, totalWeight, gx};
}

}  // namespace

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

void attentionSoftmaxInPlace(const at::Tensor& scores, double scale, bool causal) {
  launchAttentionSoftmax(&AttentionSoftmaxKernelSpec::forwardLaunch, scores, {scores.data_ptr()}, scale, causal);
}

void attentionSoftmaxBackwardInPlace(const at::Tensor& grad, const at::Tensor& probs, double scale, bool causal) {
  TORCH_CHECK(probs.sizes() == grad.sizes() && probs.scalar_type() == at::kFloat && probs.is_contiguous(),
              "spmd::fused_attention_backward: the gemm kernel's probabilities must be contiguous fp32 of the "
              "gradient's shape");
  launchAttentionSoftmax(&AttentionSoftmaxKernelSpec::backwardLaunch, grad, {grad.data_ptr(), probs.data_ptr()}, scale,
                         causal);
}

void ensureFusedKernelsCudaRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_IMPL(spmd, CUDA, m) {
  m.impl("fused", &spmd::fusedCuda);
  m.impl("cross_entropy", &spmd::crossEntropyCuda);
  m.impl("cross_entropy_backward", &spmd::crossEntropyBackwardCuda);
  m.impl("cross_entropy_with_grad", &spmd::crossEntropyWithGradCuda);
}

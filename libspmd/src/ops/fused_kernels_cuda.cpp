// spmd::fused on CUDA: the generated kernel (ops/cuda_codegen.h), compiled
// with the CUDA toolkit's NVRTC, loaded once per device through the driver
// API and launched on the current stream, so a CUDA graph captures it.
// Compiled only into CUDA builds. (ATen's own NVRTC table, which jiterator
// uses, is not reachable: pip's LibTorch ships no definition of its struct.)
#include "spmd/ops/attention_codegen.h"
#include "spmd/ops/cross_entropy_codegen.h"
#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/fused_kernels.h"
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
#include <functional>
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

// The kernels the process has: compiled images by (arch, source), and the
// loaded functions by (device, program and input signature) or modules by
// (device, source).
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

  // The kernel and its vector form (nullptr where the source has none).
  struct Functions {
    CUfunction scalar = nullptr, vector = nullptr;
  };

  // `sourceOf` generates the source, on the first call for `key` only.
  Functions functions(int device, const std::string& key, const std::function<std::string()>& sourceOf) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = functions_.find({device, key});
    if (it != functions_.end()) return it->second;
    CUmodule module = load(sourceOf());
    Functions f;
    // A row program's source has its row kernel only.
    if (cuModuleGetFunction(&f.scalar, module, kFusedKernelName) != CUDA_SUCCESS) {
      checkDriver(cuModuleGetFunction(&f.scalar, module, kFusedRowsKernelName), "finding a generated kernel");
    }
    if (cuModuleGetFunction(&f.vector, module, kFusedVectorKernelName) != CUDA_SUCCESS) f.vector = nullptr;
    return functions_[{device, key}] = f;
  }

  // The kernel `name` of `source`, loaded on `device`.
  CUfunction function(int device, const std::string& source, const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = modules_.find({device, source});
    if (it == modules_.end()) it = modules_.emplace(std::make_pair(device, source), load(source)).first;
    CUfunction f = nullptr;
    checkDriver(cuModuleGetFunction(&f, it->second, name), "finding a generated kernel");
    return f;
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
  std::map<std::pair<int, std::string>, Functions> functions_;
  std::map<std::pair<int, std::string>, CUmodule> modules_;
  size_t compiledAtLaunch_ = 0;
};

// The driver API wants a current context; ATen's runtime calls make the
// primary one current, but only once something has run on this thread.
void ensureContext() {
  CUcontext ctx = nullptr;
  checkDriver(cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) cudaFree(nullptr);
}

std::vector<at::Tensor> fusedCuda(at::TensorList inputs, c10::string_view text) {
  TORCH_CHECK(!inputs.empty(), "spmd::fused: no inputs");
  const std::string programText(text.data(), text.size());
  PointwiseProgram program;
  try {
    program = parsePointwiseProgram(programText);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "spmd::fused: bad program: ", e.what());
  }
  std::vector<KernelTensor> sig;
  std::string key = programText;
  for (const at::Tensor& t : inputs) {
    sig.push_back({t.scalar_type(), t.sizes().vec()});
    key += "|" + std::to_string(static_cast<int>(t.scalar_type())) + ":" + c10::str(t.sizes());
  }
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
  KernelCache::Functions f;
  try {
    ensureContext();
    f = KernelCache::instance().functions(onDevice->get_device(), key,
                                          [&] { return pointwiseKernelSource(program, sig); });
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "spmd::fused: ", e.what());
  }

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
  std::vector<void*> args;
  for (void*& p : pointers) args.push_back(&p);
  if (hasRowReductions(program)) {
    const auto blocks = static_cast<unsigned int>(fusedRowBlocks(numel / shape.back()));
    const CUresult launched = cuLaunchKernel(f.scalar, blocks, 1, 1, kFusedBlockSize, 1, 1, 0,
                                             at::cuda::getCurrentCUDAStream(), args.data(), nullptr);
    TORCH_CHECK(launched == CUDA_SUCCESS, "spmd::fused: launching a generated kernel failed (CUDA error ", launched, ")");
    return out;
  }
  // The vector form where every operand allows 16-byte access.
  const int width = f.vector ? fusedVectorWidth(program, sig) : 0;
  bool aligned = width > 0;
  for (void* p : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto grid = static_cast<unsigned int>(fusedGridSize(aligned ? numel / width : numel, sms));
  const CUresult launched = cuLaunchKernel(aligned ? f.vector : f.scalar, grid, 1, 1, kFusedBlockSize, 1, 1, 0,
                                                   at::cuda::getCurrentCUDAStream(), args.data(), nullptr);
  TORCH_CHECK(launched == CUDA_SUCCESS, "spmd::fused: launching a generated kernel failed (CUDA error ", launched, ")");
  return out;
}

// The attention softmax kernel `name` over `scores` ([..., queries, keys],
// contiguous fp32), one warp a row.
void launchAttentionSoftmax(const char* name, const at::Tensor& scores, std::vector<void*> pointers, double scale,
                            bool causal) {
  TORCH_CHECK(scores.is_cuda() && scores.scalar_type() == at::kFloat && scores.is_contiguous() && scores.dim() >= 2,
              "spmd::fused_attention: the gemm kernel's scores must be contiguous fp32 on the GPU");
  const int64_t keys = scores.size(-1), rows = scores.numel() / std::max<int64_t>(keys, 1);
  const int64_t width = attentionSoftmaxWidth(scores.size(-2), keys, causal);
  for (void* p : pointers) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(p) % (4 * width) == 0, "spmd::fused_attention: the gemm kernel's scores "
                "must start ", 4 * width, "-byte aligned");
  }
  const std::string source = generatedSource(
      "spmd::fused_attention", [&] { return attentionSoftmaxSource(scores.size(-2), keys, scale, causal); });
  launchGenerated("spmd::fused_attention", source, name, scores.device(),
                  (rows + kAttentionSoftmaxRowsPerBlock - 1) / kAttentionSoftmaxRowsPerBlock,
                  32 * kAttentionSoftmaxRowsPerBlock, std::move(pointers), rows);
}

void checkCrossEntropyArgs(const char* op, const at::Tensor& logits, const at::Tensor& target) {
  const at::ScalarType t = logits.scalar_type();
  TORCH_CHECK(logits.is_cuda() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && logits.dim() == 2 &&
                  target.scalar_type() == at::kLong && target.dim() == 1 && target.size(0) == logits.size(0),
              op, ": fp32, bf16 or f16 logits [rows, classes] and int64 targets [rows] on the GPU");
}

std::string crossEntropySourceFor(const at::Tensor& logits, const at::Tensor& target, int64_t reduction,
                                  int64_t ignoreIndex) {
  checkCrossEntropyArgs("spmd::cross_entropy", logits, target);
  return generatedSource("spmd::cross_entropy",
                         [&] { return crossEntropySource(logits.size(1), reduction, ignoreIndex, logits.scalar_type()); });
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
  const std::string source = crossEntropySourceFor(logits, target, reduction, ignoreIndex);
  const at::Tensor x = alignedForCrossEntropy(logits), t = target.contiguous();
  const int64_t rows = x.size(0);
  at::Tensor lse = at::empty({rows}, rowValues(x)), rowLoss = at::empty({rows}, rowValues(x));
  launchGenerated("spmd::cross_entropy", source, kCrossEntropyKernelName, x.device(), rows, kCrossEntropyThreads,
                  {x.data_ptr(), t.data_ptr(), lse.data_ptr(), rowLoss.data_ptr()}, rows);
  const at::Tensor totalWeight = t.ne(ignoreIndex).sum().to(at::kFloat);
  at::Tensor loss = rowLoss.sum();
  if (reduction == 1) loss = loss / totalWeight;
  return {loss, totalWeight, lse};
}

at::Tensor crossEntropyBackwardCuda(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& target,
                                    const at::Tensor& lse, const at::Tensor& totalWeight, int64_t reduction,
                                    int64_t ignoreIndex) {
  const std::string source = crossEntropySourceFor(logits, target, reduction, ignoreIndex);
  const at::Tensor x = alignedForCrossEntropy(logits), t = target.contiguous(), l = lse.contiguous();
  const at::Tensor g = grad.to(at::kFloat), w = totalWeight.to(at::kFloat);
  at::Tensor gx = at::empty_like(x);
  launchGenerated("spmd::cross_entropy_backward", source, kCrossEntropyBackwardKernelName, x.device(), x.size(0),
                  kCrossEntropyThreads, {x.data_ptr(), t.data_ptr(), l.data_ptr(), g.data_ptr(), w.data_ptr(), gx.data_ptr()},
                  x.size(0));
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
  const std::string source = generatedSource(
      op, [&] {
        return crossEntropyWithGradSource(logits.size(1), reduction, ignoreIndex, gradScale, logits.scalar_type());
      });
  const at::Tensor x = alignedForCrossEntropy(logits), t = target.contiguous();
  const int64_t rows = x.size(0), rowBytes = crossEntropyRowBytes(x.size(1), x.scalar_type());
  const at::Tensor totalWeight = t.ne(ignoreIndex).sum().to(at::kFloat);
  at::Tensor rowLoss = at::empty({rows}, rowValues(x)), gx = at::empty_like(x);
  if (rowBytes <= static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin)) {
    launchGenerated(op, source, kCrossEntropyWithGradKernelName, x.device(), rows, kCrossEntropyFusedThreads,
                    {x.data_ptr(), t.data_ptr(), totalWeight.data_ptr(), rowLoss.data_ptr(), gx.data_ptr()}, rows,
                    static_cast<int>(rowBytes));
  } else {
    at::Tensor lse = at::empty({rows}, rowValues(x));
    const at::Tensor grad = at::full({}, gradScale, rowValues(x));
    launchGenerated(op, source, kCrossEntropyKernelName, x.device(), rows, kCrossEntropyThreads,
                    {x.data_ptr(), t.data_ptr(), lse.data_ptr(), rowLoss.data_ptr()}, rows);
    launchGenerated(op, source, kCrossEntropyBackwardKernelName, x.device(), rows, kCrossEntropyThreads,
                    {x.data_ptr(), t.data_ptr(), lse.data_ptr(), grad.data_ptr(), totalWeight.data_ptr(),
                     gx.data_ptr()},
                    rows);
  }
  at::Tensor loss = rowLoss.sum();
  if (reduction == 1) loss = loss / totalWeight;
  return {loss, totalWeight, gx};
}

}  // namespace

void launchGenerated(const char* op, const std::string& source, const char* name, const at::Device& device,
                     int64_t blocks, int threads, std::vector<void*> pointers, long long count, int sharedBytes) {
  if (blocks == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  CUfunction f = nullptr;
  try {
    ensureContext();
    f = KernelCache::instance().function(device.index(), source, name);
    // More than 48 KB of dynamic shared memory is opt-in, per function.
    if (sharedBytes > 48 * 1024) {
      checkDriver(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, sharedBytes),
                  "asking for a generated kernel's shared memory");
    }
  } catch (const std::exception& e) {
    TORCH_CHECK(false, op, ": ", e.what());
  }
  std::vector<void*> args;
  for (void*& p : pointers) args.push_back(&p);
  args.push_back(&count);
  const CUresult launched =
      cuLaunchKernel(f, static_cast<unsigned int>(blocks), 1, 1, threads, 1, 1, static_cast<unsigned int>(sharedBytes),
                     at::cuda::getCurrentCUDAStream(), args.data(), nullptr);
  TORCH_CHECK(launched == CUDA_SUCCESS, op, ": launching ", name, " failed (CUDA error ", launched, ")");
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
  launchAttentionSoftmax(kAttentionSoftmaxKernelName, scores, {scores.data_ptr()}, scale, causal);
}

void attentionSoftmaxBackwardInPlace(const at::Tensor& grad, const at::Tensor& probs, double scale, bool causal) {
  TORCH_CHECK(probs.sizes() == grad.sizes() && probs.scalar_type() == at::kFloat && probs.is_contiguous(),
              "spmd::fused_attention_backward: the gemm kernel's probabilities must be contiguous fp32 of the "
              "gradient's shape");
  launchAttentionSoftmax(kAttentionSoftmaxBackwardKernelName, grad, {grad.data_ptr(), probs.data_ptr()}, scale, causal);
}

void ensureFusedKernelsCudaRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_IMPL(spmd, CUDA, m) {
  m.impl("fused", &spmd::fusedCuda);
  m.impl("cross_entropy", &spmd::crossEntropyCuda);
  m.impl("cross_entropy_backward", &spmd::crossEntropyBackwardCuda);
  m.impl("cross_entropy_with_grad", &spmd::crossEntropyWithGradCuda);
}

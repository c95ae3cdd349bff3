// spmd::fused, spmd::cross_entropy(_backward), spmd::cross_entropy_with_grad
// and the gemm attention's softmax on CUDA: each call's kernel spec
// (ops/*_codegen.h) made from its arguments and launched through the kernel
// cache (backend/generated_kernels.h). Compiled only into CUDA builds.
#include "spmd/backend/generated_kernels.h"

#include "spmd/ops/attention_codegen.h"
#include "spmd/ops/cross_entropy_codegen.h"
#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/ops/ivalue_call_args.h"
#include "spmd/ops/op_helpers.h"
#include "spmd/ops/pointwise_program.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace spmd {
namespace {

std::vector<int64_t> permuted(const std::vector<int64_t>& v, const std::vector<int64_t>& order) {
  std::vector<int64_t> out;
  for (int64_t d : order) out.push_back(v[d]);
  return out;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> out(order.size());
  for (size_t k = 0; k < order.size(); ++k) out[order[k]] = static_cast<int64_t>(k);
  return out;
}

// The kernel runs over the iteration space as fusedKernelLayout says (the
// memory order of the first result's layout, ATen's), so that it writes that
// layout densely; a result of another layout is copied into it.
std::vector<at::Tensor> fusedCuda(at::TensorList inputs, c10::string_view text) {
  TORCH_CHECK(!inputs.empty(), "spmd::fused: no inputs");
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
  const std::string programText(text.data(), text.size());
  PointwiseProgram parsed;
  try {
    parsed = parsePointwiseProgram(programText);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "spmd::fused: bad program: ", e.what());
  }
  const FusedKernelLayout layout = fusedKernelLayout(parsed, inputs);
  const std::vector<int64_t>& shape = layout.shape;
  const std::vector<std::vector<int64_t>>& strides = layout.resultStrides;
  const std::vector<int64_t>& order = layout.order;
  const std::vector<KernelTensor>& sig = layout.signature;
  // A 0-dim CPU input is copied to the device; the others are read in place.
  std::vector<at::Tensor> views;
  std::vector<void*> pointers;
  for (size_t k = 0; k < inputs.size(); ++k) {
    views.push_back(inputs[k].is_cuda() ? layout.views[k] : inputs[k].to(onDevice->device()));
    pointers.push_back(views.back().data_ptr());
  }
  std::optional<PointwiseKernelSpec> spec;
  try {
    spec.emplace(programText, sig);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "spmd::fused: bad program: ", e.what());
  }
  const PointwiseProgram& program = spec->program();
  // Loaded (compiled where no image is installed) before the sizes are looked at, so that
  // even a call with nothing to compute has its kernel ready, as before.
  loadGenerated("spmd::fused", *spec, spec->scalarKernelName(), onDevice->device());

  std::vector<at::Tensor> written;
  for (size_t r = 0; r < program.results.size(); ++r) {
    written.push_back(at::empty(permuted(resultShape(program, r, shape), order),
                                onDevice->options().dtype(program.statements[program.results[r]].dtype)));
    pointers.push_back(written.back().data_ptr());
  }
  const int64_t numel = c10::multiply_integers(shape);
  // fuse-rows takes no rows of length 0 (whose sums and maxima would need filling in).
  TORCH_CHECK(!hasRowReductions(program) || shape.back() > 0, "spmd::fused: a row program over rows of length 0");
  if (numel > 0) {
    // The vector form where every operand it reads or writes whole allows
    // 16-byte access (a strided input is read an element at a time).
    bool aligned = true;
    for (size_t k = 0; k < pointers.size(); ++k) {
      const bool elementwise = k < sig.size() && !sig[k].strides.empty();
      aligned = aligned && (elementwise || reinterpret_cast<uintptr_t>(pointers[k]) % 16 == 0);
    }
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    launchGenerated("spmd::fused", *spec, spec->launch(sms, aligned), onDevice->device(), std::move(pointers));
  }
  std::vector<at::Tensor> out;
  for (size_t r = 0; r < written.size(); ++r) {
    at::Tensor value = written[r].permute(inverse(order));
    if (!sameLayout(value.sizes().vec(), value.strides().vec(), strides[r])) {
      value = at::empty_strided(value.sizes(), strides[r], value.options()).copy_(value);
    }
    out.push_back(value);
  }
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
// of the same source (the same values). `upcast`: the .upcast overload.
std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyWithGradOnGpu(const at::Tensor& logits,
                                                                         const at::Tensor& target, int64_t reduction,
                                                                         int64_t ignoreIndex, double gradScale,
                                                                         bool upcast) {
  const char* op = upcast ? "spmd::cross_entropy_with_grad.upcast" : "spmd::cross_entropy_with_grad";
  checkCrossEntropyArgs(op, logits, target);
  const CrossEntropyWithGradKernelSpec spec = generatedSpec(op, [&] {
    return CrossEntropyWithGradKernelSpec::forCall(IValueCallArgs({logits, target, reduction, ignoreIndex, gradScale}),
                                                   upcast);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyWithGradCuda(const at::Tensor& logits,
                                                                        const at::Tensor& target, int64_t reduction,
                                                                        int64_t ignoreIndex, double gradScale) {
  return crossEntropyWithGradOnGpu(logits, target, reduction, ignoreIndex, gradScale, /*upcast=*/false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> crossEntropyWithGradUpcastCuda(const at::Tensor& logits,
                                                                              const at::Tensor& target,
                                                                              int64_t reduction, int64_t ignoreIndex,
                                                                              double gradScale) {
  return crossEntropyWithGradOnGpu(logits, target, reduction, ignoreIndex, gradScale, /*upcast=*/true);
}

}  // namespace

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

// The gemm attention kernel (ops/attention_ops.cpp, a layer below) runs
// its softmax through this hook, set while the program starts.
const bool kAttentionSoftmaxSet =
    (setAttentionSoftmaxKernels({&attentionSoftmaxInPlace, &attentionSoftmaxBackwardInPlace}), true);

void ensureFusedKernelsCudaRegistered() { (void)kAttentionSoftmaxSet; }

}  // namespace spmd

TORCH_LIBRARY_IMPL(spmd, CUDA, m) {
  m.impl("fused", &spmd::fusedCuda);
  m.impl("cross_entropy", &spmd::crossEntropyCuda);
  m.impl("cross_entropy_backward", &spmd::crossEntropyBackwardCuda);
  m.impl("cross_entropy_with_grad", &spmd::crossEntropyWithGradCuda);
  m.impl("cross_entropy_with_grad.upcast", &spmd::crossEntropyWithGradUpcastCuda);
}

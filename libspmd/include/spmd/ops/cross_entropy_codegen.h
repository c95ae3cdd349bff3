// CUDA C for spmd::cross_entropy(_backward), which stand for log_softmax over
// the classes followed by nll_loss (what F.cross_entropy records) and their
// backward ops, over logits [rows, classes] of fp32, bf16 or f16 (`logit` below;
// the arithmetic is fp32, log_softmax's result rounded to the logits' type
// where the unfused graph holds it so). One source holds both:
//
//   spmd_cross_entropy(const logit* logits, const long long* target,
//                      float* lse, float* row_loss, long long rows)
//     per row: lse = log(sum(exp(logits))), computed in one pass with a
//     running maximum; row_loss = lse - logits[target], 0 where the target
//     is ignore_index. The caller sums row_loss (deterministically, with ATen).
//   spmd_cross_entropy_backward(const logit* logits, const long long* target,
//                               const float* lse, const float* grad,
//                               const float* total_weight, logit* grad_logits,
//                               long long rows)
//     with a = -grad / total_weight (mean) or -grad (sum), nll_loss_backward's
//     value at the target: grad_logits = (class == target ? a : 0)
//     - exp(logits - lse) * a, log_softmax_backward's formula; rows whose
//     target is ignore_index get 0. A target out of range gives NaN.
//
//   spmd_cross_entropy_with_grad(const logit* logits, const long long* target,
//                                const float* total_weight, float* row_loss,
//                                logit* grad_logits, long long rows)
//     both at once, where the loss's incoming gradient is a constant known
//     when lowering (the ones_like the backward starts from, times
//     kGradScale): the row's first classes (at most
//     kCrossEntropyCachedBytes of them) are kept in shared memory as the forward
//     reads them (its size a launch argument: crossEntropyRowBytes), the
//     rest read again, and the gradient written. Two blocks an SM. The
//     caller sums row_loss as for the forward; total_weight comes first.
//
// One block per row; the logits are read once by the forward and once by
// the backward (once in all by the kernel with both), and log_softmax's
// result is never written.
#pragma once

#include "spmd/ops/kernel_spec.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace spmd {

constexpr const char* kCrossEntropyKernelName = "spmd_cross_entropy";
constexpr const char* kCrossEntropyBackwardKernelName = "spmd_cross_entropy_backward";
constexpr const char* kCrossEntropyWithGradKernelName = "spmd_cross_entropy_with_grad";
constexpr int kCrossEntropyThreads = 512;
constexpr int kCrossEntropyFusedThreads = 1024;
// 100 KB a row: two blocks an SM fit an H100's or H200's shared memory
// (25600 fp32 classes; 51200 bf16 ones, GPT-2's whole 50304).
constexpr int64_t kCrossEntropyCachedBytes = 102400;

// 4 for fp32 logits, 2 for bf16 and f16.
int64_t crossEntropyElementBytes(c10::ScalarType logits);
// Classes in 16 bytes: 4 fp32, 8 bf16 or f16.
int64_t crossEntropyVectorWidth(c10::ScalarType logits);
// Whether the kernels read (and write) rows 16 bytes at a time (the classes
// a multiple of the vector width): then the logits and their gradient must
// start 16-byte aligned.
bool crossEntropyVectorized(int64_t classes, c10::ScalarType logits);

// spmd::cross_entropy's and spmd::cross_entropy_backward's kernels (one
// source holds both): the classes, ATen's reduction code (at::Reduction: 1
// mean, 2 sum; the kernels take those two), ignore_index and the logits'
// dtype. Key "cross_entropy c=50304 red=mean ignore=-100 logits=bf16".
class CrossEntropyKernelSpec : public KernelSpec {
 public:
  // Throws std::invalid_argument for classes < 1, another reduction or
  // logits of another type.
  CrossEntropyKernelSpec(int64_t classes, int64_t reduction, int64_t ignoreIndex, c10::ScalarType logits);
  // spmd::cross_entropy(logits, target, reduction, ignore_index) and
  // spmd::cross_entropy_backward(grad, logits, target, lse, total_weight,
  // reduction, ignore_index): the logits' classes and dtype, the reduction
  // and ignore_index.
  static CrossEntropyKernelSpec forCall(const KernelCallArgs& call);
  static CrossEntropyKernelSpec forBackwardCall(const KernelCallArgs& call);
  // One block a row, for both kernels.
  KernelLaunch forwardLaunch(int64_t rows) const;
  KernelLaunch backwardLaunch(int64_t rows) const;

 protected:
  CrossEntropyKernelSpec(std::string key, int64_t classes, int64_t reduction, int64_t ignoreIndex,
                         c10::ScalarType logits);
  CrossEntropyKernelSpec(std::string key, int64_t classes, int64_t reduction, int64_t ignoreIndex,
                         c10::ScalarType logits, bool upcast);
  std::string generateSource() const override;

  int64_t classes_, reduction_, ignoreIndex_;
  c10::ScalarType logits_;
  bool upcast_ = false;
};

// spmd::cross_entropy_with_grad's kernels: CrossEntropyKernelSpec's source
// with the forward-and-backward kernel added, for a loss gradient of
// `gradScale`. Key "cross_entropy_with_grad c=... red=... ignore=...
// scale=1.0 logits=...". `upcast` (spmd::cross_entropy_with_grad.upcast):
// bf16 or f16 logits computed with as their fp32 values are, the gradient
// rounded once to the logits' type (key "... as=Float").
class CrossEntropyWithGradKernelSpec final : public CrossEntropyKernelSpec {
 public:
  // Throws std::invalid_argument as CrossEntropyKernelSpec's, and for a
  // gradScale that is not finite.
  CrossEntropyWithGradKernelSpec(int64_t classes, int64_t reduction, int64_t ignoreIndex, double gradScale,
                                 c10::ScalarType logits, bool upcast = false);
  // spmd::cross_entropy_with_grad(logits, target, reduction, ignore_index, grad_scale),
  // or its .upcast overload.
  static CrossEntropyWithGradKernelSpec forCall(const KernelCallArgs& call, bool upcast = false);
  // Whether a block can hold a row's first classes (crossEntropyRowBytes)
  // in the `sharedPerBlock` bytes of dynamic shared memory the GPU allows
  // it: then withGradLaunch, else forwardLaunch and backwardLaunch (the
  // same values).
  bool fitsOneKernel(int64_t sharedPerBlock) const;
  KernelLaunch withGradLaunch(int64_t rows) const;

 private:
  std::string generateSource() const override;

  double gradScale_;
};

// The dynamic shared memory the forward-and-backward kernel asks for (a
// GPU whose blocks cannot have that much runs the two kernels instead),
// the first crossEntropyCachedClasses of a row.
int64_t crossEntropyRowBytes(int64_t classes, c10::ScalarType logits);
int64_t crossEntropyCachedClasses(int64_t classes, c10::ScalarType logits);

}  // namespace spmd

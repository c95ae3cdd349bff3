// The ops of spmd-lower's dropout-mask-in-kernel (passes/fuse_dropout.cpp):
//
//   spmd::dropout_seed(Tensor like) -> Tensor
//     a 0-dim int64 seed on like's device, drawn from its default generator
//     (like's values are not read); a random op.
//   spmd::dropout_mul(Tensor self, Tensor seed, float keep, ScalarType mask_dtype, float divisor) -> Tensor
//     self * m, where m is 1 / divisor (in float, rounded to mask_dtype) with
//     probability keep and else 0, drawn from the seed over self's shape
//     (ops/pointwise_program.h, `bernoulli`).
//
// dropout_mul runs as spmd::fused with that program, so it is the same
// kernel on every device: ATen's ops on the CPU, a generated kernel on CUDA
// (where fuse-pointwise normally puts it inside a larger one).
#include "spmd/ops/dtype.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace spmd {
namespace {

at::Tensor dropoutSeed(const at::Tensor& like) { return at::empty({}, like.options().dtype(at::kLong)).random_(); }

at::Tensor dropoutSeedMeta(const at::Tensor& like) { return at::empty({}, like.options().dtype(at::kLong)); }

// The statements fuse-pointwise translates dropout_mul into (passes/pointwise_groups.cpp),
// the inputs in this node's order.
std::string dropoutProgram(at::ScalarType self, at::ScalarType mask, double keep, double divisor) {
  const std::string m = dtypeShortName(mask), out = dtypeShortName(c10::promoteTypes(self, mask));
  return "t0:" + m + " = bernoulli(in1, " + constantText(keep) + ", " + constantText(dropoutScale(mask, divisor)) +
         "); t1:" + out + " = mul(in0, t0); return t1";
}

at::Tensor dropoutMul(const at::Tensor& self, const at::Tensor& seed, double keep, at::ScalarType maskDtype,
                      double divisor) {
  TORCH_CHECK(isPointwiseDtype(self.scalar_type()) && isPointwiseDtype(maskDtype),
              "spmd::dropout_mul: f32, bf16 or f16 values and masks");
  static const auto fused = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("spmd::fused", "")
                                .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view)>();
  const std::string program = dropoutProgram(self.scalar_type(), maskDtype, keep, divisor);
  return fused.call({self, seed}, program).at(0);
}

}  // namespace

void ensureDropoutOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) {
  m.def("dropout_seed(Tensor like) -> Tensor");
  m.def("dropout_mul(Tensor self, Tensor seed, float keep, ScalarType mask_dtype, float divisor) -> Tensor");
}

TORCH_LIBRARY_IMPL(spmd, CompositeExplicitAutograd, m) {
  m.impl("dropout_seed", &spmd::dropoutSeed);
  m.impl("dropout_mul", &spmd::dropoutMul);
}

TORCH_LIBRARY_IMPL(spmd, Meta, m) { m.impl("dropout_seed", &spmd::dropoutSeedMeta); }

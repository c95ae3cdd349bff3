// spmd::attention as a call of F.scaled_dot_product_attention (`sdpa`
// true): on the CPU its forward and its backward (autograd through the op,
// as spmd-expand records it) against LibTorch's own scaled_dot_product_attention
// with autograd, in every form the attention pass takes; with dropout
// against the math written out here on the same keep mask. On CUDA
// (builds against a CUDA LibTorch, with a GPU) spmd::fused_attention with
// masks, grouped-query heads and dropout against ATen's math.
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "test_support.h"

using namespace spmd;

namespace {

// One call's arguments beside q, k and v.
struct SdpaForm {
  std::string name;
  c10::optional<at::Tensor> mask;
  bool causal = false;
  c10::optional<double> scale;  // nullopt: SDPA's default, 1/sqrt(head size)
  bool gqa = false;
  double dropoutP = 0.0;
  c10::optional<at::Tensor> keep;
};

using AttentionOp = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const c10::optional<at::Tensor>&, double, bool, bool, c10::optional<at::ScalarType>,
                               bool, double, const c10::optional<at::Tensor>&, bool);

// out, dq, dk, dv of spmd::attention through its autograd kernel.
std::vector<at::Tensor> spmdAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& grad, const SdpaForm& f) {
  ensureAttentionOpsRegistered();
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("spmd::attention", "").typed<AttentionOp>();
  const at::Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
                   vv = v.detach().requires_grad_(true);
  const double scale = f.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const at::Tensor out = op.call(qq, kk, vv, f.mask, scale, f.causal, false, c10::nullopt, true, f.dropoutP, f.keep, f.gqa);
  const auto grads = torch::autograd::grad({out}, {qq, kk, vv}, {grad});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// The same from LibTorch's scaled_dot_product_attention and autograd.
std::vector<at::Tensor> atenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& grad, const SdpaForm& f) {
  const at::Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
                   vv = v.detach().requires_grad_(true);
  const at::Tensor out = at::scaled_dot_product_attention(qq, kk, vv, f.mask, 0.0, f.causal, f.scale, f.gqa);
  const auto grads = torch::autograd::grad({out}, {qq, kk, vv}, {grad});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// Dropout's math written out: softmax(q k^T * scale), the dropped
// probabilities zeroed and the kept ones divided by 1 - p, times v.
std::vector<at::Tensor> droppedMath(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& grad, const SdpaForm& f) {
  const at::Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
                   vv = v.detach().requires_grad_(true);
  const double scale = f.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  at::Tensor probs = at::softmax(at::matmul(qq, kk.transpose(-2, -1)) * scale, -1);
  probs = probs.masked_fill(f.keep->logical_not(), 0.0) / (1.0 - f.dropoutP);
  const at::Tensor out = at::matmul(probs, vv);
  const auto grads = torch::autograd::grad({out}, {qq, kk, vv}, {grad});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

const char* kResultNames[] = {"out", "grad q", "grad k", "grad v"};

// out, dq, dk and dv equal bit for bit, shapes included.
void checkEqualResults(const std::vector<at::Tensor>& ours, const std::vector<at::Tensor>& ref) {
  for (size_t i = 0; i < ours.size(); ++i) {
    INFO(kResultNames[i]);
    CHECK(ours[i].sizes() == ref[i].sizes());
    CHECK(at::equal(ours[i], ref[i]));
  }
}

// q as a model's [batch, length, heads, size] view gives it; k and v with
// `kvHeads` heads.
struct Inputs {
  at::Tensor q, k, v, grad;
};
Inputs makeInputs(int64_t heads, int64_t kvHeads, int64_t queries, int64_t keys, at::TensorOptions opts) {
  at::manual_seed(7);
  Inputs in;
  in.q = at::randn({2, queries, heads, 16}, opts).transpose(1, 2);
  in.k = at::randn({2, keys, kvHeads, 16}, opts).transpose(1, 2);
  in.v = at::randn({2, keys, kvHeads, 16}, opts).transpose(1, 2);
  in.grad = at::randn({2, queries, heads, 16}, opts).transpose(1, 2);
  return in;
}

std::vector<SdpaForm> formsWithoutDropout(at::TensorOptions opts) {
  at::Tensor padding = at::ones({2, 1, 1, 12}, opts.dtype(at::kBool));
  padding.index_put_({1, 0, 0, at::indexing::Slice(9, at::indexing::None)}, false);  // the second sequence: 9 tokens
  const at::Tensor additive = at::randn({12, 12}, opts);
  std::vector<SdpaForm> forms(7);
  forms[0].name = "plain";
  forms[1].name = "is_causal";
  forms[1].causal = true;
  forms[2].name = "boolean padding mask [B,1,1,S]";
  forms[2].mask = padding;
  forms[3].name = "additive mask [L,S]";
  forms[3].mask = additive;
  forms[4].name = "explicit scale";
  forms[4].scale = 0.3;
  forms[5].name = "causal mask passed as a boolean mask";
  forms[5].mask = at::ones({12, 12}, opts.dtype(at::kBool)).tril();
  forms[5].causal = true;  // marked causal by the pass; the op still applies the mask
  // Mistral's and Gemma's: each query sees itself and the 3 keys before it.
  const at::Tensor rows = at::arange(12, opts.dtype(at::kLong)).unsqueeze(1), cols = rows.t();
  forms[6].name = "sliding-window mask [1,1,L,S]";
  forms[6].mask = cols.le(rows).logical_and(rows.sub(cols).lt(4)).view({1, 1, 12, 12});
  return forms;
}

}  // namespace

TEST_CASE("spmd::attention as SDPA equals LibTorch's SDPA and autograd bit for bit on the CPU", "[attention]") {
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().dtype(dtype);
    const Inputs in = makeInputs(4, 4, 12, 12, opts);
    for (const SdpaForm& f : formsWithoutDropout(opts)) {
      INFO(f.name << ", " << c10::toString(dtype));
      SdpaForm reference = f;
      if (f.mask && f.causal) reference.causal = false;  // SDPA takes the mask itself
      const auto ours = spmdAttention(in.q, in.k, in.v, in.grad, f);
      const auto ref = atenAttention(in.q, in.k, in.v, in.grad, reference);
      checkEqualResults(ours, ref);
    }
  }
}

TEST_CASE("spmd::attention as SDPA with enable_gqa equals LibTorch's on the CPU", "[attention]") {
  const Inputs in = makeInputs(6, 2, 10, 10, at::TensorOptions());
  SdpaForm f;
  f.name = "gqa";
  f.gqa = true;
  f.causal = true;
  const auto ours = spmdAttention(in.q, in.k, in.v, in.grad, f);
  const auto ref = atenAttention(in.q, in.k, in.v, in.grad, f);
  checkEqualResults(ours, ref);
}

TEST_CASE("spmd::attention's dropout drops on its keep mask, forward and backward alike", "[attention]") {
  const Inputs in = makeInputs(2, 2, 16, 16, at::TensorOptions());
  SdpaForm f;
  f.name = "dropout";
  f.dropoutP = 0.25;
  at::manual_seed(3);
  f.keep = at::rand({2, 2, 16, 16}).ge(f.dropoutP);
  const auto ours = spmdAttention(in.q, in.k, in.v, in.grad, f);
  const auto ref = droppedMath(in.q, in.k, in.v, in.grad, f);
  for (size_t i = 0; i < ours.size(); ++i) testing::requireClose(ours[i], ref[i], kResultNames[i], 1e-5, 1e-6);
  // Another keep mask gives another result: the mask is what is applied.
  SdpaForm other = f;
  other.keep = at::rand({2, 2, 16, 16}).ge(f.dropoutP);
  CHECK_FALSE(at::allclose(spmdAttention(in.q, in.k, in.v, in.grad, other)[0], ours[0]));
}

#ifdef SPMD_WITH_CUDA
namespace {

using FusedForward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, double, bool, double,
    c10::string_view);
using FusedBackward = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool, double,
    c10::string_view);

std::vector<at::Tensor> fusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& grad, const c10::optional<at::Tensor>& mask, double scale,
                                       bool causal, double dropoutP, const std::string& kernel) {
  ensureAttentionOpsRegistered();
  auto& dispatcher = c10::Dispatcher::singleton();
  static const auto forward = dispatcher.findSchemaOrThrow("spmd::fused_attention", "").typed<FusedForward>();
  static const auto backward =
      dispatcher.findSchemaOrThrow("spmd::fused_attention_backward", "").typed<FusedBackward>();
  const auto [out, lse, seed, offset] = forward.call(q, k, v, mask, scale, causal, dropoutP, kernel);
  const auto [dq, dk, dv] = backward.call(grad, q, k, v, mask, out, lse, seed, offset, scale, causal, dropoutP, kernel);
  return {out, dq, dk, dv};
}

}  // namespace

// GPU only: the fused kernels on what the SDPA form brings (masks, GQA)
// against LibTorch's math, in fp32 (TF32 off) and bf16.
TEST_CASE("fused attention with masks and grouped-query heads equals SDPA's math", "[attention][cuda]") {
  REQUIRE(at::hasCUDA());
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const double tol = dtype == at::kFloat ? 2e-4 : 3e-2;
    for (const bool gqa : {false, true}) {
      const Inputs in = makeInputs(4, gqa ? 2 : 4, 12, 12, opts);
      for (const SdpaForm& f : formsWithoutDropout(opts)) {
        for (const std::string kernel : {"efficient", "flash", "cudnn", "gemm"}) {
          const bool lowPrecision = dtype != at::kFloat;
          const bool bias = f.mask && !f.causal;
          if ((kernel == "flash" || kernel == "cudnn") && !lowPrecision) continue;
          if (kernel == "flash" && bias) continue;
          if (kernel == "gemm" && (lowPrecision || bias)) continue;
          INFO(f.name << ", " << c10::toString(dtype) << ", gqa " << gqa << ", " << kernel);
          const double scale = f.scale.value_or(0.25);
          const auto ours =
              fusedAttention(in.q, in.k, in.v, in.grad, bias ? f.mask : c10::nullopt, scale, f.causal, 0.0, kernel);
          SdpaForm math = f;
          math.scale = scale;
          math.gqa = gqa;
          if (f.mask && f.causal) math.mask = c10::nullopt;
          if (math.mask && math.mask->is_floating_point()) math.mask = math.mask->to(at::kDouble);
          const auto ref = atenAttention(in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble),
                                         in.grad.to(at::kDouble), math);
          for (size_t i = 0; i < ours.size(); ++i) {
            const double worst = (ours[i].to(at::kDouble) - ref[i]).abs().max().item<double>();
            std::printf("[attention-numerics] %-9s %s gqa %d %-40s %-7s max abs diff %.3g\n", kernel.c_str(),
                        c10::toString(dtype), gqa, f.name.c_str(), kResultNames[i], worst);
            testing::requireClose(ours[i].cpu(), ref[i].cpu(), kResultNames[i], tol, tol);
          }
        }
      }
    }
  }
}

// GPU only: the fused kernels' dropout. With v the identity (head size =
// keys), the forward's result is the dropped probabilities themselves, so
// the backward's grad v must be out^T grad: forward and backward dropped the
// same ones. About dropout_p of them are dropped, and the kept are scaled.
TEST_CASE("fused attention's dropout drops alike forward and backward", "[attention][cuda]") {
  REQUIRE(at::hasCUDA());
  for (const std::string kernel : {"efficient", "flash"}) {
    const c10::ScalarType dtype = kernel == "flash" ? at::kBFloat16 : at::kFloat;
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    INFO(kernel);
    at::manual_seed(5);
    const int64_t keys = 64;
    const at::Tensor q = at::randn({2, 2, keys, keys}, opts), k = at::randn({2, 2, keys, keys}, opts);
    const at::Tensor v = at::eye(keys, opts).expand({2, 2, keys, keys}).contiguous();
    const at::Tensor grad = at::randn({2, 2, keys, keys}, opts);
    const double p = 0.3;
    const auto r = fusedAttention(q, k, v, grad, c10::nullopt, 0.125, false, p, kernel);
    const at::Tensor dropped = r[0].to(at::kFloat);
    const double zeros = dropped.eq(0).to(at::kFloat).mean().item<double>();
    std::printf("[attention-dropout] %s: %.3f of the probabilities dropped (p %.2f)\n", kernel.c_str(), zeros, p);
    CHECK(std::abs(zeros - p) < 0.03);
    const at::Tensor expectedGradV = at::matmul(dropped.transpose(-2, -1), grad.to(at::kFloat));
    testing::requireClose(r[3].to(at::kFloat).cpu(), expectedGradV.cpu(), "grad v", 2e-2, 2e-2);
  }
}
#endif

// spmd-kernel-bench (CUDA builds only): the achieved memory bandwidth of
// generated kernels (spmd::fused; the cross entropy with its gradient and the
// attention softmax at GPT-2 small's shapes) beside a device-to-device copy
// and beside the ATen ops they replace, in one process. Medians of 30 timed
// runs with CUDA events, after 5 warm-up runs, each run queued behind a sleep
// kernel (its launch not timed). Prints a markdown table.
//   build-gpu/spmd-kernel-bench [ELEMENTS]   (default 2^27)
#include "spmd/ops/attention_codegen.h"
#include "spmd/backend/generated_kernels.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int64_t kLaunchCoverCycles = 4'000'000;  // about 2 ms at H200's clock

// The GPU's time between two events around f(). A sleep kernel queued first
// keeps the GPU busy while the host dispatches and launches f()'s kernels, so
// that their launch latency is not timed (as in a step replayed from a CUDA graph).
double medianMs(const std::function<void()>& f) {
  for (int i = 0; i < 5; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < 30; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    at::cuda::sleep(kLaunchCoverCycles);
    start.record();
    f();
    stop.record();
    stop.synchronize();
    ms.push_back(start.elapsed_time(stop));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<at::Tensor> fused(const std::vector<at::Tensor>& inputs, const std::string& program) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("spmd::fused", "")
                             .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view)>();
  return op.call(inputs, program);
}

struct Case {
  const char* name;
  std::vector<at::Tensor> inputs;
  std::string program;
  std::function<void()> aten;  // the unfused ops
};

int64_t bytesOf(const std::vector<at::Tensor>& ts) {
  int64_t b = 0;
  for (const auto& t : ts) b += t.nbytes();
  return b;
}

// Prints a table row: name, elements, bytes moved, ms, and ATen's ms.
using Row = std::function<void(const char*, int64_t, int64_t, double, double)>;

// GPT-2 small's loss: 8192 rows of 50304 classes, the logits read once and
// their gradient written once (what spmd::cross_entropy_with_grad must move),
// beside ATen's log_softmax, nll_loss and their backward ops.
void crossEntropyRows(const Row& row) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("spmd::cross_entropy_with_grad", "")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                                   int64_t, int64_t, double)>();
  const int64_t rows = 8192, classes = 50304;
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const at::Tensor logits = at::randn({rows, classes}, opts) * 3;
    const at::Tensor target = at::randint(classes, {rows}, opts.dtype(at::kLong));
    const int64_t mean = 1, ignore = -100;
    const auto aten = [&] {
      const at::Tensor lp = at::_log_softmax(logits, 1, false);
      const auto nll = at::nll_loss_forward(lp, target, {}, mean, ignore);
      const at::Tensor g = at::nll_loss_backward(at::ones_like(std::get<0>(nll)), lp, target, {}, mean, ignore,
                                                 std::get<1>(nll));
      at::_log_softmax_backward_data(g, lp, 1, dtype);
    };
    row(dtype == at::kFloat ? "cross entropy with its gradient, f32, 8192 x 50304"
                            : "cross entropy with its gradient, bf16, 8192 x 50304",
        logits.numel(), 2 * logits.nbytes(), medianMs([&] { op.call(logits, target, mean, ignore, 1.0); }),
        medianMs(aten));
  }
}

// GPT-2 small's attention softmax over [8, 12, 1024, 1024] fp32 scores,
// causal, in place: the bytes the kernels must touch (attentionSoftmaxElements),
// beside ATen's softmax and its backward over the whole rows.
void attentionSoftmaxRows(const Row& row) {
  const int64_t batch = 8 * 12, n = 1024;
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const at::Tensor init = at::randn({8, 12, n, n}, opts);
  at::Tensor scores = init.clone(), grad = at::randn_like(init);
  const at::Tensor probs = at::softmax(init, -1);
  const double scale = 0.125;
  const spmd::AttentionSoftmaxElements e = spmd::attentionSoftmaxElements(n, n, true);
  // The forward works in place: each run starts from the same scores (the
  // copy is timed alone and taken off).
  const double copyMs = medianMs([&] { scores.copy_(init); });
  const auto forward = [&] {
    scores.copy_(init);
    spmd::attentionSoftmaxInPlace(scores, scale, true);
  };
  row("attention softmax, causal, in place, f32 [8, 12, 1024, 1024] (the scores' copy timed alone, taken off)",
      init.numel(), batch * (e.read + e.written) * 4, medianMs(forward) - copyMs,
      medianMs([&] { at::_softmax(init, -1, false); }));
  row("attention softmax backward, causal, in place, f32 [8, 12, 1024, 1024]", init.numel(),
      batch * (2 * e.read + e.written) * 4,
      medianMs([&] { spmd::attentionSoftmaxBackwardInPlace(grad, probs, scale, true); }),
      medianMs([&] { at::_softmax_backward_data(grad, probs, -1, at::kFloat); }));
}

}  // namespace

int main(int argc, char** argv) {
  spmd::ensureSpmdOpsRegistered();
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{1} << 27);
  const int64_t cols = 4096, rows = n / cols;
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const auto bf16 = f32.dtype(at::kBFloat16);
  at::Tensor a = at::randn({rows, cols}, f32), b = at::randn({rows, cols}, f32);
  at::Tensor xb = at::randn({rows, cols}, bf16), yb = at::randn({rows, cols}, bf16), bias = at::randn({cols}, bf16);
  at::Tensor dst = at::empty_like(a);
  const at::Tensor seed = at::scalar_tensor(int64_t{1234}, f32.dtype(at::kLong));
  const at::Tensor keptMask = at::rand({rows, cols}, f32) < 0.9;  // ATen's dropout backward reads a bool mask

  const double copyMs = medianMs([&] { dst.copy_(a); });
  const double copyGbs = 2.0 * a.nbytes() / copyMs / 1e6;
  std::printf("| kernel | elements | bytes moved | generated ms | GB/s | of copy | ATen ops ms |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::printf("| device copy (f32) | %lld | %lld | %.3f | %.0f | 100%% | |\n", static_cast<long long>(a.numel()),
              static_cast<long long>(2 * a.nbytes()), copyMs, copyGbs);

  std::vector<Case> cases = {
      {"residual add f32 + cast to bf16 (2 results)", {a, b},
       "t0:f32 = add(in0, in1); t1:bf16 = cast(t0); return t0, t1", [&] { (a + b).to(at::kBFloat16); }},
      {"bias + tanh GELU, bf16", {xb, bias},
       "t0:bf16 = add(in0, in1); t1:bf16 = gelu_tanh(t0); return t1", [&] { at::gelu(xb + bias, "tanh"); }},
      {"GELU backward, bf16", {yb, xb}, "t0:bf16 = gelu_grad(in0, in1); return t0",
       [&] { at::gelu_backward(yb, xb, "none"); }},
      {"tanh GELU backward, bf16", {yb, xb}, "t0:bf16 = gelu_tanh_grad(in0, in1); return t0",
       [&] { at::gelu_backward(yb, xb, "tanh"); }},
      {"scale and shift, f32", {a}, "t0:f32 = mul(in0, 0.5); t1:f32 = add(t0, 1.0); return t1",
       [&] { at::add(at::mul(a, 0.5), 1.0); }},
      {"cast f32 to bf16", {a}, "t0:bf16 = cast(in0); return t0", [&] { a.to(at::kBFloat16); }},
      // dropout-mask-in-kernel's programs (the kept value 1 / 0.9 rounded to the dtype):
      // the mask drawn in the kernel, stored nowhere (ATen's fused dropout
      // writes a bool mask for its backward to read).
      {"dropout p=0.1 + residual add, bf16 (the mask drawn)", {seed, xb, yb},
       "t0:bf16 = bernoulli(in0, 0.9, 1.109375); t1:bf16 = mul(in1, t0); t2:bf16 = add(in2, t1); return t2",
       [&] { at::add(at::dropout(xb, 0.1, true), yb); }},
      {"dropout backward p=0.1, bf16 (the mask drawn again)", {seed, yb},
       "t0:bf16 = bernoulli(in0, 0.9, 1.109375); t1:bf16 = mul(in1, t0); return t1",
       [&] { at::native_dropout_backward(yb, keptMask, 1 / 0.9); }},
      {"dropout p=0.1, f32 (the mask drawn)", {seed, a},
       "t0:f32 = bernoulli(in0, 0.9, 1.1111112); t1:f32 = mul(in1, t0); return t1",
       [&] { at::dropout(a, 0.1, true); }},
  };
  const auto row = [&](const char* name, int64_t elements, int64_t moved, double ms, double atenMs) {
    const double gbs = moved / ms / 1e6;
    std::printf("| %s | %lld | %lld | %.3f | %.0f | %.0f%% | %.3f |\n", name, static_cast<long long>(elements),
                static_cast<long long>(moved), ms, gbs, 100 * gbs / copyGbs, atenMs);
  };
  for (const Case& c : cases) {
    const std::vector<at::Tensor> outs = fused(c.inputs, c.program);  // compiles it once
    const int64_t moved = bytesOf(c.inputs) + bytesOf(outs);
    row(c.name, outs[0].numel(), moved, medianMs([&] { fused(c.inputs, c.program); }), medianMs(c.aten));
  }
  crossEntropyRows(row);
  attentionSoftmaxRows(row);
  return 0;
}

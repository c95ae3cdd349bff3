#include "spmd/ops/cross_entropy_codegen.h"

#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/pointwise_program.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace spmd {
namespace {

// A block-wide combination of per-thread (maximum, sum of exp(x - maximum))
// pairs, and a block-wide sum; warps by shuffles, then the first warp over
// the warps' results (shared memory for kThreads / 32 of them).
constexpr const char* kHelpers = R"(struct alignas(16) spmd_f32x4 { float v[4]; };

// One logit into a running (maximum, sum of exp(x - maximum)).
__device__ __forceinline__ void spmd_accumulate(float& m, float& s, float v) {
  if (v > m) {
    s = s * expf(m - v) + 1.0f;
    m = v;
  } else if (m != __int_as_float(0xff800000)) {  // -inf - -inf would be NaN
    s += expf(v - m);
  }
}

__device__ __forceinline__ void spmd_combine(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == __int_as_float(0xff800000)) return;  // both empty
  s = s * expf(m - top) + s2 * expf(m2 - top);
  m = top;
}

// Leaves the block's (maximum, sum) in warp 0, for `threads` threads.
template <int threads>
__device__ void spmd_block_max_sum(float& m, float& s) {
  __shared__ float ms[threads / 32], ss[threads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    spmd_combine(m, s, m2, s2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    ms[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < threads / 32 ? ms[lane] : __int_as_float(0xff800000);
    s = lane < threads / 32 ? ss[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      spmd_combine(m, s, m2, s2);
    }
  }
}
)";

constexpr const char* kForward = R"(
extern "C" __global__ void __launch_bounds__(kThreads) spmd_cross_entropy(const float* logits, const long long* target,
                                                                        float* lse, float* row_loss, long long rows) {
  const long long row = blockIdx.x;
  if (row >= rows) return;
  const float* x = logits + row * kClasses;
  float m = __int_as_float(0xff800000), s = 0.0f;
  if (kVector) {
    const spmd_f32x4* x4 = reinterpret_cast<const spmd_f32x4*>(x);
    for (int j = threadIdx.x; j < kClasses / 4; j += kThreads) {
      const spmd_f32x4 q = x4[j];
#pragma unroll
      for (int e = 0; e < 4; ++e) spmd_accumulate(m, s, q.v[e]);
    }
  } else {
    for (int j = threadIdx.x; j < kClasses; j += kThreads) spmd_accumulate(m, s, x[j]);
  }
  spmd_block_max_sum<kThreads>(m, s);
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    const long long t = target[row];
    lse[row] = l;
    // A target out of range (ATen asserts on the device) makes the loss NaN.
    row_loss[row] = t == kIgnoreIndex ? 0.0f : t < 0 || t >= kClasses ? __int_as_float(0x7fc00000) : l - x[t];
  }
}
)";

constexpr const char* kBackward = R"(
extern "C" __global__ void __launch_bounds__(kThreads) spmd_cross_entropy_backward(
    const float* logits, const long long* target, const float* lse, const float* grad, const float* total_weight,
    float* grad_logits, long long rows) {
  const long long row = blockIdx.x;
  if (row >= rows) return;
  const long long t = target[row];
  const float* x = logits + row * kClasses;
  float* gx = grad_logits + row * kClasses;
  // nll_loss_backward's value at the target, then log_softmax_backward's
  // formula: a at the target, minus softmax * a everywhere.
  const bool valid = t >= 0 && t < kClasses;
  const float a = t == kIgnoreIndex ? 0.0f
                  : !valid          ? __int_as_float(0x7fc00000)
                                    : (kMean ? -grad[0] / total_weight[0] : -grad[0]);
  const float l = lse[row];
  if (kVector) {
    const spmd_f32x4* x4 = reinterpret_cast<const spmd_f32x4*>(x);
    spmd_f32x4* g4 = reinterpret_cast<spmd_f32x4*>(gx);
    for (int j = threadIdx.x; j < kClasses / 4; j += kThreads) {
      const spmd_f32x4 q = x4[j];
      spmd_f32x4 r;
#pragma unroll
      for (int e = 0; e < 4; ++e) r.v[e] = (4 * j + e == t ? a : 0.0f) - expf(q.v[e] - l) * a;
      g4[j] = r;
    }
  } else {
    for (int j = threadIdx.x; j < kClasses; j += kThreads) gx[j] = (j == t ? a : 0.0f) - expf(x[j] - l) * a;
  }
}
)";

// The forward and the backward in one kernel, for a loss whose incoming
// gradient is a known constant (kGradScale: the ones_like the backward
// starts from): the row's first kCached classes are kept in shared memory
// as the forward reads them, the rest read again (from L2, mostly) for the
// gradient, which is written with the backward kernel's formula. Two blocks
// an SM: one's reading overlaps the other's writing.
constexpr const char* kWithGrad = R"(
extern "C" __global__ void __launch_bounds__(kFusedThreads, 2) spmd_cross_entropy_with_grad(
    const float* logits, const long long* target, const float* total_weight, float* row_loss, float* grad_logits,
    long long rows) {
  extern __shared__ spmd_f32x4 spmd_row[];  // the row's first kCached floats
  const long long row = blockIdx.x;
  if (row >= rows) return;
  const float* x = logits + row * kClasses;
  float* gx = grad_logits + row * kClasses;
  float m = __int_as_float(0xff800000), s = 0.0f;
  if (kVector) {
    const spmd_f32x4* x4 = reinterpret_cast<const spmd_f32x4*>(x);
    for (int j = threadIdx.x; j < kClasses / 4; j += kFusedThreads) {
      const spmd_f32x4 q = x4[j];
      if (j < kCached / 4) spmd_row[j] = q;
#pragma unroll
      for (int e = 0; e < 4; ++e) spmd_accumulate(m, s, q.v[e]);
    }
  } else {
    float* cache = reinterpret_cast<float*>(spmd_row);
    for (int j = threadIdx.x; j < kClasses; j += kFusedThreads) {
      const float v = x[j];
      if (j < kCached) cache[j] = v;
      spmd_accumulate(m, s, v);
    }
  }
  spmd_block_max_sum<kFusedThreads>(m, s);
  __shared__ float lse;
  const long long t = target[row];
  if (threadIdx.x == 0) {
    lse = m + logf(s);
    row_loss[row] = t == kIgnoreIndex ? 0.0f : t < 0 || t >= kClasses ? __int_as_float(0x7fc00000) : lse - x[t];
  }
  __syncthreads();
  const float l = lse;
  const bool valid = t >= 0 && t < kClasses;
  const float a = t == kIgnoreIndex ? 0.0f
                  : !valid          ? __int_as_float(0x7fc00000)
                                    : (kMean ? -kGradScale / total_weight[0] : -kGradScale);
  if (kVector) {
    const spmd_f32x4* x4 = reinterpret_cast<const spmd_f32x4*>(x);
    spmd_f32x4* g4 = reinterpret_cast<spmd_f32x4*>(gx);
    for (int j = threadIdx.x; j < kClasses / 4; j += kFusedThreads) {
      const spmd_f32x4 q = j < kCached / 4 ? spmd_row[j] : x4[j];
      spmd_f32x4 r;
#pragma unroll
      for (int e = 0; e < 4; ++e) r.v[e] = (4 * j + e == t ? a : 0.0f) - expf(q.v[e] - l) * a;
      g4[j] = r;
    }
  } else {
    const float* cache = reinterpret_cast<const float*>(spmd_row);
    for (int j = threadIdx.x; j < kClasses; j += kFusedThreads) {
      gx[j] = (j == t ? a : 0.0f) - expf((j < kCached ? cache[j] : x[j]) - l) * a;
    }
  }
}
)";

}  // namespace

bool crossEntropyVectorized(int64_t classes) { return classes % 4 == 0; }

int64_t crossEntropyCachedClasses(int64_t classes) { return std::min(classes, kCrossEntropyCachedClasses); }

int64_t crossEntropyRowBytes(int64_t classes) { return crossEntropyCachedClasses(classes) * 4; }

namespace {

// The constants every kernel of the source reads.
std::string constants(int64_t classes, int64_t reduction, int64_t ignoreIndex) {
  if (classes < 1 || classes > (int64_t{1} << 30)) {
    throw std::invalid_argument("cross entropy: " + std::to_string(classes) + " classes");
  }
  if (reduction != 1 && reduction != 2) throw std::invalid_argument("cross entropy: reduction other than mean or sum");
  std::string src = "// Generated by spmd-lower (codegen version " + std::to_string(kCodegenVersion) + ").\n";
  src += "// cross entropy over " + std::to_string(classes) + " classes, reduction " +
         (reduction == 1 ? "mean" : "sum") + ", ignore_index " + std::to_string(ignoreIndex) + "\n";
  src += "constexpr int kClasses = " + std::to_string(classes) + ";\n";
  src += "constexpr int kThreads = " + std::to_string(kCrossEntropyThreads) + ";\n";
  src += std::string("constexpr bool kMean = ") + (reduction == 1 ? "true" : "false") + ";\n";
  src += "constexpr long long kIgnoreIndex = " + std::to_string(ignoreIndex) + ";\n";
  src += "// Rows of a multiple of 4 classes are read 16 bytes at a time (the logits' start is 16-byte aligned).\n";
  src += std::string("constexpr bool kVector = ") + (crossEntropyVectorized(classes) ? "true" : "false") + ";\n";
  return src;
}

}  // namespace

std::string crossEntropySource(int64_t classes, int64_t reduction, int64_t ignoreIndex) {
  return constants(classes, reduction, ignoreIndex) + "\n" + kHelpers + kForward + kBackward;
}

std::string crossEntropyWithGradSource(int64_t classes, int64_t reduction, int64_t ignoreIndex, double gradScale) {
  if (!std::isfinite(static_cast<float>(gradScale))) {
    throw std::invalid_argument("cross entropy: a gradient scale that is not finite");
  }
  std::string src = constants(classes, reduction, ignoreIndex);
  src += "constexpr int kFusedThreads = " + std::to_string(kCrossEntropyFusedThreads) + ";\n";
  src += "constexpr int kCached = " + std::to_string(crossEntropyCachedClasses(classes)) +
         ";  // classes a block keeps in shared memory\n";
  src += "constexpr float kGradScale = " + constantText(gradScale) + "f;  // the loss's incoming gradient\n\n";
  return src + kHelpers + kForward + kBackward + kWithGrad;
}

}  // namespace spmd

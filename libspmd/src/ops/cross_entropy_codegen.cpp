#include "spmd/ops/cross_entropy_codegen.h"

#include "spmd/ops/cuda_emitter.h"
#include "spmd/ops/pointwise_program.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace spmd {
namespace {

// The device functions the kernels share: a row's loss and gradient, a
// running (maximum, sum of exp(x - maximum)) per thread, and its block-wide
// combination (warps by shuffles, then the first warp over the warps'
// results, shared memory for kThreads / 32 of them). spmd_exp, spmd_unpack
// and spmd_pack come with the logits' type.
constexpr const char* kHelpers = R"(
// A row's loss, -log_softmax at the target; and the logits' gradient,
// log_softmax_backward's formula over nll_loss_backward's value `a` at the
// target. Both see log_softmax's result in the logits' type, as the unfused
// graph holds it.
__device__ __forceinline__ float spmd_loss(spmd_logit x, float lse) { return -spmd_as_logit(spmd_load(x) - lse); }

__device__ __forceinline__ spmd_logit spmd_grad(spmd_logit x, float lse, float a, bool target) {
  return spmd_store((target ? a : 0.0f) - spmd_exp(spmd_as_logit(spmd_load(x) - lse)) * a);
}

// The same for a vector of kVec logits; `target` is the target's place in
// it (outside [0, kVec) where it is elsewhere).
__device__ __forceinline__ spmd_logits spmd_grad_vec(const spmd_logits& q, float lse, float a, int target) {
  float v[kVec];
  spmd_unpack(q, v);
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] -= lse;
  if (kRoundLogProbs) spmd_unpack(spmd_pack(v), v);  // log_softmax's result in the logits' type
#pragma unroll
  for (int e = 0; e < kVec; ++e) v[e] = (e == target ? a : 0.0f) - spmd_exp(v[e]) * a;
  return spmd_pack(v);
}

// The maximum of two floats, NaN if either is (one instruction from sm_80).
__device__ __forceinline__ float spmd_max_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return b > a || b != b ? b : a;
#endif
}

// One logit into a running (maximum, sum of exp(x - maximum)).
__device__ __forceinline__ void spmd_accumulate(float& m, float& s, float v) {
  if (v > m) {
    s = s * spmd_exp(m - v) + 1.0f;
    m = v;
  } else if (m != __int_as_float(0xff800000)) {  // -inf - -inf would be NaN
    s += spmd_exp(v - m);
  }
}

// A vector of logits into a running (maximum, sum): its maximum first, so
// the sum is rescaled once and each logit costs one exp (bf16 rows hold
// twice the logits a byte of fp32 ones: the instructions a logit bound
// that kernel more than its bytes do).
__device__ __forceinline__ void spmd_accumulate_vec(float& m, float& s, const spmd_logits& q) {
  float v[kVec];
  spmd_unpack(q, v);
  float top = m;
#pragma unroll
  for (int e = 0; e < kVec; ++e) top = spmd_max_nan(top, v[e]);  // a NaN becomes the maximum: the sum turns NaN
  if (top == __int_as_float(0xff800000)) return;  // all -inf so far
  s *= spmd_exp(m - top);
#pragma unroll
  for (int e = 0; e < kVec; ++e) s += spmd_exp(v[e] - top);
  m = top;
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
extern "C" __global__ void __launch_bounds__(kThreads) spmd_cross_entropy(const spmd_logit* logits, const long long* target,
                                                                        float* lse, float* row_loss, long long rows) {
  const long long row = blockIdx.x;
  if (row >= rows) return;
  const spmd_logit* x = logits + row * kClasses;
  float m = __int_as_float(0xff800000), s = 0.0f;
  if (kVector) {
    const spmd_logits* xv = reinterpret_cast<const spmd_logits*>(x);
    for (int j = threadIdx.x; j < kClasses / kVec; j += kThreads) {
      spmd_accumulate_vec(m, s, xv[j]);
    }
  } else {
    for (int j = threadIdx.x; j < kClasses; j += kThreads) spmd_accumulate(m, s, spmd_load(x[j]));
  }
  spmd_block_max_sum<kThreads>(m, s);
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    const long long t = target[row];
    lse[row] = l;
    // A target out of range (ATen asserts on the device) makes the loss NaN.
    row_loss[row] = t == kIgnoreIndex ? 0.0f : t < 0 || t >= kClasses ? __int_as_float(0x7fc00000) : spmd_loss(x[t], l);
  }
}
)";

constexpr const char* kBackward = R"(
extern "C" __global__ void __launch_bounds__(kThreads) spmd_cross_entropy_backward(
    const spmd_logit* logits, const long long* target, const float* lse, const float* grad, const float* total_weight,
    spmd_logit* grad_logits, long long rows) {
  const long long row = blockIdx.x;
  if (row >= rows) return;
  const long long t = target[row];
  const spmd_logit* x = logits + row * kClasses;
  spmd_logit* gx = grad_logits + row * kClasses;
  // nll_loss_backward's value at the target, then log_softmax_backward's
  // formula: a at the target, minus softmax * a everywhere.
  const bool valid = t >= 0 && t < kClasses;
  const float a = t == kIgnoreIndex ? 0.0f
                  : !valid          ? __int_as_float(0x7fc00000)
                                    : spmd_as_logit(kMean ? -grad[0] / total_weight[0] : -grad[0]);
  const float l = lse[row];
  if (kVector) {
    const spmd_logits* xv = reinterpret_cast<const spmd_logits*>(x);
    spmd_logits* gv = reinterpret_cast<spmd_logits*>(gx);
    const int column = valid ? (int)t : -1;  // where a is NaN or 0, which class is the target does not matter
    for (int j = threadIdx.x; j < kClasses / kVec; j += kThreads) gv[j] = spmd_grad_vec(xv[j], l, a, column - kVec * j);
  } else {
    for (int j = threadIdx.x; j < kClasses; j += kThreads) gx[j] = spmd_grad(x[j], l, a, j == t);
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
    const spmd_logit* logits, const long long* target, const float* total_weight, float* row_loss,
    spmd_logit* grad_logits, long long rows) {
  extern __shared__ spmd_logits spmd_row[];  // the row's first kCached logits
  const long long row = blockIdx.x;
  if (row >= rows) return;
  const spmd_logit* x = logits + row * kClasses;
  spmd_logit* gx = grad_logits + row * kClasses;
  float m = __int_as_float(0xff800000), s = 0.0f;
  if (kVector) {
    const spmd_logits* xv = reinterpret_cast<const spmd_logits*>(x);
    for (int j = threadIdx.x; j < kClasses / kVec; j += kFusedThreads) {
      const spmd_logits q = xv[j];
      if (j < kCached / kVec) spmd_row[j] = q;
      spmd_accumulate_vec(m, s, q);
    }
  } else {
    spmd_logit* cache = reinterpret_cast<spmd_logit*>(spmd_row);
    for (int j = threadIdx.x; j < kClasses; j += kFusedThreads) {
      const spmd_logit v = x[j];
      if (j < kCached) cache[j] = v;
      spmd_accumulate(m, s, spmd_load(v));
    }
  }
  spmd_block_max_sum<kFusedThreads>(m, s);
  __shared__ float lse;
  const long long t = target[row];
  if (threadIdx.x == 0) {
    lse = m + logf(s);
    row_loss[row] = t == kIgnoreIndex ? 0.0f : t < 0 || t >= kClasses ? __int_as_float(0x7fc00000) : spmd_loss(x[t], lse);
  }
  __syncthreads();
  const float l = lse;
  const bool valid = t >= 0 && t < kClasses;
  const float a = t == kIgnoreIndex ? 0.0f
                  : !valid          ? __int_as_float(0x7fc00000)
                                    : spmd_as_logit(kMean ? -kGradScale / total_weight[0] : -kGradScale);
  if (kVector) {
    const spmd_logits* xv = reinterpret_cast<const spmd_logits*>(x);
    spmd_logits* gv = reinterpret_cast<spmd_logits*>(gx);
    const int column = valid ? (int)t : -1;  // where a is NaN or 0, which class is the target does not matter
    for (int j = threadIdx.x; j < kClasses / kVec; j += kFusedThreads) {
      gv[j] = spmd_grad_vec(j < kCached / kVec ? spmd_row[j] : xv[j], l, a, column - kVec * j);
    }
  } else {
    const spmd_logit* cache = reinterpret_cast<const spmd_logit*>(spmd_row);
    for (int j = threadIdx.x; j < kClasses; j += kFusedThreads) {
      gx[j] = spmd_grad(j < kCached ? cache[j] : x[j], l, a, j == t);
    }
  }
}
)";

}  // namespace

int64_t crossEntropyElementBytes(c10::ScalarType logits) { return logits == c10::ScalarType::Float ? 4 : 2; }

int64_t crossEntropyVectorWidth(c10::ScalarType logits) { return 16 / crossEntropyElementBytes(logits); }

bool crossEntropyVectorized(int64_t classes, c10::ScalarType logits) {
  return classes % crossEntropyVectorWidth(logits) == 0;
}

int64_t crossEntropyCachedClasses(int64_t classes, c10::ScalarType logits) {
  return std::min(classes, kCrossEntropyCachedBytes / crossEntropyElementBytes(logits));
}

int64_t crossEntropyRowBytes(int64_t classes, c10::ScalarType logits) {
  return crossEntropyCachedClasses(classes, logits) * crossEntropyElementBytes(logits);
}

namespace {

// The logits' type: how a kernel loads one, stores a gradient, and rounds a
// float to it and back (what the unfused graph's casts do); for `upcast`
// 16-bit logits the log-probabilities stay fp32, as for fp32 logits.
std::string logitType(c10::ScalarType logits, bool upcast) {
  std::string helpers, comment;
  switch (logits) {
    case c10::ScalarType::Float: comment = "// fp32 logits and gradient\n"; break;
    case c10::ScalarType::BFloat16:
      helpers = bfloat16Helpers();
      comment = upcast ? "// bf16 logits and gradient, everything else as for their fp32 values\n"
                       : "// bf16 logits and gradient; the arithmetic in fp32\n";
      break;
    case c10::ScalarType::Half:
      helpers = float16Helpers();
      comment = upcast ? "// f16 logits and gradient, everything else as for their fp32 values\n"
                       : "// f16 logits and gradient; the arithmetic in fp32\n";
      break;
    default:
      throw std::invalid_argument(std::string("cross entropy: ") + c10::toString(logits) + " logits");
  }
  return helpers + comment + storageTypedef("spmd_logit", logits) +
         "__device__ __forceinline__ float spmd_load(spmd_logit v) { return " + toFloatExpr(logits, "v") + "; }\n" +
         "__device__ __forceinline__ spmd_logit spmd_store(float v) { return " + fromFloatExpr(logits, "v") + "; }\n" +
         (upcast ? "__device__ __forceinline__ float spmd_as_logit(float v) { return v; }\n"
                 : "__device__ __forceinline__ float spmd_as_logit(float v) { return spmd_load(spmd_store(v)); }\n") +
         std::string("constexpr bool kRoundLogProbs = ") + (upcast ? "false" : "true") + ";\n";
}

// 16 bytes of logits (kVec of them), how the kernels unpack them to floats
// and round floats back into them, and the exp they use (expf's accuracy
// for `upcast` logits, as for fp32 ones).
std::string vectorType(c10::ScalarType logits, bool upcast) {
  const std::string loops =
      "__device__ __forceinline__ void spmd_unpack(const spmd_logits& q, float* v) {\n#pragma unroll\n"
      "  for (int k = 0; k < kVec / 2; ++k) {\n";
  const std::string pack =
      "__device__ __forceinline__ spmd_logits spmd_pack(const float* v) {\n  spmd_logits q;\n#pragma unroll\n"
      "  for (int k = 0; k < kVec / 2; ++k) ";
  // The approximate exp's error (a few fp32 ulps; the argument is scaled
  // after the kernels subtract, so it is not much amplified) is far below
  // half an ulp of a 16-bit result, which rounds as with expf but at ties.
  const std::string approxExp = upcast ? "__device__ __forceinline__ float spmd_exp(float x) { return expf(x); }\n" :
      "__device__ __forceinline__ float spmd_exp(float x) {\n"
      "  float r;\n  asm(\"ex2.approx.f32 %0, %1;\" : \"=f\"(r) : \"f\"(x * 1.44269504088896341f));\n  return r;\n}\n";
  switch (logits) {
    case c10::ScalarType::Float:
      return "struct alignas(16) spmd_logits { float v[kVec]; };\n"
             "__device__ __forceinline__ void spmd_unpack(const spmd_logits& q, float* v) {\n#pragma unroll\n"
             "  for (int e = 0; e < kVec; ++e) v[e] = q.v[e];\n}\n"
             "__device__ __forceinline__ spmd_logits spmd_pack(const float* v) {\n  spmd_logits q;\n#pragma unroll\n"
             "  for (int e = 0; e < kVec; ++e) q.v[e] = v[e];\n  return q;\n}\n"
             "// fp32 results keep expf's accuracy\n"
             "__device__ __forceinline__ float spmd_exp(float x) { return expf(x); }\n";
    case c10::ScalarType::BFloat16:
      return "struct alignas(16) spmd_logits { unsigned int w[kVec / 2]; };  // two a word, the first in the low half\n"
             "// Two floats rounded to bf16, `lo` in the low half: one instruction for both from sm_80.\n"
             "__device__ __forceinline__ unsigned int spmd_f32x2_to_bf16x2(float lo, float hi) {\n"
             "#if __CUDA_ARCH__ >= 800\n"
             "  unsigned int r;\n  asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo));\n  return r;\n"
             "#else\n"
             "  return spmd_f32_to_bf16(lo) | ((unsigned int)spmd_f32_to_bf16(hi) << 16);\n"
             "#endif\n}\n" +
             loops +
             "    v[2 * k] = __uint_as_float(q.w[k] << 16);\n"
             "    v[2 * k + 1] = __uint_as_float(q.w[k] & 0xffff0000u);\n  }\n}\n" +
             pack + "q.w[k] = spmd_f32x2_to_bf16x2(v[2 * k], v[2 * k + 1]);\n  return q;\n}\n" + approxExp;
    case c10::ScalarType::Half:
      return "struct alignas(16) spmd_logits { unsigned int w[kVec / 2]; };  // two a word, the first in the low half\n" +
             loops +
             "    v[2 * k] = spmd_f16_to_f32((unsigned short)(q.w[k] & 0xffffu));\n"
             "    v[2 * k + 1] = spmd_f16_to_f32((unsigned short)(q.w[k] >> 16));\n  }\n}\n" +
             pack +
             "q.w[k] = spmd_f32_to_f16(v[2 * k]) | ((unsigned int)spmd_f32_to_f16(v[2 * k + 1]) << 16);\n"
             "  return q;\n}\n" +
             approxExp;
    default:
      throw std::invalid_argument(std::string("cross entropy: ") + c10::toString(logits) + " logits");
  }
}

// The constants every kernel of the source reads.
std::string constants(int64_t classes, int64_t reduction, int64_t ignoreIndex, c10::ScalarType logits, bool upcast) {
  std::string src = generatedBanner();
  src += std::string("// cross entropy over ") + c10::toString(logits) + (upcast ? " (as fp32)" : "") + " logits of " +
         std::to_string(classes) +
         " classes, reduction " +
         (reduction == 1 ? "mean" : "sum") + ", ignore_index " + std::to_string(ignoreIndex) + "\n";
  src += "constexpr int kClasses = " + std::to_string(classes) + ";\n";
  src += "constexpr int kThreads = " + std::to_string(kCrossEntropyThreads) + ";\n";
  src += std::string("constexpr bool kMean = ") + (reduction == 1 ? "true" : "false") + ";\n";
  src += "constexpr long long kIgnoreIndex = " + std::to_string(ignoreIndex) + ";\n";
  const int64_t vec = crossEntropyVectorWidth(logits);
  src += "// Rows of a multiple of kVec classes are read 16 bytes at a time (the logits' start is 16-byte aligned):\n";
  src += "// a thread's one load in flight moves that much, half as much memory in flight at 8 bytes.\n";
  src += std::string("constexpr bool kVector = ") + (crossEntropyVectorized(classes, logits) ? "true" : "false") + ";\n";
  src += logitType(logits, upcast);
  src += "constexpr int kVec = " + std::to_string(vec) + ";\n";
  return src + vectorType(logits, upcast);
}

}  // namespace

namespace {

// The attributes checked, in the order the source generators used to check them.
void checkCrossEntropy(int64_t classes, int64_t reduction, c10::ScalarType logits) {
  if (classes < 1 || classes > (int64_t{1} << 30)) {
    throw std::invalid_argument("cross entropy: " + std::to_string(classes) + " classes");
  }
  if (reduction != 1 && reduction != 2) throw std::invalid_argument("cross entropy: reduction other than mean or sum");
  if (logits != c10::ScalarType::Float && logits != c10::ScalarType::BFloat16 && logits != c10::ScalarType::Half) {
    throw std::invalid_argument(std::string("cross entropy: ") + c10::toString(logits) + " logits");
  }
}

std::string crossEntropyKey(const char* kernel, int64_t classes, int64_t reduction, int64_t ignoreIndex,
                            const std::string& scale, c10::ScalarType logits) {
  checkCrossEntropy(classes, reduction, logits);
  return std::string(kernel) + " c=" + std::to_string(classes) + " red=" + (reduction == 1 ? "mean" : "sum") +
         " ignore=" + std::to_string(ignoreIndex) + scale + " logits=" + c10::toString(logits);
}

std::string withGradKey(int64_t classes, int64_t reduction, int64_t ignoreIndex, double gradScale,
                        c10::ScalarType logits, bool upcast) {
  if (!std::isfinite(static_cast<float>(gradScale))) {
    throw std::invalid_argument("cross entropy: a gradient scale that is not finite");
  }
  if (upcast && logits == c10::ScalarType::Float) throw std::invalid_argument("cross entropy: fp32 logits as fp32");
  return crossEntropyKey("cross_entropy_with_grad", classes, reduction, ignoreIndex,
                         " scale=" + constantText(gradScale), logits) +
         (upcast ? " as=Float" : "");
}

// The classes of a call's logits [rows, classes].
int64_t classesOf(const KernelCallArgs& call, size_t logits) {
  const std::vector<int64_t> shape = call.shape(logits);
  if (shape.size() != 2) throw std::invalid_argument("logits of other than 2 dimensions");
  return shape[1];
}

}  // namespace

CrossEntropyKernelSpec::CrossEntropyKernelSpec(int64_t classes, int64_t reduction, int64_t ignoreIndex,
                                               c10::ScalarType logits)
    : CrossEntropyKernelSpec(crossEntropyKey("cross_entropy", classes, reduction, ignoreIndex, "", logits), classes,
                             reduction, ignoreIndex, logits) {}

CrossEntropyKernelSpec::CrossEntropyKernelSpec(std::string key, int64_t classes, int64_t reduction,
                                               int64_t ignoreIndex, c10::ScalarType logits)
    : KernelSpec(std::move(key)), classes_(classes), reduction_(reduction), ignoreIndex_(ignoreIndex), logits_(logits) {}

CrossEntropyKernelSpec::CrossEntropyKernelSpec(std::string key, int64_t classes, int64_t reduction,
                                               int64_t ignoreIndex, c10::ScalarType logits, bool upcast)
    : CrossEntropyKernelSpec(std::move(key), classes, reduction, ignoreIndex, logits) {
  upcast_ = upcast;
}

CrossEntropyKernelSpec CrossEntropyKernelSpec::forCall(const KernelCallArgs& call) {
  return CrossEntropyKernelSpec(classesOf(call, 0), call.integer(2), call.integer(3), call.dtype(0));
}

CrossEntropyKernelSpec CrossEntropyKernelSpec::forBackwardCall(const KernelCallArgs& call) {
  return CrossEntropyKernelSpec(classesOf(call, 1), call.integer(5), call.integer(6), call.dtype(1));
}

KernelLaunch CrossEntropyKernelSpec::forwardLaunch(int64_t rows) const {
  return {kCrossEntropyKernelName, rows, kCrossEntropyThreads, 0, rows};
}

KernelLaunch CrossEntropyKernelSpec::backwardLaunch(int64_t rows) const {
  return {kCrossEntropyBackwardKernelName, rows, kCrossEntropyThreads, 0, rows};
}

std::string CrossEntropyKernelSpec::generateSource() const {
  return constants(classes_, reduction_, ignoreIndex_, logits_, upcast_) + kHelpers + kForward + kBackward;
}

CrossEntropyWithGradKernelSpec::CrossEntropyWithGradKernelSpec(int64_t classes, int64_t reduction,
                                                               int64_t ignoreIndex, double gradScale,
                                                               c10::ScalarType logits, bool upcast)
    : CrossEntropyKernelSpec(withGradKey(classes, reduction, ignoreIndex, gradScale, logits, upcast), classes,
                             reduction, ignoreIndex, logits, upcast),
      gradScale_(gradScale) {}

CrossEntropyWithGradKernelSpec CrossEntropyWithGradKernelSpec::forCall(const KernelCallArgs& call, bool upcast) {
  return CrossEntropyWithGradKernelSpec(classesOf(call, 0), call.integer(2), call.integer(3), call.real(4),
                                        call.dtype(0), upcast);
}

bool CrossEntropyWithGradKernelSpec::fitsOneKernel(int64_t sharedPerBlock) const {
  return crossEntropyRowBytes(classes_, logits_) <= sharedPerBlock;
}

KernelLaunch CrossEntropyWithGradKernelSpec::withGradLaunch(int64_t rows) const {
  return {kCrossEntropyWithGradKernelName, rows, kCrossEntropyFusedThreads,
          static_cast<int>(crossEntropyRowBytes(classes_, logits_)), rows};
}

std::string CrossEntropyWithGradKernelSpec::generateSource() const {
  std::string src = "constexpr int kFusedThreads = " + std::to_string(kCrossEntropyFusedThreads) + ";\n";
  src += "constexpr int kCached = " + std::to_string(crossEntropyCachedClasses(classes_, logits_)) +
         ";  // classes a block keeps in shared memory\n";
  src += "constexpr float kGradScale = " + constantText(gradScale_) + "f;  // the loss's incoming gradient\n";
  return constants(classes_, reduction_, ignoreIndex_, logits_, upcast_) + src + kHelpers + kForward + kBackward +
         kWithGrad;
}

}  // namespace spmd

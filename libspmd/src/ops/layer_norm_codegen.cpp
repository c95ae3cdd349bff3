#include "spmd/ops/layer_norm_codegen.h"

#include "spmd/ops/cuda_emitter.h"
#include "spmd/ops/pointwise_program.h"

#include <cmath>
#include <optional>
#include <stdexcept>

namespace spmd {
namespace {

// Shared by both sources: 16-byte rows and a warp-wide sum.
std::string sharedHelpers() {
  return vectorStruct("spmd_f32x4", c10::ScalarType::Float, "4", 16) +
         vectorStruct("spmd_bf16x4", c10::ScalarType::BFloat16, "4", 8) + "\n" +
         warpReductionFunction("spmd_warp_sum", WarpReduction::Sum, "s");
}

constexpr const char* kForward = R"(
extern "C" __global__ void __launch_bounds__(kThreads) spmd_layer_norm(const float* x, const spmd_res* residual,
                                                                     const float* weight, const float* bias,
                                                                     spmd_out* y, float* mean, float* rstd,
                                                                     float* sum, long long rows) {
  const long long row = (long long)blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float v[kChunks][4];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = j * 32 + lane;
    if (c < kVectors) {
      spmd_load_f32(x + row * kFeatures, c, v[j]);
      if (kResidual) {  // the skip connection's add, rounded to f32 as aten::add's
        float r[4];
        spmd_load_res(residual + row * kFeatures, c, r);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[j][e] += r[e];
        spmd_store_f32(sum + row * kFeatures, c, v[j]);
      }
      s += (v[j][0] + v[j][1]) + (v[j][2] + v[j][3]);
    }
  }
  const float mu = spmd_warp_sum(s) / kFeatures;
  // The variance from the deviations (two passes over registers), not Welford's.
  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (j * 32 + lane < kVectors) {
#pragma unroll
      for (int e = 0; e < 4; ++e) q += (v[j][e] - mu) * (v[j][e] - mu);
    }
  }
  const float r = rsqrtf(spmd_warp_sum(q) / kFeatures + kEps);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = j * 32 + lane;
    if (c < kVectors) {
      float w[4], b[4], o[4];
      spmd_load_f32(weight, c, w);
      spmd_load_f32(bias, c, b);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = (v[j][e] - mu) * r * w[e] + b[e];
      spmd_store_out(y + row * kFeatures, c, o);
    }
  }
}
)";

constexpr const char* kBackward = R"(
__device__ __forceinline__ void spmd_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Two blocks an SM (at most 128 registers a thread): the weight is read
// again from L1 where it is used, not held.
extern "C" __global__ void __launch_bounds__(kThreads, 2) spmd_layer_norm_backward(
    const spmd_grad* dy, const float* x, const float* mean, const float* rstd, const float* weight,
    const float* residual, float* dx, spmd_copy* dx_copy, float* partial, long long rows) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This lane's columns summed over its warp's rows: dy * xhat and dy.
  float sum_gx[kChunks][4], sum_g[kChunks][4];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sum_gx[j][e] = sum_g[j][e] = 0.0f;
  }
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const long long row = ((long long)blockIdx.x * kWarps + warp) * kRowsPerWarp + k;
    if (row >= rows) break;
    // The residual is read only once the row's sums are known: ask L2 for its
    // lines now, so that their fetch overlaps the sums (8% faster on H200, standalone).
    if (kResidual) {
      for (int l = lane; l < (kFeatures + 31) / 32; l += 32) spmd_prefetch_l2(residual + row * kFeatures + 32 * l);
    }
    const float mu = mean[row], rs = rstd[row];
    float xhat[kChunks][4], g[kChunks][4];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = j * 32 + lane;
      if (c < kVectors) {
        float w[4];
        spmd_load_f32(x + row * kFeatures, c, xhat[j]);
        spmd_load_grad(dy + row * kFeatures, c, g[j]);
        spmd_load_f32(weight, c, w);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          xhat[j][e] = (xhat[j][e] - mu) * rs;
          const float wg = g[j][e] * w[e];
          s1 += wg;
          s2 += wg * xhat[j][e];
          sum_gx[j][e] += g[j][e] * xhat[j][e];
          sum_g[j][e] += g[j][e];
        }
      }
    }
    const float mean_g = spmd_warp_sum(s1) / kFeatures, mean_gx = spmd_warp_sum(s2) / kFeatures;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = j * 32 + lane;
      if (c < kVectors) {
        float w[4], o[4], add[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        spmd_load_f32(weight, c, w);
        if (kResidual) spmd_load_f32(residual + row * kFeatures, c, add);
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = rs * (g[j][e] * w[e] - mean_g - xhat[j][e] * mean_gx) + add[e];
        spmd_store_f32(dx + row * kFeatures, c, o);
        if (kCopy) spmd_store_copy(dx_copy + row * kFeatures, c, o);
      }
    }
  }
  // The block's column sums, warp by warp in order: partial[block][0] for
  // the weight, partial[block][1] for the bias.
  __shared__ float cols[kWarps][kFeatures];
  for (int part = 0; part < 2; ++part) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = j * 32 + lane;
      if (c < kVectors) {
#pragma unroll
        for (int e = 0; e < 4; ++e) cols[warp][4 * c + e] = part == 0 ? sum_gx[j][e] : sum_g[j][e];
      }
    }
    __syncthreads();
    for (int f = threadIdx.x; f < kFeatures; f += kThreads) {
      float t = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) t += cols[k][f];
      partial[((long long)blockIdx.x * 2 + part) * kFeatures + f] = t;
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(kParamsThreads) spmd_layer_norm_backward_params(
    const float* partial, float* dweight, float* dbias, long long blocks) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int f = blockIdx.x * 32 + lane;
  float sw = 0.0f, sb = 0.0f;
  if (f < kFeatures) {
    for (long long b = warp; b < blocks; b += kParamsThreads / 32) {
      sw += partial[2 * b * kFeatures + f];
      sb += partial[(2 * b + 1) * kFeatures + f];
    }
  }
  __shared__ float ws[kParamsThreads / 32][32], bs[kParamsThreads / 32][32];
  ws[warp][lane] = sw;
  bs[warp][lane] = sb;
  __syncthreads();
  if (warp == 0 && f < kFeatures) {
    float tw = 0.0f, tb = 0.0f;
#pragma unroll
    for (int k = 0; k < kParamsThreads / 32; ++k) {
      tw += ws[k][lane];
      tb += bs[k][lane];
    }
    dweight[f] = tw;
    dbias[f] = tb;
  }
}
)";

void checkDtype(c10::ScalarType t, const char* what) {
  if (t != c10::ScalarType::Float && t != c10::ScalarType::BFloat16) {
    throw std::invalid_argument(std::string("layer norm: ") + what + " of a dtype other than f32 and bf16");
  }
}

void checkFeatures(int64_t features) {
  const std::string why = layerNormUnsupported(features);
  if (!why.empty()) throw std::invalid_argument("layer norm: " + why);
}

// The constants both sources start with.
std::string header(const std::string& what, int64_t features) {
  std::string src = generatedBanner();
  src += "// " + what + "\n";
  src += "constexpr int kFeatures = " + std::to_string(features) + ";\n";
  src += "constexpr int kVectors = " + std::to_string(features / 4) + ";  // 16-byte pieces of a row\n";
  src += "constexpr int kChunks = " + std::to_string((features / 4 + 31) / 32) + ";  // pieces a lane holds\n";
  src += "constexpr int kWarps = " + std::to_string(kLayerNormWarps) + ";\n";
  src += "constexpr int kThreads = " + std::to_string(32 * kLayerNormWarps) + ";\n";
  return src;
}

bool isBf16(c10::ScalarType t) { return t == c10::ScalarType::BFloat16; }

}  // namespace

int64_t layerNormBackwardBlocks(int64_t rows) {
  return (rows + kLayerNormBackwardBlockRows - 1) / kLayerNormBackwardBlockRows;
}

std::string layerNormUnsupported(int64_t features) {
  if (features < 4 || features % 4 != 0) return std::to_string(features) + " features, not a multiple of 4";
  if (features > kLayerNormMaxFeatures) {
    return std::to_string(features) + " features, more than the " + std::to_string(kLayerNormMaxFeatures) +
           " a warp's registers hold";
  }
  return "";
}

namespace {

std::string residualText(std::optional<c10::ScalarType> residual) {
  return residual ? (isBf16(*residual) ? "bf16" : "f32") : "none";
}

// The forward's key, once its attributes are checked.
std::string layerNormKey(int64_t features, double eps, c10::ScalarType outDtype,
                         std::optional<c10::ScalarType> residual) {
  checkFeatures(features);
  checkDtype(outDtype, "an output");
  if (residual) checkDtype(*residual, "a residual");
  if (!(eps >= 0) || !std::isfinite(static_cast<float>(eps))) throw std::invalid_argument("layer norm: a bad eps");
  return "layer_norm f=" + std::to_string(features) + " eps=" + constantText(eps) +
         " out=" + (isBf16(outDtype) ? "bf16" : "f32") + " res=" + residualText(residual);
}

std::string layerNormBackwardKey(int64_t features, c10::ScalarType gradDtype, bool residual, bool bf16Copy) {
  checkFeatures(features);
  checkDtype(gradDtype, "an incoming gradient");
  return "layer_norm_backward f=" + std::to_string(features) + " grad=" + (isBf16(gradDtype) ? "bf16" : "f32") +
         " res=" + (residual ? "1" : "0") + (bf16Copy ? " copy=bf16" : "");
}

// The last dimension of a call's input.
int64_t featuresOf(const KernelCallArgs& call, size_t input) {
  const std::vector<int64_t> shape = call.shape(input);
  if (shape.empty()) throw std::invalid_argument("an input of no dimensions");
  return shape.back();
}

}  // namespace

LayerNormKernelSpec::LayerNormKernelSpec(int64_t features, double eps, c10::ScalarType outDtype,
                                         std::optional<c10::ScalarType> residual)
    : KernelSpec(layerNormKey(features, eps, outDtype, residual)),
      features_(features),
      eps_(eps),
      out_(outDtype),
      residual_(residual) {}

LayerNormKernelSpec LayerNormKernelSpec::forCall(const KernelCallArgs& call) {
  const auto out = static_cast<c10::ScalarType>(call.integer(5));
  if (!call.given(1)) return LayerNormKernelSpec(featuresOf(call, 0), call.real(4), out, std::nullopt);
  return LayerNormKernelSpec(featuresOf(call, 0), call.real(4), out, call.dtype(1));
}

KernelLaunch LayerNormKernelSpec::launch(int64_t rows) const {
  return {kLayerNormKernelName, (rows + kLayerNormWarps - 1) / kLayerNormWarps, 32 * kLayerNormWarps, 0, rows};
}

std::string LayerNormKernelSpec::generateSource() const {
  const c10::ScalarType residualDtype = residual_.value_or(c10::ScalarType::Float);
  std::string what = "layer norm over " + std::to_string(features_) + " features, eps " + constantText(eps_) +
                     ", output " + (isBf16(out_) ? "bf16" : "f32");
  if (residual_) what += std::string(", of the input plus a ") + (isBf16(residualDtype) ? "bf16" : "f32") + " residual";
  std::string src = header(what, features_);
  src += "constexpr float kEps = " + constantText(eps_) + "f;\n";
  src += std::string("constexpr bool kResidual = ") + (residual_ ? "true" : "false") + ";\n\n";
  if (isBf16(out_) || isBf16(residualDtype)) src += bfloat16Helpers();
  src += sharedHelpers();
  src += fourLoadFunction("spmd_load_f32", "spmd_f32", c10::ScalarType::Float);
  src += fourLoadFunction("spmd_load_res", "spmd_res", residualDtype);
  src += fourStoreFunction("spmd_store_f32", "spmd_f32", c10::ScalarType::Float);
  src += fourStoreFunction("spmd_store_out", "spmd_out", out_);
  return src + kForward;
}

LayerNormBackwardKernelSpec::LayerNormBackwardKernelSpec(int64_t features, c10::ScalarType gradDtype, bool residual,
                                                         bool bf16Copy)
    : KernelSpec(layerNormBackwardKey(features, gradDtype, residual, bf16Copy)),
      features_(features),
      grad_(gradDtype),
      residual_(residual),
      bf16Copy_(bf16Copy) {}

LayerNormBackwardKernelSpec LayerNormBackwardKernelSpec::forCall(const KernelCallArgs& call) {
  return LayerNormBackwardKernelSpec(featuresOf(call, 1), call.dtype(0), call.given(5), call.flag(6));
}

KernelLaunch LayerNormBackwardKernelSpec::rowsLaunch(int64_t rows) const {
  return {kLayerNormBackwardKernelName, layerNormBackwardBlocks(rows), 32 * kLayerNormWarps, 0, rows};
}

KernelLaunch LayerNormBackwardKernelSpec::paramsLaunch(int64_t rows) const {
  return {kLayerNormParamsKernelName, (features_ + kLayerNormParamsColumns - 1) / kLayerNormParamsColumns,
          kLayerNormParamsThreads, 0, layerNormBackwardBlocks(rows)};
}

std::string LayerNormBackwardKernelSpec::generateSource() const {
  std::string src = header(std::string("layer norm backward over ") + std::to_string(features_) +
                               " features, incoming gradient " + (isBf16(grad_) ? "bf16" : "f32") +
                               (residual_ ? ", a residual gradient added" : "") +
                               (bf16Copy_ ? ", dx also written in bf16" : ""),
                           features_);
  src += "constexpr int kRowsPerWarp = " + std::to_string(kLayerNormRowsPerWarp) + ";\n";
  src += "constexpr int kParamsThreads = " + std::to_string(kLayerNormParamsThreads) + ";\n";
  src += std::string("constexpr bool kResidual = ") + (residual_ ? "true" : "false") + ";\n";
  src += std::string("constexpr bool kCopy = ") + (bf16Copy_ ? "true" : "false") + ";\n\n";
  if (isBf16(grad_) || bf16Copy_) src += bfloat16Helpers();
  src += sharedHelpers();
  src += fourLoadFunction("spmd_load_f32", "spmd_f32", c10::ScalarType::Float);
  src += fourLoadFunction("spmd_load_grad", "spmd_grad", grad_);
  src += fourStoreFunction("spmd_store_f32", "spmd_f32", c10::ScalarType::Float);
  src += fourStoreFunction("spmd_store_copy", "spmd_copy",
                           bf16Copy_ ? c10::ScalarType::BFloat16 : c10::ScalarType::Float);
  return src + kBackward;
}

}  // namespace spmd

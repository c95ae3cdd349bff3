#include "spmd/ops/layer_norm_codegen.h"

#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/pointwise_program.h"

#include <cmath>
#include <optional>
#include <stdexcept>

namespace spmd {
namespace {

// Shared by both sources: 16-byte rows and a warp-wide sum. The butterfly
// leaves the same sum, bit for bit, in every lane (each step adds the same
// two numbers in both lanes of a pair).
constexpr const char* kHelpers = R"(struct alignas(16) spmd_f32x4 { float v[4]; };
struct alignas(8) spmd_bf16x4 { unsigned short v[4]; };

__device__ __forceinline__ float spmd_warp_sum(float s) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}
)";

// Four consecutive elements of a row, as float, from f32 or bf16 storage;
// and four floats into the output's storage.
std::string loadFunction(const char* name, const char* type, c10::ScalarType dtype) {
  const bool bf16 = dtype == c10::ScalarType::BFloat16;
  std::string s = std::string("typedef ") + (bf16 ? "unsigned short " : "float ") + type + ";\n";
  s += std::string("__device__ __forceinline__ void ") + name + "(const " + type + "* row, int c, float r[4]) {\n";
  if (bf16) {
    s += "  const spmd_bf16x4 q = reinterpret_cast<const spmd_bf16x4*>(row)[c];\n"
         "#pragma unroll\n  for (int e = 0; e < 4; ++e) r[e] = spmd_bf16_to_f32(q.v[e]);\n}\n";
  } else {
    s += "  const spmd_f32x4 q = reinterpret_cast<const spmd_f32x4*>(row)[c];\n"
         "#pragma unroll\n  for (int e = 0; e < 4; ++e) r[e] = q.v[e];\n}\n";
  }
  return s;
}

std::string storeFunction(const char* name, const char* type, c10::ScalarType dtype) {
  const bool bf16 = dtype == c10::ScalarType::BFloat16;
  std::string s = std::string("typedef ") + (bf16 ? "unsigned short " : "float ") + type + ";\n";
  s += std::string("__device__ __forceinline__ void ") + name + "(" + type + "* row, int c, const float r[4]) {\n";
  if (bf16) {
    s += "  spmd_bf16x4 q;\n#pragma unroll\n  for (int e = 0; e < 4; ++e) q.v[e] = spmd_f32_to_bf16(r[e]);\n"
         "  reinterpret_cast<spmd_bf16x4*>(row)[c] = q;\n}\n";
  } else {
    s += "  spmd_f32x4 q;\n#pragma unroll\n  for (int e = 0; e < 4; ++e) q.v[e] = r[e];\n"
         "  reinterpret_cast<spmd_f32x4*>(row)[c] = q;\n}\n";
  }
  return s;
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
    const float* residual, float* dx, float* partial, long long rows) {
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
  std::string src = "// Generated by spmd-lower (codegen version " + std::to_string(kCodegenVersion) + ").\n";
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

std::string layerNormSource(int64_t features, double eps, c10::ScalarType outDtype,
                            std::optional<c10::ScalarType> residual) {
  checkFeatures(features);
  checkDtype(outDtype, "an output");
  if (residual) checkDtype(*residual, "a residual");
  if (!(eps >= 0) || !std::isfinite(static_cast<float>(eps))) throw std::invalid_argument("layer norm: a bad eps");
  const c10::ScalarType residualDtype = residual.value_or(c10::ScalarType::Float);
  std::string what = "layer norm over " + std::to_string(features) + " features, eps " + constantText(eps) +
                     ", output " + (isBf16(outDtype) ? "bf16" : "f32");
  if (residual) what += std::string(", of the input plus a ") + (isBf16(residualDtype) ? "bf16" : "f32") + " residual";
  std::string src = header(what, features);
  src += "constexpr float kEps = " + constantText(eps) + "f;\n";
  src += std::string("constexpr bool kResidual = ") + (residual ? "true" : "false") + ";\n\n";
  if (isBf16(outDtype) || isBf16(residualDtype)) src += bfloat16Helpers();
  src += kHelpers;
  src += loadFunction("spmd_load_f32", "spmd_f32", c10::ScalarType::Float);
  src += loadFunction("spmd_load_res", "spmd_res", residualDtype);
  src += storeFunction("spmd_store_f32", "spmd_f32", c10::ScalarType::Float);
  src += storeFunction("spmd_store_out", "spmd_out", outDtype);
  return src + kForward;
}

std::string layerNormBackwardSource(int64_t features, c10::ScalarType gradDtype, bool residual) {
  checkFeatures(features);
  checkDtype(gradDtype, "an incoming gradient");
  std::string src = header(std::string("layer norm backward over ") + std::to_string(features) +
                               " features, incoming gradient " + (isBf16(gradDtype) ? "bf16" : "f32") +
                               (residual ? ", a residual gradient added" : ""),
                           features);
  src += "constexpr int kRowsPerWarp = " + std::to_string(kLayerNormRowsPerWarp) + ";\n";
  src += "constexpr int kParamsThreads = " + std::to_string(kLayerNormParamsThreads) + ";\n";
  src += std::string("constexpr bool kResidual = ") + (residual ? "true" : "false") + ";\n\n";
  if (isBf16(gradDtype)) src += bfloat16Helpers();
  src += kHelpers;
  src += loadFunction("spmd_load_f32", "spmd_f32", c10::ScalarType::Float);
  src += loadFunction("spmd_load_grad", "spmd_grad", gradDtype);
  src += storeFunction("spmd_store_f32", "spmd_f32", c10::ScalarType::Float);
  return src + kBackward;
}

}  // namespace spmd

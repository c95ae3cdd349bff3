#include "spmd/ops/attention_codegen.h"

#include "spmd/ops/cuda_emitter.h"
#include "spmd/ops/pointwise_program.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace spmd {
namespace {

// The helpers both kernels use: the last key a row keeps and the end of what
// it writes.
constexpr const char* kRowHelpers = R"(__device__ __forceinline__ int spmd_last_key(long long row) {
  const long long query = row % kQueries;
  return kCausal && query < kKeys - 1 ? (int)query : kKeys - 1;
}

__device__ __forceinline__ int spmd_write_end(long long row) {
  return kBlockRows == 0 ? kKeys : (int)((row % kQueries / kBlockRows + 1) * kBlockRows);
}
)";

// Warp-wide reductions by butterfly shuffles, after kRowHelpers.
std::string warpReductions() {
  return warpReductionFunction("spmd_warp_max", WarpReduction::Max, "v") + "\n" +
         warpReductionFunction("spmd_warp_sum", WarpReduction::Sum, "v");
}

// As ATen's softmax: the maximum, the sum of exp(x - max), then each
// exp(x - max) divided by the sum. A lane reads and writes kWidth scores
// at a time: key j = kWidth * (lane + 32 * i) + e.
constexpr const char* kForward = R"(
extern "C" __global__ void __launch_bounds__(kThreads) spmd_attention_softmax(float* scores, long long rows) {
  const long long row = (long long)blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31, last = spmd_last_key(row), end = spmd_write_end(row);
  spmd_scores* x = reinterpret_cast<spmd_scores*>(scores + row * kKeys);
  float v[kPerLane][kWidth];
  float m = __int_as_float(0xff800000);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int j = kWidth * (lane + 32 * i);
    spmd_scores q = {};
    if (j <= last) q = x[lane + 32 * i];
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      v[i][e] = j + e <= last ? q.v[e] * kScale : __int_as_float(0xff800000);
      m = fmaxf(m, v[i][e]);
    }
  }
  m = spmd_warp_max(m);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      v[i][e] = kWidth * (lane + 32 * i) + e <= last ? expf(v[i][e] - m) : 0.0f;
      sum += v[i][e];
    }
  }
  sum = spmd_warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (kWidth * (lane + 32 * i) >= end) continue;
    spmd_scores r;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) r.v[e] = v[i][e] / sum;
    x[lane + 32 * i] = r;
  }
}
)";

// As ATen's softmax backward (p * g first, then minus p times its row sum),
// then times the scale, as the backward of the scores' scaling.
constexpr const char* kBackward = R"(
extern "C" __global__ void __launch_bounds__(kThreads) spmd_attention_softmax_backward(float* grad, const float* probs,
                                                                                 long long rows) {
  const long long row = (long long)blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31, last = spmd_last_key(row), end = spmd_write_end(row);
  spmd_scores* g = reinterpret_cast<spmd_scores*>(grad + row * kKeys);
  const spmd_scores* p = reinterpret_cast<const spmd_scores*>(probs + row * kKeys);
  float pv[kPerLane][kWidth], pg[kPerLane][kWidth];
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int j = kWidth * (lane + 32 * i);
    spmd_scores pq = {}, gq = {};
    if (j <= last) {
      pq = p[lane + 32 * i];
      gq = g[lane + 32 * i];
    }
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      pv[i][e] = j + e <= last ? pq.v[e] : 0.0f;
      pg[i][e] = j + e <= last ? pv[i][e] * gq.v[e] : 0.0f;
      dot += pg[i][e];
    }
  }
  dot = spmd_warp_sum(dot);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (kWidth * (lane + 32 * i) >= end) continue;
    spmd_scores r;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) r.v[e] = (pg[i][e] - pv[i][e] * dot) * kScale;
    g[lane + 32 * i] = r;
  }
}
)";

}  // namespace

int64_t attentionCausalBlockRows(int64_t queries, int64_t keys, bool causal) {
  if (!causal || queries != keys) return 0;
  for (int64_t blocks : {4, 2}) {
    if (queries % blocks == 0 && queries / blocks >= 128) return queries / blocks;
  }
  return 0;
}

// 16 bytes where every row's start and written end fall on them (keys and
// the causal blocks' rows multiples of 4), else 4.
int64_t attentionSoftmaxWidth(int64_t queries, int64_t keys, bool causal) {
  return keys % 4 == 0 && attentionCausalBlockRows(queries, keys, causal) % 4 == 0 ? 4 : 1;
}

// As the kernels' spmd_last_key and spmd_write_end count them.
AttentionSoftmaxElements attentionSoftmaxElements(int64_t queries, int64_t keys, bool causal) {
  const int64_t blockRows = attentionCausalBlockRows(queries, keys, causal);
  AttentionSoftmaxElements e;
  for (int64_t q = 0; q < queries; ++q) {
    e.read += causal ? std::min(q, keys - 1) + 1 : keys;
    e.written += blockRows == 0 ? keys : (q / blockRows + 1) * blockRows;
  }
  return e;
}

namespace {

// The key, once the attributes are checked.
std::string attentionSoftmaxKey(int64_t queries, int64_t keys, double scale, bool causal) {
  if (keys < 1 || keys > kAttentionSoftmaxMaxKeys) {
    throw std::invalid_argument("attention softmax: " + std::to_string(keys) + " keys a row (1 to " +
                                std::to_string(kAttentionSoftmaxMaxKeys) + " fit a warp's registers)");
  }
  if (queries < 1) throw std::invalid_argument("attention softmax: no queries");
  if (!std::isfinite(static_cast<float>(scale))) throw std::invalid_argument("attention softmax: a scale that is not finite");
  return "attention_softmax q=" + std::to_string(queries) + " k=" + std::to_string(keys) + " scale=" +
         constantText(scale) + " causal=" + (causal ? "1" : "0");
}

}  // namespace

AttentionSoftmaxKernelSpec::AttentionSoftmaxKernelSpec(int64_t queries, int64_t keys, double scale, bool causal)
    : KernelSpec(attentionSoftmaxKey(queries, keys, scale, causal)),
      queries_(queries),
      keys_(keys),
      scale_(scale),
      causal_(causal) {}

AttentionSoftmaxKernelSpec AttentionSoftmaxKernelSpec::forScores(const std::vector<int64_t>& shape, double scale,
                                                                 bool causal) {
  if (shape.size() < 2) throw std::invalid_argument("probabilities of fewer than 2 dimensions");
  return AttentionSoftmaxKernelSpec(shape[shape.size() - 2], shape.back(), scale, causal);
}

KernelLaunch AttentionSoftmaxKernelSpec::forwardLaunch(int64_t rows) const {
  return {kAttentionSoftmaxKernelName, (rows + kAttentionSoftmaxRowsPerBlock - 1) / kAttentionSoftmaxRowsPerBlock,
          32 * kAttentionSoftmaxRowsPerBlock, 0, rows};
}

KernelLaunch AttentionSoftmaxKernelSpec::backwardLaunch(int64_t rows) const {
  KernelLaunch launch = forwardLaunch(rows);
  launch.kernel = kAttentionSoftmaxBackwardKernelName;
  return launch;
}

std::string AttentionSoftmaxKernelSpec::generateSource() const {
  const int64_t queries = queries_, keys = keys_;
  const double scale = scale_;
  const bool causal = causal_;
  const std::string scaleText = constantText(scale);
  std::string src = generatedBanner();
  src += "// attention softmax: rows of " + std::to_string(keys) + " keys, query = row % " + std::to_string(queries) +
         ", scale " + scaleText + (causal ? ", causal" : "") + "\n";
  src += "constexpr int kKeys = " + std::to_string(keys) + ";\n";
  src += "constexpr long long kQueries = " + std::to_string(queries) + ";\n";
  const int64_t width = attentionSoftmaxWidth(queries, keys, causal);
  src += "constexpr int kWidth = " + std::to_string(width) + ";  // scores a load or store moves\n";
  src += vectorStruct("spmd_scores", c10::ScalarType::Float, "kWidth", static_cast<int>(4 * width));
  src += "constexpr int kPerLane = " + std::to_string((keys / width + 31) / 32) + ";  // loads (and stores) a lane makes a row\n";
  src += "constexpr int kRowsPerBlock = " + std::to_string(kAttentionSoftmaxRowsPerBlock) + ";\n";
  src += "constexpr int kThreads = " + std::to_string(32 * kAttentionSoftmaxRowsPerBlock) + ";\n";
  src += std::string("constexpr bool kCausal = ") + (causal ? "true" : "false") + ";\n";
  src += "constexpr long long kBlockRows = " + std::to_string(attentionCausalBlockRows(queries, keys, causal)) +
         ";  // rows of a causal GEMM block; 0: not blocked\n";
  src += "constexpr float kScale = " + scaleText + "f;\n\n";
  return src + kRowHelpers + warpReductions() + kForward + kBackward;
}

}  // namespace spmd

// CUDA C for the row softmax of spmd::fused_attention's "gemm" kernel, which
// runs attention as batched GEMMs (TF32 where allowed) around two generated
// kernels over the [..., queries, keys] score matrix, each in place:
//
//   spmd_attention_softmax(float* scores, long long rows)
//     p = softmax(scores * scale) over each row, keys after the row's query
//     masked out when causal (top-left aligned, as SDPA's is_causal);
//   spmd_attention_softmax_backward(float* grad, const float* probs, long long rows)
//     grad = (p * grad - p * sum(p * grad)) * scale, the gradient of the
//     scores (ATen's softmax backward, then the scaling's).
//
// One warp per row, the row held in registers; masked keys are neither read
// nor computed, only written (as 0), and under causal blocking
// (attentionCausalBlockRows) only up to the end of the row's block: the
// blocked GEMMs read no further. The source is deterministic and needs no
// headers, like the pointwise kernels' (ops/cuda_codegen.h).
#pragma once

#include "spmd/ops/kernel_spec.h"

#include <cstdint>
#include <string>
#include <vector>

namespace spmd {

constexpr const char* kAttentionSoftmaxKernelName = "spmd_attention_softmax";
constexpr const char* kAttentionSoftmaxBackwardKernelName = "spmd_attention_softmax_backward";
constexpr int kAttentionSoftmaxRowsPerBlock = 4;  // warps per block, a row each
// A row lives in its warp's registers: at most 64 floats per lane.
constexpr int64_t kAttentionSoftmaxMaxKeys = 2048;

// How the gemm kernel blocks a causal square attention's GEMMs: queries in
// blocks of this many rows (4 blocks, else 2, of at least 128), block i
// against the keys of blocks 0..i only. 0: not blocked (not causal, not
// square, or too short): every query against every key.
int64_t attentionCausalBlockRows(int64_t queries, int64_t keys, bool causal);

// The scores the kernels load or store at a time: 4 (16 bytes) where keys
// and the causal blocks' rows are multiples of 4 (then the scores must
// start 16-byte aligned), else 1.
int64_t attentionSoftmaxWidth(int64_t queries, int64_t keys, bool causal);

// The elements of one [queries, keys] score matrix the kernels touch: a
// causal row reads its keys up to its query, and every row writes up to
// its block's end (all keys when not blocked). The backward reads twice as
// much (probabilities and gradient), writes as much.
struct AttentionSoftmaxElements {
  int64_t read = 0, written = 0;
};
AttentionSoftmaxElements attentionSoftmaxElements(int64_t queries, int64_t keys, bool causal);

// The softmax kernels of spmd::fused_attention(_backward)'s "gemm" kernel
// (one source holds both): the score matrix's queries and keys, the scale
// and the causal mask. Key "attention_softmax q=1024 k=1024 scale=0.125 causal=1".
class AttentionSoftmaxKernelSpec final : public KernelSpec {
 public:
  // Throws std::invalid_argument for keys outside [1,
  // kAttentionSoftmaxMaxKeys], queries < 1 or a scale that is not finite.
  AttentionSoftmaxKernelSpec(int64_t queries, int64_t keys, double scale, bool causal);
  // Over scores (or probabilities) of `shape` [..., queries, keys]; throws
  // for fewer than 2 dimensions.
  static AttentionSoftmaxKernelSpec forScores(const std::vector<int64_t>& shape, double scale, bool causal);
  // The scores a load or store moves (attentionSoftmaxWidth): the rows
  // must start 4 * width bytes aligned.
  int64_t width() const { return attentionSoftmaxWidth(queries_, keys_, causal_); }
  // One warp a row, kAttentionSoftmaxRowsPerBlock rows a block.
  KernelLaunch forwardLaunch(int64_t rows) const;
  KernelLaunch backwardLaunch(int64_t rows) const;

 private:
  std::string generateSource() const override;

  int64_t queries_, keys_;
  double scale_;
  bool causal_;
};

}  // namespace spmd

// The spmd operator library, registered with LibTorch's dispatcher under the
// `spmd::` namespace so that the verifier and interpreter treat spmd ops and
// ATen ops alike.
//
//   spmd::batch_norm_train  BatchNorm in training mode with its running-stat
//                           update returned as outputs instead of done in place.
//   spmd::all_reduce        a gradient reduced across ranks ("mean" or "sum"; "max"
//                           for a sharded step's infinity-norm clipping).
//   spmd::broadcast         a buffer as rank `src` holds it.
//   spmd::bucket_start      launches the all-reduce of a bucket's packed gradients.
//   spmd::bucket_wait       waits for it and returns the reduced flat tensor.
//   spmd::reduce_scatter    launches a sharded bucket's reduce-scatter: the flat
//                           gradients of `world` ranks' rows in, this rank's
//                           reduced row out, waited for by spmd::bucket_wait.
//   spmd::all_gather        every rank's flat shard, concatenated in rank order;
//   spmd::gather_start      the same launched (--shard parameters' gathers
//   spmd::gather_wait       of whole parameters), and waited for.
//   spmd::shard             this rank's 1/world of a tensor's rows (no
//                           communication: the rows are the same on every rank).
//   spmd::attention         softmax(q k^T * scale [+ mask]) v, as a model writes it
//                           (spmd-expand's attention pass; `divide`: q k^T / scale;
//                           `softmax_dtype`: softmax's dtype), or, with `sdpa`, a
//                           call of F.scaled_dot_product_attention (its dropout on
//                           the keep mask `keep`, its grouped-query heads), differentiated by
//   spmd::attention_backward  LibTorch's autograd over the same ops.
//   spmd::fused_attention(_backward)  ATen's fused attention kernels (efficient,
//                           flash, cudnn), or batched GEMMs around a generated
//                           softmax (gemm, fp32), in their place on CUDA (spmd-lower).
//   spmd::fused_adam        torch.optim's fused Adam/AdamW over lists, functional
//                           (spmd-lower on CUDA); spmd::fused_adam_ is its
//                           in-place form, which the interpreter picks where
//                           the update is the state's last reader.
//   spmd::cross_entropy(_backward)  log_softmax + nll_loss and their backward as
//                           one generated kernel each on CUDA (spmd-lower's
//                           cross-entropy-to-kernel; ops/cross_entropy_ops.cpp);
//   spmd::cross_entropy_with_grad  both in one kernel, for the loss's seed ones_like.
//   spmd::layer_norm(_backward)  LayerNorm over the last dimension and its
//                           backward as generated kernels on CUDA, with the
//                           casts and the residual gradient around them
//                           (spmd-lower's layer-norm-to-kernel; ops/layer_norm_ops.cpp).
//   spmd::column_sum        the sum over every dimension but the last (a bias's
//                           gradient) as generated kernels on CUDA (spmd-lower's
//                           column-sum-to-kernel; ops/column_sum_ops.cpp).
//   spmd::flat_cat          tensors' elements one after the other, converted to
//                           a dtype as they are copied (a bucket's packing:
//                           spmd-lower's pack-buckets; ops/flat_cat_ops.cpp).
//   spmd::grouped_mm        a mixture of experts' per-expert products over rows
//                           sorted by expert (ATen's _grouped_mm, transformers'
//                           grouped_mm_fallback), differentiated by itself and
//   spmd::grouped_mm_weight_grad  each expert's input^T @ grad (ops/grouped_mm_ops.cpp).
//   spmd::fused             a group of pointwise ops as one generated kernel
//                           (spmd-lower's fuse-pointwise; ops/fused_kernels.h).
//   spmd::dropout_seed      a seed for a dropout mask, and
//   spmd::dropout_mul       a product with the mask it draws (spmd-lower's
//                           dropout-mask-in-kernel; ops/dropout_ops.cpp).
// On one rank the collectives are the identity.
#pragma once

#include <cstddef>

namespace spmd {

// Referencing this pulls the registration's object file into the link.
void ensureSpmdOpsRegistered();
void ensureAttentionOpsRegistered();       // ops/attention_ops.cpp
void ensureFusedOptimizerOpsRegistered();  // ops/fused_optimizer_ops.cpp
void ensureCrossEntropyOpsRegistered();    // ops/cross_entropy_ops.cpp
void ensureLayerNormOpsRegistered();       // ops/layer_norm_ops.cpp
void ensureColumnSumOpsRegistered();       // ops/column_sum_ops.cpp
void ensureDropoutOpsRegistered();         // ops/dropout_ops.cpp
void ensureFlatCatOpsRegistered();         // ops/flat_cat_ops.cpp
void ensureGroupedMmOpsRegistered();       // ops/grouped_mm_ops.cpp

// The arguments of spmd::attention by position; spmd::attention_backward's
// are the same after its first (the gradient).
enum AttentionArg : std::size_t {
  kAttentionQuery,
  kAttentionKey,
  kAttentionValue,
  kAttentionMask,
  kAttentionScale,
  kAttentionCausal,
  kAttentionDivide,
  kAttentionSoftmaxDtype,
  kAttentionSdpa,
  kAttentionDropoutP,
  kAttentionKeep,
  kAttentionEnableGqa,
  kAttentionArgs,
};

}  // namespace spmd

// torch.nn.utils.clip_grad_norm_ over a step's reduced gradients, as nodes:
// the optimizer pass clips with it before the update (--clip-grad-norm), as
// a training loop calls clip_grad_norm_ between DDP's backward and
// optimizer.step().
#pragma once

#include "spmd/ir/builder.h"

#include <vector>

namespace spmd {

struct ClippedGradients {
  std::vector<ValueId> clipped;  // one per input gradient, in its order
  ValueId totalNorm = kNoValue;  // the norm before clipping (f32[])
};

// `gradients` in the module's parameter order (it fixes the order of the
// stacked norms, as clip_grad_norm_'s list does). Norm type 2: the norm of
// the per-gradient norms (aten::norm, as torch.norm calls it); inf: the max
// of the per-gradient max(abs). The coefficient is 1 / (norm + 1e-6) * max,
// clamped to at most 1 (Python's float / tensor is reciprocal then mul).
ClippedGradients clipGradNorm(GraphBuilder& b, const std::vector<ValueId>& gradients, double maxNorm, double normType);

}  // namespace spmd

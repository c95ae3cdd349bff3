// A rank's training state on its device: the parameters, buffers and
// optimizer state the step reads and updates, copied from the artifact.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/runtime/executor.h"

#include <c10/core/Device.h>

namespace spmd {

class Collectives;

// Every non-data graph input of `artifact`, by name, on `device`: the
// artifact's value copied (the step writes over it), or zeros for the
// state the artifact marks zero-initialised. An input of a sharded step
// whose artifact value is the whole tensor takes rank `rank`'s shard of it
// (ir/shard_layout.h). Throws Diagnostic for an input the artifact holds no
// value for.
TensorMap placeState(const Artifact& artifact, const at::Device& device, int rank);

// Rank `rank`'s dim-0 shard of `whole` over `world` ranks, zero rows added
// past its end (ir/shard_layout.h).
at::Tensor rankShardOf(const at::Tensor& whole, int64_t world, int rank);

// The step's parameters as whole tensors: those the ranks hold shards of
// (--shard parameters) all-gathered through `comm`, which every rank must
// call, in the same order; the others as `state` holds them.
TensorMap wholeParameters(const Artifact& artifact, const TensorMap& state, Collectives* comm);

}  // namespace spmd

// A rank's training state on its device: the parameters, buffers and
// optimizer state the step reads and updates, copied from the artifact.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/runtime/executor.h"

#include <c10/core/Device.h>

namespace spmd {

// Every non-data graph input of `artifact`, by name, on `device`: the
// artifact's value copied (the step writes over it), or zeros for the
// state the artifact marks zero-initialised. Throws Diagnostic for an input
// the artifact holds no value for.
TensorMap placeState(const Artifact& artifact, const at::Device& device);

}  // namespace spmd

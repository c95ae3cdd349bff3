// Loading the parameter and buffer values a graph's weights reference names.
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace spmd {

// Every parameter and buffer of the weights file, by name: a TorchScript
// module's named_parameters() and named_buffers(), or the {name: tensor}
// dict of a torch.save file. Throws Diagnostic naming the file on failure.
std::map<std::string, at::Tensor> loadWeights(const WeightsRef& ref);

}  // namespace spmd

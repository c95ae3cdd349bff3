// TorchScript import: a module saved with torch.jit.save (scripted or traced)
// becomes a flat spmd graph specialised to the given input shapes.
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"

#include <string>
#include <string_view>
#include <vector>

namespace spmd {

// `bytes` is the saved module; `fileName` names it in the graph's weights
// reference and in diagnostics. Submodule calls are inlined, control flow
// that depends on attributes or shapes is resolved by running the module on
// inputs of the given specs (LibTorch's tracer records the ATen calls), and
// parameters and buffers become graph inputs named as named_parameters() /
// named_buffers() name them. In-place updates of buffers become explicit
// StateUpdates. Throws Diagnostic for what cannot be flattened.
// Auto traces the module on the meta device (nothing computed) and on CPU
// tensors where that fails; tests compare the two paths.
enum class TraceOn { Auto, Cpu, Meta };
Graph importTorchScript(std::string_view bytes, const std::string& fileName,
                        const std::vector<InputSpec>& inputs, TraceOn traceOn = TraceOn::Auto);

}  // namespace spmd

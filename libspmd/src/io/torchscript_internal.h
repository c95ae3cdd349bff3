// What the files of the TorchScript importer share; torchscript.cpp runs them
// in order: Python source lines, the data-dependence check, tracing with
// swapped-in tensors, and conversion of the traced graph.
#pragma once

#include "spmd/io/input_spec.h"
#include "spmd/ir/graph.h"
#include "spmd/support/diagnostic.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace spmd {
namespace torchscript_detail {

namespace jit = torch::jit;

// ---- Python source lines (torchscript_source.cpp) ---------------------------

c10::optional<jit::SourceRange> preferredSource(const std::vector<jit::SourceRange>& frames);
std::string sourceOf(const jit::Node* n);
std::string describe(const jit::Node* n);
Diagnostic forwardFailure(const std::string& report);

// ---- data-dependent control flow (torchscript_checks.cpp) -------------------

void markDataDependence(const jit::Block* block, std::set<const jit::Value*>& dependent);

// ---- running the module under the tracer (torchscript_trace.cpp) -----------

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  InputKind kind;
};

at::Tensor exampleInput(const InputSpec& spec, at::Generator& gen);
std::vector<NamedTensor> moduleState(const jit::Module& module);
std::shared_ptr<jit::Graph> traceForward(const jit::Module& module, std::shared_ptr<jit::Graph> forward,
                                         const std::vector<at::Tensor>& dataInputs,
                                         const std::vector<NamedTensor>& state);
std::vector<NamedTensor> onMeta(const std::vector<NamedTensor>& state);
void swapModuleTensors(jit::Module& module, const std::vector<NamedTensor>& to);

// ---- converting the traced graph (torchscript_convert.cpp) ------------------

Graph convertTrace(const jit::Graph& traced, const std::vector<InputSpec>& ordered,
                   const std::vector<NamedTensor>& state, const std::string& fileName);

}  // namespace torchscript_detail
}  // namespace spmd

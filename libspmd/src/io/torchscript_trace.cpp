// Running forward under LibTorch's tracer, on example or meta tensors swapped
// into the module's parameter and buffer slots.
#include "torchscript_internal.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace spmd {
namespace torchscript_detail {

// ---- running the module under the tracer ----------------------------------

at::Tensor exampleInput(const InputSpec& spec, at::Generator& gen) {
  auto options = at::TensorOptions().dtype(spec.dtype);
  // Integer inputs are indices or targets: zeros are valid for any vocabulary.
  if (!c10::isFloatingType(spec.dtype)) return at::zeros(spec.shape, options);
  return at::randn(spec.shape, gen, options);
}

// Parameters then buffers, each tensor once under its first name, as
// named_parameters() / named_buffers() deduplicate shared tensors.
std::vector<NamedTensor> moduleState(const jit::Module& module) {
  std::vector<NamedTensor> state;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (seen.insert(p.value.unsafeGetTensorImpl()).second) {
      state.push_back({p.name, p.value, InputKind::Parameter});
    }
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    if (seen.insert(b.value.unsafeGetTensorImpl()).second) {
      state.push_back({b.name, b.value, InputKind::Buffer});
    }
  }
  return state;
}

namespace {

// Records on each traced node the source line of the TorchScript frame that
// called it, preferring the innermost frame in the user's own code over
// torch.nn's library code.
void recordInterpreterSource(jit::Node* n) {
  std::vector<jit::SourceRange> frames;
  for (const auto& entry : jit::currentCallstack()) frames.push_back(entry.range);  // innermost first
  if (auto range = preferredSource(frames)) n->setSourceRange(*range);
}

}  // namespace

std::shared_ptr<jit::Graph> traceForward(const jit::Module& module, std::shared_ptr<jit::Graph> forward,
                                         const std::vector<at::Tensor>& dataInputs,
                                         const std::vector<NamedTensor>& state) {
  jit::Stack traceInputs;
  for (const auto& t : dataInputs) traceInputs.emplace_back(t);
  for (const auto& s : state) traceInputs.emplace_back(s.tensor);

  jit::Code code(forward, "forward");
  auto run = [&](jit::Stack) {
    jit::Stack stack;
    stack.emplace_back(module._ivalue());
    for (const auto& t : dataInputs) stack.emplace_back(t);
    jit::InterpreterState(code).run(stack);
    return stack;
  };
  at::NoGradGuard noGrad;
  jit::tracer::setRecordSourceLocation(&recordInterpreterSource);
  try {
    auto traced = jit::tracer::trace(std::move(traceInputs), run,
                                     [](const at::Tensor&) { return std::string(); },
                                     /*strict=*/false, /*force_outplace=*/false);
    jit::tracer::setRecordSourceLocation([](jit::Node*) {});
    return traced.first->graph;
  } catch (...) {
    jit::tracer::setRecordSourceLocation([](jit::Node*) {});
    throw;
  }
}

// The module's parameters and buffers as meta tensors (shared ones stay shared).
std::vector<NamedTensor> onMeta(const std::vector<NamedTensor>& state) {
  std::vector<NamedTensor> meta;
  for (const auto& s : state) {
    at::Tensor m = at::empty_strided(s.tensor.sizes(), s.tensor.strides(), s.tensor.options().device(at::kMeta));
    meta.push_back({s.name, m.requires_grad_(s.tensor.requires_grad()), s.kind});
  }
  return meta;
}

// Puts `to` (in moduleState's order) into the module's parameter and buffer
// slots, wherever the tensor now there (in moduleState's order) sits.
void swapModuleTensors(jit::Module& module, const std::vector<NamedTensor>& to) {
  std::map<std::string, at::Tensor> byName;
  for (const auto& t : to) byName[t.name] = t.tensor;
  std::map<const c10::TensorImpl*, at::Tensor> byImpl;
  const auto current = moduleState(module);
  for (size_t i = 0; i < current.size(); ++i) byImpl[current[i].tensor.unsafeGetTensorImpl()] = byName.at(current[i].name);
  for (auto sub : module.modules()) {
    std::vector<std::pair<std::string, at::Tensor>> slots;
    for (const auto& p : sub.named_parameters(/*recurse=*/false)) slots.emplace_back(p.name, p.value);
    for (const auto& b : sub.named_buffers(/*recurse=*/false)) slots.emplace_back(b.name, b.value);
    for (const auto& [name, t] : slots) {
      auto it = byImpl.find(t.unsafeGetTensorImpl());
      if (it != byImpl.end()) sub.setattr(name, it->second);
    }
  }
}

}  // namespace torchscript_detail
}  // namespace spmd

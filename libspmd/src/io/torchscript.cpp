// TorchScript import: loads the module, matches the input specs to forward's
// arguments, and runs the other torchscript_*.cpp files' steps in order.
#include "spmd/io/torchscript.h"

#include "spmd/ops/meta.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/phase_times.h"
#include "huge_pages.h"
#include "torchscript_internal.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/zeros.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <set>

namespace spmd {
namespace {

namespace jit = torch::jit;

using torchscript_detail::convertTrace;
using torchscript_detail::exampleInput;
using torchscript_detail::forwardFailure;
using torchscript_detail::markDataDependence;
using torchscript_detail::moduleState;
using torchscript_detail::onMeta;
using torchscript_detail::swapModuleTensors;
using torchscript_detail::traceForward;

std::vector<std::string> forwardArgumentNames(const jit::Module& module) {
  std::vector<std::string> names;
  const auto& args = module.get_method("forward").function().getSchema().arguments();
  for (size_t i = 1; i < args.size(); ++i) names.push_back(args[i].name());  // 0 is self
  return names;
}

std::vector<InputSpec> orderSpecs(const std::vector<std::string>& names, const std::vector<InputSpec>& specs) {
  std::vector<InputSpec> ordered;
  for (const auto& name : names) {
    auto it = std::find_if(specs.begin(), specs.end(), [&](const InputSpec& s) { return s.name == name; });
    if (it == specs.end()) {
      throw Diagnostic("forward(" + name + ")", "missing --input spec for '" + name + "'");
    }
    ordered.push_back(*it);
  }
  for (const auto& s : specs) {
    if (std::find(names.begin(), names.end(), s.name) == names.end()) {
      throw Diagnostic("--input " + s.name, "forward has no argument '" + s.name + "'");
    }
  }
  return ordered;
}

jit::Module loadModule(std::string_view bytes) {
  TimedPhase phase("load the module (jit::load)");
  HugePageAllocations hugePages;
  try {
    return jit::load(std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw Diagnostic("", "not a loadable TorchScript module: " + what.substr(0, what.find('\n')));
  }
}

}  // namespace

Graph importTorchScript(std::string_view bytes, const std::string& fileName,
                        const std::vector<InputSpec>& specs, TraceOn traceOn) {
  ensureSpmdOpsRegistered();
  jit::Module module = loadModule(bytes);
  if (!module.find_method("forward")) throw Diagnostic("", "the module has no forward method");
  const auto ordered = orderSpecs(forwardArgumentNames(module), specs);

  auto forward = jit::toGraphFunction(module.get_method("forward").function()).graph()->copy();
  jit::Inline(*forward);
  std::set<const jit::Value*> dependent;
  markDataDependence(forward->block(), dependent);

  const auto state = moduleState(module);
  std::string metaFailure;  // why the trace on the meta device failed, if it did
  // Tracing on the meta device computes nothing, so a large model imports in
  // a moment. Where an op has no meta kernel or the trace reads a value (a
  // tensor constant, .item()), the module is traced on CPU tensors instead.
  // (LibTorch 1.13 lacks meta kernels for many ops, relu among them: there
  // most modules take the CPU path.)
  if (traceOn != TraceOn::Cpu) try {
    // On LibTorch 1.13, ops without meta kernels run on zero CPU tensors
    // for the length of the trace.
    MetaFallbackScope metaFallback;
    std::vector<at::Tensor> metaInputs;
    for (const auto& spec : ordered) metaInputs.push_back(at::zeros(spec.shape, at::TensorOptions().dtype(spec.dtype).device(at::kMeta)));
    const auto metaState = onMeta(state);
    swapModuleTensors(module, metaState);
    std::shared_ptr<jit::Graph> traced;
    {
      TimedPhase phase("trace forward on the meta device");
      traced = traceForward(module, forward, metaInputs, metaState);
    }
    TimedPhase phase("convert the trace");
    Graph graph = convertTrace(*traced, ordered, metaState, fileName);
    swapModuleTensors(module, state);
    return graph;
  } catch (const std::exception& e) {
    swapModuleTensors(module, state);
    if (traceOn == TraceOn::Meta) throw;
    const c10::Error* c10error = dynamic_cast<const c10::Error*>(&e);
    metaFailure = c10error ? c10error->what_without_backtrace() : e.what();
    metaFailure = metaFailure.substr(0, metaFailure.find('\n'));
    // Tracing again on CPU inputs allocates them whole: not for inputs
    // beyond the bound shape inference keeps to (issue #19).
    int64_t bytes = 0;
    for (const auto& spec : ordered) bytes += *boundedNumel(spec.shape) * static_cast<int64_t>(c10::elementSize(spec.dtype));
    if (bytes > kMaxStandInBytes) throw forwardFailure(metaFailure);
  }
  // --time-passes names what sent the trace to the CPU.
  TimedPhase phase("trace forward on CPU tensors" + (metaFailure.empty() ? "" : " (on meta: " + metaFailure + ")"));
  at::Generator gen = at::detail::createCPUGenerator(0);
  std::vector<at::Tensor> dataInputs;
  for (const auto& spec : ordered) dataInputs.push_back(exampleInput(spec, gen));
  std::shared_ptr<jit::Graph> traced;
  try {
    traced = traceForward(module, forward, dataInputs, state);
  } catch (const c10::Error& e) {
    throw forwardFailure(e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw forwardFailure(e.what());
  }
  return convertTrace(*traced, ordered, state, fileName);
}

}  // namespace spmd

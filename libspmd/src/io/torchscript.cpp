// TorchScript import: loads the module, matches the input specs to forward's
// arguments, and runs the other torchscript_*.cpp files' steps in order.
#include "spmd/io/torchscript.h"

#include "spmd/ops/meta.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"
#include "spmd/support/phase_times.h"
#include "torchscript_internal.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <algorithm>
#include <set>

namespace spmd {
namespace {

namespace jit = torch::jit;

using torchscript_detail::convertTrace;
using torchscript_detail::exampleInput;
using torchscript_detail::forwardFailure;
using torchscript_detail::loadModule;
using torchscript_detail::NamedTensor;
using torchscript_detail::WeightValues;
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

// The module and what the trace needs of it: forward's inlined graph, which
// of its values depend on data, the specs in forward's order and the state.
struct Prepared {
  jit::Module module;
  std::shared_ptr<jit::Graph> forward;
  std::vector<InputSpec> ordered;
  std::vector<NamedTensor> state;
};

Prepared prepare(jit::Module module, const std::vector<InputSpec>& specs) {
  if (!module.find_method("forward")) throw Diagnostic("", "the module has no forward method");
  Prepared p{module, nullptr, orderSpecs(forwardArgumentNames(module), specs), moduleState(module)};
  p.forward = jit::toGraphFunction(module.get_method("forward").function()).graph()->copy();
  jit::Inline(*p.forward);
  std::set<const jit::Value*> dependent;
  markDataDependence(p.forward->block(), dependent);
  return p;
}

// Tracing on the meta device computes nothing, so a large model imports in
// a moment; its weights are not even read. Throws where an op has no meta
// kernel or the trace reads a value (a tensor constant, .item()).
Graph traceOnMeta(Prepared& p, const std::string& fileName) {
  // Shape functions for the ops whose meta function is Python's, for the
  // length of the trace.
  MetaFallbackScope metaFallback;
  std::vector<at::Tensor> metaInputs;
  for (const auto& spec : p.ordered) metaInputs.push_back(at::zeros(spec.shape, at::TensorOptions().dtype(spec.dtype).device(at::kMeta)));
  const auto metaState = onMeta(p.state);
  swapModuleTensors(p.module, metaState);
  std::shared_ptr<jit::Graph> traced;
  {
    TimedPhase phase("trace forward on the meta device");
    traced = traceForward(p.module, p.forward, metaInputs, metaState);
  }
  TimedPhase phase("convert the trace");
  return convertTrace(*traced, p.ordered, metaState, fileName);
}

// `metaFailure` says why the meta trace failed, if it was tried.
Graph traceOnCpu(Prepared& p, const std::string& fileName, const std::string& metaFailure) {
  // --time-passes names what sent the trace to the CPU.
  const std::string why = metaFailure.substr(0, metaFailure.find('\n'));
  TimedPhase phase("trace forward on CPU tensors" + (why.empty() ? "" : " (on meta: " + why + ")"));
  at::Generator gen = at::detail::createCPUGenerator(0);
  std::vector<at::Tensor> dataInputs;
  for (const auto& spec : p.ordered) dataInputs.push_back(exampleInput(spec, gen));
  std::shared_ptr<jit::Graph> traced;
  try {
    traced = traceForward(p.module, p.forward, dataInputs, p.state);
  } catch (const c10::Error& e) {
    throw forwardFailure(e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw forwardFailure(e.what());
  }
  return convertTrace(*traced, p.ordered, p.state, fileName);
}

// The whole report (forwardFailure picks the user's line and the error out
// of the interpreter's two tracebacks), without LibTorch's C++ backtrace.
std::string reportOf(const std::exception& e) {
  const c10::Error* c10error = dynamic_cast<const c10::Error*>(&e);
  return c10error ? c10error->what_without_backtrace() : e.what();
}

// The forward could not be traced on the meta device, and the inputs are
// too large to trace it on CPU tensors: the shapes are what the user can
// change, so the message leads with them, then says why meta failed.
Diagnostic inputsTooLargeForCpu(int64_t inputBytes, const Diagnostic& metaFailure) {
  return Diagnostic("forward", "the per-rank inputs take " + std::to_string(inputBytes >> 20) +
                                   " MiB, more than the " + std::to_string(kMaxStandInBytes >> 20) +
                                   " MiB a trace on CPU tensors may take, which this module needs (on the meta "
                                   "device, " + metaFailure.where() + ": " + metaFailure.message() +
                                   "): give smaller per-rank shapes");
}

}  // namespace

Graph importTorchScript(std::string_view bytes, const std::string& fileName,
                        const std::vector<InputSpec>& specs, TraceOn traceOn) {
  ensureSpmdOpsRegistered();
  std::string metaFailure;
  if (traceOn != TraceOn::Cpu) {
    std::optional<jit::Module> module = loadModule(bytes, WeightValues::Skip);
    if (!module) module = loadModule(bytes, WeightValues::Read);
    Prepared p = prepare(*module, specs);
    takeStandInRefusal();  // only this trace's refusal counts
    try {
      return traceOnMeta(p, fileName);
    } catch (const std::exception& e) {
      if (traceOn == TraceOn::Meta) throw;
      metaFailure = reportOf(e);
    }
    // An op's stand-ins beyond the bound: on CPU tensors the same op would
    // take at least as much, after minutes of computing the layers before it.
    if (std::optional<std::string> refusal = takeStandInRefusal()) throw Diagnostic("forward", *refusal);
    // Tracing again on CPU inputs allocates them whole: not for inputs
    // beyond the bound shape inference keeps to (issue #19).
    int64_t inputBytes = 0;
    for (const auto& spec : p.ordered) inputBytes += *boundedNumel(spec.shape) * static_cast<int64_t>(c10::elementSize(spec.dtype));
    if (inputBytes > kMaxStandInBytes) throw inputsTooLargeForCpu(inputBytes, forwardFailure(metaFailure));
  }
  // The module is loaded again, with its weights: the trace on CPU tensors
  // computes with them.
  Prepared p = prepare(*loadModule(bytes, WeightValues::Read), specs);
  return traceOnCpu(p, fileName, metaFailure);
}

}  // namespace spmd

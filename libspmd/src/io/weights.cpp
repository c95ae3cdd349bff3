#include "spmd/io/weights.h"

#include "spmd/io/exported_program.h"
#include "spmd/io/torch_save.h"
#include "spmd/support/diagnostic.h"
#include "spmd/support/phase_times.h"

#include "huge_pages.h"

#include <torch/script.h>

#include <unistd.h>

namespace spmd {
namespace {

std::map<std::string, at::Tensor> fromModule(const std::string& file) {
  try {
    // Views of the mapped file: no copy of the weights (tests compare it with jit::load).
    return loadTorchScriptTensors(file);
  } catch (const DamagedRecord&) {
    throw;  // a member cut short: LibTorch's loader would read past it
  } catch (const Diagnostic&) {
    // Its data.pkl holds what our pickle reader does not know: LibTorch's
    // loader reads it, copying the weights.
  }
  HugePageAllocations hugePages;
  torch::jit::Module module = torch::jit::load(file);
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : module.named_parameters(true)) weights.emplace(p.name, p.value);
  for (const auto& b : module.named_buffers(true)) weights.emplace(b.name, b.value);
  return weights;
}

std::map<std::string, at::Tensor> fromPickle(const std::string& file) {
  c10::IValue dict = loadTorchSave(file);
  if (!dict.isGenericDict()) throw Diagnostic("", "weights file is not a {name: tensor} dict");
  std::map<std::string, at::Tensor> weights;
  for (const auto& item : dict.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor()) {
      throw Diagnostic("", "weights file is not a {name: tensor} dict");
    }
    weights.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return weights;
}

// A relative path is the dump's: beside it first, then (dumps written to
// stdout name files relative to where the pipeline ran) the working directory.
std::string resolvedPath(const WeightsRef& ref) {
  if (ref.file.empty() || ref.file[0] == '/' || ref.baseDir.empty()) return ref.file;
  const std::string beside = ref.baseDir + "/" + ref.file;
  return ::access(beside.c_str(), F_OK) == 0 ? beside : ref.file;
}

}  // namespace

std::map<std::string, at::Tensor> loadWeights(const WeightsRef& ref) {
  TimedPhase phase("read weights " + ref.file);
  try {
    const std::string file = resolvedPath(ref);
    if (ref.format == "torchscript") return fromModule(file);
    if (ref.format == "pt2") return loadExportedWeights(file);
    return fromPickle(file);
  } catch (Diagnostic& d) {
    throw d.inFile(ref.file);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw Diagnostic("", "cannot load weights: " + what.substr(0, what.find('\n'))).inFile(ref.file);
  }
}

}  // namespace spmd

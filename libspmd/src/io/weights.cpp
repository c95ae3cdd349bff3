#include "spmd/io/weights.h"

#include "spmd/io/torch_save.h"
#include "spmd/support/diagnostic.h"

#include <torch/script.h>

namespace spmd {
namespace {

std::map<std::string, at::Tensor> fromModule(const std::string& file) {
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

}  // namespace

std::map<std::string, at::Tensor> loadWeights(const WeightsRef& ref) {
  try {
    return ref.format == "torchscript" ? fromModule(ref.file) : fromPickle(ref.file);
  } catch (Diagnostic& d) {
    throw d.inFile(ref.file);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw Diagnostic("", "cannot load weights: " + what.substr(0, what.find('\n'))).inFile(ref.file);
  }
}

}  // namespace spmd

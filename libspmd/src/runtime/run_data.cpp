#include "run_data.h"

#include "spmd/io/torch_save.h"
#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <map>

namespace spmd {

StepData::StepData(const Graph& g, const std::string& file, uint64_t seed, const RankInfo& rank, at::Device device)
    : graph_(g), seed_(seed), rank_(rank), device_(device) {
  if (file.empty()) return;
  const int worldSize = rank.worldSize;
  auto dict = loadTorchSave(file);
  if (!dict.isGenericDict()) throw Diagnostic("", "expected a dict {input name: tensor}").inFile(file);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : dict.toGenericDict()) {
    if (item.key().isString() && item.value().isTensor()) tensors[item.key().toStringRef()] = item.value().toTensor();
  }
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Data) continue;
    const Value& v = g.value(in.value);
    auto it = tensors.find(v.name);
    if (it == tensors.end()) throw Diagnostic("'" + v.name + "'", "the data file has no tensor for this graph input").inFile(file);
    const at::Tensor& t = it->second;
    const std::string want = "[S, " + std::to_string(v.shape.empty() ? 1 : v.shape[0] * worldSize) + ", ...]";
    if (v.shape.empty() || t.dim() != static_cast<int64_t>(v.shape.size()) + 1) {
      throw Diagnostic("'" + v.name + "'", "expected shape " + want + " for per-rank " + typeText(v) + ", got " +
                                               std::to_string(t.dim()) + " dimensions").inFile(file);
    }
    if (t.size(0) == 0) {
      throw Diagnostic("'" + v.name + "'", "the data file holds no steps (dimension 0 of [S, G, ...] is 0)").inFile(file);
    }
    if (t.size(1) % worldSize != 0) {
      throw Diagnostic("'" + v.name + "'", "the batch of " + std::to_string(t.size(1)) + " rows does not divide among " +
                                               std::to_string(worldSize) + " ranks").inFile(file);
    }
    std::vector<int64_t> perRank = t.sizes().slice(1).vec();
    perRank[0] /= worldSize;
    const int64_t micro = g.training().microBatches;
    if (micro > 1 && perRank[0] % micro != 0) {
      throw Diagnostic("'" + v.name + "'", "each rank's " + std::to_string(perRank[0]) + " rows do not divide into the step's " +
                                               std::to_string(micro) + " micro-batches").inFile(file);
    }
    if (perRank != v.shape || t.scalar_type() != v.dtype) {
      Value got{v.name, t.scalar_type(), perRank};
      const std::string perMicroBatch =
          micro > 1 ? " (" + std::to_string(micro) + " micro-batches of " + std::to_string(v.shape[0] / micro) + " rows)" : "";
      throw Diagnostic("'" + v.name + "'", "each rank's slice would be " + typeText(got) + ", the graph takes " + typeText(v) +
                                               perMicroBatch)
          .inFile(file);
    }
    data_.push_back({v.name, t});
  }
}

TensorMap StepData::forStep(int step) const {
  TensorMap inputs;
  if (data_.empty()) {
    at::Generator gen = at::detail::createCPUGenerator(seed_ * 1000003 + rank_.rank * 7919 + step);
    for (const auto& in : graph_.inputs()) {
      if (in.kind != InputKind::Data) continue;
      const Value& v = graph_.value(in.value);
      auto opts = at::TensorOptions().dtype(v.dtype);
      at::Tensor t = c10::isFloatingType(v.dtype) ? at::randn(v.shape, gen, opts) : at::randint(0, 2, v.shape, gen, opts);
      inputs[v.name] = t.to(device_);
    }
    return inputs;
  }
  for (const auto& d : data_) {
    const int64_t rows = d.all.size(1) / rank_.worldSize;
    inputs[d.name] = d.all[step % d.all.size(0)].narrow(0, rank_.rank * rows, rows).contiguous().to(device_);
  }
  return inputs;
}

}  // namespace spmd

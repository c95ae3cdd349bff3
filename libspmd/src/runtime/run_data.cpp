#include "run_data.h"

#include "spmd/runtime/data_files.h"

#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#ifdef SPMD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <map>

namespace spmd {
namespace {

std::vector<const Value*> dataInputs(const Graph& g) {
  std::vector<const Value*> out;
  for (const auto& in : g.inputs()) {
    if (in.kind == InputKind::Data) out.push_back(&g.value(in.value));
  }
  return out;
}

// `t` as [S, G, ...]: as it is, or rows [N, ...] cut into N // G batches of
// G rows (a view: nothing is read).
at::Tensor asSteps(const at::Tensor& t, const Value& v, int64_t globalRows, const std::string& file) {
  if (v.shape.empty() || (t.dim() != static_cast<int64_t>(v.shape.size()) + 1 && t.dim() != static_cast<int64_t>(v.shape.size()))) {
    const std::string want = "[S, " + std::to_string(v.shape.empty() ? 1 : globalRows) + ", ...] or [N, ...]";
    throw Diagnostic("'" + v.name + "'", "expected shape " + want + " for per-rank " + typeText(v) + ", got " +
                                             std::to_string(t.dim()) + " dimensions").inFile(file);
  }
  if (t.dim() == static_cast<int64_t>(v.shape.size()) + 1) return t;
  const int64_t batches = t.size(0) / globalRows;
  if (batches == 0) {
    throw Diagnostic("'" + v.name + "'", "holds " + std::to_string(t.size(0)) + " rows, fewer than one step's " +
                                             std::to_string(globalRows)).inFile(file);
  }
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = globalRows;
  shape.insert(shape.begin(), batches);
  return t.narrow(0, 0, batches * globalRows).view(shape);
}

void checkSteps(const at::Tensor& t, const Value& v, const RankInfo& rank, int64_t micro, const std::string& file) {
  if (t.size(0) == 0) {
    throw Diagnostic("'" + v.name + "'", "the data file holds no steps (dimension 0 of [S, G, ...] is 0)").inFile(file);
  }
  if (t.size(1) % rank.worldSize != 0) {
    throw Diagnostic("'" + v.name + "'", "the batch of " + std::to_string(t.size(1)) + " rows does not divide among " +
                                             std::to_string(rank.worldSize) + " ranks").inFile(file);
  }
  std::vector<int64_t> perRank = t.sizes().slice(1).vec();
  perRank[0] /= rank.worldSize;
  if (micro > 1 && perRank[0] % micro != 0) {
    throw Diagnostic("'" + v.name + "'", "each rank's " + std::to_string(perRank[0]) + " rows do not divide into the step's " +
                                             std::to_string(micro) + " micro-batches").inFile(file);
  }
  if (perRank != v.shape || t.scalar_type() != v.dtype) {
    Value got{v.name, t.scalar_type(), perRank};
    const std::string perMicroBatch =
        micro > 1 ? " (" + std::to_string(micro) + " micro-batches of " + std::to_string(v.shape[0] / micro) + " rows)" : "";
    throw Diagnostic("'" + v.name + "'", "each rank's slice would be " + typeText(got) + ", the graph takes " + typeText(v) +
                                             perMicroBatch).inFile(file);
  }
}

// Host rows on the device, a copy (they may lie in a read-only mapping of
// the file). On CUDA through a pinned staging buffer and an asynchronous
// copy on the step's stream: from pageable memory the copy runs at a
// fraction of the link's speed and holds the host until it ends. The
// caching host allocator keeps the buffer until the copy has read it.
at::Tensor onDevice(const at::Tensor& rows, at::Device device) {
  if (!device.is_cuda()) return rows.to(device, false, /*copy=*/true).contiguous();
  at::Tensor staged = at::empty(rows.sizes(), rows.options().pinned_memory(true));
  staged.copy_(rows);
  return staged.to(device, /*non_blocking=*/true);
}

}  // namespace

StepData::StepData(const Graph& g, const DataSource& source, uint64_t seed, const RankInfo& rank, at::Device device)
    : graph_(g), seed_(seed), rank_(rank), device_(device) {
  if (!source.tokens.empty()) {
    tokens_ = std::make_unique<TokenFile>(source.tokens, source.tokenDtype);
    checkTokenInputs();
  }
  if (source.file.empty()) return;
  const std::string& file = source.file;
  const std::map<std::string, at::Tensor> tensors = openDataTensors(file);
  for (const Value* v : dataInputs(g)) {
    auto it = tensors.find(v->name);
    if (it == tensors.end()) throw Diagnostic("'" + v->name + "'", "the data file has no tensor for this graph input").inFile(file);
    const int64_t globalRows = v->shape.empty() ? 1 : v->shape[0] * rank.worldSize;
    const at::Tensor steps = asSteps(it->second, *v, globalRows, file);
    checkSteps(steps, *v, rank, g.training().microBatches, file);
    if (source.shuffle && !data_.empty() && steps.size(0) != data_.front().all.size(0)) {
      throw Diagnostic("'" + v->name + "'", "holds " + std::to_string(steps.size(0)) + " steps of rows, '" +
                                                data_.front().name + "' " + std::to_string(data_.front().all.size(0)) +
                                                ": --shuffle draws the same rows of every input")
          .inFile(file);
    }
    data_.push_back({v->name, steps});
  }
  shuffle_ = source.shuffle;
}

const at::Tensor& StepData::permutation(int64_t epoch, int64_t rows) const {
  if (epoch != permutationEpoch_) {
    // Seeded by the run's seed and the epoch only: every rank draws the same order.
    at::Generator gen = at::detail::createCPUGenerator(seed_ * 1000003 + 0x5DEECE66Dull + static_cast<uint64_t>(epoch));
    permutation_ = at::randperm(rows, gen, at::kLong);
    permutationEpoch_ = epoch;
  }
  return permutation_;
}

struct StepData::SideStream {
#ifdef SPMD_WITH_CUDA
  explicit SideStream(at::Device d) : stream(c10::cuda::getStreamFromPool(false, d.index())) {}
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAEvent copied;  // recorded after the prefetched step's copies
#else
  explicit SideStream(at::Device) {}
#endif
};

StepData::~StepData() = default;

void StepData::prefetch(int step) {
  if (!device_.is_cuda()) return;  // the CPU has no copy to overlap
  if (next_.valid()) next_.get();  // one step ahead at most
  if (!side_) side_ = std::make_unique<SideStream>(device_);
  prefetched_ = step;
  next_ = std::async(std::launch::async, [this, step] { return uploadAhead(step); });
}

TensorMap StepData::forStep(int step) {
  if (next_.valid()) {
    const int made = prefetched_;
    TensorMap inputs = next_.get();
    if (made == step) {
      handOver(inputs);
      return inputs;
    }
  }
  return inputsOf(step);
}

// On the worker thread: the host's part now, the copies queued on the side
// stream (their device memory comes from that stream's pool).
TensorMap StepData::uploadAhead(int step) const {
#ifdef SPMD_WITH_CUDA
  c10::cuda::CUDAStreamGuard onSide(side_->stream);
  TensorMap inputs = inputsOf(step);
  side_->copied.record(side_->stream);
  return inputs;
#else
  return inputsOf(step);
#endif
}

// The step's stream waits for the side stream's copies, and the allocator
// learns that it uses their memory (so that it is not reused under it).
void StepData::handOver(const TensorMap& inputs) const {
#ifdef SPMD_WITH_CUDA
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  side_->copied.block(current);
  for (const auto& [name, t] : inputs) t.record_stream(current);
#else
  (void)inputs;
#endif
}

void StepData::checkTokenInputs() const {
  const std::vector<const Value*> inputs = dataInputs(graph_);
  const auto isWindow = [](const Value* v) { return v->shape.size() == 2 && !c10::isFloatingType(v->dtype); };
  if (inputs.size() < 2 || !isWindow(inputs[0]) || !isWindow(inputs[1]) || inputs[0]->shape != inputs[1]->shape) {
    throw Diagnostic("--tokens", "the graph's first two data inputs must be integer [B, T] (tokens and targets)");
  }
  if (inputs.size() > 2) throw Diagnostic("--tokens", "the graph has data inputs besides tokens and targets ('" + inputs[2]->name + "')");
  if (tokens_->size() <= inputs[0]->shape[1]) {
    throw Diagnostic("", "holds " + std::to_string(tokens_->size()) + " tokens, not more than one window of " +
                             std::to_string(inputs[0]->shape[1])).inFile(tokens_->path());
  }
}

TensorMap StepData::inputsOf(int step) const {
  TensorMap inputs;
  at::Generator gen = at::detail::createCPUGenerator(seed_ * 1000003 + rank_.rank * 7919 + step);
  if (tokens_) {
    const std::vector<const Value*> pair = dataInputs(graph_);
    const int64_t rows = pair[0]->shape[0], length = pair[0]->shape[1];
    const at::Tensor offsets = at::randint(tokens_->size() - length, {rows}, gen, at::kLong);
    const std::vector<int64_t> starts(offsets.data_ptr<int64_t>(), offsets.data_ptr<int64_t>() + rows);
    inputs[pair[0]->name] = onDevice(tokens_->windows(starts, length, 0).to(pair[0]->dtype), device_);
    inputs[pair[1]->name] = onDevice(tokens_->windows(starts, length, 1).to(pair[1]->dtype), device_);
    return inputs;
  }
  if (data_.empty()) {
    for (const Value* v : dataInputs(graph_)) {
      auto opts = at::TensorOptions().dtype(v->dtype);
      at::Tensor t = c10::isFloatingType(v->dtype) ? at::randn(v->shape, gen, opts) : at::randint(0, 2, v->shape, gen, opts);
      inputs[v->name] = onDevice(t, device_);
    }
    return inputs;
  }
  for (const auto& d : data_) {
    const int64_t batches = d.all.size(0), global = d.all.size(1), rows = global / rank_.worldSize;
    if (shuffle_) {
      const at::Tensor& order = permutation(step / batches, batches * global);
      const at::Tensor mine = order.narrow(0, (step % batches) * global + rank_.rank * rows, rows);
      inputs[d.name] = onDevice(d.all.flatten(0, 1).index_select(0, mine), device_);
      continue;
    }
    inputs[d.name] = onDevice(d.all[step % batches].narrow(0, rank_.rank * rows, rows), device_);
  }
  return inputs;
}

}  // namespace spmd

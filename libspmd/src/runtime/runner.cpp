#include "spmd/runtime/runner.h"

#include "spmd/io/load.h"
#include "spmd/io/torch_save.h"
#include "spmd/ir/printer.h"
#include "spmd/ir/iter_graph.h"
#include "spmd/ops/op_traits.h"
#include "spmd/runtime/executor.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#ifdef SPMD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>

namespace spmd {
namespace {

std::string resolveDevice(const Artifact& a, const std::string& requested) {
  const bool haveCuda = torch::cuda::is_available();
  if (a.device == "cuda" && !haveCuda) {
    throw Diagnostic("", "the artifact was lowered for CUDA and this machine has no CUDA device; lower it with --device cpu");
  }
  if (requested == "cuda" && !haveCuda) throw Diagnostic("--device cuda", "this machine has no CUDA device");
  return requested == "auto" ? a.device : requested;
}

struct DataInput {
  std::string name;
  at::Tensor all;  // [S, G, ...]
};

// The data inputs' slices for one rank, checked against the graph before step 1.
std::vector<DataInput> loadData(const Graph& g, const std::string& file, int worldSize) {
  auto dict = loadTorchSave(file);
  if (!dict.isGenericDict()) throw Diagnostic("", "expected a dict {input name: tensor}").inFile(file);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : dict.toGenericDict()) {
    if (item.key().isString() && item.value().isTensor()) tensors[item.key().toStringRef()] = item.value().toTensor();
  }
  std::vector<DataInput> data;
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
    if (t.size(1) % worldSize != 0) {
      throw Diagnostic("'" + v.name + "'", "the batch of " + std::to_string(t.size(1)) + " rows does not divide among " +
                                               std::to_string(worldSize) + " ranks").inFile(file);
    }
    std::vector<int64_t> perRank = t.sizes().slice(1).vec();
    perRank[0] /= worldSize;
    if (perRank != v.shape || t.scalar_type() != v.dtype) {
      Value got{v.name, t.scalar_type(), perRank};
      throw Diagnostic("'" + v.name + "'", "each rank's slice would be " + typeText(got) + ", the graph takes " + typeText(v))
          .inFile(file);
    }
    data.push_back({v.name, t});
  }
  return data;
}

std::map<std::string, at::Tensor> randomBatch(const Graph& g, uint64_t seed, int rank, int step) {
  at::Generator gen = at::detail::createCPUGenerator(seed * 1000003 + rank * 7919 + step);
  std::map<std::string, at::Tensor> batch;
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Data) continue;
    const Value& v = g.value(in.value);
    auto opts = at::TensorOptions().dtype(v.dtype);
    batch[v.name] = c10::isFloatingType(v.dtype) ? at::randn(v.shape, gen, opts) : at::randint(0, 2, v.shape, gen, opts);
  }
  return batch;
}

void synchronize(const std::string& device) {
#ifdef SPMD_WITH_CUDA
  if (device == "cuda") at::cuda::getCurrentCUDAStream().synchronize();
#else
  (void)device;
#endif
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

void saveParameters(const Graph& g, const std::map<std::string, at::Tensor>& state, const std::string& path) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& in : g.inputs()) {
    if (in.kind == InputKind::Parameter) {
      const std::string& name = g.value(in.value).name;
      params.emplace_back(name, state.at(name).detach().to(at::kCPU).contiguous());
    }
  }
  // Not torch::pickle_save: torch.load(weights_only=True) rejects the
  // torch.jit._pickle globals in its output.
  writeOutput(path, saveTorchSave(params));
}

// Files written after the last step: a directory that cannot take them is
// refused before step 1, not after the whole run.
void requireWritableDirectory(const std::string& path, const std::string& flag) {
  if (path.empty() || path == "-") return;
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::access(dir.c_str(), W_OK) != 0) {
    throw Diagnostic(flag + " " + path, "cannot write to " + dir + ": " + std::strerror(errno));
  }
}

void progress(int step, int steps) {
  const int width = 30, done = width * step / steps;
  std::fprintf(stderr, "\r[%s%s] %d/%d", std::string(done, '=').c_str(), std::string(width - done, ' ').c_str(), step, steps);
  if (step == steps) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// Peak bytes the caching allocator handed out on this rank's GPU (0 on CPU).
int64_t peakDeviceBytes(const std::string& device, int localRank) {
#ifdef SPMD_WITH_CUDA
  if (device == "cuda") {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(localRank));
    // Index 0 is StatType::AGGREGATE, whose namespace moved between LibTorch versions.
    return stats.allocated_bytes[0].peak;
  }
#endif
  (void)device;
  (void)localRank;
  return 0;
}

// --profile: the time of every node, the device synchronized after it,
// summed by operator over the timed steps.
class OpProfile {
 public:
  explicit OpProfile(std::string device) : device_(std::move(device)) {}

  std::function<void(const Node&)> startStep(bool timed) {
    synchronize(device_);
    last_ = std::chrono::steady_clock::now();
    if (timed) ++steps_;
    return [this, timed](const Node& node) {
      synchronize(device_);
      const auto now = std::chrono::steady_clock::now();
      if (timed) {
        auto& [ms, calls] = byOp_[node.qualifiedName()];
        ms += std::chrono::duration<double, std::milli>(now - last_).count();
        ++calls;
      }
      last_ = now;
    };
  }

  std::string report(int ranks) const {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (const auto& [op, t] : byOp_) {
      rows.emplace_back(t.first, op);
      total += t.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    const double steps = std::max(steps_, 1);
    std::ostringstream out;
    out << "# spmd-run --profile: " << steps_ << " timed steps, rank 0 of " << ranks << " (" << device_
        << "), the device synchronized after every node\n# ms/step   share  calls/step  op\n";
    char line[256];
    for (const auto& [ms, op] : rows) {
      std::snprintf(line, sizeof line, "%9.3f  %5.1f%%  %10.1f  %s\n", ms / steps, total > 0 ? 100 * ms / total : 0.0,
                    byOp_.at(op).second / steps, op.c_str());
      out << line;
    }
    std::snprintf(line, sizeof line, "%9.3f  100.0%%              total\n", total / steps);
    out << line;
    return out.str();
  }

 private:
  std::string device_;
  std::chrono::steady_clock::time_point last_;
  int steps_ = 0;
  std::map<std::string, std::pair<double, int64_t>> byOp_;  // ms, calls
};

// The graph each kind of iteration runs, bound once. With CUDA graphs, the
// main iteration (the one that repeats) is captured unless a node forbids it.
class IterationPlans {
 public:
  IterationPlans(const Graph& g, bool cudagraphs, bool lead) : unrolled_(g), cudagraphs_(cudagraphs) {
    if (!cudagraphs) return;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (syncsWithHost(g.nodes()[i].op)) {
        if (lead) {
          std::cerr << "spmd-run: note: /nodes/" << i << ": " << g.nodes()[i].qualifiedName()
                    << " waits for a result on the host; the step runs without CUDA graphs\n";
        }
        cudagraphs_ = false;
        break;
      }
    }
  }

  StepExecutor& at(Iteration it) {
    auto& slot = plans_[it];
    if (!slot) slot = std::make_unique<StepExecutor>(graphForIteration(unrolled_, it), cudagraphs_ && it == Iteration::Middle);
    return *slot;
  }

 private:
  const Graph& unrolled_;
  bool cudagraphs_;
  std::map<Iteration, std::unique_ptr<StepExecutor>> plans_;
};

}  // namespace

std::string loweringDevice(const std::string& requested) {
  if (requested != "auto") return requested;
  return torch::cuda::is_available() ? "cuda" : "cpu";
}

void runTraining(const Artifact& artifact, const std::optional<RankInfo>& rankInfo, const RunOptions& o,
                 std::ostream& out) {
  const Graph& g = artifact.graph;
  const RankInfo info = rankInfo.value_or(RankInfo{});
  const std::string device = resolveDevice(artifact, o.device);
  std::vector<DataInput> data;
  if (!o.dataFile.empty()) data = loadData(g, o.dataFile, info.worldSize);
  const int steps = o.steps > 0 ? o.steps : (g.iters() > 0 ? g.iters() : 10);
  if (o.warmup >= steps) throw Diagnostic("--warmup", "must be fewer than the " + std::to_string(steps) + " steps");
  if (info.rank == 0) {
    requireWritableDirectory(o.saveParams, "--save-params");
    requireWritableDirectory(o.profile, "--profile");
  }

  std::map<std::string, at::Tensor> state;
  const at::Device dev = device == "cuda" ? at::Device(at::kCUDA, info.localRank) : at::Device(at::kCPU);
#ifdef SPMD_WITH_CUDA
  if (device == "cuda") c10::cuda::set_device(static_cast<c10::DeviceIndex>(info.localRank));
#endif
  for (const auto& in : g.inputs()) {
    if (in.kind == InputKind::Data) continue;
    const std::string& name = g.value(in.value).name;
    auto it = artifact.state.find(name);
    if (it == artifact.state.end()) throw Diagnostic("'" + name + "'", "the artifact holds no value for this input");
    const at::Tensor& initial = it->second;
    state[name] = artifact.zeroState.count(name) ? at::zeros(initial.sizes(), initial.options().device(dev))
                                                 : initial.to(initial.options().device(dev), false, /*copy=*/true);
  }
  if (device == "cuda") at::globalContext().setAllowTF32CuBLAS(o.tf32);
  const bool capture = artifact.cudagraphs && device == "cuda" && !o.eager && o.profile.empty();
  std::optional<OpProfile> profile;
  if (!o.profile.empty()) profile.emplace(device);
  auto plans = std::make_unique<IterationPlans>(g, capture, info.rank == 0);
  std::unique_ptr<Collectives> comm;
  if (rankInfo) comm = joinProcessGroup(info, device, o.timeout);

  const bool lead = info.rank == 0;
  const bool bar = lead && !o.json && ::isatty(STDERR_FILENO);
  std::vector<double> losses, ms;
  for (int step = 0; step < steps; ++step) {
    TensorMap inputs;
    if (data.empty()) {
      for (auto& [name, t] : randomBatch(g, o.seed, info.rank, step)) inputs[name] = t.to(dev);
    } else {
      for (const auto& d : data) {
        const int64_t rows = d.all.size(1) / info.worldSize;
        inputs[d.name] = d.all[step % d.all.size(0)].narrow(0, info.rank * rows, rows).contiguous().to(dev);
      }
    }
    synchronize(device);
    const auto begin = std::chrono::steady_clock::now();
    auto afterNode = profile ? profile->startStep(step >= o.warmup) : std::function<void(const Node&)>();
    at::Tensor lossTensor = plans->at(iterationAt(step, steps)).run(state, inputs, comm.get(), afterNode);
    synchronize(device);
    const double stepMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
    if (step >= o.warmup) ms.push_back(stepMs);
    const double loss = lossTensor.defined() ? lossTensor.to(at::kCPU).to(at::kDouble).item<double>() : 0.0;
    losses.push_back(loss);
    if (lead && !o.json && !bar) {
      char line[128];
      std::snprintf(line, sizeof line, "step %d/%d  loss %.6g  %.3f ms\n", step + 1, steps, loss, stepMs);
      out << line << std::flush;
    }
    if (bar) progress(step + 1, steps);
  }
  const int64_t peak = peakDeviceBytes(device, info.localRank);
  synchronize(device);
  // Captured graphs hold NCCL's resources: they go before the communicator.
  plans.reset();
  synchronize(device);
  if (comm) comm->shutdown();
  if (!lead) return;
  if (!o.saveParams.empty()) saveParameters(g, state, o.saveParams);
  if (profile) writeOutput(o.profile, profile->report(info.worldSize));
  const double median = percentile(ms, 0.5), lo = *std::min_element(ms.begin(), ms.end()),
               hi = *std::max_element(ms.begin(), ms.end());
  char summary[256];
  if (o.json) {
    std::ostringstream j;
    j << "{\"ranks\": " << info.worldSize << ", \"device\": \"" << device << "\", \"steps\": " << steps
      << ", \"timed_steps\": " << ms.size() << ", \"peak_bytes\": " << peak << ", \"losses\": [";
    for (size_t i = 0; i < losses.size(); ++i) j << (i ? ", " : "") << floatText(losses[i]);
    std::snprintf(summary, sizeof summary,
                  "], \"ms_per_step\": {\"median\": %.4f, \"min\": %.4f, \"max\": %.4f}, \"steps_per_s\": %.3f}\n", median,
                  lo, hi, median > 0 ? 1000.0 / median : 0.0);
    out << j.str() << summary << std::flush;
    return;
  }
  if (bar) out << "final loss " << floatText(losses.back()) << "\n";
  std::snprintf(summary, sizeof summary, "%d steps on %d rank%s (%s): median %.3f ms, min %.3f ms, max %.3f ms per step, %.1f steps/s\n",
                steps, info.worldSize, info.worldSize == 1 ? "" : "s", device.c_str(), median, lo, hi,
                median > 0 ? 1000.0 / median : 0.0);
  out << summary;
  if (peak > 0) out << "peak device memory " << floatText(std::round(peak / 1048576.0 * 10) / 10) << " MiB on rank 0\n";
  out << std::flush;
}

}  // namespace spmd

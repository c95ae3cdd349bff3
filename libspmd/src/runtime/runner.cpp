// runTraining: one rank's run of an artifact, as a sequence of jobs each
// done by its own unit: the device (run_device), the state on it
// (run_state), each step's data (run_data), the per-op profile
// (op_profile), progress lines (run_progress), and the reports after the
// last step (run_report).
#include "spmd/runtime/runner.h"

#include "iteration_plans.h"
#include "op_profile.h"
#include "run_data.h"
#include "run_device.h"
#include "run_progress.h"
#include "run_report.h"
#include "run_state.h"

#include "spmd/io/load.h"
#include "spmd/ir/iter_graph.h"
#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>

namespace spmd {
namespace {

// The schedule's rate for `step`, put into `inputs` as the graph input "lr"
// (f64[] on the device: a captured graph reads it from there).
std::optional<double> scheduledRate(const Graph& g, int step, const at::Device& device, TensorMap& inputs) {
  if (!g.training().scheduled) return std::nullopt;
  const double lr = learningRateAt(g.training().schedule, step);
  inputs["lr"] = at::scalar_tensor(lr, at::TensorOptions().dtype(at::kDouble)).to(device);
  return lr;
}

std::optional<double> scalarOutput(const std::vector<at::Tensor>& outputs, size_t k) {
  if (k >= outputs.size() || !outputs[k].defined()) return std::nullopt;
  return outputs[k].to(at::kCPU).to(at::kDouble).item<double>();
}

// The global batch's rows: the first data input's, on every rank.
int64_t samplesPerStep(const Graph& g, int worldSize) {
  for (const auto& in : g.inputs()) {
    const Value& v = g.value(in.value);
    if (in.kind == InputKind::Data && !v.shape.empty()) return v.shape[0] * worldSize;
  }
  return 0;
}

}  // namespace

void runTraining(const Artifact& artifact, const std::optional<RankInfo>& rankInfo, const RunOptions& o,
                 std::ostream& out) {
  const Graph& g = artifact.graph;
  const RankInfo info = rankInfo.value_or(RankInfo{});
  const bool lead = info.rank == 0;

  // Bad input is refused before step 1.
  const RunDevice device(artifact, o.device, info.localRank);
  const StepData data(g, o.dataFile, o.seed, info, device.device());
  const int steps = o.steps > 0 ? o.steps : (g.iters() > 0 ? g.iters() : 10);
  if (o.warmup >= steps) throw Diagnostic("--warmup", "must be fewer than the " + std::to_string(steps) + " steps");
  if (lead) {
    requireWritableDirectory(o.saveParams, "--save-params");
    requireWritableDirectory(o.profile, "--profile");
  }

  device.makeCurrent();
  TensorMap state = placeState(artifact, device.device());
  device.allowTF32(o.tf32);
  std::optional<OpProfile> profile;
  if (!o.profile.empty()) profile.emplace(device);
  const bool capture = artifact.cudagraphs && device.isCuda() && !o.eager && !profile;
  auto plans = std::make_unique<IterationPlans>(g, capture, lead);
  std::unique_ptr<Collectives> comm;
  if (rankInfo) comm = joinProcessGroup(info, device.name(), o.timeout);

  const Progress progress(lead, o.json);
  std::optional<MetricsLog> metrics;
  if (lead && !o.metrics.empty()) metrics.emplace(o.metrics, samplesPerStep(g, info.worldSize));
  RunRecord record(info.worldSize, device.name(), steps);
  for (int step = 0; step < steps; ++step) {
    const bool timed = step >= o.warmup;
    TensorMap inputs = data.forStep(step);
    const std::optional<double> lr = scheduledRate(g, step, device.device(), inputs);
    // Dropout masks: a stream per rank and step, reproducible from --seed
    // (not PyTorch's stream: README, "Dropout").
    device.seedRandomOps((o.seed * 1000003 + static_cast<uint64_t>(info.rank) * 7919 + static_cast<uint64_t>(step)) ^
                         0x9E3779B97F4A7C15ull);
    device.synchronize();
    const auto begin = std::chrono::steady_clock::now();
    auto afterNode = profile ? profile->startStep(timed) : std::function<void(const Node&)>();
    const std::vector<at::Tensor> outputs = plans->at(iterationAt(step, steps)).run(state, inputs, comm.get(), afterNode);
    device.synchronize();
    StepReport report;
    report.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
    report.loss = scalarOutput(outputs, 0);  // none: a graph without outputs
    report.lr = lr;
    if (g.training().clips()) report.gradNorm = scalarOutput(outputs, 1);
    if (report.loss && !std::isfinite(*report.loss) && !o.allowNonfinite) {
      throw Diagnostic("step " + std::to_string(step + 1), "rank " + std::to_string(info.rank) + "'s loss is " +
                                                              floatText(*report.loss) +
                                                              " (--allow-nonfinite trains on)");
    }
    record.addStep(report, timed);
    progress.stepDone(step + 1, steps, report, out);
    if (metrics) metrics->write(step + 1, report, device.peakBytes());
  }
  record.setPeakBytes(device.peakBytes());
  device.synchronize();
  // Captured graphs hold NCCL's resources: they go before the communicator.
  plans.reset();
  device.synchronize();
  if (comm) comm->shutdown();

  if (!lead) return;
  if (!o.saveParams.empty()) saveParameters(g, state, o.saveParams);
  if (profile) writeOutput(o.profile, profile->report(info.worldSize));
  if (o.json) {
    record.writeJson(out);
  } else {
    record.writeSummary(out, /*finalLoss=*/progress.bar());
  }
}

}  // namespace spmd

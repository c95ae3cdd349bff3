// runTraining: one rank's run of an artifact, as a sequence of jobs each
// done by its own unit: the device (run_device), the state on it
// (run_state), each step's data (run_data), the per-op profile
// (op_profile), progress lines (run_progress), and the reports after the
// last step (run_report).
#include "spmd/runtime/runner.h"

#include "evaluation.h"
#include "spmd/backend/generated_kernels.h"

#include "spmd/runtime/checkpoint.h"
#include "iteration_plans.h"
#include "op_profile.h"
#include "step_trace.h"
#include "run_data.h"
#include "run_device.h"
#include "run_progress.h"
#include "run_report.h"
#include "spmd/runtime/run_state.h"

#include "spmd/io/load.h"
#include "spmd/ir/iter_graph.h"
#include "spmd/ir/printer.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
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

// Which iteration of the unrolled schedule step `step` runs, in a run from
// `start` to `steps` with a checkpoint after every `every`-th step (0: only
// at the end). A checkpoint ends a segment with the cleanup iteration, so
// that it holds finished state, and the next step (or a resumed run) begins
// a segment with the setup iteration. Segments change no bits: the work
// moved to the next iteration runs on the same values either way, at the
// end of this iteration instead of the start of the next.
Iteration iterationOf(int step, int start, int steps, std::initializer_list<int> periods) {
  int first = start, end = steps;
  for (int every : periods) {
    if (every <= 0) continue;
    first = std::max(first, step / every * every);
    end = std::min(end, (step / every + 1) * every);
  }
  return iterationAt(step - first, end - first);
}

// A resume continues the checkpoint's seed and the data position its step
// implies; a run that names another seed or data is told (one write per
// note: ranks share the terminal).
// The first flag whose recorded value differs between the checkpoint's step
// and this one ("--lr 0.001 there, 0.002 here"), "" when neither records
// one that differs (checkpoints written before steps recorded flags).
std::string flagDifference(const std::vector<std::vector<std::string>>& theirs,
                           const std::vector<std::vector<std::string>>& mine) {
  if (theirs.empty() || mine.empty()) return "";
  const auto text = [](const std::vector<std::string>& words) {
    std::string s;
    for (size_t i = 1; i < words.size(); ++i) s += (i > 1 ? " " : "") + words[i];
    return s.empty() ? std::string("given") : s;
  };
  const auto valuesOf = [&](const std::vector<std::vector<std::string>>& flags, const std::string& name) {
    std::string values;
    for (const auto& words : flags) {
      if (words[0] == name) values += (values.empty() ? "" : ", ") + text(words);
    }
    return values.empty() ? std::string("not given") : values;
  };
  for (const auto* side : {&theirs, &mine}) {
    for (const auto& words : *side) {
      const std::string there = valuesOf(theirs, words[0]), here = valuesOf(mine, words[0]);
      if (there != here) return words[0] + " " + there + " there, " + here + " here";
    }
  }
  return "";
}

void noteResumeChanges(const Checkpoint& c, const RunOptions& o) {
  if (o.seed != c.info.seed) {
    std::cerr << ("spmd-run: note: --resume " + c.folder + ": continues the checkpoint's seed " +
                  std::to_string(c.info.seed) + ", not --seed " + std::to_string(o.seed) + "\n");
  }
  const std::string data = dataIdentity(o.dataFile, o.tokens);
  if (!c.info.data.empty() && c.info.data != data) {
    std::cerr << ("spmd-run: note: --resume " + c.folder + ": the checkpoint was written training on " +
                  c.info.data + "; this run trains on " + data + ", from the position step " +
                  std::to_string(c.info.step) + " implies\n");
  }
}

// The state a run starts from: the artifact's, with --init-from's weights,
// or a checkpoint's (--resume). Returns the step it starts at; `seed` becomes
// the checkpoint's (its random inputs and dropout masks go on as they were).
int startingState(const Artifact& artifact, const RunOptions& o, const RankInfo& info, TensorMap& state,
                  uint64_t& seed) {
  const Graph& g = artifact.graph;
  if (!o.initFrom.empty()) {
    const std::vector<std::string> unused = initFromStateDict(g, o.initFrom, info.rank, state);
    if (info.rank == 0 && !unused.empty()) {
      // One string, one write: ranks share the terminal.
      std::cerr << ("spmd-run: note: " + o.initFrom + ": " + std::to_string(unused.size()) +
                    " entries the step has no input for were left out (first: '" + unused.front() + "')\n");
    }
  }
  if (o.resume.empty()) return 0;
  // A sharded run's ranks each read their own folder, at the newest step
  // all of them hold; the weights alone come from rank 0's.
  std::string folder = o.resume;
  if (o.resumeWeightsOnly && isShardedCheckpoint(o.resume)) {
    folder = rankCheckpointRoot(o.resume, 0);
  } else if (!o.resumeWeightsOnly && g.training().shard != ShardMode::None) {
    folder = shardedCheckpointFolder(o.resume, info.rank, info.worldSize);
  } else if (isShardedCheckpoint(o.resume)) {
    throw Diagnostic("--resume " + o.resume, "holds a sharded run's checkpoint and this step is not sharded; "
                                             "--resume-weights-only takes its weights alone");
  }
  const Checkpoint c = readCheckpoint(g, folder, o.resumeWeightsOnly);
  if (o.resumeWeightsOnly) {
    restoreState(g, c, /*weightsOnly=*/true, info.rank, state);
    return 0;
  }
  const std::string fingerprint = stepFingerprint(artifact);
  if (c.info.fingerprint != fingerprint) {
    const std::string flag = flagDifference(c.info.flags, g.flags());
    throw Diagnostic("--resume " + c.folder, "was written by another step (" + (flag.empty() ? "" : flag + "; ") +
                                                 "fingerprint " + c.info.fingerprint + ", this artifact's " +
                                                 fingerprint + "); --resume-weights-only takes its weights alone");
  }
  if (c.info.worldSize != info.worldSize) {
    throw Diagnostic("--resume " + c.folder, "was written by a run of " + std::to_string(c.info.worldSize) +
                                                 " ranks, this one has " + std::to_string(info.worldSize) +
                                                 "; --resume-weights-only takes its weights alone");
  }
  if (c.info.rank && *c.info.rank != info.rank) {
    throw Diagnostic("--resume " + c.folder, "holds rank " + std::to_string(*c.info.rank) + "'s shards, not rank " +
                                                 std::to_string(info.rank) +
                                                 "'s: the rank folders were swapped or copied");
  }
  restoreState(g, c, /*weightsOnly=*/false, info.rank, state);
  if (info.rank == 0) noteResumeChanges(c, o);
  seed = c.info.seed;
  return static_cast<int>(c.info.step);
}

}  // namespace

std::string loweringDevice(const std::string& requested) {
  if (requested != "auto") return requested;
  return torch::cuda::is_available() ? "cuda" : "cpu";
}

void runTraining(const Artifact& artifact, const std::optional<RankInfo>& rankInfo, const RunOptions& o,
                 std::ostream& out) {
  const Graph& g = artifact.graph;
  const RankInfo info = rankInfo.value_or(RankInfo{});
  const bool lead = info.rank == 0;

  // Bad input is refused before step 1.
  const int64_t compiledFor = g.training().worldSize;
  if (compiledFor > 0 && compiledFor != info.worldSize) {
    throw Diagnostic("/training/world_size", "the step was compiled for " + std::to_string(compiledFor) +
                                                 " ranks (spmd-split --world-size), this run has " +
                                                 std::to_string(info.worldSize));
  }
  const RunDevice device(artifact, o.device, info.localRank);
  const int steps = o.steps > 0 ? o.steps : (g.iters() > 0 ? g.iters() : 10);
  if (lead) {
    requireWritableDirectory(o.saveParams, "--save-params");
    requireWritableDirectory(o.saveStateDict, "--save-state-dict");
    requireWritableDirectory(o.profile, "--profile");
    requireWritableDirectory(o.trace, "--trace");
  }
  // A sharded step's ranks each hold state of their own: each checkpoints it.
  const bool sharded = g.training().shard != ShardMode::None;
  std::optional<CheckpointWriter> checkpoints;
  if (sharded && !o.checkpoint.empty()) {
    checkpoints.emplace(shardedCheckpointRoot(o.checkpoint, info.rank, info.worldSize, artifact), o.keep);
  } else if (lead && !o.checkpoint.empty()) {
    checkpoints.emplace(o.checkpoint, o.keep);
  }
  const int every = o.checkpoint.empty() ? 0 : o.checkpointEvery;
  const std::string fingerprint = checkpoints ? stepFingerprint(artifact) : "";
  const std::string dataName = checkpoints ? dataIdentity(o.dataFile, o.tokens) : "";

  device.makeCurrent();
  ensureCudaBackendRegistered();  // the spmd ops' CUDA kernels
  // Compiled at lower time: a launch finds them instead of compiling them.
  for (const CompiledKernel& kernel : artifact.kernels) {
    if (!kernel.image.empty()) installCompiledKernel(kernel);
  }
  TensorMap state = placeState(artifact, device.device(), info.rank);
  uint64_t seed = o.seed;
  const int start = startingState(artifact, o, info, state, seed);
  if (start >= steps) {
    throw Diagnostic("--steps", "the checkpoint is at step " + std::to_string(start) + " already: ask for more steps");
  }
  StepData data(g, DataSource{o.dataFile, o.tokens, o.tokenDtype, o.shuffle}, seed, info, device.device());
  std::optional<Evaluation> evaluation;
  if (!o.evalArtifact.empty()) {
    evaluation.emplace(EvalOptions{o.evalArtifact, o.evalStep, o.evalEvery, o.evalSteps,
                                   {o.evalData, o.evalTokens, o.tokenDtype}},
                       artifact, device.name(), seed, info, device.device());
  }
  if (o.warmup >= steps - start) {
    throw Diagnostic("--warmup", "must be fewer than the " + std::to_string(steps - start) + " steps to run");
  }
  device.allowTF32(o.tf32, o.cudnnTf32);
  device.cudnnDeterministic(o.cudnnDeterministic);
  std::optional<OpProfile> profile;
  if (!o.profile.empty()) profile.emplace(device);
  std::optional<StepTrace> trace;
  if (lead && !o.trace.empty()) trace.emplace(device, o.trace);
  const bool capture = artifact.cudagraphs && device.isCuda() && !o.eager && !profile;
  auto plans = std::make_unique<IterationPlans>(g, capture, lead);
  std::unique_ptr<Collectives> comm;
  if (rankInfo) {
    // Ranks of different steps, step counts or starting points would train
    // together, each exiting 0 (issue 57): every rank presents these at the join.
    const RunAgreement agreed = {{"the artifact's fingerprint", fingerprint.empty() ? stepFingerprint(artifact) : fingerprint},
                                 {"WORLD_SIZE", std::to_string(info.worldSize)},
                                 {"--steps", std::to_string(steps)},
                                 {"the first step (--resume)", std::to_string(start)},
                                 {"the seed", std::to_string(seed)}};
    comm = joinProcessGroup(info, device.name(), o.timeout, agreed);
  }

  const Progress progress(lead, o.json);
  std::optional<MetricsLog> metrics;
  if (lead && !o.metrics.empty()) metrics.emplace(o.metrics, samplesPerStep(g, info.worldSize));
  RunRecord record(info.worldSize, device.name(), steps - start);
  for (int step = start; step < steps; ++step) {
    const bool timed = step - start >= o.warmup;
    TensorMap inputs = data.forStep(step);
    const std::optional<double> lr = scheduledRate(g, step, device.device(), inputs);
    // Dropout masks: a stream per rank and step, reproducible from --seed
    // (not PyTorch's stream: README, "Dropout").
    device.seedRandomOps((seed * 1000003 + static_cast<uint64_t>(info.rank) * 7919 + static_cast<uint64_t>(step)) ^
                         0x9E3779B97F4A7C15ull);
    if (trace) trace->beforeStep(timed);
    device.synchronize();
    const auto begin = std::chrono::steady_clock::now();
    auto afterNode = profile ? profile->startStep(timed) : std::function<void(const Node&)>();
    // A checkpoint or an evaluation reads finished state: each ends a segment.
    const Iteration iteration = iterationOf(step, start, steps, {every, evaluation ? o.evalEvery : 0});
    const std::vector<at::Tensor> outputs = plans->at(iteration).run(state, inputs, comm.get(), afterNode);
    // The next batch is read and uploaded while this step computes.
    if (step + 1 < steps) data.prefetch(step + 1);
    device.synchronize();
    StepReport report;
    report.step = step + 1;
    report.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
    report.loss = scalarOutput(outputs, 0);  // none: a graph without outputs
    report.lr = lr;
    if (g.training().clips()) report.gradNorm = scalarOutput(outputs, 1);
    if (report.loss && !std::isfinite(*report.loss) && !o.allowNonfinite) {
      throw Diagnostic("step " + std::to_string(step + 1), "rank " + std::to_string(info.rank) + "'s loss is " +
                                                              floatText(*report.loss) +
                                                              " (--allow-nonfinite trains on)");
    }
    if (evaluation && (step + 1 == steps || (o.evalEvery > 0 && (step + 1) % o.evalEvery == 0))) {
      report.valLoss = evaluation->run(state, comm.get());
    }
    record.addStep(report, timed);
    progress.stepDone(step + 1, steps, report, out);
    if (metrics) metrics->write(step + 1, report, device.peakBytes());
    const bool segmentEnds = iteration == Iteration::Last || iteration == Iteration::Only;
    if (checkpoints && segmentEnds) {
      CheckpointInfo written{step + 1, info.worldSize, fingerprint, seed, lr, dataName, {}, std::nullopt,
                             o.config, g.flags(), o.command};
      if (g.training().shard != ShardMode::None) written.rank = info.rank;
      for (const std::string& note : checkpoints->write(g, state, written)) {
        std::cerr << ("spmd-run: note: --checkpoint: " + note + "\n") << std::flush;
      }
    }
  }
  if (trace) trace->write();
  record.setPeakBytes(device.peakBytes());
  record.setKernelsCompiled(kernelsCompiledAtLaunch());
  device.synchronize();
  // Captured graphs hold NCCL's resources: they go before the communicator.
  plans.reset();
  device.synchronize();
  // --shard parameters: every rank takes part in gathering the parameters whole.
  const bool saves = !o.saveParams.empty() || !o.saveStateDict.empty();
  const TensorMap params = saves ? wholeParameters(artifact, state, comm.get()) : TensorMap();
  if (comm) comm->shutdown();

  if (!lead) return;
  if (!o.saveParams.empty()) saveParameters(g, params, o.saveParams);
  if (!o.saveStateDict.empty()) saveStateDict(g, params, state, o.saveStateDict);
  if (profile) writeOutput(o.profile, profile->report(info.worldSize));
  if (o.json) {
    record.writeJson(out);
  } else {
    record.writeSummary(out, /*finalLoss=*/progress.bar());
  }
}

}  // namespace spmd

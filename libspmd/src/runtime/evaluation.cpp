#include "evaluation.h"

#include "spmd/io/load.h"
#include "spmd/ir/builder.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

namespace spmd {
namespace {

const std::string kFlag = "--eval";

std::shared_ptr<const Artifact> loadEvalArtifact(const std::string& file) {
  LoadedGraph loaded;
  try {
    loaded = loadGraph(file, {});
  } catch (Diagnostic& d) {
    throw Diagnostic(kFlag + " " + file, d.message());
  }
  if (!loaded.artifact) {
    throw Diagnostic(kFlag + " " + file, "not an artifact: compile the evaluation step with spmd-compile --eval-step "
                                         "(or spmd-expand --eval-step | spmd-lower)");
  }
  return loaded.artifact;
}

// The evaluation step reads the training state's parameters and buffers.
void requireSameState(const Graph& eval, const Artifact& training, const std::string& where) {
  const Graph& g = training.graph;
  if (!eval.gradients().empty() || eval.outputs().size() != 1) {
    throw Diagnostic(where, "not an evaluation step (its loss its only output, no gradients): compile it with "
                            "spmd-compile --eval-step");
  }
  if (g.training().shard == ShardMode::Parameters) {
    throw Diagnostic(where, "the training step holds sharded parameters (--shard parameters): evaluation needs them "
                            "whole; shard optimizer or gradients, or evaluate from a checkpoint");
  }
  for (const auto& in : eval.inputs()) {
    if (in.kind != InputKind::Parameter && in.kind != InputKind::Buffer) continue;
    const Value& v = eval.value(in.value);
    const std::optional<ValueId> mine = g.findValue(v.name);
    const GraphInput* input = mine ? g.inputOf(*mine) : nullptr;
    if (!input || input->kind != in.kind) {
      throw Diagnostic(where, "its " + std::string(in.kind == InputKind::Parameter ? "parameter" : "buffer") + " '" +
                                  v.name + "' is not one of the training step's: compile both from the same model");
    }
    const Value& t = g.value(*mine);
    if (t.shape != v.shape || t.dtype != v.dtype) {
      throw Diagnostic(where, "'" + v.name + "' has another shape or dtype than in the training step");
    }
  }
}

}  // namespace

Evaluation::Evaluation(const EvalOptions& options, const Artifact& training, const std::string& device, uint64_t seed,
                       const RankInfo& rank, at::Device where)
    : artifact_(options.loaded ? options.loaded : loadEvalArtifact(options.artifact)), steps_(options.steps) {
  const std::string flag = kFlag + " " + options.artifact;
  if (artifact_->device != device) {
    throw Diagnostic(flag, "lowered for " + artifact_->device + ", the run is on " + device +
                               ": lower it with --device " + device);
  }
  requireSameState(artifact_->graph, training, flag);
  interpreter_ = std::make_unique<Interpreter>(artifact_->graph);
  data_ = std::make_unique<StepData>(artifact_->graph, options.data, seed, rank, where);
}

Evaluation::~Evaluation() = default;

double Evaluation::run(const TensorMap& state, Collectives* comm) const {
  at::NoGradGuard noGrad;
  // The parameters as they are (the same on every rank); the buffers rank
  // 0's, as DDP's forward broadcasts them (broadcast_buffers=True) in eval
  // mode too: each rank's own BatchNorm statistics differ after a step.
  TensorMap weights;
  for (const auto& in : artifact_->graph.inputs()) {
    if (in.kind != InputKind::Parameter && in.kind != InputKind::Buffer) continue;
    const std::string& name = artifact_->graph.value(in.value).name;
    weights[name] = state.at(name);
    if (in.kind == InputKind::Buffer && comm) {
      Node broadcast;
      broadcast.op = "spmd::broadcast";
      broadcast.args = {Arg::tensor(0), Arg::ofInt(0)};
      weights[name] = comm->run(broadcast, {state.at(name)}).at(0);  // a copy: the state stays this rank's
    }
  }
  at::Tensor sum;
  for (int k = 0; k < steps_; ++k) {
    TensorMap inputs = data_->forStep(k);
    for (const auto& [name, t] : weights) inputs[name] = t;
    const at::Tensor loss = interpreter_->run(inputs).outputs.at(0).to(at::kDouble);
    sum = sum.defined() ? sum + loss : loss;
  }
  at::Tensor mean = sum / steps_;
  if (comm) {
    Node reduce;
    reduce.op = "spmd::all_reduce";
    reduce.args = {Arg::tensor(0), strArg("mean")};
    mean = comm->run(reduce, {mean.reshape({1})}).at(0);
  }
  return mean.to(at::kCPU).item<double>();
}

}  // namespace spmd

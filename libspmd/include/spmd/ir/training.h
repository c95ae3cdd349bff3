// What a training step does besides forward, backward and the update, as
// spmd-expand's flags set it and spmd-run applies it per step: the learning
// rate schedule, global gradient-norm clipping and gradient accumulation over
// micro-batches. The graph carries it (Graph::training()) through every stage
// into the artifact; each part is set by the pass that builds it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace spmd {

enum class LrScheduleKind { Constant, Linear, Cosine, Step };
const char* lrScheduleName(LrScheduleKind kind);
bool parseLrScheduleKind(const std::string& name, LrScheduleKind& kind);

// The learning rate at each step index (from 0), after a linear warmup of
// `warmupSteps` steps (lr * (it + 1) / (W + 1), nanoGPT's):
//   constant: lr
//   linear:   lr at W down to minLr at decaySteps, minLr after
//   cosine:   nanoGPT's get_lr: minLr + 0.5 * (1 + cos(pi * (it - W) / (D - W))) * (lr - minLr), minLr after D
//   step:     lr multiplied by gamma every stepSize steps after W (StepLR's chained form)
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Constant;
  double lr = 0.0;  // the optimizer's --lr
  int64_t warmupSteps = 0;
  int64_t decaySteps = 0;
  double minLr = 0.0;
  int64_t stepSize = 0;
  double gamma = 0.1;
};
double learningRateAt(const LrSchedule& schedule, int64_t step);

// How spmd-split shards the model state across ranks (--shard): none is
// DDP (every rank holds everything); optimizer (ZeRO-1) reduce-scatters each
// bucket's gradients and keeps each parameter's optimizer state as this
// rank's dim-0 shard; gradients (ZeRO-2) is the same step, whose full
// gradients die at their reduce-scatter; parameters (ZeRO-3, FSDP) keeps
// only shards of the parameters too, gathered whole for the forward and again
// for the backward (see passes/shard.cpp).
enum class ShardMode { None, Optimizer, Gradients, Parameters };
const char* shardModeName(ShardMode mode);
bool parseShardMode(const std::string& name, ShardMode& mode);

// Norm types clip_grad_norm_ takes here: 2 (Euclidean) or infinity (max abs).
inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

struct TrainingConfig {
  // The learning rate is the graph input "lr" (kind schedule, f64[]), fed
  // per step from `schedule` (the optimizer pass sets both).
  bool scheduled = false;
  LrSchedule schedule;
  // > 0: the reduced gradients are clipped to this global norm, and the
  // graph's second output is the norm before clipping (the clip pass).
  double clipMaxNorm = 0.0;
  double clipNormType = 2.0;
  // Forward and backward run on this many consecutive slices of each data
  // input's rows, gradients reduced once (the micro-batches pass).
  int64_t microBatches = 1;
  // The ranks the step was compiled for (spmd-split --world-size; 0: any):
  // spmd-run refuses another world size. A sharded step's shapes depend on it.
  int64_t worldSize = 0;
  ShardMode shard = ShardMode::None;  // spmd-split --shard

  bool clips() const { return clipMaxNorm > 0.0; }
};

// Rejects what makes no schedule: negative step counts, decay ending before
// warmup does, a step size below 1, a clip norm <= 0 or of another type,
// fewer than one micro-batch, a
// negative world size, sharding without one. Throws Diagnostic naming the flag.
void validateTraining(const TrainingConfig& config);

// "lr-schedule=cosine lr=0.0006 warmup=10 ..." listing only what differs
// from the defaults; "" for a plain step. parseTrainingText reads it back
// and returns "" or what is wrong.
std::string trainingText(const TrainingConfig& config);
std::string parseTrainingText(const std::string& text, TrainingConfig& config);

}  // namespace spmd

// spmd-run --eval: the forward-only evaluation step (spmd-expand
// --eval-step, lowered) run every N steps on held-out batches, with the
// training state's parameters and buffers, its loss averaged over the batches
// and the ranks: the validation loss of nanoGPT's estimate_loss and of the
// HF Trainer's evaluate.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/runtime/collectives.h"
#include "spmd/runtime/executor.h"
#include "spmd/runtime/interpreter.h"
#include "run_data.h"

#include <memory>
#include <string>

namespace spmd {

struct EvalOptions {
  std::string artifact;  // --eval: the evaluation step's artifact
  std::shared_ptr<const Artifact> loaded;  // that artifact already in memory, or null
  int every = 0;         // --eval-every N: after every N-th step (and the last)
  int steps = 1;         // --eval-steps K: batches per evaluation
  DataSource data;       // --eval-data / --eval-tokens
};

class Evaluation {
 public:
  // Loads the artifact and checks it against the training step, before step
  // 1 (Diagnostic naming the flag): an evaluation step (no gradients, one
  // output), for the run's device, whose parameters and buffers the training
  // state holds with the same shapes and dtypes (whole: not a --shard
  // parameters step); then opens its data as the training data is opened.
  Evaluation(const EvalOptions& options, const Artifact& training, const std::string& device, uint64_t seed,
             const RankInfo& rank, at::Device where);
  ~Evaluation();

  // The mean of the loss over the K batches (the same K each time) on every
  // rank, averaged over the ranks through `comm` (nullptr: one rank).
  double run(const TensorMap& state, Collectives* comm) const;

 private:
  std::shared_ptr<const Artifact> artifact_;
  std::unique_ptr<Interpreter> interpreter_;
  std::unique_ptr<StepData> data_;
  int steps_;
};

}  // namespace spmd

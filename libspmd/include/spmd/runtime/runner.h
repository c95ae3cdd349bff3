// spmd-run's training loop: one rank's execution of an artifact.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/runtime/collectives.h"

#include <chrono>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace spmd {

struct RunOptions {
  int steps = 0;   // the step the run ends at (0: the unrolled graph's iterations, else 10), also when resumed
  int warmup = 0;  // steps left out of the timing summary
  std::string dataFile;    // --data: {input: [S, G, ...] or [N, ...]}: torch.save'd, .npz, or a folder of .npy
  std::string tokens;      // --tokens: a token stream (nanoGPT's train.bin) for the first two data inputs
  std::string tokenDtype = "uint16";  // --token-dtype: uint16 or uint32
  bool shuffle = false;    // --shuffle: --data's rows in a seeded order, a new one each epoch
  std::string saveParams;  // --save-params: rank 0's parameters after the run
  std::string saveStateDict;  // --save-state-dict: parameters and buffers, as model.state_dict() holds them
  std::string device = "auto";
  uint64_t seed = 0;
  bool json = false;
  bool tf32 = false;  // TF32 matmuls on CUDA, as torch.backends.cuda.matmul.allow_tf32
  bool cudnnTf32 = true;  // TF32 in cuDNN's convolutions, as torch.backends.cudnn.allow_tf32 (on by default there too)
  bool cudnnDeterministic = false;  // as torch.backends.cudnn.deterministic
  bool eager = false; // no CUDA graphs, even for an artifact lowered with --cudagraphs
  bool allowNonfinite = false;  // --allow-nonfinite: train on after a NaN or infinite loss
  std::string profile;  // --profile: rank 0's time per op, the device synchronized after each node
  std::string trace;    // --trace: a PyTorch profiler (Kineto) Chrome trace of rank 0's timed steps
  std::string metrics;  // --metrics: rank 0 appends one JSON line per step
  std::string checkpoint;   // --checkpoint DIR: rank 0 writes checkpoints there (runtime/checkpoint.h)
  int checkpointEvery = 0;  // --checkpoint-every K: also after every K-th step (0: only at the end)
  int keep = 3;             // --keep N: checkpoints kept in DIR
  std::string resume;       // --resume DIR: continue from a checkpoint (a folder, or DIR's latest)
  bool resumeWeightsOnly = false;  // --resume-weights-only: take its parameters and buffers, start at step 0
  std::string initFrom;     // --init-from FILE: parameters and buffers from a PyTorch state_dict file
  std::string config;       // the resolved configuration (spmd-train), kept in every checkpoint as config.toml
  std::vector<std::string> command;  // the tool and its arguments, as given, in every checkpoint's manifest
  std::string evalArtifact; // --eval FILE: the evaluation step (spmd-compile --eval-step)
  std::shared_ptr<const Artifact> evalStep;  // or that step already in memory (spmd-train; evalArtifact names it)
  int evalEvery = 0;        // --eval-every N: evaluate after every N-th step and after the last
  int evalSteps = 1;        // --eval-steps K: batches per evaluation
  std::string evalData;     // --eval-data FILE: held-out batches, in --data's contract
  std::string evalTokens;   // --eval-tokens FILE: held-out token stream (nanoGPT's val.bin)
  std::chrono::milliseconds timeout{300000};
};

// The device a graph given to spmd-run is lowered for: `requested`, or for
// "auto" CUDA where this machine has it.
std::string loweringDevice(const std::string& requested);

// Runs `artifact` for options.steps steps as rank `rank` (nullopt: a single
// process without a process group). Rank 0 reports each step's loss and a
// summary on `out` (JSON with options.json), and a progress bar on a
// terminal. Throws Diagnostic for bad input, before step 1 where it can.
void runTraining(const Artifact& artifact, const std::optional<RankInfo>& rank, const RunOptions& options,
                 std::ostream& out);

}  // namespace spmd

// spmd-run's training loop: one rank's execution of an artifact.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/runtime/collectives.h"

#include <chrono>
#include <optional>
#include <ostream>
#include <string>

namespace spmd {

struct RunOptions {
  int steps = 0;   // 0: the unrolled graph's iterations, else 10
  int warmup = 0;  // steps left out of the timing summary
  std::string dataFile;    // --data: {input: [S, G, ...]} saved with torch.save
  std::string saveParams;  // --save-params: rank 0's parameters after the run
  std::string device = "auto";
  uint64_t seed = 0;
  bool json = false;
  bool tf32 = false;  // TF32 matmuls on CUDA, as torch.backends.cuda.matmul.allow_tf32
  bool eager = false; // no CUDA graphs, even for an artifact lowered with --cudagraphs
  bool allowNonfinite = false;  // --allow-nonfinite: train on after a NaN or infinite loss
  std::string profile;  // --profile: rank 0's time per op, the device synchronized after each node
  std::string metrics;  // --metrics: rank 0 appends one JSON line per step
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

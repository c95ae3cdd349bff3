// spmd-run's front half, shared by spmd-run and the spmd-train driver so
// that a flag and an error mean the same in both: its flags (all but IN and
// --input) and the run of an artifact as this process's rank, each failure
// reported in one line with the exit code the launcher expects.
#pragma once

#include "spmd/io/artifact.h"
#include "spmd/runtime/runner.h"

#include <CLI/CLI.hpp>

#include <array>
#include <functional>
#include <string>

namespace spmd {

// What the run flags bind besides RunOptions.
struct RunFlags {
  int nproc = 0;             // --nproc: local ranks to spawn
  double timeoutSec = 300;   // --timeout
  bool noCudnnTf32 = false;  // --no-cudnn-tf32
  // --eval-every, --eval-steps, --eval-data, --eval-tokens: each needs --eval.
  std::array<CLI::Option*, 4> evalFlags{};
};

void addRunFlags(CLI::App& app, RunOptions& options, RunFlags& flags);
// After parsing: the timeout and cuDNN's TF32 into `options`; the --eval
// flags checked (Diagnostic naming the flag).
void finishRunFlags(const RunFlags& flags, RunOptions& options);

// Runs the artifact `load` returns (it may throw Diagnostic) as the rank the
// environment names (a launcher's), or alone; `file` names it in errors.
// Prints each failure as one line `tool: error: [rank R: ]...` and returns
// the exit code: 0, 1 for a failure of this rank, peerFailureExitCode() for a
// peer's. Under no launcher with flags.nproc > 1, spawns `argv` as that many
// local ranks instead (launchLocalRanks).
int runAsRank(const std::string& tool, const std::function<Artifact()>& load, const std::string& file,
              const RunOptions& options, const RunFlags& flags, const std::vector<std::string>& argv);

}  // namespace spmd

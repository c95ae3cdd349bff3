// What rank 0 reports after the last step: the timing summary (text or
// --json), and the files --save-params and --profile name, whose
// directories are checked before step 1.
#pragma once

#include "spmd/ir/graph.h"
#include "run_progress.h"
#include "spmd/runtime/executor.h"

#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

namespace spmd {

// Refuses (Diagnostic naming `flag`) a path where no file can be written: an
// existing directory, a path under a regular file, a directory where a
// probe file cannot be made (/proc, read-only, missing). A file written
// after the last step is checked before step 1, not after the whole run.
// "" and "-" pass.
void requireWritableDirectory(const std::string& path, const std::string& flag);

// The graph's parameters in `state`, on the CPU, saved as torch.save's
// {name: tensor} at `path` (torch.load reads it).
void saveParameters(const Graph& g, const TensorMap& state, const std::string& path);
// --save-state-dict: the parameters (`params`, whole) then the buffers (this
// rank's `state`), by their module names, in the graph's order: what
// model.state_dict() holds, for model.load_state_dict(strict=True).
void saveStateDict(const Graph& g, const TensorMap& params, const TensorMap& state, const std::string& path);

// --metrics FILE.jsonl: one JSON object per step (step, loss, lr and
// grad_norm where the step has them, ms, samples_per_s, peak_bytes on CUDA),
// appended and flushed after each step, so that a run that crashes keeps
// what it logged. Non-finite numbers are written as null.
class MetricsLog {
 public:
  // Opens `path` for appending (Diagnostic if it cannot); `samplesPerStep`:
  // the global batch's rows (0: not known, left out).
  MetricsLog(const std::string& path, int64_t samplesPerStep);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Step `step` (1-based); throws Diagnostic when the line cannot be written
  // (a file this log created and could not write a line to is removed).
  void write(int step, const StepReport& report, int64_t peakBytes);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t samplesPerStep_;
  bool created_ = false;  // the file did not exist before
  bool wroteLine_ = false;
};

// Each step's loss and time, and what the summary says about the run.
class RunRecord {
 public:
  RunRecord(int ranks, std::string device, int steps) : ranks_(ranks), device_(std::move(device)), steps_(steps) {}

  // The next step's loss and time; `timed`: past the warm-up, so in the timings.
  void addStep(const StepReport& step, bool timed);
  void setPeakBytes(int64_t bytes) { peakBytes_ = bytes; }
  void setKernelsCompiled(size_t kernels) { kernelsCompiled_ = kernels; }

  // One JSON object on one line: ranks, device, steps, timed steps, peak
  // bytes, generated kernels compiled at launch, losses (and lrs, grad_norms
  // where the step has them), ms per step (median, min, max), steps per second.
  void writeJson(std::ostream& out) const;
  // The text summary; `finalLoss` first where no step line showed it.
  void writeSummary(std::ostream& out, bool finalLoss) const;

 private:
  int ranks_;
  std::string device_;
  int steps_;
  std::vector<double> losses_, ms_, lrs_, gradNorms_;
  std::vector<std::pair<int, double>> valLosses_;  // (the step, 1-based; the validation loss after it)
  int64_t peakBytes_ = 0;
  size_t kernelsCompiled_ = 0;
};

}  // namespace spmd

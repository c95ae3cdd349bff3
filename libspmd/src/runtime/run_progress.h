// What rank 0 shows while it trains: a line per step, or a progress bar on
// stderr when stderr is a terminal; nothing with --json, nor on other ranks.
#pragma once

#include <chrono>
#include <optional>
#include <ostream>

namespace spmd {

// What a step reports: its loss and time, and, where the step has them, the
// learning rate the schedule gave it and the gradient norm before clipping.
struct StepReport {
  int step = 0;  // 1-based
  std::optional<double> loss;  // none when the graph has no outputs
  double ms = 0.0;
  std::optional<double> lr;
  std::optional<double> gradNorm;
  std::optional<double> valLoss;  // --eval: the validation loss after this step
};

class Progress {
 public:
  Progress(bool lead, bool json);

  // After step `step` (1-based) of `steps`: its line on `out`, or the bar
  // (with the loss, steps per second and the time left).
  void stepDone(int step, int steps, const StepReport& report, std::ostream& out) const;

  // Whether the bar stands in for the step lines (the summary then adds the
  // final loss).
  bool bar() const { return bar_; }

 private:
  bool bar_;
  bool lines_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace spmd

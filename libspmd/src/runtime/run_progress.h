// What rank 0 shows while it trains: a line per step, or a progress bar on
// stderr when stderr is a terminal; nothing with --json, nor on other ranks.
#pragma once

#include <ostream>

namespace spmd {

class Progress {
 public:
  Progress(bool lead, bool json);

  // After step `step` (1-based) of `steps`: its line on `out`, or the bar.
  void stepDone(int step, int steps, double loss, double ms, std::ostream& out) const;

  // Whether the bar stands in for the step lines (the summary then adds the
  // final loss).
  bool bar() const { return bar_; }

 private:
  bool bar_;
  bool lines_;
};

}  // namespace spmd

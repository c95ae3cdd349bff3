// --profile: the time of every node, the device synchronized after it,
// summed by operator over the timed steps (rank 0's table).
#pragma once

#include "run_device.h"

#include "spmd/ir/graph.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

namespace spmd {

class OpProfile {
 public:
  explicit OpProfile(const RunDevice& device) : device_(device) {}

  // Starts a step's clock; the callback, given to the step as its
  // afterNode, books each node's time (only when `timed`: warm-up steps are
  // left out).
  std::function<void(const Node&)> startStep(bool timed);

  // The table: ms per step, share and calls per step of each op, slowest
  // first, and the total.
  std::string report(int ranks) const;

 private:
  const RunDevice& device_;
  std::chrono::steady_clock::time_point last_;
  int steps_ = 0;
  std::map<std::string, std::pair<double, int64_t>> byOp_;  // ms, calls
};

}  // namespace spmd

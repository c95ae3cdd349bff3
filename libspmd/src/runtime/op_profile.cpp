#include "op_profile.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

namespace spmd {

std::function<void(const Node&)> OpProfile::startStep(bool timed) {
  device_.synchronize();
  last_ = std::chrono::steady_clock::now();
  if (timed) ++steps_;
  return [this, timed](const Node& node) {
    device_.synchronize();
    const auto now = std::chrono::steady_clock::now();
    if (timed) {
      auto& [ms, calls] = byOp_[node.qualifiedName()];
      ms += std::chrono::duration<double, std::milli>(now - last_).count();
      ++calls;
    }
    last_ = now;
  };
}

std::string OpProfile::report(int ranks) const {
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (const auto& [op, t] : byOp_) {
    rows.emplace_back(t.first, op);
    total += t.first;
  }
  std::sort(rows.rbegin(), rows.rend());
  const double steps = std::max(steps_, 1);
  std::ostringstream out;
  out << "# spmd-run --profile: " << steps_ << " timed steps, rank 0 of " << ranks << " (" << device_.name()
      << "), the device synchronized after every node\n# ms/step   share  calls/step  op\n";
  char line[256];
  for (const auto& [ms, op] : rows) {
    std::snprintf(line, sizeof line, "%9.3f  %5.1f%%  %10.1f  %s\n", ms / steps, total > 0 ? 100 * ms / total : 0.0,
                  byOp_.at(op).second / steps, op.c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "%9.3f  100.0%%              total\n", total / steps);
  out << line;
  return out.str();
}

}  // namespace spmd

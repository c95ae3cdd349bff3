#include "spmd/support/phase_times.h"

#include <cstdio>
#include <ostream>
#include <utility>
#include <vector>

namespace spmd {
namespace {

struct Phase {
  std::string name;
  double seconds = 0;
  int depth = 0;  // phases inside another are indented and left out of the total
};

bool gEnabled = false;
int gDepth = 0;

std::vector<Phase>& phases() {
  static std::vector<Phase> recorded;
  return recorded;
}

}  // namespace

void enablePhaseTimes() { gEnabled = true; }
bool phaseTimesEnabled() { return gEnabled; }

TimedPhase::TimedPhase(std::string name) : name_(std::move(name)), start_(std::chrono::steady_clock::now()) {
  if (!gEnabled) return;
  // A slot now, so that a phase is listed before the phases inside it.
  slot_ = static_cast<int>(phases().size());
  phases().push_back({"", 0, gDepth++});
}

TimedPhase::~TimedPhase() {
  if (slot_ < 0) return;
  --gDepth;
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_;
  phases()[slot_].name = std::move(name_);
  phases()[slot_].seconds = took.count();
}

void printPhaseTimes(std::ostream& log) {
  if (phases().empty()) return;
  double total = 0;
  for (const auto& p : phases()) total += p.depth == 0 ? p.seconds : 0;
  char line[200];
  log << "===-------------------------------------------------------------------------===\n"
      << "                         ... Pass execution timing report ...\n"
      << "===-------------------------------------------------------------------------===\n";
  std::snprintf(line, sizeof line, "  Total Execution Time: %.4f seconds\n\n   ----Wall Time----  ----Name----\n", total);
  log << line;
  for (const auto& p : phases()) {
    std::snprintf(line, sizeof line, "   %.4f (%5.1f%%)  %s%s\n", p.seconds, total > 0 ? 100.0 * p.seconds / total : 0.0,
                  std::string(2 * p.depth, ' ').c_str(), p.name.c_str());
    log << line;
  }
  std::snprintf(line, sizeof line, "   %.4f (100.0%%)  Total\n", total);
  log << line;
}

}  // namespace spmd

#include "run_progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace spmd {

Progress::Progress(bool lead, bool json)
    : bar_(lead && !json && ::isatty(STDERR_FILENO)), lines_(lead && !json && !bar_) {}

void Progress::stepDone(int step, int steps, double loss, double ms, std::ostream& out) const {
  if (lines_) {
    char line[128];
    std::snprintf(line, sizeof line, "step %d/%d  loss %.6g  %.3f ms\n", step, steps, loss, ms);
    out << line << std::flush;
  }
  if (bar_) {
    const int width = 30, done = width * step / steps;
    std::fprintf(stderr, "\r[%s%s] %d/%d", std::string(done, '=').c_str(), std::string(width - done, ' ').c_str(), step,
                 steps);
    if (step == steps) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }
}

}  // namespace spmd

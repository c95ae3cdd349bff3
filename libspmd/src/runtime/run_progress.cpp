#include "run_progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace spmd {

Progress::Progress(bool lead, bool json)
    : bar_(lead && !json && ::isatty(STDERR_FILENO)), lines_(lead && !json && !bar_) {}

void Progress::stepDone(int step, int steps, const StepReport& r, std::ostream& out) const {
  if (lines_) {
    char line[192];
    int n = std::snprintf(line, sizeof line, "step %d/%d  loss %.6g", step, steps, r.loss);
    if (r.lr) n += std::snprintf(line + n, sizeof line - n, "  lr %.6g", *r.lr);
    if (r.gradNorm) n += std::snprintf(line + n, sizeof line - n, "  grad norm %.6g", *r.gradNorm);
    std::snprintf(line + n, sizeof line - n, "  %.3f ms\n", r.ms);
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

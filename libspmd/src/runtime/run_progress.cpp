#include "run_progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace spmd {

Progress::Progress(bool lead, bool json)
    : bar_(lead && !json && ::isatty(STDERR_FILENO)), lines_(lead && !json && !bar_) {}

namespace {

// "1:05" or "2:03:10": the time left at the rate so far.
std::string durationText(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%ld:%02ld", s / 60, s % 60);
  }
  return text;
}

}  // namespace

void Progress::stepDone(int step, int steps, const StepReport& r, std::ostream& out) const {
  if (lines_) {
    char line[192];
    int n = r.loss ? std::snprintf(line, sizeof line, "step %d/%d  loss %.6g", step, steps, *r.loss)
                   : std::snprintf(line, sizeof line, "step %d/%d  no loss (the graph has no outputs)", step, steps);
    if (r.lr) n += std::snprintf(line + n, sizeof line - n, "  lr %.6g", *r.lr);
    if (r.gradNorm) n += std::snprintf(line + n, sizeof line - n, "  grad norm %.6g", *r.gradNorm);
    if (r.valLoss) n += std::snprintf(line + n, sizeof line - n, "  val loss %.6g", *r.valLoss);
    std::snprintf(line + n, sizeof line - n, "  %.3f ms\n", r.ms);
    out << line << std::flush;
  }
  if (bar_) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = elapsed > 0 ? step / elapsed : 0.0;
    const int width = 30, done = width * step / steps;
    char line[256];
    int n = std::snprintf(line, sizeof line, "\r[%s%s] %d/%d", std::string(done, '=').c_str(),
                          std::string(width - done, ' ').c_str(), step, steps);
    if (r.loss) n += std::snprintf(line + n, sizeof line - n, "  loss %.4g", *r.loss);
    if (r.valLoss) n += std::snprintf(line + n, sizeof line - n, "  val %.4g", *r.valLoss);
    if (rate > 0) {
      n += std::snprintf(line + n, sizeof line - n, "  %.3g steps/s  ETA %s", rate,
                         durationText((steps - step) / rate).c_str());
    }
    // Spaces wipe the end of a longer line before it; the last step ends the line.
    std::snprintf(line + n, sizeof line - n, "   %s", step == steps ? "\n" : "");
    std::fputs(line, stderr);
    std::fflush(stderr);
  }
}

}  // namespace spmd

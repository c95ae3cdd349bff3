// Wall times of a tool's phases for --time-passes: reading the input,
// verifying, each pass, writing the output. Off until enabled; while off, a
// timed phase records nothing. Single-threaded, as the compiler stages are.
#pragma once

#include <chrono>
#include <iosfwd>
#include <string>

namespace spmd {

// --time-passes: from now on, phases are recorded.
void enablePhaseTimes();
bool phaseTimesEnabled();

// Records the wall time from construction to destruction under `name`;
// phases timed inside it are listed under it, indented.
class TimedPhase {
 public:
  explicit TimedPhase(std::string name);
  ~TimedPhase();
  TimedPhase(const TimedPhase&) = delete;
  TimedPhase& operator=(const TimedPhase&) = delete;
  void rename(std::string name) { name_ = std::move(name); }

 private:
  std::string name_;
  std::chrono::steady_clock::time_point start_;
  int slot_ = -1;  // its place in the report; -1 while phase times are off
};

// The phases recorded, in order, as mlir-opt's --mlir-timing prints its
// report; nothing when none was recorded.
void printPhaseTimes(std::ostream& log);

}  // namespace spmd

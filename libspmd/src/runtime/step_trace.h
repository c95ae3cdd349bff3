// --trace: a PyTorch profiler (Kineto) trace of rank 0's timed steps,
// written as a Chrome trace (chrome://tracing, Perfetto) with the number of
// steps it covers under "spmd" (bench/trace_kernels.py sums it per step).
// Unlike --profile nothing is synchronized: the trace shows each ATen op's
// CPU time and, on CUDA, every kernel the device ran (cuBLAS's, ATen's and
// spmd's generated ones) with its own duration.
#pragma once

#include "run_device.h"

#include <string>

namespace spmd {

class StepTrace {
 public:
  StepTrace(const RunDevice& device, std::string path) : device_(device), path_(std::move(path)) {}
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;
  // Stops a recording left running (an error ended the run): nothing is written.
  ~StepTrace();

  // Called before every step; recording starts with the first timed one.
  void beforeStep(bool timed);
  // Stops recording and writes the trace, once the device is idle.
  void write();

 private:
  const RunDevice& device_;
  std::string path_;
  bool recording_ = false;
  int steps_ = 0;  // timed steps recorded
};

}  // namespace spmd

// The device one rank of spmd-run computes on: chosen from the artifact and
// --device, made current, synchronized around timings, asked for its peak
// memory. The only place the runner touches CUDA's API.
#pragma once

#include "spmd/io/artifact.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace spmd {

class RunDevice {
 public:
  // `requested`: --device (auto, cpu or cuda). Throws Diagnostic where the
  // artifact or the request wants CUDA and this machine has none.
  RunDevice(const Artifact& artifact, const std::string& requested, int localRank);

  const std::string& name() const { return name_; }  // "cpu" or "cuda"
  bool isCuda() const { return name_ == "cuda"; }
  // This rank's device: cuda:<localRank>, or the CPU.
  const at::Device& device() const { return device_; }

  // Makes this rank's GPU the current one (nothing on CPU).
  void makeCurrent() const;
  // TF32 on CUDA: in matmuls (torch.backends.cuda.matmul.allow_tf32) and in
  // cuDNN's convolutions (torch.backends.cudnn.allow_tf32); nothing on CPU.
  void allowTF32(bool matmuls, bool convolutions) const;
  // cuDNN's algorithms: deterministic ones only (torch.backends.cudnn.deterministic).
  void cudnnDeterministic(bool on) const;
  // Waits for the work queued on the device (nothing on CPU).
  void synchronize() const;
  // Seeds the generators random ops (dropout's bernoulli) draw from when
  // they name none: the CPU's and, on CUDA, this GPU's.
  void seedRandomOps(uint64_t seed) const;
  // Peak bytes the caching allocator handed out on this GPU (0 on CPU).
  int64_t peakBytes() const;

 private:
  std::string name_;
  at::Device device_;
  int localRank_;
};

}  // namespace spmd

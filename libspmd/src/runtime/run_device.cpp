#include "run_device.h"

#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <mutex>
#include <torch/cuda.h>
#ifdef SPMD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace spmd {
namespace {

std::string resolveDevice(const Artifact& a, const std::string& requested) {
  const bool haveCuda = torch::cuda::is_available();
  if (a.device == "cuda" && !haveCuda) {
    throw Diagnostic("", "the artifact was lowered for CUDA and this machine has no CUDA device; lower it with --device cpu");
  }
  if (requested == "cuda" && !haveCuda) throw Diagnostic("--device cuda", "this machine has no CUDA device");
  return requested == "auto" ? a.device : requested;
}

}  // namespace

RunDevice::RunDevice(const Artifact& artifact, const std::string& requested, int localRank)
    : name_(resolveDevice(artifact, requested)),
      device_(name_ == "cuda" ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank)) : at::Device(at::kCPU)),
      localRank_(localRank) {}

void RunDevice::makeCurrent() const {
#ifdef SPMD_WITH_CUDA
  if (isCuda()) c10::cuda::set_device(static_cast<c10::DeviceIndex>(localRank_));
#endif
}

void RunDevice::allowTF32(bool matmuls, bool convolutions) const {
  if (!isCuda()) return;
  at::globalContext().setAllowTF32CuBLAS(matmuls);
  at::globalContext().setAllowTF32CuDNN(convolutions);
}

void RunDevice::cudnnDeterministic(bool on) const {
  if (isCuda()) at::globalContext().setDeterministicCuDNN(on);
}

void RunDevice::synchronize() const {
#ifdef SPMD_WITH_CUDA
  if (isCuda()) at::cuda::getCurrentCUDAStream().synchronize();
#endif
}

int64_t RunDevice::peakBytes() const {
#ifdef SPMD_WITH_CUDA
  if (isCuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(localRank_));
    // Index 0 is StatType::AGGREGATE, whose namespace moved between LibTorch versions.
    return stats.allocated_bytes[0].peak;
  }
#endif
  return 0;
}

void RunDevice::seedRandomOps(uint64_t seed) const {
  auto reseed = [seed](at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  };
  reseed(at::globalContext().defaultGenerator(at::Device(at::kCPU)));
  if (isCuda()) reseed(at::globalContext().defaultGenerator(device_));
}

}  // namespace spmd

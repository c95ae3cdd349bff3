// The differences between the LibTorch versions spmd builds against (1.13 in
// CI, 2.x on the GPU machine) that are not a whole function apart (meta.cpp
// keeps those), in one place.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace spmd::compat {

// torch.autocast(device_type, dtype)'s lower precision type for `device`.
inline void setAutocastDtype(c10::DeviceType device, c10::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

inline c10::ScalarType autocastDtype(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

// A profiler event's (torch::autograd::profiler::KinetoEvent's) start and
// duration in microseconds: 2.1 renamed the accessors and counts in ns.
struct EventSpanUs {
  double start = 0, duration = 0;
};

template <class ProfilerEvent>
EventSpanUs eventSpanUs(const ProfilerEvent& event) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return {static_cast<double>(event.startNs()) / 1e3, static_cast<double>(event.durationNs()) / 1e3};
#else
  return {static_cast<double>(event.startUs()), static_cast<double>(event.durationUs())};
#endif
}

}  // namespace spmd::compat

// Helpers that the ATen implementations of spmd's ops share: the CPU and
// meta kernels (ops/layer_norm_ops.cpp) and the CUDA launches of generated
// kernels (backend/fused_kernels_cuda.cpp, backend/reduction_kernels_cuda.cpp),
// so that both give the same shapes and errors.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace spmd {

// An optional tensor argument that was passed and is defined.
inline bool given(const c10::optional<at::Tensor>& t) { return t && t->defined(); }

// The shape of LayerNorm's per-row mean and rstd: the input's, its last
// dimension 1.
inline std::vector<int64_t> layerNormStatsShape(const at::Tensor& input) {
  std::vector<int64_t> shape = input.sizes().vec();
  shape.back() = 1;
  return shape;
}

// `make()`'s kernel spec (ops/kernel_spec.h); the std::invalid_argument
// with which a spec refuses its attributes becomes an error of `op`
// (c10::Error, what the dispatcher's callers catch).
template <typename F>
auto generatedSpec(const char* op, F make) -> decltype(make()) {
  try {
    return make();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, op, ": ", e.what());
    throw;  // not reached: TORCH_CHECK(false) throws
  }
}

}  // namespace spmd

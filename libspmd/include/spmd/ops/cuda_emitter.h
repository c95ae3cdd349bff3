// CUDA source pieces that every generated kernel family shares (pointwise,
// rows, LayerNorm, cross entropy, column sums, attention's softmax). The
// lowest layer of code generation: it knows CUDA C++, not the graph.
#pragma once

#include <string>

namespace spmd {

// The device functions spmd_bf16_to_f32(unsigned short),
// spmd_f32_to_bf16(float) (round to nearest even: the hardware's conversion
// from sm_80, as ATen's CUDA kernels use there; c10::BFloat16's integer
// rounding before it), which every generated source that reads or writes
// bf16 as 16-bit words shares.
std::string bfloat16Helpers();
// The same for f16: spmd_f16_to_f32 and spmd_f32_to_f16 (round to nearest even).
std::string float16Helpers();

}  // namespace spmd

// CUDA C for a pointwise program (ops/pointwise_program.h) on static shapes:
// `spmd_fused` (and `spmd_fused_vec`, see below), whose arguments are the
// inputs' and outputs' data pointers in order (contiguous tensors); shapes,
// broadcasting and the element count are constants in the source. The text is deterministic
// (golden tests read it) and needs no headers, so NVRTC compiles it as is.
#pragma once

#include "spmd/ops/cuda_emitter.h"  // the bf16 and f16 helpers every kernel family writes
#include "spmd/ops/pointwise_program.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spmd {

// Bumped whenever the generated code changes meaning or calling convention:
// an artifact's compiled kernels are used only by the version that made them.
constexpr int kCodegenVersion = 1;
constexpr const char* kFusedKernelName = "spmd_fused";
constexpr int kFusedBlockSize = 256;
constexpr const char* kFusedVectorKernelName = "spmd_fused_vec";
// A row program's kernel (ops/pointwise_program.h): one warp a row, this many
// rows a block of kFusedBlockSize threads. It is the source's only kernel.
constexpr const char* kFusedRowsKernelName = "spmd_fused_rows";
constexpr int kFusedRowsPerBlock = kFusedBlockSize / 32;

struct KernelTensor {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
};

// The shape every input broadcasts to (numpy's rules); throws
// std::invalid_argument when they do not.
std::vector<int64_t> broadcastShapes(const std::vector<KernelTensor>& inputs);

// The kernel for `program` over `inputs` (in the program's input order);
// throws std::invalid_argument for inputs that do not match the program.
std::string pointwiseKernelSource(const PointwiseProgram& program, const std::vector<KernelTensor>& inputs);

// `spmd_fused_vec`'s elements per iteration (8 where every operand it reads
// or writes whole is 16-bit, else 4), or 0 when the element count is no
// multiple of it, or the program is a row program, and the source has no such kernel. spmd::fused launches it
// when every data pointer is 16-byte aligned.
int fusedVectorWidth(const PointwiseProgram& program, const std::vector<KernelTensor>& inputs);


// Blocks to launch for a row program over `rows` rows (one warp each).
int64_t fusedRowBlocks(int64_t rows);

// Blocks to launch for `numel` elements (a grid-stride loop covers the rest).
int64_t fusedGridSize(int64_t numel, int multiprocessors);

}  // namespace spmd

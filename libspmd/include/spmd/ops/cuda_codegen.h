// CUDA C for a pointwise program (ops/pointwise_program.h) on static shapes:
// `spmd_fused` (and `spmd_fused_vec`, see below), whose arguments are the
// inputs' and outputs' data pointers in order (contiguous tensors, or inputs
// of given strides); shapes, strides, broadcasting and the element count are
// constants in the source. The text is deterministic
// (golden tests read it) and needs no headers, so NVRTC compiles it as is.
#pragma once

#include "spmd/ops/cuda_emitter.h"  // the pieces every kernel family writes
#include "spmd/ops/kernel_spec.h"
#include "spmd/ops/pointwise_program.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spmd {

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
  // An input read in place through a view (a transpose, a select): its
  // strides, in elements. Empty: contiguous. The kernel reads a strided
  // input an element at a time, never as vectors.
  std::vector<int64_t> strides = {};
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

// The kernel of one spmd::fused(Tensor[] inputs, str program) call, a
// pointwise or a row program (fuse-pointwise's and fuse-rows' nodes are the
// same op): the program and its inputs' dtypes and shapes. Its key is
// "pointwise <the program as printed> in=<dtype[shape]>,..." (a strided
// input's entry followed by its strides: "bf16[8,4]:[1,8]").
class PointwiseKernelSpec final : public KernelSpec {
 public:
  // Throws std::invalid_argument for a program that does not parse; inputs
  // that do not fit it are refused by source() and shape().
  PointwiseKernelSpec(const std::string& programText, std::vector<KernelTensor> inputs);

  const PointwiseProgram& program() const { return program_; }
  const std::vector<KernelTensor>& inputs() const { return inputs_; }
  // The broadcast iteration space.
  std::vector<int64_t> shape() const { return broadcastShapes(inputs_); }
  // The launch over the iteration space: a row program's row kernel, else
  // spmd_fused_vec where every data pointer is 16-byte aligned (`aligned`)
  // and the source has it, else spmd_fused. No count argument.
  KernelLaunch launch(int multiprocessors, bool aligned) const;
  // The kernel every such source has: the row kernel or spmd_fused.
  const char* scalarKernelName() const;

 private:
  PointwiseKernelSpec(PointwiseProgram program, std::vector<KernelTensor> inputs);
  std::string generateSource() const override { return pointwiseKernelSource(program_, inputs_); }

  PointwiseProgram program_;
  std::vector<KernelTensor> inputs_;
};

}  // namespace spmd

// CUDA C for spmd::column_sum: the sum over every dimension but the last of
// a contiguous tensor, seen as [rows, columns] (a bias's gradient: what
// aten::sum.dim_IntList(grad, [0], keepdim) records for a Linear). f32 or
// bf16 in, accumulated in float, the result in the input's dtype, as ATen's
// sum gives it. One source holds two kernels:
//
//   spmd_column_sum(const IN* x, float* partial, long long rows)
//     block (tile, part) sums rows [part * kBlockRows, +kBlockRows) of the
//     columns of its tile (16 bytes of a row for each lane) into
//     partial[part][column];
//   spmd_column_sum_parts(const float* partial, OUT* out, long long parts)
//     sums the parts in a fixed order;
//   spmd_column_sum_whole(const IN* x, OUT* out, long long rows)
//     for at most kColumnSumWholeRows rows, one kernel: block `tile` sums
//     every row of its columns (a warp takes every kColumnSumWarps-th row)
//     and writes the result.
//
// The parts cover a fixed number of rows, so the order of the additions
// (and their rounding) does not depend on the GPU. The source is
// deterministic and needs no headers, like the pointwise kernels'.
#pragma once

#include "spmd/ops/kernel_spec.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spmd {

constexpr const char* kColumnSumKernelName = "spmd_column_sum";
constexpr const char* kColumnSumPartsKernelName = "spmd_column_sum_parts";
constexpr const char* kColumnSumWholeKernelName = "spmd_column_sum_whole";
constexpr int kColumnSumWarps = 8;
constexpr int64_t kColumnSumBlockRows = 64;  // rows a part sums
constexpr int kColumnSumPartsThreads = 256;
// Up to this many rows one block sums a tile's whole columns (the seeds'
// MLP's bias gradients, 100 rows): one launch instead of two.
constexpr int64_t kColumnSumWholeRows = 512;

// Columns a block's tile spans: 32 lanes x 16 bytes.
int64_t columnSumTileColumns(c10::ScalarType dtype);
// Blocks along the columns and along the rows (parts) for [rows, columns].
int64_t columnSumTiles(int64_t columns, c10::ScalarType dtype);
int64_t columnSumParts(int64_t rows);

// Why [*, columns] of `dtype` cannot be generated ("" when it can): f32 or
// bf16, and a row a whole number of 16-byte pieces.
std::string columnSumUnsupported(int64_t columns, c10::ScalarType dtype);

// spmd::column_sum's kernels: the columns and their dtype. Key
// "column_sum c=3072 in=f32".
class ColumnSumKernelSpec final : public KernelSpec {
 public:
  // Throws std::invalid_argument for what columnSumUnsupported refuses.
  ColumnSumKernelSpec(int64_t columns, c10::ScalarType dtype);
  // spmd::column_sum(input, keepdim): the input's last dimension and dtype.
  static ColumnSumKernelSpec forCall(const KernelCallArgs& call);
  // For [rows, columns]: spmd_column_sum_whole alone up to
  // kColumnSumWholeRows rows; else spmd_column_sum into
  // columnSumParts(rows) rows of float partial sums, then
  // spmd_column_sum_parts over them. No launch for rows = 0 (the caller
  // fills the result with zeros).
  std::vector<KernelLaunch> launches(int64_t rows) const;

 private:
  std::string generateSource() const override;

  int64_t columns_;
  c10::ScalarType dtype_;
};

}  // namespace spmd

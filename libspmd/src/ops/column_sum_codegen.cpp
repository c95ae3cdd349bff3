#include "spmd/ops/column_sum_codegen.h"

#include "spmd/ops/cuda_emitter.h"

#include <stdexcept>

namespace spmd {
namespace {

constexpr const char* kKernels = R"(
// A block's share of a column sum: rows [first, end) of tile `tile`'s
// columns, 16 bytes of a row a lane (warp w takes rows first + w,
// first + w + kWarps, ...). The warps' sums are added in warp order and each
// column's total is handed to store(column, total).
template <typename Store>
__device__ __forceinline__ void spmd_sum_tile(const spmd_in* x, long long tile, long long first, long long end,
                                              Store store) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long piece = tile * 32 + lane;  // this lane's 16 bytes of a row
  float s[kPerPiece];
#pragma unroll
  for (int e = 0; e < kPerPiece; ++e) s[e] = 0.0f;
  if (piece < kPieces) {
    for (long long r = first + warp; r < end; r += kWarps) {
      float v[kPerPiece];
      spmd_load(x + r * kColumns, piece, v);
#pragma unroll
      for (int e = 0; e < kPerPiece; ++e) s[e] += v[e];
    }
  }
  __shared__ float acc[kWarps][32 * kPerPiece];
#pragma unroll
  for (int e = 0; e < kPerPiece; ++e) acc[warp][lane * kPerPiece + e] = s[e];
  __syncthreads();
  for (int c = threadIdx.x; c < 32 * kPerPiece; c += kThreads) {
    const long long column = tile * 32 * kPerPiece + c;
    if (column < kColumns) {
      float t = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) t += acc[k][c];
      store(column, t);
    }
  }
}

struct spmd_to_partial {  // a part's float sums
  float* row;
  __device__ void operator()(long long column, float t) const { row[column] = t; }
};
struct spmd_to_out {  // the result, in the output's dtype
  spmd_out* out;
  __device__ void operator()(long long column, float t) const { spmd_store(out, column, t); }
};

extern "C" __global__ void __launch_bounds__(kThreads) spmd_column_sum(const spmd_in* x, float* partial,
                                                                     long long rows) {
  const long long tile = blockIdx.x % kTiles, part = blockIdx.x / kTiles;
  const long long first = part * kBlockRows, end = first + kBlockRows < rows ? first + kBlockRows : rows;
  spmd_sum_tile(x, tile, first, end, spmd_to_partial{partial + part * kColumns});
}

extern "C" __global__ void __launch_bounds__(kThreads) spmd_column_sum_whole(const spmd_in* x, spmd_out* out,
                                                                           long long rows) {
  spmd_sum_tile(x, blockIdx.x, 0, rows, spmd_to_out{out});
}

extern "C" __global__ void __launch_bounds__(kPartsThreads) spmd_column_sum_parts(const float* partial, spmd_out* out,
                                                                                 long long parts) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long column = (long long)blockIdx.x * 32 + lane;
  float s = 0.0f;
  if (column < kColumns) {
    for (long long p = warp; p < parts; p += kPartsThreads / 32) s += partial[p * kColumns + column];
  }
  __shared__ float acc[kPartsThreads / 32][32];
  acc[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && column < kColumns) {
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < kPartsThreads / 32; ++k) t += acc[k][lane];
    spmd_store(out, column, t);
  }
}
)";

bool isBf16(c10::ScalarType t) { return t == c10::ScalarType::BFloat16; }

// Loads of a row's 16-byte piece as floats, and one element stored.
std::string accessors(c10::ScalarType dtype) {
  const std::string perPiece = isBf16(dtype) ? "8" : "4";
  std::string s = (isBf16(dtype) ? bfloat16Helpers() : "") + storageTypedef("spmd_in", dtype) +
                  storageTypedef("spmd_out", dtype) + vectorStruct("spmd_piece", dtype, perPiece, 16) +
                  "__device__ __forceinline__ void spmd_load(const spmd_in* row, long long piece, float v[" + perPiece +
                  "]) {\n" + "  const spmd_piece q = reinterpret_cast<const spmd_piece*>(row)[piece];\n" +
                  "#pragma unroll\n  for (int e = 0; e < " + perPiece + "; ++e) v[e] = " + toFloatExpr(dtype, "q.v[e]") +
                  ";\n}\n" + "__device__ __forceinline__ void spmd_store(spmd_out* out, long long i, float v) {";
  // Kept as each dtype's source had it: the f32 store on one line.
  return s + (isBf16(dtype) ? "\n  out[i] = " + fromFloatExpr(dtype, "v") + ";\n}\n" : " out[i] = v; }\n");
}

int64_t perPiece(c10::ScalarType dtype) { return isBf16(dtype) ? 8 : 4; }

}  // namespace

int64_t columnSumTileColumns(c10::ScalarType dtype) { return 32 * perPiece(dtype); }

int64_t columnSumTiles(int64_t columns, c10::ScalarType dtype) {
  const int64_t tile = columnSumTileColumns(dtype);
  return (columns + tile - 1) / tile;
}

int64_t columnSumParts(int64_t rows) { return (rows + kColumnSumBlockRows - 1) / kColumnSumBlockRows; }

std::string columnSumUnsupported(int64_t columns, c10::ScalarType dtype) {
  if (dtype != c10::ScalarType::Float && !isBf16(dtype)) return "a dtype other than f32 and bf16";
  if (columns < 1 || columns % perPiece(dtype) != 0) {
    return std::to_string(columns) + " columns, not a multiple of " + std::to_string(perPiece(dtype));
  }
  if (columns > (int64_t{1} << 30)) return std::to_string(columns) + " columns";
  return "";
}

namespace {

// The key, once the attributes are checked.
std::string columnSumKey(int64_t columns, c10::ScalarType dtype) {
  const std::string why = columnSumUnsupported(columns, dtype);
  if (!why.empty()) throw std::invalid_argument("column sum: " + why);
  return "column_sum c=" + std::to_string(columns) + " in=" + (isBf16(dtype) ? "bf16" : "f32");
}

}  // namespace

ColumnSumKernelSpec::ColumnSumKernelSpec(int64_t columns, c10::ScalarType dtype)
    : KernelSpec(columnSumKey(columns, dtype)), columns_(columns), dtype_(dtype) {}

ColumnSumKernelSpec ColumnSumKernelSpec::forCall(const KernelCallArgs& call) {
  const std::vector<int64_t> shape = call.shape(0);
  if (shape.empty()) throw std::invalid_argument("an input of no dimensions");
  return ColumnSumKernelSpec(shape.back(), call.dtype(0));
}

std::vector<KernelLaunch> ColumnSumKernelSpec::launches(int64_t rows) const {
  const int64_t tiles = columnSumTiles(columns_, dtype_);
  if (rows == 0) return {};
  if (rows <= kColumnSumWholeRows) return {{kColumnSumWholeKernelName, tiles, 32 * kColumnSumWarps, 0, rows}};
  const int64_t parts = columnSumParts(rows);
  return {{kColumnSumKernelName, parts * tiles, 32 * kColumnSumWarps, 0, rows},
          {kColumnSumPartsKernelName, (columns_ + 31) / 32, kColumnSumPartsThreads, 0, parts}};
}

std::string ColumnSumKernelSpec::generateSource() const {
  const int64_t columns = columns_;
  const c10::ScalarType dtype = dtype_;
  std::string src = generatedBanner();
  src += "// column sum over " + std::to_string(columns) + " columns of " + (isBf16(dtype) ? "bf16" : "f32") + "\n";
  src += "constexpr long long kColumns = " + std::to_string(columns) + ";\n";
  src += "constexpr int kPerPiece = " + std::to_string(perPiece(dtype)) + ";  // elements in 16 bytes\n";
  src += "constexpr long long kPieces = " + std::to_string(columns / perPiece(dtype)) + ";\n";
  src += "constexpr long long kTiles = " + std::to_string(columnSumTiles(columns, dtype)) +
         ";  // blocks along a row, 32 pieces each\n";
  src += "constexpr long long kBlockRows = " + std::to_string(kColumnSumBlockRows) + ";  // rows a part sums\n";
  src += "constexpr int kWarps = " + std::to_string(kColumnSumWarps) + ";\n";
  src += "constexpr int kThreads = " + std::to_string(32 * kColumnSumWarps) + ";\n";
  src += "constexpr int kPartsThreads = " + std::to_string(kColumnSumPartsThreads) + ";\n\n";
  return src + accessors(dtype) + kKernels;
}

}  // namespace spmd

// column-sum-to-kernel (spmd-lower runs it for --device cuda, with generated
// kernels): a sum over every dimension but the last, which is what a Linear
// bias's gradient records,
//
//   %db: f32[1,C] = aten::sum.dim_IntList(%g, [0], True, None)     (%g: f32[R,C])
//     -> %db: f32[1,C] = spmd::column_sum(%g, True)
//
// becomes spmd::column_sum (ops/column_sum_ops.cpp), generated kernels
// whose order of additions is fixed (one kernel up to kColumnSumWholeRows
// rows, two beyond). Taken: f32 or bf16 input of at least
// two dimensions, the result in the input's dtype (no dtype argument), the
// last dimension a whole number of 16-byte pieces, at least kMinRows rows. Other sums stay ATen's;
// only those over the leading dimensions that this pass does not take get
// a note. Not done here: the sum taken into the kernel that makes %g.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/column_sum_codegen.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <string>
#include <vector>

namespace spmd {
namespace {

// Whether `dims` (negative ones counted from the end) are exactly
// 0 .. rank - 2, in any order.
bool leadingDims(std::vector<int64_t> dims, size_t rank) {
  if (rank < 2 || dims.size() != rank - 1) return false;
  for (int64_t& d : dims) d = d < 0 ? d + static_cast<int64_t>(rank) : d;
  std::sort(dims.begin(), dims.end());
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] != static_cast<int64_t>(k)) return false;
  }
  return true;
}

// A sum over one row is a copy: left to ATen.
constexpr int64_t kMinRows = 2;

int64_t rowsOf(const Value& v) {
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < v.shape.size(); ++d) rows *= v.shape[d];
  return rows;
}

class ColumnSumToKernel final : public RewritePattern {
 public:
  ColumnSumToKernel() : RewritePattern("column-sum-to-kernel", {"aten::sum.dim_IntList"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& n) override {
    if (n.args.size() != 4) return MatchResult::skip();
    const Arg &x = argument(n, "self"), &dims = argument(n, "dim"), &keepdim = argument(n, "keepdim"),
              &dtype = argument(n, "dtype");
    if (x.kind != Arg::Kind::Value || dims.kind != Arg::Kind::Ints || keepdim.kind != Arg::Kind::Bool) {
      return MatchResult::skip();
    }
    const Value& in = g.value(x.value);
    if (!leadingDims(dims.ints, in.shape.size()) || rowsOf(in) < kMinRows) return MatchResult::skip();
    std::string why = columnSumUnsupported(in.shape.back(), in.dtype);
    if (why.empty() && dtype.kind != Arg::Kind::None) why = "a dtype argument";
    if (!why.empty()) return MatchResult::failure(why);
    GraphBuilder b(g);
    b.setMeta(n.meta);
    b.replace(n, "spmd::column_sum", {x, keepdim});
    return MatchResult::success();
  }
};

class FuseColumnSumPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    const int fused = applyPatternsNotingFailures(g, {&pattern_},
                                                  diagnostics, "column-sum-to-kernel: not fused: ").total();
    count("sum(s) over the rows as generated kernels", fused);
    return fused > 0;
  }

 private:
  ColumnSumToKernel pattern_;
};

}  // namespace

std::unique_ptr<Pass> createFuseColumnSumPass(const PipelineOptions&) { return std::make_unique<FuseColumnSumPass>(); }

}  // namespace spmd

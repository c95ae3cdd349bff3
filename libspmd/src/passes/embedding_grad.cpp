// embedding-grad (spmd-lower runs it for --cudagraphs on CUDA): each embedding_dense_backward
// becomes new_zeros + index_add, which a CUDA graph can hold. CUDA's
// embedding_dense_backward sorts the indices and sizes its segments on the
// host, so a step with an embedding could not be captured at all.
//
//   flat_grad = reshape(grad, [-1, D]); flat_index = reshape(indices, [-1])
//   (padding_idx p >= 0: flat_grad = where(unsqueeze(flat_index != p, 1), flat_grad, 0))
//   weight_grad = index_add(new_zeros(flat_grad, [num_weights, D]), 0, flat_index, flat_grad)
//
// The sums are the same, but on CUDA index_add adds with atomics: rows that
// several tokens share may round differently from run to run (not
// bit-reproducible). scale_grad_by_freq divides by counts made on the host:
// such nodes stay, and check-capture notes them.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

namespace spmd {
namespace {

bool rewritable(const Graph& g, const Node& n) {
  if (n.args.size() != 5 || n.outputs.size() != 1) return false;
  const Arg& grad = n.args[0];
  const Arg& scaleByFreq = n.args[4];
  return grad.kind == Arg::Kind::Value && n.args[1].kind == Arg::Kind::Value && n.args[2].kind == Arg::Kind::Int &&
         n.args[3].kind == Arg::Kind::Int && scaleByFreq.kind == Arg::Kind::Bool && !scaleByFreq.b &&
         !g.value(grad.value).shape.empty();
}

void rewrite(Graph& g, const Node& n) {
  GraphBuilder b(g);
  b.setInsertionPoint(n);
  b.setMeta(n.meta);
  const int64_t numWeights = n.args[2].i, paddingIdx = n.args[3].i, dim = g.value(n.args[0].value).shape.back();
  const std::string base = g.value(n.outputs[0]).name;
  ValueId flatGrad = b.call("aten::reshape", {n.args[0], intsArg({-1, dim})}, base + "_rows");
  const ValueId flatIndex = b.call("aten::reshape", {n.args[1], intsArg({-1})}, base + "_index");
  if (paddingIdx >= 0) {
    const ValueId keep = b.call("aten::ne.Scalar", {Arg::tensor(flatIndex), Arg::ofInt(paddingIdx)}, base + "_keep");
    const ValueId keepRows = b.call("aten::unsqueeze", {Arg::tensor(keep), Arg::ofInt(1)}, base + "_keep_rows");
    flatGrad = b.call("aten::where.ScalarOther", {Arg::tensor(keepRows), Arg::tensor(flatGrad), Arg::ofFloat(0.0)},
                      base + "_kept");
  }
  const ValueId zeros = b.call("aten::new_zeros", {Arg::tensor(flatGrad), intsArg({numWeights, dim}), Arg::none(),
                                                   Arg::none(), Arg::none(), Arg::none()},
                               base + "_zeros");
  b.replace(n, "aten::index_add",
            {Arg::tensor(zeros), Arg::ofInt(0), Arg::tensor(flatIndex), Arg::tensor(flatGrad), Arg::ofInt(1)});
}


class EmbeddingGradToIndexAdd final : public RewritePattern {
 public:
  EmbeddingGradToIndexAdd() : RewritePattern("embedding-grad-to-index-add", {"aten::embedding_dense_backward"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& n) override {
    if (!rewritable(g, n)) return MatchResult::skip();
    rewrite(g, n);
    return MatchResult::success();
  }
};

class EmbeddingGradPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override;
};

}  // namespace

std::unique_ptr<Pass> createEmbeddingGradPass(const PipelineOptions&) { return std::make_unique<EmbeddingGradPass>(); }

bool EmbeddingGradPass::run(Graph& g, DiagnosticEngine& diagnostics) {
  EmbeddingGradToIndexAdd pattern;
  const int rewritten = applyPatternsGreedily(g, {&pattern}, nullptr).total();
  count("embedding_dense_backward(s) as index_add, which a CUDA graph can hold", rewritten);
  if (rewritten > 0) {
    diagnostics.note("embedding-grad: on CUDA, index_add's atomic adds make those gradients not bit-reproducible "
                     "from run to run");
  }
  return rewritten > 0;
}

}  // namespace spmd

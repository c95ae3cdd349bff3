// embedding-grad: with --cudagraphs on CUDA, each embedding_dense_backward
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
#include "spmd/passes/pass.h"

namespace spmd {
namespace {

Arg ints(std::vector<int64_t> v) {
  Arg a;
  a.kind = Arg::Kind::Ints;
  a.ints = std::move(v);
  return a;
}

bool rewritable(const Graph& g, const Node& n) {
  if (n.qualifiedName() != "aten::embedding_dense_backward" || n.args.size() != 5 || n.outputs.size() != 1) return false;
  const Arg& grad = n.args[0];
  const Arg& scaleByFreq = n.args[4];
  return grad.kind == Arg::Kind::Value && n.args[1].kind == Arg::Kind::Value && n.args[2].kind == Arg::Kind::Int &&
         n.args[3].kind == Arg::Kind::Int && scaleByFreq.kind == Arg::Kind::Bool && !scaleByFreq.b &&
         !g.value(grad.value).shape.empty();
}

// Adds `op(args)` with one output of the given type, named after `base`.
ValueId emit(Graph& g, const Node& like, const std::string& op, const std::string& overload, std::vector<Arg> args,
             const std::string& base, c10::ScalarType dtype, std::vector<int64_t> shape) {
  const ValueId out = g.addValue({g.freshName(base), dtype, std::move(shape)});
  Node n;
  n.op = op;
  n.overload = overload;
  n.args = std::move(args);
  n.outputs = {out};
  n.meta = like.meta;
  g.addNode(std::move(n));
  return out;
}

void rewrite(Graph& g, const Node& n) {
  const Value grad = g.value(n.args[0].value);
  const Value indices = g.value(n.args[1].value);
  const int64_t numWeights = n.args[2].i, paddingIdx = n.args[3].i, dim = grad.shape.back();
  const int64_t rows = numel(indices);
  const std::string base = g.value(n.outputs[0]).name;
  ValueId flatGrad = emit(g, n, "aten::reshape", "", {n.args[0], ints({-1, dim})}, base + "_rows", grad.dtype, {rows, dim});
  const ValueId flatIndex =
      emit(g, n, "aten::reshape", "", {n.args[1], ints({-1})}, base + "_index", indices.dtype, {rows});
  if (paddingIdx >= 0) {
    const ValueId keep = emit(g, n, "aten::ne", "Scalar", {Arg::tensor(flatIndex), Arg::ofInt(paddingIdx)},
                              base + "_keep", c10::ScalarType::Bool, {rows});
    const ValueId keepRows = emit(g, n, "aten::unsqueeze", "", {Arg::tensor(keep), Arg::ofInt(1)}, base + "_keep_rows",
                                  c10::ScalarType::Bool, {rows, 1});
    flatGrad = emit(g, n, "aten::where", "ScalarOther", {Arg::tensor(keepRows), Arg::tensor(flatGrad), Arg::ofFloat(0.0)},
                    base + "_kept", grad.dtype, {rows, dim});
  }
  const ValueId zeros = emit(g, n, "aten::new_zeros", "",
                             {Arg::tensor(flatGrad), ints({numWeights, dim}), Arg::none(), Arg::none(), Arg::none(), Arg::none()},
                             base + "_zeros", grad.dtype, {numWeights, dim});
  Node add;
  add.op = "aten::index_add";
  add.args = {Arg::tensor(zeros), Arg::ofInt(0), Arg::tensor(flatIndex), Arg::tensor(flatGrad), Arg::ofInt(1)};
  add.outputs = n.outputs;
  add.meta = n.meta;
  g.addNode(std::move(add));
}

}  // namespace

bool runEmbeddingGrad(Graph& g, const PipelineOptions& options) {
  if (!options.lower.cudagraphs || options.lower.device != "cuda") return false;
  size_t rewritten = 0;
  for (Node& n : g.takeNodes()) {
    if (rewritable(g, n)) {
      rewrite(g, n);
      ++rewritten;
    } else {
      g.addNode(std::move(n));
    }
  }
  if (rewritten > 0 && options.notes) {
    options.notes->push_back("embedding-grad: " + std::to_string(rewritten) +
                             " embedding_dense_backward became index_add, which a CUDA graph can hold; on CUDA its "
                             "atomic adds make those gradients not bit-reproducible from run to run");
  }
  return rewritten > 0;
}

}  // namespace spmd

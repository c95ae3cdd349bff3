#include "spmd/passes/clip_grad_norm.h"

#include "spmd/ir/training.h"

#include <numeric>

namespace spmd {
namespace {

// aten::norm(t, 2, all dims): torch.norm(t, 2.0) on a strided tensor.
ValueId euclideanNorm(GraphBuilder& b, ValueId t, const std::string& name) {
  std::vector<int64_t> dims(b.value(t).shape.size());
  std::iota(dims.begin(), dims.end(), 0);
  return b.call("aten::norm.ScalarOpt_dim", {Arg::tensor(t), Arg::ofFloat(2.0), intsArg(dims), Arg::ofBool(false)}, name);
}

ValueId maxAbs(GraphBuilder& b, ValueId t, const std::string& name) {
  return b.call("aten::max", {Arg::tensor(b.call("aten::abs", {Arg::tensor(t)}))}, name);
}

}  // namespace

ClippedGradients clipGradNorm(GraphBuilder& b, const std::vector<ValueId>& gradients, double maxNorm, double normType) {
  ClippedGradients out;
  if (gradients.empty()) return out;
  const bool inf = normType == kInfNorm;
  std::vector<ValueId> norms;
  for (ValueId g : gradients) {
    const std::string name = b.value(g).name + ".norm";
    norms.push_back(inf ? maxAbs(b, g, name) : euclideanNorm(b, g, name));
  }
  Arg list;
  list.kind = Arg::Kind::Values;
  list.values = norms;
  if (inf) {
    out.totalNorm = norms.size() == 1 ? norms[0]
                                      : b.call("aten::max", {Arg::tensor(b.call("aten::stack", {list, Arg::ofInt(0)}))}, "grad_norm");
  } else {
    out.totalNorm = euclideanNorm(b, b.call("aten::stack", {list, Arg::ofInt(0)}), "grad_norm");
  }
  const ValueId shifted = b.call("aten::add.Scalar", {Arg::tensor(out.totalNorm), Arg::ofFloat(1e-6), Arg::ofInt(1)});
  const ValueId coef = b.mulScalar(b.call("aten::reciprocal", {Arg::tensor(shifted)}), maxNorm);
  const ValueId clamped = b.call("aten::clamp", {Arg::tensor(coef), Arg::none(), Arg::ofFloat(1.0)}, "clip_coef");
  for (ValueId g : gradients) out.clipped.push_back(b.call("aten::mul.Tensor", {Arg::tensor(g), Arg::tensor(clamped)},
                                                           b.value(g).name + ".clipped"));
  return out;
}

}  // namespace spmd

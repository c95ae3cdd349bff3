// cat-views (spmd-lower runs it for --device cuda): a cat along the last
// dimension whose inputs are [..., H * D] reshapes of [..., H, D] tensors
// becomes a cat of those tensors along their second-to-last dimension and a
// view of the result. That is what attention's backward records for the
// q/k/v projection's gradient:
//
//   %c = aten::clone(%dq_t, torch.contiguous_format)      (%dq_t: [B, T, H, D], a transpose)
//   %dq = aten::_unsafe_view(%c, [B, T, H * D])
//   %dk = aten::_reshape_alias(%dk_t, [B, T, H * D], ...)
//   %g = aten::cat([%dq, %dk, %dv], 2)
//     -> %cat = aten::cat([%dq_t, %dk_t, %dv_t], 2)          ([B, T, 3 H, D])
//        %g = aten::view(%cat, [B, T, 3 H D])
//
// so the cat reads the strided tensors itself and the clones, each a copy
// of a whole gradient, are gone (dce erases them when nothing else reads them). The
// values are the same, bit for bit. Not done here: cats along other
// dimensions, or of inputs that are not such reshapes.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace spmd {
namespace {

// The [..., H, D] tensor that `v` ([..., H * D]) reshapes, or nullopt.
std::optional<ValueId> reshapedFrom(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  if (!n || n->args.empty() || n->args[0].kind != Arg::Kind::Value) return std::nullopt;
  ValueId source = n->args[0].value;
  static const OpName kUnsafeView = OpName::known("aten::_unsafe_view"), kClone = OpName::known("aten::clone"),
                      kReshapeAlias = OpName::known("aten::_reshape_alias"), kView = OpName::known("aten::view"),
                      kReshape = OpName::known("aten::reshape");
  if (n->is(kUnsafeView)) {
    const Node* clone = producerOf(g, *n, 0, kClone);
    if (!clone || clone->args[0].kind != Arg::Kind::Value) return std::nullopt;
    source = clone->args[0].value;
  } else if (!n->is(kReshapeAlias) && !n->is(kView) && !n->is(kReshape)) {
    return std::nullopt;
  }
  const Value &from = g.value(source), &to = g.value(v);
  if (from.dtype != to.dtype || from.shape.size() != to.shape.size() + 1 || to.shape.empty()) return std::nullopt;
  for (size_t d = 0; d + 1 < to.shape.size(); ++d) {
    if (from.shape[d] != to.shape[d]) return std::nullopt;
  }
  const size_t r = from.shape.size();
  if (from.shape[r - 2] * from.shape[r - 1] != to.shape.back()) return std::nullopt;
  return source;
}

// Rewrites `cat`, returning whether it did.
bool rewrite(Graph& g, const Node& cat) {
  static const OpName kUnsafeView = OpName::known("aten::_unsafe_view");
  if (cat.args.size() != 2 || cat.args[0].kind != Arg::Kind::Values || cat.args[1].kind != Arg::Kind::Int) return false;
  const std::vector<ValueId> parts = cat.args[0].values;
  const Value& out = g.value(cat.outputs[0]);
  const int64_t rank = static_cast<int64_t>(out.shape.size());
  if (parts.size() < 2 || (cat.args[1].i != rank - 1 && cat.args[1].i != -1)) return false;
  std::vector<ValueId> sources;
  bool cloned = false;
  for (ValueId p : parts) {
    const std::optional<ValueId> s = reshapedFrom(g, p);
    // The pieces are cat along [..., H, D]'s H: they must agree on D.
    if (!s || g.value(*s).shape.back() != g.value(sources.empty() ? *s : sources[0]).shape.back()) return false;
    sources.push_back(*s);
    cloned = cloned || g.producer(p)->is(kUnsafeView);
  }
  if (!cloned) return false;  // no copy to save
  Arg list;
  list.kind = Arg::Kind::Values;
  list.values = sources;
  GraphBuilder b(g);
  b.setMeta(cat.meta);
  b.setInsertionPoint(cat);
  const ValueId wide = b.call("aten::cat", {list, Arg::ofInt(rank - 1)}, "cat");
  Arg shape;
  shape.kind = Arg::Kind::Ints;
  shape.ints = out.shape;
  b.replace(cat, "aten::view", {Arg::tensor(wide), shape});
  return true;
}

class CatOfReshapes final : public RewritePattern {
 public:
  CatOfReshapes() : RewritePattern("cat-of-reshapes", {"aten::cat"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& cat) override {
    return rewrite(g, cat) ? MatchResult::success() : MatchResult::skip();
  }
};

class CatViewsPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    CatOfReshapes pattern;
    const int rewritten = applyPatternsGreedily(g, {&pattern}, nullptr).total();
    count("cat(s) read the tensors their inputs reshape, their copies gone", rewritten);
    return rewritten > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createCatViewsPass(const PipelineOptions&) { return std::make_unique<CatViewsPass>(); }

}  // namespace spmd

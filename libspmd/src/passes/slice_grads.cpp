// slice-grads (spmd-lower): the gradients autograd writes for slices and
// concatenations without the zero-filled tensors it builds them from.
//
// A slice's backward, slice_backward(g, sizes, dim, start, end, 1), fills a
// tensor of `sizes` with zeros and copies g into its range. Two of them over
// ranges that split the dimension, added (cat's backward feeding a slice's,
// as in rotary embeddings' rotate_half), are a concatenation:
//
//   %a = aten::slice_backward(%lo, S, d, 0, h, 1)
//   %b = aten::slice_backward(%hi, S, d, h, end, 1)
//   %s = aten::add.Tensor(%a, %b, 1)            ->  %s = aten::cat([%lo, %hi], d)
//
// and one over the whole dimension is its gradient itself. The values are
// the same (x + 0 is x; only a -0.0 stays -0.0 instead of becoming +0.0);
// two fills, two copies and an add become one copy, or none. Taken only
// where the slice_backward results are read by nothing else.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <optional>
#include <string>

namespace spmd {
namespace {

// A slice_backward with step 1: what it scatters, along which dimension,
// into which range of a tensor of which shape (bounds clamped as slice's).
struct SliceGrad {
  ValueId grad = kNoValue;
  std::vector<int64_t> sizes;
  int64_t dim = 0, start = 0, end = 0;
};

std::optional<SliceGrad> sliceGrad(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  static const OpName kSliceBackward = OpName::known("aten::slice_backward");
  if (!n || !n->is(kSliceBackward) || n->args.size() != 6) return std::nullopt;
  const auto& a = n->args;
  if (a[0].kind != Arg::Kind::Value || a[1].kind != Arg::Kind::Ints || a[2].kind != Arg::Kind::Int ||
      a[3].kind != Arg::Kind::Int || a[4].kind != Arg::Kind::Int || a[5].kind != Arg::Kind::Int || a[5].i != 1) {
    return std::nullopt;
  }
  SliceGrad s{a[0].value, a[1].ints, a[2].i, a[3].i, a[4].i};
  const int64_t rank = static_cast<int64_t>(s.sizes.size());
  if (s.dim < 0) s.dim += rank;
  if (s.dim < 0 || s.dim >= rank) return std::nullopt;
  const int64_t length = s.sizes[s.dim];
  auto clamp = [&](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + length : i, 0, length); };
  s.start = clamp(s.start);
  s.end = std::max(s.start, clamp(s.end));
  return s;
}

// add(slice_backward(lo, ...), slice_backward(hi, ...), 1) -> cat([lo, hi], d).
class SumOfSliceGradsToCat final : public RewritePattern {
 public:
  SumOfSliceGradsToCat() : RewritePattern("sum-of-slice-grads-to-cat", {"aten::add.Tensor"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& add) override;
};

// slice_backward(g, sizes, d, 0, end, 1) over all of d: g itself.
class WholeSliceGradToInput final : public RewritePattern {
 public:
  WholeSliceGradToInput() : RewritePattern("whole-slice-grad-to-input", {"aten::slice_backward"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& n) override;
};

class SliceGradsPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    // The sums first, then the whole slices: a whole slice that is a part of
    // a sum (beside an empty one) goes into the cat, as it always has.
    SumOfSliceGradsToCat sums;
    WholeSliceGradToInput wholes;
    const int cats = applyPatternsGreedily(g, {&sums}, nullptr).total();
    const int whole = applyPatternsGreedily(g, {&wholes}, nullptr).total();
    count("sums of slice gradients as cat", cats);
    count("whole-dimension slice gradients dropped", whole);
    return cats + whole > 0;
  }
};

MatchResult SumOfSliceGradsToCat::matchAndRewrite(Graph& g, const Node& add) {
  if (add.args.size() != 3 || add.args[0].kind != Arg::Kind::Value || add.args[1].kind != Arg::Kind::Value ||
      add.args[2].kind != Arg::Kind::Int || add.args[2].i != 1) {
    return MatchResult::skip();
  }
  const ValueId x = add.args[0].value, y = add.args[1].value;
  std::optional<SliceGrad> a = sliceGrad(g, x), b = sliceGrad(g, y);
  if (!a || !b || x == y || g.soleReader(x) != &add || g.soleReader(y) != &add) return MatchResult::skip();
  if (a->start > b->start) std::swap(a, b);
  const Value& out = g.value(add.outputs[0]);
  const bool splits = a->sizes == b->sizes && a->dim == b->dim && a->start == 0 && a->end == b->start &&
                      b->end == a->sizes[a->dim] && out.shape == a->sizes && g.value(a->grad).dtype == out.dtype &&
                      g.value(b->grad).dtype == out.dtype;
  if (!splits) return MatchResult::skip();
  const Node* lower = g.producer(x);
  const Node* upper = g.producer(y);
  Arg parts;
  parts.kind = Arg::Kind::Values;
  parts.values = {a->grad, b->grad};
  GraphBuilder builder(g);
  builder.setMeta(add.meta);
  builder.replace(add, "aten::cat", {parts, Arg::ofInt(a->dim)});
  g.erase(*lower);
  g.erase(*upper);
  return MatchResult::success();
}

MatchResult WholeSliceGradToInput::matchAndRewrite(Graph& g, const Node& n) {
  if (n.outputs.size() != 1) return MatchResult::skip();
  const std::optional<SliceGrad> s = sliceGrad(g, n.outputs[0]);
  if (!s || s->start != 0 || s->end != s->sizes[s->dim] || g.value(s->grad).shape != s->sizes ||
      g.readBeyondNodes(n.outputs[0])) {
    return MatchResult::skip();
  }
  g.replaceAllUsesWith(n.outputs[0], s->grad);
  g.erase(n);
  return MatchResult::success();
}

}  // namespace

std::unique_ptr<Pass> createSliceGradsPass(const PipelineOptions&) { return std::make_unique<SliceGradsPass>(); }

}  // namespace spmd

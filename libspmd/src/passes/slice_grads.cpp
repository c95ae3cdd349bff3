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
//
// A select's backward, select_backward(g, sizes, dim, index), is likewise
// g in a zero-filled tensor. A chain of adds of them over one small
// dimension that names each of its indices at least once (the backward of
// rotary embeddings written on [..., pairs, 2] views, as Meta's LLaMA and
// torchtune write them: four for each of q and k) is a stack of each
// index's gradients, summed in the chain's order:
//
//   %a = aten::select_backward(%g0, S, d, 0)
//   %b = aten::select_backward(%g1, S, d, 1)
//   %c = aten::select_backward(%g2, S, d, 1)
//   %s = aten::add.Tensor(aten::add.Tensor(%a, %b, 1), %c, 1)
//     ->  %s = aten::stack([%g0, aten::add.Tensor(%g1, %g2, 1)], d)
//
// The same values (signed zeros aside, as above); the fills, the copies
// and the full-size adds become half-size adds and one copy. Taken only for
// left-deep chains (each add reads the one before as its first argument),
// where every add and select_backward is read by the next alone.
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

// select_backward(g, sizes, d, i): g's place in a zero tensor of `sizes`.
struct SelectGrad {
  ValueId grad = kNoValue;
  std::vector<int64_t> sizes;
  int64_t dim = 0, index = 0;
};

// Dimensions at most this long are stacked: rotary embeddings' pairs, 2.
constexpr int64_t kMaxStackedIndices = 16;

std::optional<SelectGrad> selectGrad(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  static const OpName kSelectBackward = OpName::known("aten::select_backward");
  if (!n || !n->is(kSelectBackward) || n->args.size() != 4) return std::nullopt;
  const auto& a = n->args;
  if (a[0].kind != Arg::Kind::Value || a[1].kind != Arg::Kind::Ints || a[2].kind != Arg::Kind::Int ||
      a[3].kind != Arg::Kind::Int) {
    return std::nullopt;
  }
  SelectGrad s{a[0].value, a[1].ints, a[2].i, a[3].i};
  const int64_t rank = static_cast<int64_t>(s.sizes.size());
  if (s.dim < 0) s.dim += rank;
  if (s.dim < 0 || s.dim >= rank) return std::nullopt;
  if (s.index < 0) s.index += s.sizes[s.dim];
  if (s.index < 0 || s.index >= s.sizes[s.dim]) return std::nullopt;
  return s;
}

// add.Tensor(x, y, 1) of two values.
bool isPlainAdd(const Node& n) {
  static const OpName kAdd = OpName::known("aten::add.Tensor");
  return n.is(kAdd) && n.args.size() == 3 && n.args[0].kind == Arg::Kind::Value &&
         n.args[1].kind == Arg::Kind::Value && n.args[2].kind == Arg::Kind::Int && n.args[2].i == 1;
}

// add(...add(select_backward, select_backward)..., select_backward) -> stack.
class SumOfSelectGradsToStack final : public RewritePattern {
 public:
  SumOfSelectGradsToStack() : RewritePattern("sum-of-select-grads-to-stack", {"aten::add.Tensor"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& add) override;
};

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
    SumOfSelectGradsToStack selects;
    const int cats = applyPatternsGreedily(g, {&sums}, nullptr).total();
    const int whole = applyPatternsGreedily(g, {&wholes}, nullptr).total();
    const int stacks = applyPatternsGreedily(g, {&selects}, nullptr).total();
    count("sums of slice gradients as cat", cats);
    count("whole-dimension slice gradients dropped", whole);
    if (stacks) count("sums of select gradients as stack", stacks);
    return cats + whole + stacks > 0;
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

MatchResult SumOfSelectGradsToStack::matchAndRewrite(Graph& g, const Node& top) {
  if (!isPlainAdd(top)) return MatchResult::skip();
  // Only at the chain's last add: one that the next add of a chain reads first is not.
  const Node* reader = g.soleReader(top.outputs[0]);
  if (reader && isPlainAdd(*reader) && reader->args[0].value == top.outputs[0] &&
      selectGrad(g, reader->args[1].value)) {
    return MatchResult::skip();
  }
  // The chain's adds from the last to the first, and its terms in the chain's order.
  std::vector<const Node*> adds = {&top};
  while (true) {
    const Node* inner = g.producer(adds.back()->args[0].value);
    if (!inner || !isPlainAdd(*inner) || g.soleReader(inner->outputs[0]) != adds.back()) break;
    adds.push_back(inner);
  }
  std::vector<ValueId> terms = {adds.back()->args[0].value};
  for (auto it = adds.rbegin(); it != adds.rend(); ++it) terms.push_back((*it)->args[1].value);
  std::vector<SelectGrad> grads;
  for (ValueId t : terms) {
    std::optional<SelectGrad> s = selectGrad(g, t);
    if (!s || !g.hasOneReader(t)) return MatchResult::skip();
    grads.push_back(std::move(*s));
  }
  const SelectGrad& first = grads.front();
  const Value& out = g.value(top.outputs[0]);
  const int64_t width = first.sizes[first.dim];
  if (width > kMaxStackedIndices || out.shape != first.sizes) return MatchResult::skip();
  std::vector<std::vector<ValueId>> byIndex(width);
  for (const SelectGrad& s : grads) {
    if (s.sizes != first.sizes || s.dim != first.dim || g.value(s.grad).dtype != out.dtype) return MatchResult::skip();
    byIndex[s.index].push_back(s.grad);
  }
  for (const auto& parts : byIndex) {
    if (parts.empty()) return MatchResult::skip();  // an index no term fills: zeros, not taken
  }
  GraphBuilder builder(g);
  builder.setInsertionPoint(top);
  builder.setMeta(top.meta);
  Arg slices;
  slices.kind = Arg::Kind::Values;
  for (const auto& parts : byIndex) {
    ValueId sum = parts.front();
    for (size_t k = 1; k < parts.size(); ++k) sum = builder.add(sum, parts[k]);
    slices.values.push_back(sum);
  }
  std::vector<const Node*> selects;
  for (ValueId t : terms) selects.push_back(g.producer(t));
  builder.replace(top, "aten::stack", {slices, Arg::ofInt(first.dim)});
  for (size_t k = 1; k < adds.size(); ++k) g.erase(*adds[k]);  // the inner adds, each read by the one erased before
  for (const Node* n : selects) g.erase(*n);
  return MatchResult::success();
}

}  // namespace

std::unique_ptr<Pass> createSliceGradsPass(const PipelineOptions&) { return std::make_unique<SliceGradsPass>(); }

}  // namespace spmd

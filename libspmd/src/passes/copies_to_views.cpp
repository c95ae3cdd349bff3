// copies-to-views (spmd-lower runs it for --device cuda): contiguous copies
// whose readers could read what was copied in place, as views of it.
//
// torch.nn.MultiheadAttention (torchvision's ViT, nn.TransformerEncoderLayer)
// makes its packed q/k/v projection contiguous before splitting heads, and
// autograd records its backward as copies: each head gradient made
// contiguous to be reshaped, the three stacked, the stack permuted and made
// contiguous again. Three rewrites take those copies out:
//
// 1. A stack read only through a permutation and made contiguous is a stack
//    along another dimension, written in that order:
//
//      %s = aten::stack([%a, %b, %c], 0)                          [3, L, B, E]
//      %p = ... unsqueeze, transpose, squeeze of %s ...            [L, B, 3, E]
//      %t = aten::clone(%p, torch.contiguous_format)
//        -> %t = aten::stack([%a, %b, %c], 2)
//
// 2. A stack of views of contiguous copies reads what was copied, through
//    views (ir/view_pieces.h); where a view merged two dimensions a strided
//    tensor cannot merge, the stack takes their factors and its (contiguous)
//    result is viewed back:
//
//      %c = aten::clone(%dq_t, torch.contiguous_format)           [L, B * H, D]
//      %x = aten::_unsafe_view(%c, [L, B, H * D])
//      %t = aten::stack([%x, ...], 2)
//        -> %u = aten::unflatten(%dq_t, 1, [B, H])
//           %s = aten::stack([%u, ...], 2)                          [L, B, 3, H, D]
//           %t = aten::view(%s, [L, B, 3, H * D])
//
// 3. A contiguous copy read, through views, only by cuDNN's fused attention
//    (q, k, v, the output's gradient) is gone: the attention reads views of
//    what was copied, each with its last dimension walked with step 1 (what
//    the kernel takes).
//
// The values are the same, bit for bit: only the order of reads changes. Not
// done: a copy with another reader (a GEMM, an element-wise op: the copy is
// what lets them read rows), cat (cat-views takes attention's), views that
// are no views of a strided tensor (a broadcast, a dimension read twice).
#include "spmd/analysis/memory_plan.h"
#include "spmd/ir/boxing.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ir/verify.h"
#include "spmd/ir/view_pieces.h"
#include "spmd/ops/dispatch.h"
#include "spmd/passes/pass.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/core/MemoryFormat.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <vector>

namespace spmd {
namespace {

struct Ops {
  OpName clone = OpName::known("aten::clone");
  OpName contiguous = OpName::known("aten::contiguous");
  OpName stack = OpName::known("aten::stack");
  OpName attention = OpName::known("spmd::fused_attention");
  OpName attentionBackward = OpName::known("spmd::fused_attention_backward");
};
const Ops& ops() { return opTable<Ops>(); }

// Whether `n` copies its input into a new contiguous tensor.
bool isContiguousCopy(const Node& n) {
  if (!n.is(ops().clone) && !n.is(ops().contiguous)) return false;
  if (n.args.empty() || n.args[0].kind != Arg::Kind::Value) return false;
  if (n.args.size() < 2 || n.args[1].kind != Arg::Kind::MemoryFormat) return n.is(ops().contiguous);
  return n.args[1].i == static_cast<int64_t>(c10::MemoryFormat::Contiguous);
}

// Whether `n` is a view of its first argument and reads no other tensor.
bool isPureView(const Node& n) {
  if (!makesViewsOnly(n) || n.args.empty() || n.args[0].kind != Arg::Kind::Value) return false;
  return std::none_of(n.args.begin() + 1, n.args.end(), [](const Arg& a) {
    return a.kind == Arg::Kind::Value || a.kind == Arg::Kind::Values;
  });
}

// The contiguous copy `v` is a chain of single-reader views of, and that
// chain's first view (or `v` itself); nullptr where there is none.
const Node* copyBehindViews(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  while (n && !isContiguousCopy(*n)) {
    if (!isPureView(*n) || n->outputs.size() != 1 || !g.hasOneReader(n->args[0].value)) return nullptr;
    n = g.producer(n->args[0].value);
  }
  if (!n || n->outputs.size() != 1) return nullptr;
  return n;
}

// `v`, a view of `base` through single-input views, as a meta tensor viewing
// a contiguous meta tensor of base's shape (with its storage offset, which
// the verifier's meta tensors do not keep); undefined where `v` is not one.
at::Tensor replayViews(const Graph& g, ValueId base, ValueId v) {
  std::vector<const Node*> chain;
  for (ValueId w = v; w != base;) {
    const Node* n = g.producer(w);
    if (!n || !isPureView(*n)) return at::Tensor();
    chain.push_back(n);
    w = n->args[0].value;
  }
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  std::unordered_map<ValueId, at::Tensor> meta = {{base, metaTensorOf(g.value(base))}};
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Node& n = **it;
    const std::optional<c10::OperatorHandle> op = findOperator(n);
    if (!op) return at::Tensor();
    const std::vector<at::Tensor> results =
        callOperator(*op, boxArguments(n, op->schema(), [&](ValueId x) { return meta.at(x); }));
    for (size_t k = 0; k < n.outputs.size() && k < results.size(); ++k) meta[n.outputs[k]] = results[k];
  }
  return meta.at(v);
}

std::optional<ViewRecipe> recipeFor(const Graph& g, const Node& copy, ValueId view) {
  const at::Tensor v = replayViews(g, copy.outputs[0], view);
  if (!v.defined() || v.dim() == 0) return std::nullopt;
  return viewOfContiguousCopy(g.value(copy.outputs[0]).shape, v.sizes().vec(), v.strides().vec(), v.storage_offset());
}

// The recipe's views of `x`, in the view's shape where it is viewable (no
// split), in its finer shape otherwise. `viewShape` is a copy: the graph's
// values move as the builder adds some.
ValueId applyRecipe(GraphBuilder& b, ValueId x, const ViewRecipe& r, const std::vector<int64_t> viewShape) {
  for (const ViewStep& s : r.steps) {
    x = s.select ? b.call("aten::select.int", {Arg::tensor(x), Arg::ofInt(s.dim), Arg::ofInt(s.index)}, "select")
                 : b.call("aten::unflatten.int", {Arg::tensor(x), Arg::ofInt(s.dim), intsArg(s.sizes)}, "unflatten");
  }
  std::vector<int64_t> identity(r.permutation.size());
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int64_t>(i);
  if (r.permutation != identity) x = b.call("aten::permute", {Arg::tensor(x), intsArg(r.permutation)}, "permute");
  const std::vector<int64_t> target = r.split ? r.finerShape : viewShape;
  if (b.shape(x) != target) x = b.call("aten::view", {Arg::tensor(x), intsArg(target)}, "view");
  return x;
}

// Erases the producers of `v` that nothing reads any more, up a chain of
// views, copies and one stack (whose inputs other nodes read now).
void eraseDeadChain(Graph& g, ValueId v) {
  while (v != kNoValue && g.users(v).empty() && !g.readBeyondNodes(v)) {
    const Node* n = g.producer(v);
    if (!n || n->outputs.size() != 1) return;
    const bool goesOn = isPureView(*n) || isContiguousCopy(*n);
    const ValueId next = goesOn ? n->args[0].value : kNoValue;
    g.erase(*n);
    v = next;
  }
}

int64_t stackDim(const Graph& g, const Node& stack) {
  const int64_t rank = static_cast<int64_t>(g.value(stack.outputs[0]).shape.size());
  const int64_t d = stack.args[1].i;
  return d < 0 ? d + rank : d;
}

bool isStack(const Node& n) {
  return n.is(ops().stack) && n.args.size() == 2 && n.args[0].kind == Arg::Kind::Values &&
         n.args[1].kind == Arg::Kind::Int && !n.args[0].values.empty();
}

// 1. clone(permutation of stack(xs, d)) -> stack(xs', d').
bool stackIntoLayout(Graph& g, const Node& copy) {
  // Up from the copy through single-reader views to a stack.
  const Node* n = g.producer(copy.args[0].value);
  while (n && !isStack(*n)) {
    if (!isPureView(*n) || n->outputs.size() != 1 || !g.hasOneReader(n->args[0].value)) return false;
    n = g.producer(n->args[0].value);
  }
  if (!n || !g.hasOneReader(n->outputs[0])) return false;
  const Node& stack = *n;
  const at::Tensor e = replayViews(g, stack.outputs[0], copy.args[0].value);
  if (!e.defined()) return false;
  const std::vector<int64_t> stacked = g.value(stack.outputs[0]).shape;
  const std::optional<std::vector<int64_t>> walks =
      permutationOfContiguous(stacked, e.sizes().vec(), e.strides().vec(), e.storage_offset());
  const int64_t d = stackDim(g, stack);
  if (!walks || stacked[d] == 1) return false;
  const int64_t newDim = std::find(walks->begin(), walks->end(), d) - walks->begin();

  // Each input's dimensions in the order the copy walks them, then its size-1 ones.
  const int64_t inputRank = static_cast<int64_t>(stacked.size()) - 1;
  std::vector<int64_t> order;
  for (int64_t w : *walks) {
    if (w >= 0 && w != d) order.push_back(w < d ? w : w - 1);
  }
  for (int64_t k = 0; k < inputRank; ++k) {
    if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
  }
  std::vector<int64_t> inputShape = e.sizes().vec();
  inputShape.erase(inputShape.begin() + newDim);
  GraphBuilder b(g);
  b.setMeta(copy.meta);
  b.setInsertionPoint(copy);
  Arg inputs;
  inputs.kind = Arg::Kind::Values;
  for (ValueId x : stack.args[0].values) {
    ValueId y = x;
    if (!std::is_sorted(order.begin(), order.end())) y = b.call("aten::permute", {Arg::tensor(y), intsArg(order)}, "permute");
    if (b.shape(y) != inputShape) y = b.call("aten::view", {Arg::tensor(y), intsArg(inputShape)}, "view");
    inputs.values.push_back(y);
  }
  const ValueId old = copy.args[0].value;
  b.replace(copy, "aten::stack", {inputs, Arg::ofInt(newDim)});
  eraseDeadChain(g, old);
  return true;
}

// 2. stack(views of contiguous copies) -> view(stack(views of what they copied)).
bool stackOfCopies(Graph& g, const Node& stack) {
  std::vector<const Node*> copies;
  std::vector<ViewRecipe> recipes;
  for (ValueId x : stack.args[0].values) {
    const Node* copy = copyBehindViews(g, x);
    if (!copy || !g.hasOneReader(copy->outputs[0]) || !g.hasOneReader(x)) return false;
    const std::optional<ViewRecipe> r = recipeFor(g, *copy, x);
    if (!r || (!recipes.empty() && (r->finerShape != recipes[0].finerShape || r->piecesPerDim != recipes[0].piecesPerDim))) {
      return false;
    }
    copies.push_back(copy);
    recipes.push_back(*r);
  }
  const int64_t d = stackDim(g, stack);
  const std::vector<int64_t>& perDim = recipes[0].piecesPerDim;
  const int64_t finerDim = std::accumulate(perDim.begin(), perDim.begin() + d, int64_t{0});
  const std::vector<int64_t> viewShape = g.value(stack.args[0].values[0]).shape;
  const std::vector<int64_t> outShape = g.value(stack.outputs[0]).shape;

  GraphBuilder b(g);
  b.setMeta(stack.meta);
  b.setInsertionPoint(stack);
  Arg inputs;
  inputs.kind = Arg::Kind::Values;
  for (size_t i = 0; i < copies.size(); ++i) {
    inputs.values.push_back(applyRecipe(b, copies[i]->args[0].value, recipes[i], viewShape));
  }
  const std::vector<ValueId> old = stack.args[0].values;
  if (!recipes[0].split) {
    b.replace(stack, "aten::stack", {inputs, Arg::ofInt(d)});
  } else {
    const ValueId stacked = b.call("aten::stack", {inputs, Arg::ofInt(finerDim)}, "stack");
    b.replace(stack, "aten::view", {Arg::tensor(stacked), intsArg(outShape)});
  }
  for (ValueId x : old) eraseDeadChain(g, x);
  return true;
}

// Whether `reader` reads `v` only where cuDNN's fused attention takes a
// strided tensor: q, k and v, and the output's gradient.
bool cudnnAttentionReads(const Node& reader, ValueId v) {
  std::vector<std::string_view> names;
  if (reader.is(ops().attention)) names = {"query", "key", "value"};
  else if (reader.is(ops().attentionBackward)) names = {"grad", "query", "key", "value"};
  else return false;
  const Arg& kernel = argument(reader, "kernel");
  if (kernel.kind != Arg::Kind::Str || kernel.s != "cudnn") return false;
  size_t reads = 0, allowed = 0;
  for (size_t k = 0; k < reader.args.size(); ++k) {
    if (reader.args[k].kind == Arg::Kind::Value && reader.args[k].value == v) ++reads;
  }
  for (std::string_view name : names) {
    const Arg& a = argument(reader, name);
    if (a.kind == Arg::Kind::Value && a.value == v) ++allowed;
  }
  return reads > 0 && reads == allowed;
}

// 3. A contiguous copy only cuDNN attention reads, through views -> views of
// what it copied.
bool attentionReadsInPlace(Graph& g, const std::vector<at::Tensor>& meta, const Node& copy) {
  const at::Tensor& x = meta[copy.args[0].value];  // its strides: the verifier's
  if (!x.defined() || x.dim() == 0 || x.stride(-1) != 1) return false;
  // The views reached from the copy, and the values attention reads.
  std::vector<ValueId> frontier = {copy.outputs[0]}, reads;
  while (!frontier.empty()) {
    const ValueId v = frontier.back();
    frontier.pop_back();
    if (g.readBeyondNodes(v)) return false;
    bool readByAttention = false;
    for (const Node* r : g.users(v)) {
      if (isPureView(*r) && r->args[0].value == v) {
        frontier.insert(frontier.end(), r->outputs.begin(), r->outputs.end());
      } else if (cudnnAttentionReads(*r, v)) {
        readByAttention = true;
      } else {
        return false;
      }
    }
    if (readByAttention) reads.push_back(v);
  }
  std::sort(reads.begin(), reads.end(), [&](ValueId a, ValueId b) {
    return g.indexOf(*g.producer(a)) < g.indexOf(*g.producer(b));
  });
  std::vector<ViewRecipe> recipes;
  for (ValueId v : reads) {
    const std::optional<ViewRecipe> r = recipeFor(g, copy, v);
    if (!r || r->split || !r->lastIsUnitStepOfLastDim) return false;
    recipes.push_back(*r);
  }
  if (reads.empty()) return false;
  GraphBuilder b(g);
  b.setMeta(copy.meta);
  b.setInsertionPoint(copy);
  for (size_t i = 0; i < reads.size(); ++i) {
    const ValueId made = applyRecipe(b, copy.args[0].value, recipes[i], g.value(reads[i]).shape);
    g.replaceUsesWith(reads[i], made, [](const Node& n) { return !isPureView(n); });
  }
  return true;  // the copy and its views: dce's
}

// The nodes `matches` picks that something reads, in program order (a
// pass before may have left nodes it no longer reads; dce follows this one).
template <typename Match>
std::vector<const Node*> liveMatches(const Graph& g, Match matches) {
  std::vector<const Node*> picked;
  for (const Node* n : snapshot(g.nodes())) {
    const bool read = std::any_of(n->outputs.begin(), n->outputs.end(),
                                  [&](ValueId v) { return v != kNoValue && (!g.users(v).empty() || g.readBeyondNodes(v)); });
    if (read && matches(*n)) picked.push_back(n);
  }
  return picked;
}

// Each sweep decides on the graph the one before left; returns how many
// nodes `rewrite` rewrote.
template <typename Match, typename Rewrite>
int rewriteEach(Graph& g, Match matches, Rewrite rewrite) {
  int rewritten = 0;
  for (const Node* n : liveMatches(g, matches)) rewritten += rewrite(g, *n) ? 1 : 0;
  return rewritten;
}

class CopiesToViewsPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    const int layouts = rewriteEach(g, isContiguousCopy, stackIntoLayout);
    const int stacks = rewriteEach(g, isStack, stackOfCopies);
    const std::vector<at::Tensor> meta = metaValues(g);
    const int attentions = rewriteEach(
        g, isContiguousCopy, [&](Graph& graph, const Node& copy) { return attentionReadsInPlace(graph, meta, copy); });
    count("stack(s) written in the order a copy made of them", layouts);
    count("stack(s) of copies reading what was copied", stacks);
    count("copies cuDNN attention reads as views instead", attentions);
    return layouts + stacks + attentions > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createCopiesToViewsPass(const PipelineOptions&) { return std::make_unique<CopiesToViewsPass>(); }

}  // namespace spmd

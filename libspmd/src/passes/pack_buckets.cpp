// pack-buckets (spmd-lower runs it for --device cuda): a cat of flat tensors
// (spmd-split's bucket of gradients) whose pieces are exact upcasts of
// 16-bit tensors, seen through reshapes (autocast's bf16 weight gradients,
// cast to the parameters' f32), becomes one spmd::flat_cat that reads the
// 16-bit tensors themselves:
//
//   %c = aten::_to_copy(%g, torch.float32, ...)          (%g: bf16[2304, 768])
//   %r = aten::reshape(%c, [1769472])
//   %bucket = aten::cat([%r, %ln_grad, ...], 0)
//     -> %bucket = spmd::flat_cat([%g, %ln_grad, ...], torch.float32)
//
// Each gradient is then read once in 16 bits and written once into the
// bucket, where the cast wrote it whole in f32 and the cat read and wrote it
// again (14 bytes an element down to 6), and a piece's reshape of a strided
// tensor copies nothing. The values are the same, bit for bit: the upcast is
// exact, and flat_cat takes each tensor's elements in the reshape's order.
// The casts and reshapes stay where anything else reads them; a gradient's
// record (`gradient %w = %cast, reduced ...`) is no reader: it names a view
// of the bucket's slice instead, which holds that gradient in the same dtype
// and shape (and, after the bucket's all-reduce, its reduced value: nothing
// reads the record's value at run time). Not done here:
// cats along another dimension or of pieces that are not 1-D, cats without
// such an upcast among their pieces (their pieces are as cheap to read as
// they are), and downcasts (they round: a bucket sent in bf16 keeps its cast).
#include "cast_match.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/passes/pass.h"

#include <set>
#include <vector>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName view = OpName::known("aten::view");
  OpName reshape = OpName::known("aten::reshape");
  OpName reshapeAlias = OpName::known("aten::_reshape_alias");
  OpName unsafeView = OpName::known("aten::_unsafe_view");
  OpName flatten = OpName::known("aten::flatten.using_ints");
};
const Ops& ops() { return opTable<Ops>(); }

bool is16Bit(c10::ScalarType t) { return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half; }

// An op whose result holds its input's elements in the same row-major order.
bool keepsElementOrder(const Node& n) {
  const Ops& o = ops();
  return (n.is(o.view) || n.is(o.reshape) || n.is(o.reshapeAlias) || n.is(o.unsafeView) || n.is(o.flatten)) &&
         !n.args.empty() && n.args[0].kind == Arg::Kind::Value;
}

struct Piece {
  ValueId source;
  bool upcast = false;           // an exact upcast was looked through
  std::set<ValueId> passedOver;  // the piece and the values between it and the source
};

// What flat_cat reads for `piece` of a cat in `dtype`: through reshapes and
// exact upcasts to `dtype`, the tensor they start from.
Piece sourceOf(const Graph& g, ValueId piece, c10::ScalarType dtype) {
  Piece p{piece, false, {}};
  while (const Node* n = g.producer(p.source)) {
    p.passedOver.insert(p.source);
    if (keepsElementOrder(*n)) {
      p.source = n->args[0].value;
    } else if (isCastTo(*n, dtype) && is16Bit(g.value(n->args[0].value).dtype) && !is16Bit(dtype)) {
      p.source = n->args[0].value;
      p.upcast = true;
    } else {
      p.passedOver.erase(p.source);
      break;
    }
  }
  return p;
}

// Whether only nodes making values of `chain` that nothing else reads read `v`.
bool unread(const Graph& g, ValueId v, const std::set<ValueId>& chain) {
  for (const Node* reader : g.users(v)) {
    for (ValueId out : reader->outputs) {
      if (out != kNoValue && (!chain.count(out) || !unread(g, out, chain))) return false;
    }
  }
  return true;
}

// The gradient records that name a value the pieces passed over, which no
// node reads any more, name views of the bucket's slices instead (so that
// the value itself goes).
void renameGradients(Graph& g, ValueId bucket, const std::vector<Piece>& pieces) {
  std::vector<std::pair<Gradient*, size_t>> renamed;  // the record, its piece
  for (Gradient& grad : g.gradients()) {
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (pieces[k].passedOver.count(grad.value) && unread(g, grad.value, pieces[k].passedOver)) {
        renamed.emplace_back(&grad, k);
      }
    }
  }
  if (renamed.empty()) return;
  std::vector<int64_t> sizes;
  for (const Piece& p : pieces) sizes.push_back(numel(g.value(p.source)));
  GraphBuilder b(g);
  b.setMeta(g.producer(bucket)->meta);
  b.setInsertionPointAfter(*g.producer(bucket));
  const std::vector<ValueId> slices =
      b.callMulti("aten::split_with_sizes", {Arg::tensor(bucket), intsArg(sizes), Arg::ofInt(0)});
  for (auto [grad, k] : renamed) {
    const Value old = g.value(grad->value);
    grad->value = b.call("aten::view", {Arg::tensor(slices[k]), intsArg(old.shape)}, old.name);
  }
}

bool rewrite(Graph& g, const Node& cat) {
  if (cat.args.size() != 2 || cat.args[0].kind != Arg::Kind::Values || cat.args[1].kind != Arg::Kind::Int) return false;
  const Value& out = g.value(cat.outputs[0]);
  if (out.shape.size() != 1 || (cat.args[1].i != 0 && cat.args[1].i != -1)) return false;
  Arg sources;
  sources.kind = Arg::Kind::Values;
  std::vector<Piece> pieces;
  bool upcast = false;
  for (ValueId v : cat.args[0].values) {
    if (g.value(v).shape.size() != 1) return false;
    pieces.push_back(sourceOf(g, v, out.dtype));
    sources.values.push_back(pieces.back().source);
    upcast = upcast || pieces.back().upcast;
  }
  if (!upcast) return false;
  const ValueId bucket = cat.outputs[0];
  Arg dtype;
  dtype.kind = Arg::Kind::DType;
  dtype.i = static_cast<int64_t>(out.dtype);
  GraphBuilder b(g);
  b.setMeta(cat.meta);
  b.replace(cat, "spmd::flat_cat", {sources, dtype});
  renameGradients(g, bucket, pieces);
  return true;
}

class FlatCatOfUpcasts final : public RewritePattern {
 public:
  FlatCatOfUpcasts() : RewritePattern("flat-cat-of-upcasts", {"aten::cat"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& cat) override {
    return rewrite(g, cat) ? MatchResult::success() : MatchResult::skip();
  }
};

class PackBucketsPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    FlatCatOfUpcasts pattern;
    const int rewritten = applyPatternsGreedily(g, {&pattern}, nullptr).total();
    count("cat(s) of upcast gradients packed by spmd::flat_cat from the 16-bit gradients", rewritten);
    return rewritten > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createPackBucketsPass(const PipelineOptions&) { return std::make_unique<PackBucketsPass>(); }

}  // namespace spmd

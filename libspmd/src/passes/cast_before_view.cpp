// cast-before-view (spmd-lower runs it for --device cuda, before the passes
// that make generated kernels): autocast's cast to bf16 or f16 of a reshape,
// where that reshape has no other reader, becomes the reshape of the cast:
//
//   %view_1 = aten::view(%layer_norm, [-1, 768])                  (f32)
//   %view_1.bf16 = aten::_to_copy(%view_1, torch.bfloat16, ...)
//     -> %layer_norm.bf16 = aten::_to_copy(%layer_norm, torch.bfloat16, ...)
//        %view_1.bf16 = aten::view(%layer_norm.bf16, [-1, 768])
//
// That is what a Linear written as a GEMM on flattened rows records under
// autocast (transformers' Conv1D: x.view(-1, d) before addmm): the cast then
// follows the op that made the value, so the kernel that op becomes writes
// the 16-bit value itself (layer-norm-to-kernel takes the cast in, and
// fuse-pointwise puts it in a generated kernel such as GELU's), instead of
// writing the fp32 rows and a copy reading them back. GPT-2 has four such
// casts a layer. The values are the same, bit for bit: a cast is element by
// element, and it keeps a dense input's strides, so the reshape sees the
// layout it saw. A transpose or permute between the op and the cast (torch's
// MultiheadAttention transposes its batch-first input to [length, batch,
// d] after the LayerNorm) is taken the same way: the cast keeps the dense
// value's strides, so the permuted view reads the same layout. A reshape
// of a strided view such as a slice or an expand is left alone (no kernel makes such a value, so none could take the cast
// in).
//
// An upcast from bf16 or f16 that only a reshape reads moves the other way,
// after the reshape, next to the op that reads it:
//
//   %g = aten::_to_copy(%mm_8, torch.float32, ...)          (%mm_8: bf16[8192, 768])
//   %view = aten::view(%g, [8, 1024, 768])
//   ... = aten::native_layer_norm_backward(%view, ...)
//     -> %view16 = aten::view(%mm_8, [8, 1024, 768])
//        %view = aten::_to_copy(%view16, torch.float32, ...)
//
// so that layer-norm-to-kernel's backward reads the bf16 gradient itself (a
// GEMM's result, flattened rows, on its way back to [batch, length, d]).
//
// A reshape to the shape its input already has (autograd records them, as
// around a LayerNorm's incoming gradient), and a slice of a whole dimension
// (what x[:, :, None] records around transformers' repeat_kv), go too, their
// readers reading the input: it gives the same sizes and strides, and it stood between a cast
// and the kernel that takes the cast in (layer-norm-to-kernel's backward).
// Kept where it is read beyond the nodes (an output or a state update).
#include "cast_match.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/op_traits.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <string>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName view = OpName::known("aten::view");
  OpName unsafe_view = OpName::known("aten::_unsafe_view");
  OpName reshape = OpName::known("aten::reshape");
  OpName transpose = OpName::known("aten::transpose.int");
  OpName permute = OpName::known("aten::permute");
  OpName t = OpName::known("aten::t");
  OpName slice = OpName::known("aten::slice.Tensor");
};
const Ops& ops() { return opTable<Ops>(); }

bool isReshape(const Node& n) { return n.is(ops().view) || n.is(ops().unsafe_view) || n.is(ops().reshape); }
// A transpose or permute: the same elements in another order, a view of any tensor.
bool isPermutation(const Node& n) { return n.is(ops().transpose) || n.is(ops().permute) || n.is(ops().t); }

// A 16-bit dtype autocast casts down to.
bool isNarrowFloat(c10::ScalarType t) { return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half; }
// The name suffix of a value in such a dtype, as autocast's casts are named.
std::string suffixOf(c10::ScalarType t) { return t == c10::ScalarType::Half ? ".f16" : ".bf16"; }

// Whether `v` is an op's fresh result or a graph input, not a strided view
// (a slice, an expand): a cast of it keeps its layout.
bool isDenseValue(const Graph& g, ValueId v) {
  const Node* made = g.producer(v);
  return !made || !(hasTrait(made->op, OpTrait::StridedView) || hasTrait(made->op, OpTrait::ViewOfFirstArgument) ||
                    hasTrait(made->op, OpTrait::MayCopyOrAlias));
}

class CastBeforeReshape final : public RewritePattern {
 public:
  CastBeforeReshape() : RewritePattern("cast-before-reshape", {"aten::_to_copy"}) {}

  MatchResult matchAndRewrite(Graph& g, const Node& cast) override {
    const c10::ScalarType to = g.value(cast.outputs[0]).dtype;
    if (!isNarrowFloat(to) || !isCastTo(cast, to)) return MatchResult::skip();
    const ValueId reshaped = cast.args[0].value;
    const Node* reshape = g.producer(reshaped);
    if (!reshape || !(isReshape(*reshape) || isPermutation(*reshape)) || reshape->args.empty() ||
        reshape->args[0].kind != Arg::Kind::Value ||
        g.soleReader(reshaped) != &cast || g.readBeyondNodes(reshaped)) {
      return MatchResult::skip();
    }
    const ValueId source = reshape->args[0].value;
    if (!isDenseValue(g, source)) return MatchResult::skip();
    if (!c10::isFloatingType(g.value(source).dtype) || g.value(source).dtype == to) return MatchResult::skip();
    GraphBuilder b(g);
    b.setInsertionPoint(cast);
    b.setMeta(cast.meta);
    const ValueId narrowed = b.cast(source, to, g.value(source).name + suffixOf(to));
    std::vector<Arg> args = reshape->args;
    args[0] = Arg::tensor(narrowed);
    b.replace(cast, reshape->qualifiedName(), args);
    return MatchResult::success();
  }
};

class UpcastAfterReshape final : public RewritePattern {
 public:
  UpcastAfterReshape() : RewritePattern("upcast-after-reshape", {"aten::view", "aten::_unsafe_view", "aten::reshape"}) {}

  MatchResult matchAndRewrite(Graph& g, const Node& reshape) override {
    if (reshape.args.size() != 2 || reshape.args[0].kind != Arg::Kind::Value) return MatchResult::skip();
    const ValueId wide = reshape.args[0].value;
    const Node* cast = g.producer(wide);
    if (!cast || !isCastTo(*cast, c10::ScalarType::Float) || g.soleReader(wide) != &reshape ||
        !isNarrowFloat(g.value(cast->args[0].value).dtype) || !isDenseValue(g, cast->args[0].value)) {
      return MatchResult::skip();
    }
    GraphBuilder b(g);
    b.setInsertionPoint(reshape);
    b.setMeta(reshape.meta);
    const c10::ScalarType from = g.value(cast->args[0].value).dtype;
    const ValueId narrow = b.call(reshape.op, {cast->args[0], reshape.args[1]},
                                  g.value(reshape.outputs[0]).name + suffixOf(from));
    std::vector<Arg> args = cast->args;
    args[0] = Arg::tensor(narrow);
    b.replace(reshape, "aten::_to_copy", args);
    return MatchResult::success();
  }
};

// Whether `n` is a slice from the start of a dimension with step 1 (then,
// keeping its input's shape, it is the whole of it: the same view).
bool slicesFromStart(const Node& n) {
  return n.is(ops().slice) && n.args.size() == 5 &&
         (n.args[2].kind == Arg::Kind::None || (n.args[2].kind == Arg::Kind::Int && n.args[2].i == 0)) &&
         n.args[4].kind == Arg::Kind::Int && n.args[4].i == 1;
}

class IdentityReshape final : public RewritePattern {
 public:
  IdentityReshape()
      : RewritePattern("identity-reshape", {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::slice.Tensor"}) {}

  MatchResult matchAndRewrite(Graph& g, const Node& reshape) override {
    if (reshape.args.empty() || reshape.args[0].kind != Arg::Kind::Value) return MatchResult::skip();
    if (reshape.is(ops().slice) && !slicesFromStart(reshape)) return MatchResult::skip();
    const ValueId in = reshape.args[0].value, out = reshape.outputs[0];
    if (g.value(in).shape != g.value(out).shape || g.value(in).dtype != g.value(out).dtype || g.readBeyondNodes(out) ||
        g.users(out).empty()) {
      return MatchResult::skip();
    }
    g.replaceAllUsesWith(out, in);
    return MatchResult::success();
  }
};

class CastBeforeViewPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    CastBeforeReshape cast;
    UpcastAfterReshape upcast;
    IdentityReshape identity;
    const RewriteCounts counts = applyPatternsGreedily(g, {&cast, &identity, &upcast}, nullptr);
    if (counts.applied[0]) {
      count("16-bit cast(s) of a reshape or transpose made before it, where the value's kernel can write them", counts.applied[0]);
    }
    if (counts.applied[1]) count("reshape(s) and whole slice(s) gone, their readers reading what they viewed", counts.applied[1]);
    if (counts.applied[2]) count("upcast(s) from 16 bits made after the reshape that read them", counts.applied[2]);
    return counts.total() > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createCastBeforeViewPass(const PipelineOptions&) { return std::make_unique<CastBeforeViewPass>(); }

}  // namespace spmd

// stack-to-kernel (spmd-lower runs it for --device cuda, after
// fuse-pointwise): a torch.stack of two generated kernels' results along a
// new last dimension becomes one generated kernel that writes the pairs
// (ops/pointwise_program.h's `pair`), and a cast to bf16 or f16 after the
// stack and the views over it is done by that kernel too. That is a rotary
// embedding in its real form (llama's apply_rope, and its backward as
// slice-grads stacks it):
//
//   %sub = spmd::fused([x0, c, x1, s], "... sub ...")       (x0 * c - x1 * s)
//   %add = spmd::fused([x1, c, x0, s], "... add ...")       (x1 * c + x0 * s)
//   %st = aten::stack([%sub, %add], -1)
//   %fl = aten::flatten.using_ints(%st, 3, -1)
//   %tr = aten::transpose.int(%fl, 1, 2)
//   %q = aten::_to_copy(%tr, torch.bfloat16, ...)
//     -> %st2 = spmd::fused([x0', c', x1', s'], "... sub ... add ...; t:bf16 = pair(..)")
//        %fl2 = aten::flatten.using_ints(%st2, 3, -1)
//        %q = aten::transpose.int(%fl2, 1, 2)
//
// where each input is unsqueezed to broadcast along the pairs, and an input
// that is views of an exact upcast (x0 and x1 select q.float()'s pairs) is
// the same views of the 16-bit value, converted as the kernel reads it. Five
// kernels (the upcast, two, the stack's copy and the strided cast) become one. The values are
// the same, bit for bit: the pair is the f32 value each kernel computed,
// rounded once to the cast's dtype as the cast rounds it; the views give
// the layout the cast kept (it preserves a dense input's strides).
// Not done here: stacks of more than two, along other dimensions, of row
// programs or of programs drawing dropout masks (whose mask depends on the
// iteration space), or whose kernels' results anything else reads.
#include "cast_views.h"
#include "pointwise_groups.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName fused = OpName::known("spmd::fused");
};
const Ops& ops() { return opTable<Ops>(); }

// A generated kernel the stack may take in: a pointwise program of the same
// schedule, drawing no mask, whose results only the stack reads.
std::optional<PointwiseProgram> takenProgram(const Graph& g, const Node* f, const Node& stack) {
  if (!f || !f->is(ops().fused) || f->args.size() != 2 || f->args[0].kind != Arg::Kind::Values ||
      f->args[1].kind != Arg::Kind::Str || !sameSchedule(*f, stack)) {
    return std::nullopt;
  }
  PointwiseProgram p;
  try {
    p = parsePointwiseProgram(f->args[1].s);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  if (hasRowReductions(p) || hasPairs(p) || !seedInputs(p).empty()) return std::nullopt;
  for (ValueId out : f->outputs) {
    if (out == kNoValue) continue;
    for (const Node* user : g.users(out)) {
      if (user != &stack) return std::nullopt;
    }
    if (g.isGraphOutput(out)) return std::nullopt;
  }
  return p;
}

// Appends `p`'s statements to `merged`, its inputs mapped by `inputOf`;
// returns the index its statement k got as k + the returned offset.
int appendStatements(PointwiseProgram& merged, const PointwiseProgram& p, const std::vector<int>& inputOf) {
  const int offset = static_cast<int>(merged.statements.size());
  for (PointwiseStatement s : p.statements) {
    for (PointwiseOperand& o : s.operands) {
      if (o.kind == PointwiseOperand::Kind::Input) o.index = inputOf[o.index];
      if (o.kind == PointwiseOperand::Kind::Temp) o.index += offset;
    }
    merged.statements.push_back(s);
  }
  return offset;
}

class StackOfKernels final : public RewritePattern {
 public:
  StackOfKernels() : RewritePattern("stack-of-kernels", {"aten::stack"}) {}

  MatchResult matchAndRewrite(Graph& g, const Node& stack) override {
    if (stack.args.size() != 2 || stack.args[0].kind != Arg::Kind::Values || stack.args[1].kind != Arg::Kind::Int ||
        stack.args[0].values.size() != 2) {
      return MatchResult::skip();
    }
    const ValueId a = stack.args[0].values[0], b = stack.args[0].values[1];
    const Value va = g.value(a);  // a copy: adding values moves the graph's
    const int64_t rank = static_cast<int64_t>(va.shape.size());
    if (stack.args[1].i != rank && stack.args[1].i != -1) return MatchResult::failure("it stacks along another dimension");
    if (g.value(b).shape != va.shape || g.value(b).dtype != va.dtype) return MatchResult::skip();
    const Node *fa = g.producer(a), *fb = g.producer(b);
    const auto pa = takenProgram(g, fa, stack), pb = takenProgram(g, fb, stack);
    if (!pa || !pb) return MatchResult::failure("a stacked value is not a generated kernel's that only the stack reads");

    // The inputs, each unsqueezed to broadcast along the pairs (0-dim ones as
    // they are), the first expanded to the pairs' shape, which sets the
    // kernel's iteration space (a view: it is read through stride 0).
    std::vector<int64_t> pairsShape = va.shape;
    pairsShape.push_back(2);
    GraphBuilder builder(g);
    builder.setMeta(stack.meta);
    const std::optional<CastAfterViews> cast = castAfterViews(g, stack.outputs[0]);
    const Node& anchor = cast ? *cast->cast : stack;
    builder.setInsertionPoint(anchor);
    std::map<ValueId, int> inputIndex;
    std::vector<ValueId> inputs;
    auto broadcastAlongPairs = [&](ValueId v) {
      const ValueId read = readThroughUpcast(builder, v);
      builder.setMeta(stack.meta);
      if (g.value(read).shape.empty()) return read;
      const ValueId one = builder.call("aten::unsqueeze", {Arg::tensor(read), Arg::ofInt(-1)});
      if (!inputs.empty()) return one;
      return builder.call("aten::expand", {Arg::tensor(one), intsArg(pairsShape), Arg::ofBool(false)});
    };
    auto mapInputs = [&](const Node& f) {
      std::vector<int> inputOf;
      for (ValueId v : f.args[0].values) {
        auto [it, added] = inputIndex.emplace(v, static_cast<int>(inputs.size()));
        if (added) inputs.push_back(broadcastAlongPairs(v));
        inputOf.push_back(it->second);
      }
      return inputOf;
    };
    PointwiseProgram merged;
    const int offsetA = appendStatements(merged, *pa, mapInputs(*fa));
    const int offsetB = fa == fb ? offsetA : appendStatements(merged, *pb, mapInputs(*fb));
    merged.numInputs = static_cast<int>(inputs.size());
    auto resultOf = [&](const Node& f, const PointwiseProgram& p, int offset, ValueId v) {
      const size_t r = std::find(f.outputs.begin(), f.outputs.end(), v) - f.outputs.begin();
      return PointwiseOperand{PointwiseOperand::Kind::Temp, p.results.at(r) + offset, 0};
    };
    PointwiseStatement pair;
    pair.op = PointwiseOp::Pair;
    pair.operands = {resultOf(*fa, *pa, offsetA, a), resultOf(*fb, *pb, offsetB, b)};
    pair.dtype = cast ? g.value(cast->cast->outputs[0]).dtype : va.dtype;
    merged.statements.push_back(pair);
    merged.results = {static_cast<int>(merged.statements.size()) - 1};
    merged.perRow = {false};

    Arg list;
    list.kind = Arg::Kind::Values;
    list.values = inputs;
    const std::vector<Arg> args = {list, strArg(printPointwiseProgram(merged))};
    if (!cast) {
      builder.replace(stack, "spmd::fused", args);
      return MatchResult::success();
    }
    // The kernel writes the cast pairs; the views stand over them.
    const std::string stackName = g.value(stack.outputs[0]).name;  // a copy, as calls add values
    const ValueId pairs = builder.call("spmd::fused", args, stackName);
    castAfterViewsOf(builder, *cast, pairs);
    g.erase(stack);  // its views are gone: nothing reads it
    return MatchResult::success();
  }
};

class StackToKernelPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    StackOfKernels pattern;
    const int rewritten = applyPatternsNotingFailures(g, {&pattern}, diagnostics, "stack-to-kernel: not fused: ").total();
    count("stacks of generated kernels' results written by one kernel", rewritten);
    return rewritten > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createStackToKernelPass(const PipelineOptions&) { return std::make_unique<StackToKernelPass>(); }

}  // namespace spmd

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
  OpName stack = OpName::known("aten::stack");
  OpName _to_copy = OpName::known("aten::_to_copy");
  OpName type_as = OpName::known("aten::type_as");
  std::vector<OpName> views = {OpName::known("aten::view"),        OpName::known("aten::reshape"),
                               OpName::known("aten::_unsafe_view"), OpName::known("aten::flatten.using_ints"),
                               OpName::known("aten::transpose.int"), OpName::known("aten::permute"),
                               OpName::known("aten::t"),            OpName::known("aten::unsqueeze")};
  OpName select = OpName::known("aten::select.int");
};
const Ops& ops() { return opTable<Ops>(); }

bool isView(const Node& n) {
  return std::any_of(ops().views.begin(), ops().views.end(), [&](const OpName& v) { return n.is(v); });
}

bool isHalfWidthFloat(c10::ScalarType t) { return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half; }

// Whether `n` is _to_copy(self, dtype, layout, device, pin_memory,
// non_blocking, memory_format) as tensor.to(dtype) records it: a plain cast
// (the device the trace recorded is the step's: spmd-lower moves every
// device argument to its --device).
bool isPlainCast(const Node& n) {
  return n.is(ops()._to_copy) && n.args.size() == 7 && n.args[0].kind == Arg::Kind::Value &&
         (n.args[3].kind == Arg::Kind::None || n.args[3].kind == Arg::Kind::Device) &&
         n.args[4].kind == Arg::Kind::None && n.args[6].kind == Arg::Kind::None &&
         (n.args[5].kind != Arg::Kind::Bool || !n.args[5].b);
}

// Whether `n` casts a 16-bit float up to f32 and does nothing else (a plain
// cast, or fuse-pointwise's lone cast kernel): exact, so a kernel reading
// its input as a float reads the same value.
bool isExactUpcast(const Graph& g, const Node& n) {
  if (isPlainCast(n)) {
    return g.value(n.outputs[0]).dtype == c10::ScalarType::Float && isHalfWidthFloat(g.value(n.args[0].value).dtype);
  }
  if (!n.is(ops().fused) || n.args.size() != 2 || n.args[0].kind != Arg::Kind::Values ||
      n.args[0].values.size() != 1 || n.outputs.size() != 1 || n.args[1].kind != Arg::Kind::Str) {
    return false;
  }
  return n.args[1].s == "t0:f32 = cast(in0); return t0" && isHalfWidthFloat(g.value(n.args[0].values[0]).dtype);
}

// `v`, or, where `v` is views (selects, reshapes, transposes) of an exact
// upcast, the same views of the 16-bit value it casts, made before the
// builder's insertion point: the kernel converts each element as it reads
// it, and the upcast's kernel dies where nothing else reads it.
ValueId readThroughUpcast(GraphBuilder& builder, ValueId v) {
  const Graph& g = builder.graph();
  std::vector<const Node*> views;
  const Node* p = g.producer(v);
  while (p && p->outputs.size() == 1 && !p->args.empty() && p->args[0].kind == Arg::Kind::Value &&
         (isView(*p) || p->is(ops().select))) {
    views.push_back(p);
    p = g.producer(p->args[0].value);
  }
  if (!p || !isExactUpcast(g, *p)) return v;
  ValueId w = p->args[0].kind == Arg::Kind::Value ? p->args[0].value : p->args[0].values[0];
  for (auto it = views.rbegin(); it != views.rend(); ++it) {
    std::vector<Arg> args = (*it)->args;
    args[0] = Arg::tensor(w);
    const std::string name = g.value((*it)->outputs[0]).name;  // a copy, as the call adds values
    w = builder.call((*it)->qualifiedName(), args, name);
  }
  return w;
}

bool sameSchedule(const Node& a, const Node& b) {
  return a.meta.role == b.meta.role && a.meta.iteration == b.meta.iteration;
}

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

// The views over `v` that end in a cast to a 16-bit float, each the only
// reader of the one before (type_as of the same dtype counts as a view),
// and that cast; nullopt where there is none.
struct CastAfterViews {
  std::vector<const Node*> views;
  const Node* cast = nullptr;
};
std::optional<CastAfterViews> castAfterViews(const Graph& g, ValueId v) {
  CastAfterViews chain;
  for (const Node* n = g.soleReader(v); n; n = g.soleReader(n->outputs[0])) {
    if (g.isGraphOutput(v) || n->outputs.size() != 1) return std::nullopt;
    const c10::ScalarType from = g.value(v).dtype, to = g.value(n->outputs[0]).dtype;
    if (n->is(ops()._to_copy)) {
      if (!isPlainCast(*n) || !isHalfWidthFloat(to)) return std::nullopt;
      chain.cast = n;
      return chain;
    }
    const bool alias = n->is(ops().type_as) && from == to;
    if (!alias && !(isView(*n) && from == to)) return std::nullopt;
    chain.views.push_back(n);
    v = n->outputs[0];
  }
  return std::nullopt;
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
    // The views again over the cast pairs; the last one defines the cast's value.
    std::vector<const Node*> views;
    for (const Node* v : cast->views) {
      if (!v->is(ops().type_as)) views.push_back(v);
    }
    const std::string stackName = g.value(stack.outputs[0]).name;  // copies, as calls add values
    ValueId last = views.empty() ? kNoValue : builder.call("spmd::fused", args, stackName);
    for (size_t k = 0; k < views.size(); ++k) {
      std::vector<Arg> viewArgs = views[k]->args;
      viewArgs[0] = Arg::tensor(last);
      if (k + 1 == views.size()) break;
      const std::string name = g.value(views[k]->outputs[0]).name;
      last = builder.call(views[k]->qualifiedName(), viewArgs, name);
    }
    if (views.empty()) {
      builder.replace(*cast->cast, "spmd::fused", args);
    } else {
      std::vector<Arg> lastArgs = views.back()->args;
      lastArgs[0] = Arg::tensor(last);
      builder.replace(*cast->cast, views.back()->qualifiedName(), lastArgs);
    }
    // The old views and the stack read nothing now; gone, so that no later
    // sweep offers the stack again.
    for (auto it = cast->views.rbegin(); it != cast->views.rend(); ++it) g.erase(**it);
    g.erase(stack);
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

// align-gemms (spmd-lower runs it for --device cuda): GEMMs whose operands
// cuBLAS would read with a leading dimension that is not a multiple of 16
// bytes get zero-padded operands instead, as torch.compile's padding does.
// cuBLAS runs such a GEMM in its "align1" kernels, several times slower than
// the aligned ones: GPT-2's 50257-row vocabulary puts its LM head's three
// GEMMs (logits, and the gradients of the hidden states and of the
// embedding) there.
//
// aten::mm(A [M,K], B [K,N]) -> C [M,N], each operand row major (a dense
// value) or column major (aten::t of one), C row major. A dimension whose
// size is some operand's leading dimension and not a multiple of 16 bytes
// (8 bf16 or fp16 elements, 4 fp32) is padded with zeros to the next
// multiple, in every operand that has it:
//
//   K: A and B padded, C unchanged (the zeros add nothing);
//   M (A column major, the backward's t(dlogits) @ x): A padded, C's first
//     M rows are the result (a slice that is dense);
//   N (C's leading dimension, always): B padded, C's first N columns are
//     the result (a slice with rows N-padded apart).
//
// aten::linear(x, W [N,K], bias) with N misaligned: W's rows and the bias
// padded, the result's first N columns taken. A column major operand is
// padded through its transpose (t(u) padded along dim 0 is t(u padded along
// dim 1)), so the padded weight of the forward and the padded gradient read
// by both backward GEMMs are made once (per iteration) and shared.
//
// A result whose columns are sliced is taken only where every reader takes
// rows that lie apart: views and reshapes that keep the last dimension (and
// their readers, likewise), and ops that are not views; a graph output, or
// another view, leaves the GEMM as it is, with a note. A linear whose input
// features are misaligned would need its input padded: left as it is, with
// a note. The copies this adds (the padded operands) move a small part of
// what the aligned kernels save.
#include "spmd/ir/boxing.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/op_traits.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <map>
#include <optional>
#include <tuple>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName mm = OpName::known("aten::mm");
  OpName linear = OpName::known("aten::linear");
  OpName t = OpName::known("aten::t");
  OpName view = OpName::known("aten::view");
  OpName unsafe_view = OpName::known("aten::_unsafe_view");
  OpName reshape = OpName::known("aten::reshape");
};
const Ops& ops() { return opTable<Ops>(); }

// Elements in 16 bytes for the dtypes cuBLAS runs GEMMs of here; 0 for others.
int64_t alignmentOf(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return 4;
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Half: return 8;
    default: return 0;
  }
}

int64_t roundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

bool isTensorArg(const Arg& a) { return a.kind == Arg::Kind::Value && a.value != kNoValue; }

// Whether `v` is laid out densely in its own order: a graph input or an op's
// fresh result, or a view or reshape of such a value.
bool isDense(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  while (n && (n->is(ops().view) || n->is(ops().unsafe_view) || n->is(ops().reshape)) && isTensorArg(n->args[0])) {
    n = g.producer(n->args[0].value);
  }
  return !n || !hasTrait(n->op, OpTrait::StridedView);
}

enum class Layout { RowMajor, ColumnMajor };

// How cuBLAS reads the 2-D operand `v`: a dense value row major, the
// transpose (aten::t) of one column major; nullopt for other views.
std::optional<Layout> layoutOf(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  if (n && n->is(ops().t) && isTensorArg(n->args[0])) {
    const std::optional<Layout> inner = layoutOf(g, n->args[0].value);
    if (!inner) return std::nullopt;
    return *inner == Layout::RowMajor ? Layout::ColumnMajor : Layout::RowMajor;
  }
  if (!isDense(g, v)) return std::nullopt;
  return Layout::RowMajor;
}

// Whether every reader of `v`, whose last dimension will be a slice of a
// padded one, can take rows that lie apart: ops that are not views, and
// views or reshapes that keep the last dimension (whose readers are asked
// the same). Not a graph output, state update or gradient record.
bool readersTakeSlicedRows(const Graph& g, ValueId v) {
  if (g.readBeyondNodes(v)) return false;
  const int64_t last = g.value(v).shape.empty() ? -1 : g.value(v).shape.back();
  for (const Node* u : g.users(v)) {
    const bool reshapes = u->is(ops().view) || u->is(ops().unsafe_view) || u->is(ops().reshape);
    if (reshapes) {
      const Value& out = g.value(u->outputs[0]);
      if (out.shape.empty() || out.shape.back() != last || !readersTakeSlicedRows(g, u->outputs[0])) return false;
      continue;
    }
    if (hasTrait(u->op, OpTrait::StridedView) || hasTrait(u->op, OpTrait::ViewOfFirstArgument) ||
        hasTrait(u->op, OpTrait::MayCopyOrAlias)) {
      return false;
    }
    const std::optional<c10::OperatorHandle> op = findOperator(*u);
    if (!op) return false;
    for (const c10::Argument& r : op->schema().returns()) {
      if (r.alias_info()) return false;  // a view whose strides nothing here checks
    }
  }
  return true;
}

// Zero-padded operands, made once per value, dimension, size and iteration.
class Padder {
 public:
  explicit Padder(Graph& g) : g_(g) {}

  // `v` with dimension `dim` padded with zeros to `size`, made before `at`.
  ValueId pad(ValueId v, int64_t dim, int64_t size, const Node& at) {
    const auto key = std::make_tuple(v, dim, size, static_cast<int>(at.meta.iteration));
    if (auto it = made_.find(key); it != made_.end()) return it->second;
    const Node* n = g_.producer(v);
    GraphBuilder b(g_);
    b.setInsertionPoint(at);
    b.setMeta(at.meta);
    ValueId out;
    const int64_t rank = static_cast<int64_t>(g_.value(v).shape.size());
    if (n && n->is(ops().t) && rank == 2) {
      const ValueId inner = pad(n->args[0].value, 1 - dim, size, at);
      out = b.call("aten::t", {Arg::tensor(inner)}, g_.value(v).name + ".aligned");
    } else {
      // constant_pad_nd's pads run from the last dimension: (before, after) each.
      std::vector<int64_t> pads(2 * (rank - dim), 0);
      pads.back() = size - g_.value(v).shape[dim];
      out = b.call("aten::constant_pad_nd", {Arg::tensor(v), intsArg(pads), Arg::ofInt(0)},
                   g_.value(v).name + ".aligned");
    }
    return made_[key] = out;
  }

 private:
  Graph& g_;
  std::map<std::tuple<ValueId, int64_t, int64_t, int>, ValueId> made_;
};

// The first `size` of dimension `dim` of `v`, a view, made before `at`.
ValueId firstOf(Graph& g, ValueId v, int64_t dim, int64_t size, const Node& at, const std::string& name) {
  GraphBuilder b(g);
  b.setInsertionPoint(at);
  b.setMeta(at.meta);
  return b.call("aten::slice.Tensor", {Arg::tensor(v), Arg::ofInt(dim), Arg::ofInt(0), Arg::ofInt(size), Arg::ofInt(1)},
                name);
}

// Counts of what was aligned, shared by the patterns.
struct Aligned {
  int gemms = 0, linears = 0;
};

class AlignMm final : public RewritePattern {
 public:
  AlignMm(Padder& padder, Aligned& aligned)
      : RewritePattern("align-mm", {"aten::mm"}), padder_(padder), aligned_(aligned) {}

  MatchResult matchAndRewrite(Graph& g, const Node& mm) override {
    if (!isTensorArg(mm.args[0]) || !isTensorArg(mm.args[1])) return MatchResult::skip();
    const ValueId a = mm.args[0].value, bv = mm.args[1].value;
    const int64_t align = alignmentOf(g.value(a).dtype);
    const auto& as = g.value(a).shape;
    const auto& bs = g.value(bv).shape;
    if (align == 0 || as.size() != 2 || bs.size() != 2) return MatchResult::skip();
    const int64_t m = as[0], k = as[1], n = bs[1];
    if (m % align == 0 && k % align == 0 && n % align == 0) return MatchResult::skip();
    const std::optional<Layout> la = layoutOf(g, a), lb = layoutOf(g, bv);
    if (!la || !lb) return MatchResult::failure("a misaligned GEMM operand is a view the pass does not pad");
    const bool padM = la == Layout::ColumnMajor && m % align != 0;
    const bool padK = k % align != 0 && (la == Layout::RowMajor || lb == Layout::ColumnMajor);
    const bool padN = n % align != 0;
    if (!padM && !padK && !padN) return MatchResult::skip();
    const ValueId c = mm.outputs[0];
    if (padN && !readersTakeSlicedRows(g, c)) {
      return MatchResult::failure("a reader of the GEMM's result needs it dense (a view or an output)");
    }
    ValueId pa = a, pb = bv;
    const int64_t mp = padM ? roundUp(m, align) : m, kp = padK ? roundUp(k, align) : k;
    if (padM) pa = padder_.pad(pa, 0, mp, mm);
    if (padK) pa = padder_.pad(pa, 1, kp, mm), pb = padder_.pad(pb, 0, kp, mm);
    if (padN) pb = padder_.pad(pb, 1, roundUp(n, align), mm);
    GraphBuilder b(g);
    b.setInsertionPoint(mm);
    b.setMeta(mm.meta);
    const std::string name = g.value(c).name;
    ValueId out = b.call("aten::mm", {Arg::tensor(pa), Arg::tensor(pb)}, name + ".aligned");
    if (padM) out = firstOf(g, out, 0, m, mm, name + ".rows");
    if (padN) out = firstOf(g, out, 1, n, mm, name + ".columns");
    g.replaceAllUsesWith(c, out);
    g.erase(mm);
    ++aligned_.gemms;
    return MatchResult::success();
  }

 private:
  Padder& padder_;
  Aligned& aligned_;
};

class AlignLinear final : public RewritePattern {
 public:
  AlignLinear(Padder& padder, Aligned& aligned)
      : RewritePattern("align-linear", {"aten::linear"}), padder_(padder), aligned_(aligned) {}

  MatchResult matchAndRewrite(Graph& g, const Node& linear) override {
    if (!isTensorArg(linear.args[0]) || !isTensorArg(linear.args[1])) return MatchResult::skip();
    const ValueId w = linear.args[1].value;
    const auto& ws = g.value(w).shape;
    const int64_t align = alignmentOf(g.value(w).dtype);
    if (align == 0 || ws.size() != 2 || (ws[0] % align == 0 && ws[1] % align == 0)) return MatchResult::skip();
    if (ws[1] % align != 0) return MatchResult::failure("misaligned input features (the input would need padding)");
    if (!layoutOf(g, w)) return MatchResult::failure("the weight is a view the pass does not pad");
    const ValueId y = linear.outputs[0];
    if (!readersTakeSlicedRows(g, y)) {
      return MatchResult::failure("a reader of the linear's result needs it dense (a view or an output)");
    }
    const int64_t n = ws[0], np = roundUp(n, align);
    const ValueId pw = padder_.pad(w, 0, np, linear);
    const Arg bias = isTensorArg(linear.args[2]) ? Arg::tensor(padder_.pad(linear.args[2].value, 0, np, linear))
                                                  : Arg::none();
    GraphBuilder b(g);
    b.setInsertionPoint(linear);
    b.setMeta(linear.meta);
    const std::string name = g.value(y).name;
    const int64_t last = static_cast<int64_t>(g.value(y).shape.size()) - 1;
    const ValueId padded = b.call("aten::linear", {linear.args[0], Arg::tensor(pw), bias}, name + ".aligned");
    g.replaceAllUsesWith(y, firstOf(g, padded, last, n, linear, name + ".columns"));
    g.erase(linear);
    ++aligned_.linears;
    return MatchResult::success();
  }

 private:
  Padder& padder_;
  Aligned& aligned_;
};

class AlignGemmsPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    Padder padder(g);
    Aligned aligned;
    AlignMm mm(padder, aligned);
    AlignLinear linear(padder, aligned);
    applyPatternsNotingFailures(g, {&mm, &linear}, diagnostics, "align-gemms: not aligned: ");
    if (aligned.gemms) count("GEMM(s) given zero-padded operands of 16-byte-aligned leading dimensions", aligned.gemms);
    if (aligned.linears) count("linear(s) given a zero-padded weight of 16-byte-aligned rows", aligned.linears);
    return aligned.gemms + aligned.linears > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createAlignGemmsPass(const PipelineOptions&) { return std::make_unique<AlignGemmsPass>(); }

}  // namespace spmd

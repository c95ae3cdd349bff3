#include "pointwise_groups.h"

#include "spmd/ir/graph.h"

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>

#include <algorithm>
#include <map>
#include <string>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName scalar_tensor = OpName::known("aten::scalar_tensor");
  OpName spmd_dropout_mul = OpName::known("spmd::dropout_mul");
  OpName add_Tensor = OpName::known("aten::add.Tensor");
  OpName sub_Tensor = OpName::known("aten::sub.Tensor");
  OpName add_Scalar = OpName::known("aten::add.Scalar");
  OpName sub_Scalar = OpName::known("aten::sub.Scalar");
  OpName mul_Scalar = OpName::known("aten::mul.Scalar");
  OpName div_Scalar = OpName::known("aten::div.Scalar");
  OpName rsub_Scalar = OpName::known("aten::rsub.Scalar");
  OpName pow_Tensor_Scalar = OpName::known("aten::pow.Tensor_Scalar");
  OpName threshold_backward = OpName::known("aten::threshold_backward");
  OpName gelu = OpName::known("aten::gelu");
  OpName gelu_backward = OpName::known("aten::gelu_backward");
  OpName _to_copy = OpName::known("aten::_to_copy");
  OpName lerp_Scalar = OpName::known("aten::lerp.Scalar");
  OpName to_dtype = OpName::known("aten::to.dtype");
  // One tensor in, one statement out.
  std::map<OpName, PointwiseOp> unary = {
      {OpName::known("aten::neg"), PointwiseOp::Neg},       {OpName::known("aten::relu"), PointwiseOp::Relu},
      {OpName::known("aten::tanh"), PointwiseOp::Tanh},     {OpName::known("aten::sigmoid"), PointwiseOp::Sigmoid},
      {OpName::known("aten::silu"), PointwiseOp::Silu},     {OpName::known("aten::exp"), PointwiseOp::Exp},
      {OpName::known("aten::log"), PointwiseOp::Log},       {OpName::known("aten::sqrt"), PointwiseOp::Sqrt},
      {OpName::known("aten::rsqrt"), PointwiseOp::Rsqrt}};
  // Two tensors in, one statement out.
  std::map<OpName, PointwiseOp> binary = {
      {OpName::known("aten::mul.Tensor"), PointwiseOp::Mul},
      {OpName::known("aten::div.Tensor"), PointwiseOp::Div},
      {OpName::known("aten::tanh_backward"), PointwiseOp::TanhGrad},
      {OpName::known("aten::sigmoid_backward"), PointwiseOp::SigmoidGrad},
      {OpName::known("aten::silu_backward"), PointwiseOp::SiluGrad}};
};
const Ops& ops() { return opTable<Ops>(); }

bool isTensor(const Arg& a) { return a.kind == Arg::Kind::Value; }

// a + alpha * b (aten::add's formula; alpha 1 is a plain add).
std::vector<Step> addScaled(PointwiseOp op, Source a, Source b, double alpha) {
  if (alpha == 1) return {{op, {a, b}}};
  return {{PointwiseOp::Mul, {b, constantSource(alpha)}}, {op, {a, localSource(0)}}};
}

bool isPlainCopy(const Node& n) {
  // _to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)
  if (n.args.size() != 7 || n.args[1].kind != Arg::Kind::DType) return false;
  const bool stridedLayout = n.args[2].kind == Arg::Kind::None ||
                             (n.args[2].kind == Arg::Kind::Layout && n.args[2].i == static_cast<int64_t>(c10::kStrided));
  const bool keepsFormat = n.args[6].kind == Arg::Kind::None ||
                           (n.args[6].kind == Arg::Kind::MemoryFormat &&
                            n.args[6].i == static_cast<int64_t>(c10::MemoryFormat::Preserve));
  return stridedLayout && keepsFormat && (n.args[5].kind == Arg::Kind::None || !n.args[5].b);
}

}  // namespace

// The node as statements, or nullopt for ops this pass does not fuse. The
// last step's result is the node's output.
std::optional<std::vector<Step>> translatePointwise(const Node& n) {
  using P = PointwiseOp;
  const Ops& o = ops();
  const OpName op = n.name();
  const auto& a = n.args;
  auto v = [&](size_t k) { return valueSource(a[k].value); };
  auto c = [&](size_t k) { return constantSource(scalarOf(a[k])); };
  auto tensors = [&](size_t count) {
    if (a.size() < count) return false;
    for (size_t k = 0; k < count; ++k) {
      if (!isTensor(a[k])) return false;
    }
    return true;
  };
  if (auto it = o.unary.find(op); it != o.unary.end() && tensors(1) && a.size() == 1) return std::vector<Step>{{it->second, {v(0)}}};
  if (auto it = o.binary.find(op); it != o.binary.end() && tensors(2) && a.size() == 2) {
    return std::vector<Step>{{it->second, {v(0), v(1)}}};
  }
  if ((op == o.add_Tensor || op == o.sub_Tensor) && tensors(2) && a.size() == 3 && isScalar(a[2])) {
    return addScaled(op == o.add_Tensor ? P::Add : P::Sub, v(0), v(1), scalarOf(a[2]));
  }
  if ((op == o.add_Scalar || op == o.sub_Scalar) && tensors(1) && a.size() == 3 && isScalar(a[1]) && isScalar(a[2])) {
    return std::vector<Step>{{op == o.add_Scalar ? P::Add : P::Sub, {v(0), constantSource(scalarOf(a[1]) * scalarOf(a[2]))}}};
  }
  if ((op == o.mul_Scalar || op == o.div_Scalar) && tensors(1) && a.size() == 2 && isScalar(a[1])) {
    return std::vector<Step>{{op == o.mul_Scalar ? P::Mul : P::Div, {v(0), c(1)}}};
  }
  if (op == o.rsub_Scalar && tensors(1) && a.size() == 3 && isScalar(a[1]) && isScalar(a[2])) {
    // other - alpha * self
    if (scalarOf(a[2]) == 1) return std::vector<Step>{{P::Sub, {c(1), v(0)}}};
    return std::vector<Step>{{P::Mul, {v(0), c(2)}}, {P::Sub, {c(1), localSource(0)}}};
  }
  if (op == o.pow_Tensor_Scalar && tensors(1) && a.size() == 2 && isScalar(a[1])) return std::vector<Step>{{P::Pow, {v(0), c(1)}}};
  if (op == o.threshold_backward && tensors(2) && a.size() == 3 && isScalar(a[2])) {
    return std::vector<Step>{{P::ThresholdGrad, {v(0), v(1), c(2)}}};
  }
  if (op == o.gelu && tensors(1) && a.size() == 2 && a[1].kind == Arg::Kind::Str) {
    if (a[1].s == "none") return std::vector<Step>{{P::Gelu, {v(0)}}};
    if (a[1].s == "tanh") return std::vector<Step>{{P::GeluTanh, {v(0)}}};
  }
  if (op == o.gelu_backward && tensors(2) && a.size() == 3 && a[2].kind == Arg::Kind::Str) {
    if (a[2].s == "none") return std::vector<Step>{{P::GeluGrad, {v(0), v(1)}}};
    if (a[2].s == "tanh") return std::vector<Step>{{P::GeluTanhGrad, {v(0), v(1)}}};
  }
  if (op == o._to_copy && tensors(1) && isPlainCopy(n)) return std::vector<Step>{{P::Cast, {v(0)}}};
  if (op == o.lerp_Scalar && tensors(2) && a.size() == 3 && isScalar(a[2])) {
    return std::vector<Step>{{P::Lerp, {v(0), v(1), c(2)}}};
  }
  // dropout_mul(self, seed, keep, mask_dtype, divisor): self times the mask
  // the seed draws, kept at 1 / divisor in mask_dtype (the mask is rounded there).
  if (op == o.spmd_dropout_mul && tensors(2) && a.size() == 5 && isScalar(a[2]) && a[3].kind == Arg::Kind::DType &&
      isScalar(a[4])) {
    const auto mask = static_cast<c10::ScalarType>(a[3].i);
    return std::vector<Step>{{P::Bernoulli, {v(1), c(2), constantSource(dropoutScale(mask, scalarOf(a[4])))}, mask},
                             {P::Mul, {v(0), localSource(0)}}};
  }
  // to.dtype(self, dtype, non_blocking, copy, memory_format): a copy or self
  // itself, the same values either way in a graph without writes.
  if (op == o.to_dtype && tensors(1) && a.size() == 5 && a[1].kind == Arg::Kind::DType &&
      a[4].kind == Arg::Kind::None) {
    return std::vector<Step>{{P::Cast, {v(0)}}};
  }
  return std::nullopt;
}


namespace {

// A member's value that the rest of the graph reads (a node, an output, a
// state update or a gradient record).
bool readOutside(const Graph& g, const std::set<const Node*>& nodes, ValueId v) {
  for (const Node* user : g.users(v)) {
    if (!nodes.count(user)) return true;
  }
  return g.readBeyondNodes(v);
}

}  // namespace

void foldScalarTensors(const Graph& g, std::vector<Step>& steps) {
  for (Step& step : steps) {
    for (Source& src : step.operands) {
      const Node* p = src.kind == Source::Kind::Value ? g.producer(src.value) : nullptr;
      if (!p || !p->is(ops().scalar_tensor) || p->args.empty() || !isScalar(p->args[0])) continue;
      if (g.value(src.value).dtype != c10::ScalarType::Float) continue;  // f32: the kernels' arithmetic
      src = constantSource(scalarOf(p->args[0]));
    }
  }
}

bool drawsMask(const std::vector<Step>& steps) {
  return std::any_of(steps.begin(), steps.end(), [](const Step& s) { return s.op == PointwiseOp::Bernoulli; });
}

bool hasPointwiseDtypes(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || n.outputs[0] == kNoValue || !isPointwiseDtype(g.value(n.outputs[0]).dtype)) return false;
  bool ok = true;
  const bool dropout = n.is(ops().spmd_dropout_mul) && n.args.size() > 1 && n.args[1].kind == Arg::Kind::Value;
  forEachTensorArg(n, [&](ValueId v) {
    const bool seed = dropout && v == n.args[1].value && g.value(v).dtype == c10::ScalarType::Long;
    ok = ok && (seed || isPointwiseDtype(g.value(v).dtype));
  });
  return ok;
}

bool canEndGroupAt(const Graph& g, const std::vector<Candidate>& members, const std::set<const Node*>& nodes,
                   const Node& n) {
  const size_t at = g.indexOf(n);
  for (const Candidate& m : members) {
    for (const Node* user : g.users(m.node->outputs[0])) {
      if (user != &n && !nodes.count(user) && g.indexOf(*user) < at) return false;
    }
  }
  return true;
}

void replaceWithFusedNode(Graph& g, const std::vector<Candidate>& members, const std::set<const Node*>& nodes,
                          const std::function<bool(ValueId)>& perRow) {
  PointwiseProgram program;
  std::vector<ValueId> inputs, results;
  std::map<ValueId, int> temp;  // member value -> statement
  auto operandOf = [&](const Source& s, int firstLocal) {
    PointwiseOperand o;
    if (s.kind == Source::Kind::Constant) {
      o.constant = s.constant;
    } else if (s.kind == Source::Kind::Local) {
      o.kind = PointwiseOperand::Kind::Temp;
      o.index = firstLocal + s.local;
    } else if (auto it = temp.find(s.value); it != temp.end()) {
      o.kind = PointwiseOperand::Kind::Temp;
      o.index = it->second;
    } else {
      o.kind = PointwiseOperand::Kind::Input;
      auto pos = std::find(inputs.begin(), inputs.end(), s.value);
      o.index = static_cast<int>(pos - inputs.begin());
      if (pos == inputs.end()) inputs.push_back(s.value);
    }
    return o;
  };
  for (const Candidate& m : members) {
    const int firstLocal = static_cast<int>(program.statements.size());
    const ValueId out = m.node->outputs[0];
    for (size_t k = 0; k < m.steps.size(); ++k) {
      PointwiseStatement s;
      s.op = m.steps[k].op;
      // Only the op's result is rounded to its dtype; its inner steps stay float.
      const c10::ScalarType inner = m.steps[k].rounding;
      s.dtype = k + 1 == m.steps.size() ? g.value(out).dtype
                : inner == c10::ScalarType::Undefined ? c10::ScalarType::Float : inner;
      for (const Source& src : m.steps[k].operands) s.operands.push_back(operandOf(src, firstLocal));
      program.statements.push_back(s);
    }
    temp[out] = static_cast<int>(program.statements.size()) - 1;
    if (readOutside(g, nodes, out)) {
      program.results.push_back(temp[out]);
      program.perRow.push_back(perRow && perRow(out));
      results.push_back(out);
    }
  }
  program.numInputs = static_cast<int>(inputs.size());

  Node fused;
  fused.op = "spmd::fused";
  Arg list;
  list.kind = Arg::Kind::Values;
  list.values = inputs;
  Arg text;
  text.kind = Arg::Kind::Str;
  text.s = printPointwiseProgram(program);
  fused.args = {list, text};
  fused.outputs = results;
  fused.meta = members.back().node->meta;
  for (size_t k = members.size() - 1; k-- > 0;) g.extract(*members[k].node);
  g.replaceNode(*members.back().node, std::move(fused));
}

}  // namespace spmd

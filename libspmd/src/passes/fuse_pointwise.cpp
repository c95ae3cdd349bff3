// fuse-pointwise (spmd-lower runs it for --device cuda): chains of
// element-wise ATen ops over one iteration space (bias + GELU, residual adds,
// scaling, casts to and from bf16, and their backward ops) become one
// spmd::fused node each, whose string argument is the group's pointwise
// program (ops/pointwise_program.h); spmd-lower compiles each into one CUDA
// kernel (ops/cuda_codegen.h). Values used only inside a group are never
// written to memory; the values the rest of the graph reads keep their names
// as the fused node's results.
//
// Grouping is greedy, in program order: an op joins the group of one of its
// producers when it has the group's output shape, role and iteration, and no
// node outside the group reads the group's values before it (the fused node
// takes the place of its last member). Single ops stay as they are, but for
// one: a cast from bf16 or f16 up to f32 of at least kLoneCastElements
// elements over a densely laid-out input (autocast's weight gradients, cast
// back to the parameters' f32). ATen runs that cast with its unrolled,
// element-at-a-time copy kernel (about 430 GB/s for gpt's gradients on an
// H200), the generated kernel with 16-byte accesses (about 860 GB/s there).
// Not done here: reductions (softmax, LayerNorm, sums), ops on f64 or integer
// tensors, random ops, and views between members.
#include "spmd/ops/pointwise_program.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

namespace spmd {
namespace {

// An operand of a translated statement before it is placed in a program: a
// graph value, an earlier statement of the same op, or a constant.
struct Source {
  enum class Kind { Value, Local, Constant } kind = Kind::Constant;
  ValueId value = -1;
  int local = 0;
  double constant = 0;
};
Source valueSource(ValueId v) { return {Source::Kind::Value, v, 0, 0}; }
Source localSource(int k) { return {Source::Kind::Local, -1, k, 0}; }
Source constantSource(double c) { return {Source::Kind::Constant, -1, 0, c}; }

struct Step {
  PointwiseOp op;
  std::vector<Source> operands;
};

double scalarOf(const Arg& a) { return a.kind == Arg::Kind::Int ? static_cast<double>(a.i) : a.f; }
bool isScalar(const Arg& a) { return a.kind == Arg::Kind::Int || a.kind == Arg::Kind::Float; }
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

// The node as statements, or nullopt for ops this pass does not fuse. The
// last step's result is the node's output.
std::optional<std::vector<Step>> translate(const Node& n) {
  using P = PointwiseOp;
  const std::string op = n.qualifiedName();
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
  static const std::map<std::string, P> unary = {
      {"aten::neg", P::Neg},   {"aten::relu", P::Relu},       {"aten::tanh", P::Tanh}, {"aten::sigmoid", P::Sigmoid},
      {"aten::silu", P::Silu}, {"aten::exp", P::Exp},         {"aten::log", P::Log},   {"aten::sqrt", P::Sqrt},
      {"aten::rsqrt", P::Rsqrt}};
  static const std::map<std::string, P> binary = {
      {"aten::mul.Tensor", P::Mul},           {"aten::div.Tensor", P::Div},
      {"aten::tanh_backward", P::TanhGrad},   {"aten::sigmoid_backward", P::SigmoidGrad},
      {"aten::silu_backward", P::SiluGrad}};
  if (auto it = unary.find(op); it != unary.end() && tensors(1) && a.size() == 1) return std::vector<Step>{{it->second, {v(0)}}};
  if (auto it = binary.find(op); it != binary.end() && tensors(2) && a.size() == 2) {
    return std::vector<Step>{{it->second, {v(0), v(1)}}};
  }
  if ((op == "aten::add.Tensor" || op == "aten::sub.Tensor") && tensors(2) && a.size() == 3 && isScalar(a[2])) {
    return addScaled(op == "aten::add.Tensor" ? P::Add : P::Sub, v(0), v(1), scalarOf(a[2]));
  }
  if ((op == "aten::add.Scalar" || op == "aten::sub.Scalar") && tensors(1) && a.size() == 3 && isScalar(a[1]) && isScalar(a[2])) {
    return std::vector<Step>{{op == "aten::add.Scalar" ? P::Add : P::Sub, {v(0), constantSource(scalarOf(a[1]) * scalarOf(a[2]))}}};
  }
  if ((op == "aten::mul.Scalar" || op == "aten::div.Scalar") && tensors(1) && a.size() == 2 && isScalar(a[1])) {
    return std::vector<Step>{{op == "aten::mul.Scalar" ? P::Mul : P::Div, {v(0), c(1)}}};
  }
  if (op == "aten::rsub.Scalar" && tensors(1) && a.size() == 3 && isScalar(a[1]) && isScalar(a[2])) {
    // other - alpha * self
    if (scalarOf(a[2]) == 1) return std::vector<Step>{{P::Sub, {c(1), v(0)}}};
    return std::vector<Step>{{P::Mul, {v(0), c(2)}}, {P::Sub, {c(1), localSource(0)}}};
  }
  if (op == "aten::pow.Tensor_Scalar" && tensors(1) && a.size() == 2 && isScalar(a[1])) return std::vector<Step>{{P::Pow, {v(0), c(1)}}};
  if (op == "aten::threshold_backward" && tensors(2) && a.size() == 3 && isScalar(a[2])) {
    return std::vector<Step>{{P::ThresholdGrad, {v(0), v(1), c(2)}}};
  }
  if (op == "aten::gelu" && tensors(1) && a.size() == 2 && a[1].kind == Arg::Kind::Str) {
    if (a[1].s == "none") return std::vector<Step>{{P::Gelu, {v(0)}}};
    if (a[1].s == "tanh") return std::vector<Step>{{P::GeluTanh, {v(0)}}};
  }
  if (op == "aten::gelu_backward" && tensors(2) && a.size() == 3 && a[2].kind == Arg::Kind::Str) {
    if (a[2].s == "none") return std::vector<Step>{{P::GeluGrad, {v(0), v(1)}}};
    if (a[2].s == "tanh") return std::vector<Step>{{P::GeluTanhGrad, {v(0), v(1)}}};
  }
  if (op == "aten::_to_copy" && tensors(1) && isPlainCopy(n)) return std::vector<Step>{{P::Cast, {v(0)}}};
  return std::nullopt;
}

struct Candidate {
  const Node* node;
  std::vector<Step> steps;
};

// The smallest lone upcast worth a generated kernel (smaller ones are
// launch-bound either way).
constexpr int64_t kLoneCastElements = 1 << 16;

bool isHalfWidthFloat(c10::ScalarType t) { return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half; }

std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(shape[d], 1);
  return strides;
}

// Whether `v` is laid out densely as far as its producers show: a graph
// input or an op's own result, seen through reshapes and an even number of
// transposes (autograd's t(t(mm)) for a Linear's weight gradient). Only a
// matter of speed: spmd::fused makes a strided input contiguous first.
bool laidOutDense(const Graph& g, ValueId v) {
  static const std::set<std::string> kStridedViews = {
      "aten::transpose.int", "aten::permute",    "aten::expand",           "aten::slice.Tensor", "aten::select.int",
      "aten::narrow",        "aten::as_strided", "aten::split.Tensor",     "aten::split_with_sizes", "aten::diagonal"};
  int transposes = 0;
  while (const Node* p = g.producer(v)) {
    const std::string op = p->qualifiedName();
    if (p->args.empty() || p->args[0].kind != Arg::Kind::Value) return true;
    if (op == "aten::t") {
      ++transposes;
    } else if (op == "aten::_reshape_alias") {
      if (transposes % 2 || p->args.size() < 3 || p->args[2].ints != contiguousStrides(g.value(v).shape)) return false;
    } else if (op == "aten::view" || op == "aten::_unsafe_view" || op == "aten::reshape") {
      if (transposes % 2) return false;
    } else if (kStridedViews.count(op)) {
      return false;
    } else {
      return transposes % 2 == 0;
    }
    v = p->args[0].value;
  }
  return transposes % 2 == 0;
}

// The one single op fuse-pointwise takes (see the top of the file).
bool isWorthyLoneCast(const Graph& g, const Candidate& c) {
  const Node& n = *c.node;
  if (n.op != "aten::_to_copy") return false;
  const Value &in = g.value(n.args[0].value), &out = g.value(n.outputs[0]);
  int64_t numel = 1;
  for (int64_t d : out.shape) numel *= d;
  return isHalfWidthFloat(in.dtype) && out.dtype == c10::ScalarType::Float && numel >= kLoneCastElements &&
         laidOutDense(g, n.args[0].value);
}

struct Group {
  std::vector<Candidate> members;
  std::set<const Node*> nodes;
  std::vector<int64_t> shape;
};

class PointwiseFuser {
 public:
  explicit PointwiseFuser(Graph& g) : g_(g) {}

  // Returns how many groups (of two or more ops, or a lone upcast) became
  // fused nodes.
  int run() {
    for (const Node* n : snapshot(g_.nodes())) consider(*n);
    int fused = 0;
    for (Group& group : groups_) {
      if (group.members.size() < 2 && !isWorthyLoneCast(g_, group.members.front())) continue;
      replace(group);
      ++fused;
      fusedOps_ += static_cast<int>(group.members.size());
    }
    return fused;
  }
  int fusedOps() const { return fusedOps_; }

 private:
  bool eligible(const Node& n) const {
    if (n.outputs.size() != 1 || n.outputs[0] == kNoValue || !isPointwiseDtype(g_.value(n.outputs[0]).dtype)) return false;
    bool ok = true;
    forEachTensorArg(n, [&](ValueId v) { ok = ok && isPointwiseDtype(g_.value(v).dtype); });
    return ok;
  }

  static bool sameSchedule(const Node& a, const Node& b) {
    return a.meta.role == b.meta.role && a.meta.iteration == b.meta.iteration;
  }

  // No node outside `group` (and other than `n`) reads a member's value
  // before `n`, where the fused node will stand.
  bool canEndAt(const Group& group, const Node& n) const {
    const size_t at = g_.indexOf(n);
    for (const Candidate& m : group.members) {
      for (const Node* user : g_.users(m.node->outputs[0])) {
        if (user != &n && !group.nodes.count(user) && g_.indexOf(*user) < at) return false;
      }
    }
    return true;
  }

  void consider(const Node& n) {
    if (!eligible(n)) return;
    auto steps = translate(n);
    if (!steps) return;
    const std::vector<int64_t>& shape = g_.value(n.outputs[0]).shape;
    int chosen = -1;
    forEachTensorArg(n, [&](ValueId v) {
      const Node* p = g_.producer(v);
      auto it = p ? groupOf_.find(p) : groupOf_.end();
      if (chosen >= 0 || it == groupOf_.end()) return;
      const Group& group = groups_[it->second];
      if (group.shape == shape && sameSchedule(*group.members.front().node, n) && canEndAt(group, n)) chosen = it->second;
    });
    if (chosen < 0) {
      chosen = static_cast<int>(groups_.size());
      groups_.push_back(Group{{}, {}, shape});
    }
    groups_[chosen].members.push_back({&n, std::move(*steps)});
    groups_[chosen].nodes.insert(&n);
    groupOf_[&n] = chosen;
  }

  // A member's value that the rest of the graph reads (a node, an output, a
  // state update or a gradient record).
  bool readOutside(const Group& group, ValueId v) const {
    for (const Node* user : g_.users(v)) {
      if (!group.nodes.count(user)) return true;
    }
    return g_.readBeyondNodes(v);
  }

  void replace(const Group& group) {
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
    for (const Candidate& m : group.members) {
      const int firstLocal = static_cast<int>(program.statements.size());
      const ValueId out = m.node->outputs[0];
      for (size_t k = 0; k < m.steps.size(); ++k) {
        PointwiseStatement s;
        s.op = m.steps[k].op;
        // Only the op's result is rounded to its dtype; its inner steps stay float.
        s.dtype = k + 1 == m.steps.size() ? g_.value(out).dtype : c10::ScalarType::Float;
        for (const Source& src : m.steps[k].operands) s.operands.push_back(operandOf(src, firstLocal));
        program.statements.push_back(s);
      }
      temp[out] = static_cast<int>(program.statements.size()) - 1;
      if (readOutside(group, out)) {
        program.results.push_back(temp[out]);
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
    fused.meta = group.members.back().node->meta;
    for (size_t k = group.members.size() - 1; k-- > 0;) g_.extract(*group.members[k].node);
    g_.replaceNode(*group.members.back().node, std::move(fused));
  }

  Graph& g_;
  std::vector<Group> groups_;
  std::map<const Node*, int> groupOf_;
  int fusedOps_ = 0;
};

class FusePointwisePass : public Pass {
 public:
  bool run(Graph& graph, DiagnosticEngine& diagnostics) override {
    PointwiseFuser fuser(graph);
    const int groups = fuser.run();
    if (groups > 0) {
      diagnostics.note("fuse-pointwise: " + std::to_string(fuser.fusedOps()) + " element-wise ops in " +
                       std::to_string(groups) + " generated kernels");
    }
    return groups > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createFusePointwisePass(const PipelineOptions&) { return std::make_unique<FusePointwisePass>(); }

}  // namespace spmd

// fuse-optimizer: the optimizer's per-parameter element-wise ops become
// LibTorch's multi-tensor _foreach_* ops, one call per group of like ops, as
// torch.optim's foreach implementations do. On CUDA one call launches a few
// kernels for all parameters instead of one kernel per parameter.
//
// Grouped: optimizer nodes with the same op, overload and constant arguments,
// at the same depth of the graph (so none reads another's result), behind
// the same bucket_wait (so a bucket's update still overlaps later buckets'
// all-reduces) and with the same iteration tag. Before grouping, ops without
// a _foreach form are rewritten where an exact equivalent has one: rsub
// (s - x) becomes neg and add (-x + s, the same rounding), the full_like
// constants of one value each (the bias-correction numerators) become one
// node, and pow of a Scalar becomes _foreach_pow.ScalarAndTensor where this
// LibTorch has it (2.1 on). What is left (_to_copy, where, ...) stays as it
// is; a note lists it. The nodes are then rescheduled, a group running where
// its last input is ready; communication keeps its order. Values and results
// do not change: on CPU _foreach ops loop over the same per-tensor kernels.
#include "spmd/passes/pass.h"
#include "spmd/ir/boxing.h"
#include "spmd/ops/op_traits.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <stdexcept>

namespace spmd {
namespace {

struct ForeachForm {
  const char* op;
  const char* overload;
  size_t tensorArgs;  // leading tensor arguments that become lists
  size_t constants;   // constant arguments kept after them (add.Scalar's alpha of 1 goes)
  bool scalarFirst = false;  // pow.Scalar: one constant, then the tensor
};

bool hasOperator(const std::string& op, const std::string& overload) {
  Node probe;
  probe.op = op;
  probe.overload = overload;
  return findOperator(probe).has_value();
}

// The _foreach form of an element-wise op, for the argument layouts the
// optimizer pass emits; nullopt when there is none or the arguments differ.
std::optional<ForeachForm> foreachFormOf(const Node& n) {
  const std::string name = n.qualifiedName();
  auto isOne = [](const Arg& a) { return (a.kind == Arg::Kind::Int && a.i == 1) || (a.kind == Arg::Kind::Float && a.f == 1.0); };
  if (name == "aten::add.Scalar" && n.args.size() == 3 && isOne(n.args[2])) return ForeachForm{"aten::_foreach_add", "Scalar", 1, 1};
  if (name == "aten::mul.Scalar") return ForeachForm{"aten::_foreach_mul", "Scalar", 1, 1};
  if (name == "aten::add.Tensor") return ForeachForm{"aten::_foreach_add", "List", 2, 1};
  if (name == "aten::sub.Tensor") return ForeachForm{"aten::_foreach_sub", "List", 2, 1};
  if (name == "aten::mul.Tensor") return ForeachForm{"aten::_foreach_mul", "List", 2, 0};
  if (name == "aten::div.Tensor") return ForeachForm{"aten::_foreach_div", "List", 2, 0};
  if (name == "aten::maximum") return ForeachForm{"aten::_foreach_maximum", "List", 2, 0};
  if (name == "aten::addcmul") return ForeachForm{"aten::_foreach_addcmul", "Scalar", 3, 1};
  if (name == "aten::addcdiv") return ForeachForm{"aten::_foreach_addcdiv", "Scalar", 3, 1};
  if (name == "aten::sqrt") return ForeachForm{"aten::_foreach_sqrt", "", 1, 0};
  if (name == "aten::neg") return ForeachForm{"aten::_foreach_neg", "", 1, 0};
  static const bool haveLerp = hasOperator("aten::_foreach_lerp", "Scalar");
  if (name == "aten::lerp.Scalar" && haveLerp) return ForeachForm{"aten::_foreach_lerp", "Scalar", 2, 1};
  static const bool havePowScalarAndTensor = hasOperator("aten::_foreach_pow", "ScalarAndTensor");
  if (name == "aten::pow.Scalar" && havePowScalarAndTensor && n.args.size() == 2 && n.args[0].kind != Arg::Kind::Value &&
      n.args[1].kind == Arg::Kind::Value && n.outputs.size() == 1 && n.outputs[0] != kNoValue) {
    return ForeachForm{"aten::_foreach_pow", "ScalarAndTensor", 1, 1, true};
  }
  return std::nullopt;
}

// A text key of the constant (non-tensor) arguments.
std::string constantsKey(const Node& n) {
  std::string key;
  for (const Arg& a : n.args) {
    if (a.kind == Arg::Kind::Value || a.kind == Arg::Kind::Values) continue;
    char f[32];
    std::snprintf(f, sizeof f, "%.17g", a.f);  // every bit: groups share one constant
    key += std::to_string(static_cast<int>(a.kind)) + ":" + std::to_string(a.i) + ":" + f + ":" + std::to_string(a.b) +
           ":" + a.s + ";";
  }
  return key;
}

struct Analysis {
  std::vector<int> depth;  // per node: longest path from the graph inputs
  std::vector<int> stage;  // per node: the latest bucket_wait it depends on (-1: none)
  std::vector<std::vector<size_t>> deps;  // per node: producing nodes
};

Analysis analyse(const Graph& g) {
  const auto& nodes = g.nodes();
  std::map<ValueId, size_t> producer;
  Analysis a{std::vector<int>(nodes.size(), 0), std::vector<int>(nodes.size(), -1), std::vector<std::vector<size_t>>(nodes.size())};
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::set<size_t> deps;
    forEachTensorArg(nodes[i], [&](ValueId v) {
      auto it = producer.find(v);
      if (it != producer.end()) deps.insert(it->second);
    });
    for (size_t d : deps) {
      a.depth[i] = std::max(a.depth[i], a.depth[d] + 1);
      a.stage[i] = std::max(a.stage[i], a.stage[d]);
    }
    if (nodes[i].op == "spmd::bucket_wait") a.stage[i] = static_cast<int>(i);
    a.deps[i].assign(deps.begin(), deps.end());
    for (ValueId o : nodes[i].outputs) {
      if (o != kNoValue) producer[o] = i;
    }
  }
  return a;
}

Node fusedNode(const Graph& g, const std::vector<size_t>& members, const ForeachForm& form) {
  const Node& first = g.nodes()[members[0]];
  Node fused;
  fused.op = form.op;
  fused.overload = form.overload;
  fused.meta = first.meta;
  fused.meta.source.clear();
  const size_t tensorsFrom = form.scalarFirst ? 1 : 0;
  if (form.scalarFirst) fused.args.push_back(first.args[0]);
  for (size_t k = tensorsFrom; k < tensorsFrom + form.tensorArgs; ++k) {
    Arg list;
    list.kind = Arg::Kind::Values;
    for (size_t m : members) list.values.push_back(g.nodes()[m].args[k].value);
    fused.args.push_back(list);
  }
  if (!form.scalarFirst) {
    for (size_t k = form.tensorArgs; k < form.tensorArgs + form.constants; ++k) fused.args.push_back(first.args[k]);
  }
  for (size_t m : members) fused.outputs.push_back(g.nodes()[m].outputs[0]);
  return fused;
}

bool argsMatchForm(const Node& n, const ForeachForm& form) {
  const size_t from = form.scalarFirst ? 1 : 0;
  for (size_t k = 0; k < n.args.size(); ++k) {
    if ((n.args[k].kind == Arg::Kind::Value) != (k >= from && k < from + form.tensorArgs)) return false;
  }
  return n.outputs.size() == 1 && n.outputs[0] != kNoValue;
}

// ---- exact rewrites that give ops a _foreach form ----------------------------

bool isOptimizerOp(const Node& n, const char* name) { return n.meta.role == NodeRole::Optimizer && n.qualifiedName() == name; }

// rsub.Scalar(x, s, 1) = s - x  ->  add.Scalar(neg(x), s, 1) = -x + s.
size_t splitRsubs(Graph& g) {
  size_t rewritten = 0;
  std::vector<Node> nodes = g.takeNodes();
  for (Node& n : nodes) {
    const bool alphaOne = n.args.size() == 3 && n.args[2].kind == Arg::Kind::Int && n.args[2].i == 1;
    if (!isOptimizerOp(n, "aten::rsub.Scalar") || !alphaOne || n.args[0].kind != Arg::Kind::Value ||
        n.args[1].kind == Arg::Kind::Value || n.outputs.size() != 1 || n.outputs[0] == kNoValue) {
      g.addNode(std::move(n));
      continue;
    }
    const Value& out = g.value(n.outputs[0]);
    const ValueId negated = g.addValue({g.freshName(out.name + "_neg"), out.dtype, out.shape});
    Node neg;
    neg.op = "aten::neg";
    neg.args = {n.args[0]};
    neg.outputs = {negated};
    neg.meta = n.meta;
    Node add = n;
    add.op = "aten::add";
    add.overload = "Scalar";
    add.args = {Arg::tensor(negated), n.args[1], n.args[2]};
    g.addNode(std::move(neg));
    g.addNode(std::move(add));
    ++rewritten;
  }
  return rewritten;
}

void replaceUses(Graph& g, const std::map<ValueId, ValueId>& replaced) {
  auto fix = [&](ValueId& v) {
    auto it = replaced.find(v);
    if (it != replaced.end()) v = it->second;
  };
  for (Node& n : g.nodes()) forEachTensorArg(n, fix);
  for (ValueId& v : g.outputs()) fix(v);
  for (StateUpdate& u : g.updates()) fix(u.value);
  for (Gradient& gr : g.gradients()) {
    fix(gr.value);
    if (gr.reduced != kNoValue) fix(gr.reduced);
  }
}

// full_like reads only its argument's type: those with the same constants,
// type and iteration tag are one value, made once.
size_t mergeFullLikes(Graph& g) {
  std::map<std::string, ValueId> made;
  std::map<ValueId, ValueId> replaced;
  std::vector<Node> nodes = g.takeNodes();
  for (Node& n : nodes) {
    if (!isOptimizerOp(n, "aten::full_like") || n.args.empty() || n.args[0].kind != Arg::Kind::Value ||
        n.outputs.size() != 1 || n.outputs[0] == kNoValue) {
      g.addNode(std::move(n));
      continue;
    }
    const Value& like = g.value(n.args[0].value);
    std::string key = constantsKey(n) + "|" + iterationTagName(n.meta.iteration) + "|" + std::to_string(static_cast<int>(like.dtype));
    for (int64_t d : like.shape) key += "," + std::to_string(d);
    auto [it, first] = made.emplace(key, n.outputs[0]);
    if (first) {
      g.addNode(std::move(n));
    } else {
      replaced[n.outputs[0]] = it->second;
    }
  }
  replaceUses(g, replaced);
  return replaced.size();
}

// Kahn's algorithm over units (single nodes or groups), taking the ready unit
// that came first in the old order: without groups the order is unchanged.
std::vector<Node> schedule(const Graph& g, const Analysis& a, const std::vector<int>& unitOf,
                           const std::vector<Node>& units, const std::vector<size_t>& unitFirst) {
  const size_t n = units.size();
  std::vector<std::set<size_t>> succ(n);
  std::vector<size_t> pending(n, 0);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (size_t d : a.deps[i]) {
      const size_t from = unitOf[d], to = unitOf[i];
      if (from != to && succ[from].insert(to).second) ++pending[to];
    }
  }
  using Item = std::pair<size_t, size_t>;  // (first old index, unit)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
  for (size_t u = 0; u < n; ++u) {
    if (pending[u] == 0) ready.push({unitFirst[u], u});
  }
  std::vector<Node> out;
  while (!ready.empty()) {
    const size_t u = ready.top().second;
    ready.pop();
    out.push_back(units[u]);
    for (size_t s : succ[u]) {
      if (--pending[s] == 0) ready.push({unitFirst[s], s});
    }
  }
  if (out.size() != n) throw std::logic_error("fuse-optimizer: grouping made a cycle");
  return out;
}

std::vector<std::string> commOrder(const std::vector<Node>& nodes) {
  std::vector<std::string> order;
  for (const Node& n : nodes) {
    if (isCollective(n.op)) order.push_back(n.qualifiedName() + std::to_string(n.args.back().i) + iterationTagName(n.meta.iteration));
  }
  return order;
}

}  // namespace

bool runFuseOptimizer(Graph& g, const PipelineOptions& options) {
  if (!options.lower.fuse) return false;
  const bool rewritten = splitRsubs(g) + mergeFullLikes(g) > 0;
  const Analysis a = analyse(g);
  std::map<std::string, std::vector<size_t>> groups;
  std::map<std::string, ForeachForm> formOf;
  std::set<std::string> unfused;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.meta.role != NodeRole::Optimizer) continue;
    auto form = foreachFormOf(n);
    if (!form || !argsMatchForm(n, *form)) {
      unfused.insert(n.qualifiedName());
      continue;
    }
    const std::string key = n.qualifiedName() + "|" + constantsKey(n) + "|" + std::to_string(a.depth[i]) +
                            "|" + std::to_string(a.stage[i]) + "|" + iterationTagName(n.meta.iteration) + "|" +
                            std::to_string(static_cast<int>(g.value(n.outputs[0]).dtype));
    groups[key].push_back(i);
    formOf.emplace(key, *form);
  }
  // Units: every node alone, except groups of two or more.
  std::vector<int> unitOf(g.nodes().size(), -1);
  std::vector<Node> units;
  std::vector<size_t> unitFirst;
  size_t fusedCalls = 0, fusedNodes = 0;
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    for (size_t m : members) unitOf[m] = static_cast<int>(units.size());
    units.push_back(fusedNode(g, members, formOf.at(key)));
    unitFirst.push_back(members.front());
    ++fusedCalls;
    fusedNodes += members.size();
  }
  if (fusedCalls == 0) return rewritten;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (unitOf[i] >= 0) continue;
    unitOf[i] = static_cast<int>(units.size());
    units.push_back(g.nodes()[i]);
    unitFirst.push_back(i);
  }
  std::vector<Node> scheduled = schedule(g, a, unitOf, units, unitFirst);
  if (commOrder(scheduled) != commOrder(g.nodes())) throw std::logic_error("fuse-optimizer: communication reordered");
  g.takeNodes();
  for (Node& n : scheduled) g.addNode(std::move(n));
  if (options.notes) {
    std::string kept;
    for (const auto& name : unfused) kept += (kept.empty() ? "" : ", ") + name;
    options.notes->push_back("fuse-optimizer: " + std::to_string(fusedNodes) + " optimizer nodes became " +
                             std::to_string(fusedCalls) + " _foreach calls" +
                             (kept.empty() ? "" : "; these have no _foreach form: " + kept));
  }
  return true;
}

}  // namespace spmd

// optimizer-to-foreach: the optimizer's per-parameter element-wise ops become
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
// its last input is ready; collectives are launched in the same order (a
// wait may move). Values and results
// do not change: on CPU _foreach ops loop over the same per-tensor kernels.
#include "spmd/ir/builder.h"
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

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName spmd_bucket_wait = OpName::known("spmd::bucket_wait");
  OpName rsub_Scalar = OpName::known("aten::rsub.Scalar");
  OpName full_like = OpName::known("aten::full_like");
  OpName add_Scalar = OpName::known("aten::add.Scalar");
  OpName pow_Scalar = OpName::known("aten::pow.Scalar");
  // The ops whose _foreach form takes any arguments of theirs.
  std::map<OpName, ForeachForm> foreach = {
      {OpName::known("aten::mul.Scalar"), {"aten::_foreach_mul", "Scalar", 1, 1}},
      {OpName::known("aten::add.Tensor"), {"aten::_foreach_add", "List", 2, 1}},
      {OpName::known("aten::sub.Tensor"), {"aten::_foreach_sub", "List", 2, 1}},
      {OpName::known("aten::mul.Tensor"), {"aten::_foreach_mul", "List", 2, 0}},
      {OpName::known("aten::div.Tensor"), {"aten::_foreach_div", "List", 2, 0}},
      {OpName::known("aten::maximum"), {"aten::_foreach_maximum", "List", 2, 0}},
      {OpName::known("aten::addcmul"), {"aten::_foreach_addcmul", "Scalar", 3, 1}},
      {OpName::known("aten::addcdiv"), {"aten::_foreach_addcdiv", "Scalar", 3, 1}},
      {OpName::known("aten::sqrt"), {"aten::_foreach_sqrt", "", 1, 0}},
      {OpName::known("aten::neg"), {"aten::_foreach_neg", "", 1, 0}},
      {OpName::known("aten::lerp.Scalar"), {"aten::_foreach_lerp", "Scalar", 2, 1}},
  };
};
const Ops& ops() { return opTable<Ops>(); }

// The _foreach form of an element-wise op, for the argument layouts the
// optimizer pass emits; nullopt when there is none or the arguments differ.
std::optional<ForeachForm> foreachFormOf(const Node& n) {
  auto isOne = [](const Arg& a) { return (a.kind == Arg::Kind::Int && a.i == 1) || (a.kind == Arg::Kind::Float && a.f == 1.0); };
  if (n.is(ops().add_Scalar) && n.args.size() == 3 && isOne(n.args[2])) return ForeachForm{"aten::_foreach_add", "Scalar", 1, 1};
  if (auto it = ops().foreach.find(n.name()); it != ops().foreach.end()) return it->second;
  if (n.is(ops().pow_Scalar) && n.args.size() == 2 && n.args[0].kind != Arg::Kind::Value &&
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
  const NodeList nodes = g.nodes();
  Analysis a{std::vector<int>(nodes.size(), 0), std::vector<int>(nodes.size(), -1), std::vector<std::vector<size_t>>(nodes.size())};
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::set<size_t> deps;
    forEachTensorArg(nodes[i], [&](ValueId v) {
      if (const Node* p = g.producer(v)) deps.insert(g.indexOf(*p));
    });
    for (size_t d : deps) {
      a.depth[i] = std::max(a.depth[i], a.depth[d] + 1);
      a.stage[i] = std::max(a.stage[i], a.stage[d]);
    }
    if (nodes[i].is(ops().spmd_bucket_wait)) a.stage[i] = static_cast<int>(i);
    a.deps[i].assign(deps.begin(), deps.end());
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

bool isOptimizerOp(const Node& n, OpName name) { return n.meta.role == NodeRole::Optimizer && n.is(name); }

// rsub.Scalar(x, s, 1) = s - x  ->  add.Scalar(neg(x), s, 1) = -x + s.
size_t splitRsubs(Graph& g) {
  size_t rewritten = 0;
  for (const Node* n : snapshot(g.nodes())) {
    const bool alphaOne = n->args.size() == 3 && n->args[2].kind == Arg::Kind::Int && n->args[2].i == 1;
    if (!isOptimizerOp(*n, ops().rsub_Scalar) || !alphaOne || n->args[0].kind != Arg::Kind::Value ||
        n->args[1].kind == Arg::Kind::Value || n->outputs.size() != 1 || n->outputs[0] == kNoValue) {
      continue;
    }
    GraphBuilder b(g);
    b.setInsertionPoint(*n);
    b.setMeta(n->meta);
    const ValueId negated = b.call("aten::neg", {n->args[0]}, g.value(n->outputs[0]).name + "_neg");
    const std::vector<Arg> args = {Arg::tensor(negated), n->args[1], n->args[2]};
    b.replace(*n, "aten::add.Scalar", args);
    ++rewritten;
  }
  return rewritten;
}

// full_like reads only its argument's type: those with the same constants,
// type and iteration tag are one value, made once.
size_t mergeFullLikes(Graph& g) {
  std::map<std::string, ValueId> made;
  size_t merged = 0;
  for (const Node* n : snapshot(g.nodes())) {
    if (!isOptimizerOp(*n, ops().full_like) || n->args.empty() || n->args[0].kind != Arg::Kind::Value ||
        n->outputs.size() != 1 || n->outputs[0] == kNoValue) {
      continue;
    }
    const Value& like = g.value(n->args[0].value);
    std::string key = constantsKey(*n) + "|" + iterationTagName(n->meta.iteration) + "|" +
                      std::to_string(static_cast<int>(like.dtype));
    for (int64_t d : like.shape) key += "," + std::to_string(d);
    auto [it, first] = made.emplace(key, n->outputs[0]);
    if (first) continue;
    g.replaceAllUsesWith(n->outputs[0], it->second);
    g.erase(*n);
    ++merged;
  }
  return merged;
}

// Kahn's algorithm over units (single nodes or groups), taking the ready unit
// that came first in the old order: without groups the order is unchanged.
std::vector<size_t> schedule(const Graph& g, const Analysis& a, const std::vector<int>& unitOf,
                             const std::vector<size_t>& unitFirst) {
  const size_t n = unitFirst.size();
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
  std::vector<size_t> out;
  while (!ready.empty()) {
    const size_t u = ready.top().second;
    ready.pop();
    out.push_back(u);
    for (size_t s : succ[u]) {
      if (--pending[s] == 0) ready.push({unitFirst[s], s});
    }
  }
  if (out.size() != n) throw std::logic_error("optimizer-to-foreach: grouping made a cycle");
  return out;
}

// The order in which the ranks launch collectives, which must stay the same
// on every rank. A wait (bucket_wait) only waits for this rank's own launch,
// and spmd::shard is a local slice: the schedule may move those.
std::vector<std::string> commOrder(const NodeList& nodes) {
  std::vector<std::string> order;
  for (const Node& n : nodes) {
    const CollectiveKind kind = collectiveKind(n.op);
    const bool launch = kind != CollectiveKind::Shard && kind != CollectiveKind::BucketWait && kind != CollectiveKind::GatherWait;
    if (isCollective(n.op) && launch) order.push_back(n.qualifiedName() + std::to_string(n.args.back().i) + iterationTagName(n.meta.iteration));
  }
  return order;
}


std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

class FuseOptimizerPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override;
};

}  // namespace

std::unique_ptr<Pass> createFuseOptimizerPass(const PipelineOptions&) { return std::make_unique<FuseOptimizerPass>(); }

bool FuseOptimizerPass::run(Graph& g, DiagnosticEngine& diagnostics) {
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
  // Units: every node alone, except groups of two or more, which become
  // one _foreach node each.
  const std::vector<const Node*> nodes = snapshot(g.nodes());
  std::vector<int> unitOf(nodes.size(), -1);
  std::vector<const Node*> unitNode;  // the node each unit runs, once the groups are fused
  std::vector<size_t> unitFirst;
  std::vector<Node> fused;
  std::vector<std::vector<size_t>> fusedMembers;
  size_t fusedNodes = 0;
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    for (size_t m : members) unitOf[m] = static_cast<int>(unitFirst.size());
    fused.push_back(fusedNode(g, members, formOf.at(key)));
    fusedMembers.push_back(members);
    unitNode.push_back(nullptr);
    unitFirst.push_back(members.front());
    fusedNodes += members.size();
  }
  if (fused.empty()) {
    if (!unfused.empty()) diagnostics.note("optimizer-to-foreach: nothing fused; these have no _foreach form: " + joined(unfused));
    return rewritten;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (unitOf[i] >= 0) continue;
    unitOf[i] = static_cast<int>(unitFirst.size());
    unitNode.push_back(nodes[i]);
    unitFirst.push_back(i);
  }
  const std::vector<size_t> order = schedule(g, a, unitOf, unitFirst);
  const std::vector<std::string> commBefore = commOrder(g.nodes());
  // A group's members leave; its _foreach node defines their values.
  for (size_t k = 0; k < fused.size(); ++k) {
    for (size_t m : fusedMembers[k]) g.extract(*nodes[m]);
    unitNode[k] = &g.addNode(std::move(fused[k]));
  }
  std::vector<const Node*> scheduled;
  for (size_t u : order) scheduled.push_back(unitNode[u]);
  g.reorder(scheduled);
  if (commOrder(g.nodes()) != commBefore) throw std::logic_error("optimizer-to-foreach: communication reordered");
  count("optimizer nodes fused", fusedNodes);
  count("_foreach calls", static_cast<int64_t>(fused.size()));
  if (!unfused.empty()) diagnostics.note("optimizer-to-foreach: these have no _foreach form: " + joined(unfused));
  return true;
}

}  // namespace spmd

// fuse-rows (spmd-lower runs it for --device cuda, before fuse-pointwise):
// reductions over the last dimension together with the element-wise ops
// around them become one spmd::fused node each, whose program is a row
// program (ops/pointwise_program.h) and whose kernel runs a row per warp.
// What it takes:
//  - sum.dim_IntList, mean.dim and amax over the last dimension with
//    keepdim (RMSNorm's variance, the backward's sums of a broadcast);
//  - _softmax, _log_softmax and their backward over the last dimension
//    (attention written by hand: scale, mask, softmax and the casts);
//  - expand of a row's value along the row (a mean's backward);
//  - fuse-pointwise's element-wise ops, on whole rows or on the rows' values.
// Grouping is greedy in program order, as fuse-pointwise's is: an op joins
// the group of one of its producers when it runs over the group's rows (its
// result has the group's shape, or the shape with the last dimension 1 for
// a value computed from the rows' reductions alone), has the group's role
// and iteration, and no outside node reads the group's values before it. A
// group becomes a node only if it holds a reduction; the rest is left to
// fuse-pointwise. Not taken: reductions over other dimensions (column sums
// are column-sum-to-kernel's), without keepdim, or over rows of length 0.
#include "pointwise_groups.h"
#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

namespace spmd {
namespace {

using P = PointwiseOp;

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName sum_dim_IntList = OpName::known("aten::sum.dim_IntList");
  OpName mean_dim = OpName::known("aten::mean.dim");
  OpName amax = OpName::known("aten::amax");
  OpName _softmax = OpName::known("aten::_softmax");
  OpName softmax_int = OpName::known("aten::softmax.int");
  OpName _log_softmax = OpName::known("aten::_log_softmax");
  OpName log_softmax_int = OpName::known("aten::log_softmax.int");
  OpName _softmax_backward_data = OpName::known("aten::_softmax_backward_data");
  OpName _log_softmax_backward_data = OpName::known("aten::_log_softmax_backward_data");
  OpName expand = OpName::known("aten::expand");
};
const Ops& ops() { return opTable<Ops>(); }

std::vector<int64_t> rowShapeOf(std::vector<int64_t> shape) {
  if (!shape.empty()) shape.back() = 1;
  return shape;
}

// How a translated node relates to the rows it runs over.
enum class RowRole {
  Elementwise,  // fuse-pointwise's ops: its level follows its operands
  Reduction,    // one value a row from a whole row (`over` is its input)
  RowOp,        // a whole row from a whole row, reducing inside (softmax)
  Broadcast,    // a row's value along the row (expand)
};

struct RowCandidate {
  Candidate candidate;
  RowRole role = RowRole::Elementwise;
  std::vector<int64_t> rows;  // the shape it runs over (Elementwise: its output's)
};

bool isLastDim(const Arg& dims, size_t rank) {
  if (dims.kind != Arg::Kind::Ints || dims.ints.size() != 1) return false;
  const int64_t d = dims.ints[0];
  return d == -1 || (rank > 0 && d == static_cast<int64_t>(rank) - 1);
}

bool isLastDimInt(const Arg& dim, size_t rank) {
  return dim.kind == Arg::Kind::Int && (dim.i == -1 || (rank > 0 && dim.i == static_cast<int64_t>(rank) - 1));
}

// The reductions and row ops as statements (their formulas are ATen's:
// softmax is exp(x - max) / sum; its backward y * (g - sum(g * y)); log
// softmax's backward g - exp(y) * sum(g)).
std::optional<RowCandidate> translateReduction(const Graph& g, const Node& n) {
  const Ops& o = ops();
  const OpName op = n.name();
  const auto& a = n.args;
  if (a.empty() || a[0].kind != Arg::Kind::Value) return std::nullopt;
  const std::vector<int64_t>& in = g.value(a[0].value).shape;
  const Source x = valueSource(a[0].value);
  auto local = localSource;
  RowCandidate c{{&n, {}}, RowRole::Reduction, in};
  auto& steps = c.candidate.steps;
  const bool keepLast = a.size() >= 3 && isLastDim(a[1], in.size()) && a[2].kind == Arg::Kind::Bool && a[2].b;
  if ((op == o.sum_dim_IntList || op == o.mean_dim) && a.size() == 4 && keepLast) {
    steps.push_back({P::RowSum, {x}});
    if (op == o.mean_dim) steps.push_back({P::Div, {local(0), constantSource(static_cast<double>(in.back()))}});
    return c;
  }
  if (op == o.amax && a.size() == 3 && keepLast) {
    steps.push_back({P::RowMax, {x}});
    return c;
  }
  c.role = RowRole::RowOp;
  // softmax.int(x, dim, dtype) is the user's call (composite); _softmax
  // (x, dim, half_to_float) autograd's. Both compute in float.
  const bool lastDim = a.size() == 3 && isLastDimInt(a[1], in.size());
  const bool softmax = op == o._softmax || op == o.softmax_int;
  if ((softmax || op == o._log_softmax || op == o.log_softmax_int) && lastDim) {
    steps = {{P::RowMax, {x}}, {P::Sub, {x, local(0)}}, {P::Exp, {local(1)}}, {P::RowSum, {local(2)}}};
    if (softmax) {
      steps.push_back({P::Div, {local(2), local(3)}});
    } else {
      steps.push_back({P::Log, {local(3)}});
      steps.push_back({P::Sub, {local(1), local(4)}});
    }
    return c;
  }
  const bool backward = a.size() == 4 && a[1].kind == Arg::Kind::Value && isLastDimInt(a[2], in.size());
  if (op == o._softmax_backward_data && backward) {
    const Source y = valueSource(a[1].value);
    steps = {{P::Mul, {x, y}}, {P::RowSum, {local(0)}}, {P::Sub, {x, local(1)}}, {P::Mul, {y, local(2)}}};
    return c;
  }
  if (op == o._log_softmax_backward_data && backward) {
    const Source y = valueSource(a[1].value);
    steps = {{P::RowSum, {x}}, {P::Exp, {y}}, {P::Mul, {local(1), local(0)}}, {P::Sub, {x, local(2)}}};
    return c;
  }
  if (op == o.expand && a.size() >= 2) {
    const std::vector<int64_t>& out = g.value(n.outputs[0]).shape;
    if (in.size() != out.size() || rowShapeOf(out) != in || out.empty() || out.back() == 1) return std::nullopt;
    return RowCandidate{{&n, {{P::Cast, {x}}}}, RowRole::Broadcast, out};
  }
  return std::nullopt;
}

std::optional<RowCandidate> translateRowNode(const Graph& g, const Node& n) {
  if (auto steps = translatePointwise(n)) {
    return RowCandidate{{&n, std::move(*steps)}, RowRole::Elementwise, g.value(n.outputs[0]).shape};
  }
  return translateReduction(g, n);
}

struct RowGroup {
  std::vector<Candidate> members;
  std::set<const Node*> nodes;
  std::vector<int64_t> rows;    // the iteration space
  std::set<ValueId> rowValues;  // members' values of one value a row
  bool reduces = false;
};

class RowFuser {
 public:
  explicit RowFuser(Graph& g) : g_(g) {}

  int run() {
    for (const Node* n : snapshot(g_.nodes())) consider(*n);
    int fused = 0;
    for (RowGroup& group : groups_) {
      if (group.members.empty() || !group.reduces || group.rows.empty() || group.rows.back() == 0 || !inputsSpanRows(group)) continue;
      const std::vector<int64_t> perRowShape = rowShapeOf(group.rows);
      replaceWithFusedNode(g_, group.members, group.nodes, [&](ValueId v) {
        return group.rowValues.count(v) && g_.value(v).shape == perRowShape;
      });
      ++fused;
      fusedOps_ += static_cast<int>(group.members.size());
    }
    return fused;
  }
  int fusedOps() const { return fusedOps_; }

 private:
  // Whether the candidate's value is one a row within `group` (nullopt: it
  // does not run over the group's rows).
  std::optional<bool> levelIn(const RowGroup& group, const RowCandidate& c) const {
    const std::vector<int64_t>& out = g_.value(c.candidate.node->outputs[0]).shape;
    const std::vector<int64_t> perRow = rowShapeOf(group.rows);
    switch (c.role) {
      case RowRole::Reduction:
        return c.rows == group.rows ? std::optional<bool>(true) : std::nullopt;
      case RowRole::RowOp:
        return c.rows == group.rows ? std::optional<bool>(false) : std::nullopt;
      case RowRole::Broadcast:
        return c.rows == group.rows && group.rowValues.count(c.candidate.node->args[0].value) ? std::optional<bool>(true)
                                                                                              : std::nullopt;
      case RowRole::Elementwise: break;
    }
    bool fromRows = true;
    forEachTensorArg(*c.candidate.node, [&](ValueId v) {
      const Node* p = g_.producer(v);
      const bool outside = !(p && group.nodes.count(p));
      fromRows = fromRows && (group.rowValues.count(v) || (outside && constantAlongRows(g_.value(v).shape, group.rows)));
    });
    if (fromRows && (out == perRow || out == group.rows)) return true;
    if (!fromRows && out == group.rows) return false;
    return std::nullopt;
  }

  // The groups of `n`'s producers, each once, in argument order.
  std::vector<int> producerGroups(const Node& n) const {
    std::vector<int> found;
    forEachTensorArg(n, [&](ValueId v) {
      const Node* p = g_.producer(v);
      auto it = p ? groupOf_.find(p) : groupOf_.end();
      if (it != groupOf_.end() && std::find(found.begin(), found.end(), it->second) == found.end()) {
        found.push_back(it->second);
      }
    });
    return found;
  }

  // `group` with `other` in it: `other` runs over the same rows, or over
  // their values alone (then every value of it is one a row).
  static void absorb(RowGroup& group, const RowGroup& other, const Graph& g) {
    for (const Candidate& m : other.members) {
      group.members.push_back(m);
      group.nodes.insert(m.node);
      if (other.rows != group.rows) group.rowValues.insert(m.node->outputs[0]);
    }
    group.rowValues.insert(other.rowValues.begin(), other.rowValues.end());
    group.reduces = group.reduces || other.reduces;
    std::sort(group.members.begin(), group.members.end(),
              [&](const Candidate& x, const Candidate& y) { return g.indexOf(*x.node) < g.indexOf(*y.node); });
  }

  // The group `n` joins in `producers[first]`'s place, with the other
  // producer groups it can merge; nullopt when `n` cannot join it.
  std::optional<RowGroup> joined(const Node& n, const RowCandidate& c, const std::vector<int>& producers,
                                 size_t first, bool& rowLevel) const {
    const RowGroup& base = groups_[producers[first]];
    if (!sameSchedule(*base.members.front().node, n)) return std::nullopt;
    RowGroup merged = base;
    for (size_t k = 0; k < producers.size(); ++k) {
      const RowGroup& other = groups_[producers[k]];
      const bool sameRows = other.rows == base.rows || (!other.reduces && other.rows == rowShapeOf(base.rows));
      if (k != first && sameRows && sameSchedule(*other.members.front().node, n)) absorb(merged, other, g_);
    }
    for (const RowGroup* g : {static_cast<const RowGroup*>(&merged), &base}) {
      const std::optional<bool> level = levelIn(*g, c);
      if (level && canEndGroupAt(g_, g->members, g->nodes, n)) {
        rowLevel = *level;
        return *g;
      }
    }
    return std::nullopt;
  }

  void consider(const Node& n) {
    if (!hasPointwiseDtypes(g_, n)) return;
    std::optional<RowCandidate> c = translateRowNode(g_, n);
    if (!c || drawsMask(c->candidate.steps)) return;  // row kernels draw no masks: fuse-pointwise takes it
    foldScalarTensors(g_, c->candidate.steps);
    const std::vector<int> producers = producerGroups(n);
    int chosen = -1;
    bool rowLevel = false;
    for (size_t k = 0; k < producers.size() && chosen < 0; ++k) {
      std::optional<RowGroup> group = joined(n, *c, producers, k, rowLevel);
      if (!group) continue;
      chosen = producers[k];
      for (const Candidate& m : group->members) groupOf_[m.node] = chosen;
      for (int other : producers) {
        if (other != chosen && groupOf_.at(groups_[other].members.front().node) == chosen) groups_[other] = RowGroup{};
      }
      groups_[chosen] = std::move(*group);
    }
    if (chosen < 0) {
      // A group starts at an op over whole rows; a broadcast needs its row's value.
      if (c->role == RowRole::Broadcast) return;
      chosen = static_cast<int>(groups_.size());
      groups_.push_back(RowGroup{{}, {}, c->rows, {}, false});
      rowLevel = c->role == RowRole::Reduction;
    }
    RowGroup& group = groups_[chosen];
    group.reduces = group.reduces || c->role == RowRole::Reduction || c->role == RowRole::RowOp;
    if (rowLevel) group.rowValues.insert(n.outputs[0]);
    group.members.push_back(std::move(c->candidate));
    group.nodes.insert(&n);
    groupOf_[&n] = chosen;
  }

  // The kernel's iteration space is what its inputs broadcast to: they must
  // span the group's rows (not so where a row only comes from an expand).
  bool inputsSpanRows(const RowGroup& group) const {
    std::vector<KernelTensor> inputs;
    for (const Candidate& m : group.members) {
      for (const Step& s : m.steps) {
        for (const Source& src : s.operands) {
          const Node* p = src.kind == Source::Kind::Value ? g_.producer(src.value) : nullptr;
          if (src.kind == Source::Kind::Value && !(p && group.nodes.count(p))) {
            inputs.push_back({g_.value(src.value).dtype, g_.value(src.value).shape});
          }
        }
      }
    }
    try {
      return !inputs.empty() && broadcastShapes(inputs) == group.rows;
    } catch (const std::invalid_argument&) {
      return false;
    }
  }

  Graph& g_;
  std::vector<RowGroup> groups_;
  std::map<const Node*, int> groupOf_;
  int fusedOps_ = 0;
};

class FuseRowsPass : public Pass {
 public:
  bool run(Graph& graph, DiagnosticEngine&) override {
    RowFuser fuser(graph);
    const int groups = fuser.run();
    count("ops fused", fuser.fusedOps());
    count("generated row kernels", groups);
    return groups > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseRowsPass(const PipelineOptions&) { return std::make_unique<FuseRowsPass>(); }

}  // namespace spmd

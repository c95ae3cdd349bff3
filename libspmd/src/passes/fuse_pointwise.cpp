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
// takes the place of its last member). An op that reads the values of two
// or more such groups merges them, where the merged group may still end at
// it (a * b - c * d is one kernel). An op none of whose producers' groups
// it can join joins a group that reads one of its inputs too (siblings:
// the kernel reads that input once). Single ops stay as they are, but for
// dropout-mask-in-kernel's spmd::dropout_mul (whose mask only a generated kernel
// draws) and a cast from bf16 or f16 up to f32 of at least kLoneCastElements
// elements over a densely laid-out input (autocast's weight gradients, cast
// back to the parameters' f32). ATen runs that cast with its unrolled,
// element-at-a-time copy kernel (about 430 GB/s for gpt's gradients on an
// H200), the generated kernel with 16-byte accesses (about 860 GB/s there).
// Not done here: reductions (softmax, LayerNorm, sums), ops on f64 or integer
// tensors, random ops other than dropout-mask-in-kernel's masks, and views between
// members.
#include "pointwise_groups.h"
#include "spmd/ops/op_traits.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName _to_copy = OpName::known("aten::_to_copy");
  OpName t = OpName::known("aten::t");
  OpName _reshape_alias = OpName::known("aten::_reshape_alias");
  OpName view = OpName::known("aten::view");
  OpName _unsafe_view = OpName::known("aten::_unsafe_view");
  OpName reshape = OpName::known("aten::reshape");
};
const Ops& ops() { return opTable<Ops>(); }

// How far below a sibling group an op may be to move up and join it.
constexpr size_t kSiblingReach = 16;

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
  int transposes = 0;
  while (const Node* p = g.producer(v)) {
    const Ops& o = ops();
    if (p->args.empty() || p->args[0].kind != Arg::Kind::Value) return true;
    if (p->is(o.t)) {
      ++transposes;
    } else if (p->is(o._reshape_alias)) {
      if (transposes % 2 || p->args.size() < 3 || p->args[2].ints != contiguousStrides(g.value(v).shape)) return false;
    } else if (p->is(o.view) || p->is(o._unsafe_view) || p->is(o.reshape)) {
      if (transposes % 2) return false;
    } else if (hasTrait(p->op, OpTrait::StridedView)) {
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
  if (!n.is(ops()._to_copy)) return false;
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
      if (group.members.empty()) continue;  // merged into another
      const Candidate& first = group.members.front();
      if (group.members.size() < 2 && !isWorthyLoneCast(g_, first) && !drawsMask(first.steps)) continue;
      replaceWithFusedNode(g_, group.members, group.nodes);
      ++fused;
      fusedOps_ += static_cast<int>(group.members.size());
    }
    return fused;
  }
  int fusedOps() const { return fusedOps_; }

 private:
  void consider(const Node& n) {
    if (!hasPointwiseDtypes(g_, n)) return;
    auto steps = translatePointwise(n);
    if (!steps) return;
    foldScalarTensors(g_, *steps);
    const std::vector<int64_t>& shape = g_.value(n.outputs[0]).shape;
    int chosen = -1;
    forEachTensorArg(n, [&](ValueId v) {
      const Node* p = g_.producer(v);
      auto it = p ? groupOf_.find(p) : groupOf_.end();
      if (it == groupOf_.end() || it->second == chosen) return;
      const Group& group = groups_[it->second];
      if (group.shape != shape || !sameSchedule(*group.members.front().node, n)) return;
      if (chosen < 0) {
        if (canEndGroupAt(g_, group.members, group.nodes, n)) chosen = it->second;
      } else {
        mergeIfItCanEndAt(chosen, it->second, n);
      }
    });
    const Node* node = &n;
    if (chosen < 0) chosen = siblingGroupFor(node, shape);
    if (chosen < 0) {
      chosen = static_cast<int>(groups_.size());
      groups_.push_back(Group{{}, {}, shape});
    }
    groups_[chosen].members.push_back({node, std::move(*steps)});
    groups_[chosen].nodes.insert(node);
    groupOf_[node] = chosen;
    forEachTensorArg(*node, [&](ValueId v) { readBy_[v].push_back(chosen); });
  }

  // A group that reads one of n's inputs too, over the same iteration, that
  // n, read by no element-wise op, can join though neither reads the other
  // (siblings: the kernel reads the shared input once). The group may end at
  // n; or n moves up to just after the group's last member, when it is at
  // most kSiblingReach nodes below it and its inputs are there by then (or
  // are views of values that are, which move up with it). That is a
  // recomputed forward value beside the backward op that reads what it was
  // computed from, a few nodes apart (GELU's recomputation for the next
  // GEMM's weight gradient, and GELU's backward: both read the GEMM's
  // output). Returns the group, or -1; `n` is then where the node is now.
  // The nodes moved are behind the caller's walk already.
  int siblingGroupFor(const Node*& n, const std::vector<int64_t>& shape) {
    if (!readOnlyByOtherOps(*n)) return -1;  // it may join its readers' group instead
    int found = -1;
    const Node* after = nullptr;
    std::vector<const Node*> alongside;  // views n reads, moved up before it
    forEachTensorArg(*n, [&](ValueId v) {
      auto readers = readBy_.find(v);
      if (found >= 0 || readers == readBy_.end()) return;
      for (int index : readers->second) {
        const Group& group = groups_[index];
        if (group.members.empty() || group.shape != shape || !sameSchedule(*group.members.front().node, *n)) continue;
        if (canEndGroupAt(g_, group.members, group.nodes, *n)) {
          found = index;
          return;
        }
        const Node* last = group.members.back().node;
        if (std::optional<std::vector<const Node*>> views = movesUpTo(*n, *last)) {
          found = index;
          after = last;
          alongside = *views;
          return;
        }
      }
    });
    if (!after) return found;
    for (const Node* view : alongside) after = &g_.insertAfter(*after, g_.extract(*view));
    n = &g_.insertAfter(*after, g_.extract(*n));
    return found;
  }

  // Whether no element-wise op reads `n`'s result (a GEMM does, through a
  // view, say): then n would be no other group's member.
  bool readOnlyByOtherOps(const Node& n) {
    for (ValueId out : n.outputs) {
      for (const Node* reader : g_.users(out)) {
        if (hasPointwiseDtypes(g_, *reader) && translatePointwise(*reader)) return false;
      }
    }
    return true;
  }

  // The nodes to move up with `n` so that it can follow `anchor` (views of
  // values defined by then, which `n` reads), or nullopt where it cannot:
  // not close below it, or an input made later by anything but such a view.
  std::optional<std::vector<const Node*>> movesUpTo(const Node& n, const Node& anchor) {
    const size_t at = g_.indexOf(anchor), from = g_.indexOf(n);
    if (from <= at || from - at > kSiblingReach) return std::nullopt;
    std::vector<const Node*> views;
    bool ready = true;
    forEachTensorArg(n, [&](ValueId v) {
      const Node* p = g_.producer(v);
      if (!p || g_.indexOf(*p) <= at) return;
      const bool earlyView = p->is(ops().view) && p->args[0].kind == Arg::Kind::Value &&
                             (!g_.producer(p->args[0].value) || g_.indexOf(*g_.producer(p->args[0].value)) <= at);
      if (earlyView) views.push_back(p);
      ready = ready && earlyView;
    });
    if (!ready) return std::nullopt;
    return views;
  }

  // An op that reads two groups' values joins both: `other` is merged into
  // `into` where the merged group may still end at `n` (no node outside it
  // reads its values before `n`). That takes the products of a rotary
  // embedding, x0 * cos - x1 * sin, into one kernel with their difference,
  // where only one of them would join it otherwise.
  void mergeIfItCanEndAt(int into, int other, const Node& n) {
    Group merged = groups_[into];
    const Group& from = groups_[other];
    merged.members.insert(merged.members.end(), from.members.begin(), from.members.end());
    merged.nodes.insert(from.nodes.begin(), from.nodes.end());
    if (!canEndGroupAt(g_, merged.members, merged.nodes, n)) return;
    // Members stay in program order: a statement reads only earlier ones.
    std::sort(merged.members.begin(), merged.members.end(), [&](const Candidate& a, const Candidate& b) {
      return g_.indexOf(*a.node) < g_.indexOf(*b.node);
    });
    for (const Node* m : from.nodes) {
      groupOf_[m] = into;
      forEachTensorArg(*m, [&](ValueId v) { readBy_[v].push_back(into); });
    }
    groups_[into] = std::move(merged);
    groups_[other] = Group{};
  }

  Graph& g_;
  std::vector<Group> groups_;
  std::map<const Node*, int> groupOf_;
  std::map<ValueId, std::vector<int>> readBy_;  // value -> the groups whose members read it
  int fusedOps_ = 0;
};

class FusePointwisePass : public Pass {
 public:
  bool run(Graph& graph, DiagnosticEngine&) override {
    PointwiseFuser fuser(graph);
    const int groups = fuser.run();
    count("element-wise ops fused", fuser.fusedOps());
    count("generated kernels", groups);
    return groups > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createFusePointwisePass(const PipelineOptions&) { return std::make_unique<FusePointwisePass>(); }

}  // namespace spmd

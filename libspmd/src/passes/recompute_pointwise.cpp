// recompute-pointwise (spmd-lower runs it for --device cuda with generated
// kernels, before the passes that group element-wise ops into kernels): an
// element-wise result of the forward that the backward reads is computed
// again in the backward from what the forward's element-wise region read,
// instead of being kept from the forward to the backward, when that keeps
// fewer bytes. It is the idea of AOTAutograd's partitioner (torch.compile
// recomputes cheap ops in its backward) on whole regions:
//
//   forward:  %h = addmm(...)                              (bf16 [8192, 3072])
//             %x = cast(%h) -> f32 ; %t = tanh(...%x...) ; %a = add(%t, 1)
//             %g = mul(...) -> bf16                        (read by the next GEMM)
//   backward: mm(..., %g) ; mul(%grad, %a) ; tanh_backward(..., %t) ; mul(..., %x)
//     -> the backward reads clones of %g, %a, %t and %x, each computed from %h
//        just before its first backward reader, and %h is what is kept.
//
// That is transformers' GPT-2 MLP (gelu_new in fp32 under autocast): four fp32
// and two bf16 values of [8192, 3072] kept a layer become one bf16 GEMM
// result, and fuse-pointwise puts each clone in the backward's kernel that
// reads it. The values are the same, bit for bit: the clones are the same ops
// on the same inputs, and a generated kernel rounds each op to the dtype its
// node has, wherever the op is fused.
//
// A region is a connected set of the forward's element-wise ops (those
// fuse-pointwise computes, drawing no random mask) and the views between
// them; what it reads from other ops (a GEMM's result, a LayerNorm's, a
// reduction) is its frontier. A minimum cut between the frontier and the
// region's values the backward reads picks what to keep (cheapestToKeep):
// a region value costs its bytes, a frontier value twice the bytes nothing
// else keeps until the backward, plus one, so that recomputing must keep
// fewer than half the bytes to be chosen: it costs time (a residual add of
// a bf16 GEMM result to the fp32 stream, 24 MiB kept against 12, stays).
// Ops that read no data, only parameters, buffers and constants, are in no
// region (see regions()). Noted: regions kept as they are, regions of more
// than kMaxRegionNodes ops (kept). Ops of other iterations of an unrolled
// graph are left alone.
#include "pointwise_groups.h"
#include "spmd/analysis/memory_plan.h"
#include "spmd/ops/op_traits.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace spmd {
namespace {

// A bound on the cut's size (a region is a few ops a layer, joined across
// layers by the residual stream).
constexpr size_t kMaxRegionNodes = 4096;

bool isPlain(const Node& n, NodeRole role) { return n.meta.role == role && n.meta.iteration == IterationTag::Every; }
bool isForward(const Node& n) { return isPlain(n, NodeRole::Forward); }
bool isBackward(const Node& n) { return isPlain(n, NodeRole::Backward); }

// A forward element-wise op that a generated kernel computes and that draws
// nothing at random (the same op on the same inputs gives the same bits), or
// a view, which costs nothing to make again (GPT-2's Conv1D flattens the
// GELU's result before its GEMM, and the backward reads that view).
bool isRecomputable(const Graph& g, const Node& n) {
  if (!isForward(n) || n.outputs.size() != 1 || hasTrait(n.op, OpTrait::Random)) return false;
  if (makesViewsOnly(n)) return !n.args.empty() && n.args[0].kind == Arg::Kind::Value;
  if (!hasPointwiseDtypes(g, n)) return false;
  auto steps = translatePointwise(n);
  return steps && !drawsMask(*steps);
}

bool readInBackward(const Graph& g, ValueId v) {
  for (const Node* r : g.users(v)) {
    if (isBackward(*r)) return true;
  }
  return false;
}

// Union-find over node positions.
struct Components {
  std::vector<size_t> parent;
  explicit Components(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), size_t{0}); }
  size_t find(size_t k) {
    while (parent[k] != k) k = parent[k] = parent[parent[k]];
    return k;
  }
  void join(size_t a, size_t b) { parent[find(a)] = find(b); }
};

// A minimum s-t cut by maximum flow (Dinic's algorithm): after run(), the
// nodes on the source's side are those the residual graph reaches from s.
class MinCut {
 public:
  static constexpr int64_t kInfinite = int64_t{1} << 60;
  explicit MinCut(int nodes) : head_(nodes, -1), level_(nodes), next_(nodes) {}

  void addEdge(int from, int to, int64_t capacity) {
    edges_.push_back({to, head_[from], capacity});
    head_[from] = static_cast<int>(edges_.size()) - 1;
    edges_.push_back({from, head_[to], 0});
    head_[to] = static_cast<int>(edges_.size()) - 1;
  }

  void run(int s, int t) {
    while (levels(s, t)) {
      next_ = head_;
      while (push(s, t, kInfinite) > 0) {
      }
    }
  }

  bool sourceSide(int k) const { return level_[k] >= 0; }

 private:
  struct Edge {
    int to;
    int next;
    int64_t capacity;
  };

  // Breadth-first levels from s over edges with capacity left; whether t is reached.
  bool levels(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<int> queue = {s};
    level_[s] = 0;
    for (size_t q = 0; q < queue.size(); ++q) {
      for (int e = head_[queue[q]]; e >= 0; e = edges_[e].next) {
        if (edges_[e].capacity > 0 && level_[edges_[e].to] < 0) {
          level_[edges_[e].to] = level_[queue[q]] + 1;
          queue.push_back(edges_[e].to);
        }
      }
    }
    return level_[t] >= 0;
  }

  int64_t push(int v, int t, int64_t limit) {
    if (v == t) return limit;
    for (int& e = next_[v]; e >= 0; e = edges_[e].next) {
      Edge& edge = edges_[e];
      if (edge.capacity <= 0 || level_[edge.to] != level_[v] + 1) continue;
      const int64_t pushed = push(edge.to, t, std::min(limit, edge.capacity));
      if (pushed > 0) {
        edge.capacity -= pushed;
        edges_[e ^ 1].capacity += pushed;
        return pushed;
      }
    }
    return 0;
  }

  std::vector<Edge> edges_;
  std::vector<int> head_, level_, next_;
};

class RecomputePointwisePass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    bool changed = false;
    for (std::vector<const Node*>& region : regions(g)) changed |= consider(g, region, diagnostics);
    return changed;
  }

 private:
  // The forward's element-wise ops, grouped by the values they pass each
  // other, each group in program order; groups ordered by their first op.
  // Ops that read no data, only parameters, buffers and constants (at any
  // distance), are no part of any: autocast's
  // casts of the weights (made once a step, read by the forward and the
  // backward alike), and tables such as rotary embeddings' cos and sin that
  // every layer reads (which would join the layers' regions into one).
  static std::vector<std::vector<const Node*>> regions(const Graph& g) {
    const std::vector<const Node*> nodes = snapshot(g.nodes());
    std::map<const Node*, size_t> position;
    std::vector<bool> recomputable(nodes.size(), false);
    std::vector<bool> fromState(nodes.size(), false);
    for (size_t k = 0; k < nodes.size(); ++k) {
      position[nodes[k]] = k;
      bool noData = true;
      forEachTensorArg(*nodes[k], [&](ValueId v) {
        const Node* p = g.producer(v);
        const GraphInput* in = p ? nullptr : g.inputOf(v);
        noData = noData && (p ? fromState[position.at(p)] : (in && in->kind != InputKind::Data));
      });
      fromState[k] = noData;
      recomputable[k] = !noData && isRecomputable(g, *nodes[k]);
    }
    Components components(nodes.size());
    for (size_t k = 0; k < nodes.size(); ++k) {
      if (!recomputable[k]) continue;
      forEachTensorArg(*nodes[k], [&](ValueId v) {
        const Node* p = g.producer(v);
        if (p && recomputable[position.at(p)]) components.join(k, position.at(p));
      });
    }
    std::map<size_t, std::vector<const Node*>> byRoot;  // root -> members; keyed again by first member below
    for (size_t k = 0; k < nodes.size(); ++k) {
      if (recomputable[k]) byRoot[components.find(k)].push_back(nodes[k]);
    }
    std::map<size_t, std::vector<const Node*>> byFirst;
    for (auto& [root, members] : byRoot) byFirst[position.at(members.front())] = std::move(members);
    std::vector<std::vector<const Node*>> result;
    for (auto& [first, members] : byFirst) result.push_back(std::move(members));
    return result;
  }

  // Recomputes those of the region's values the backward reads that are not
  // among the cheapest values to keep; returns whether it did.
  bool consider(Graph& g, const std::vector<const Node*>& region, DiagnosticEngine& diagnostics) {
    const std::set<const Node*> members(region.begin(), region.end());
    std::vector<ValueId> read;  // the region's values the backward reads
    for (const Node* n : region) {
      if (readInBackward(g, n->outputs[0])) read.push_back(n->outputs[0]);
    }
    if (read.empty()) return false;
    if (region.size() > kMaxRegionNodes) {
      diagnostics.note(region.front()->meta.source, "recompute-pointwise: a region of " +
                                                        std::to_string(region.size()) + " ops kept: more than " +
                                                        std::to_string(kMaxRegionNodes));
      return false;
    }
    const std::vector<ValueId> frontier = frontierOf(g, region);
    const std::set<ValueId> keep = cheapestToKeep(g, region, frontier, read);
    std::vector<ValueId> recomputed;
    int64_t before = 0, after = 0, computed = 0;
    std::set<ValueId> memory;  // distinct memory the backward reads now
    for (ValueId v : read) {
      const ValueId base = memoryBaseOf(g, v);
      if (members.count(g.producer(base)) && memory.insert(base).second) before += bytes(g.value(base));
      if (keep.count(v)) continue;
      recomputed.push_back(v);
      if (!makesViewsOnly(*g.producer(v))) ++computed;
    }
    for (ValueId v : keep) after += members.count(g.producer(v)) ? bytes(g.value(v)) : extraBytesToKeep(g, v);
    if (computed == 0) {
      if (before > 0) count("region(s) kept as they are: recomputing would not keep half as many bytes");
      return false;
    }
    recompute(g, recomputed, members, keep);
    count("value(s) recomputed in the backward instead of kept", computed);
    count("MiB fewer kept from the forward to the backward", (before - after) >> 20);
    return true;
  }

  // The values to keep for the backward, fewest bytes first: a minimum cut
  // between what the region reads (its frontier) and what the backward reads
  // of it, through the region's ops. Keeping a region value costs its bytes
  // (nothing for one the step returns anyway, never a view: its base is
  // kept instead); keeping a frontier value costs twice the bytes nothing
  // else keeps until the backward, plus one, so that recomputing must keep
  // fewer than half the bytes to be chosen (it costs time).
  static std::set<ValueId> cheapestToKeep(const Graph& g, const std::vector<const Node*>& region,
                                          const std::vector<ValueId>& frontier, const std::vector<ValueId>& read) {
    std::map<ValueId, int> index;  // value -> k: nodes 2k (in) and 2k + 1 (out)
    for (ValueId f : frontier) index.emplace(f, static_cast<int>(index.size()));
    for (const Node* n : region) index.emplace(n->outputs[0], static_cast<int>(index.size()));
    const int source = 2 * static_cast<int>(index.size()), sink = source + 1;
    MinCut cut(sink + 1);
    for (ValueId f : frontier) {
      const int64_t extra = extraBytesToKeep(g, f);
      cut.addEdge(source, 2 * index.at(f), MinCut::kInfinite);
      cut.addEdge(2 * index.at(f), 2 * index.at(f) + 1, extra > 0 ? 2 * extra + 1 : 0);
    }
    for (const Node* n : region) {
      const ValueId v = n->outputs[0];
      const int k = index.at(v);
      const int64_t cost = makesViewsOnly(*n) ? MinCut::kInfinite : g.readBeyondNodes(v) ? 0 : bytes(g.value(v));
      cut.addEdge(2 * k, 2 * k + 1, cost);
      forEachTensorArg(*n, [&](ValueId a) { cut.addEdge(2 * index.at(a) + 1, 2 * k, MinCut::kInfinite); });
    }
    for (ValueId v : read) cut.addEdge(2 * index.at(v) + 1, sink, MinCut::kInfinite);
    cut.run(source, sink);
    std::set<ValueId> keep;
    for (const auto& [v, k] : index) {
      if (cut.sourceSide(2 * k) && !cut.sourceSide(2 * k + 1)) keep.insert(v);
    }
    return keep;
  }

  // The region's ops that `values` depend on, short of the values in `keep`
  // (read as they are), in program order.
  static std::vector<const Node*> opsComputing(const Graph& g, const std::vector<ValueId>& values,
                                               const std::set<const Node*>& members, const std::set<ValueId>& keep) {
    std::set<const Node*> seen;
    std::vector<ValueId> work = values;
    while (!work.empty()) {
      const ValueId v = work.back();
      work.pop_back();
      const Node* p = g.producer(v);
      if (!p || !members.count(p) || keep.count(v) || !seen.insert(p).second) continue;
      forEachTensorArg(*p, [&](ValueId a) { work.push_back(a); });
    }
    std::vector<const Node*> ordered(seen.begin(), seen.end());
    std::sort(ordered.begin(), ordered.end(),
              [&](const Node* a, const Node* b) { return g.indexOf(*a) < g.indexOf(*b); });
    return ordered;
  }

  // The values `ops` read that none of them makes, each once.
  static std::vector<ValueId> frontierOf(const Graph& g, const std::vector<const Node*>& ops) {
    const std::set<const Node*> inside(ops.begin(), ops.end());
    std::vector<ValueId> result;
    std::set<ValueId> seen;
    for (const Node* n : ops) {
      forEachTensorArg(*n, [&](ValueId v) {
        if (!inside.count(g.producer(v)) && seen.insert(v).second) result.push_back(v);
      });
    }
    return result;
  }

  // The bytes that the clones reading `f` would keep alive until the
  // backward that nothing keeps alive now: none for graph inputs and for
  // memory the backward reads anyway, else the memory `f` views.
  static int64_t extraBytesToKeep(const Graph& g, ValueId f) {
    const ValueId base = memoryBaseOf(g, f);
    if (!g.producer(base) || readInBackward(g, f) || readInBackward(g, base) || g.readBeyondNodes(base)) return 0;
    return bytes(g.value(base));
  }

  // Each of `values` is computed again just before its first backward reader
  // (clones of the ops it depends on, from the values in `keep`), and the
  // backward reads that; values with the same first reader share clones.
  static void recompute(Graph& g, const std::vector<ValueId>& values, const std::set<const Node*>& members,
                        const std::set<ValueId>& keep) {
    std::map<size_t, std::vector<ValueId>> byAnchor;  // position of the first backward reader -> values
    for (ValueId v : values) {
      size_t first = g.nodes().size();
      for (const Node* r : g.users(v)) {
        if (isBackward(*r)) first = std::min(first, g.indexOf(*r));
      }
      byAnchor[first].push_back(v);
    }
    std::vector<std::pair<const Node*, std::vector<ValueId>>> groups;  // positions move as clones go in
    for (auto& [position, group] : byAnchor) groups.emplace_back(&g.nodes()[position], std::move(group));
    for (auto& [anchor, group] : groups) {
      std::map<ValueId, ValueId> clones;
      for (const Node* op : opsComputing(g, group, members, keep)) cloneBefore(g, *anchor, *op, clones);
      for (ValueId v : group) g.replaceUsesWith(v, clones.at(v), isBackward);
    }
  }

  // Inserts a copy of `op` before `anchor`, reading the clones made so far,
  // as a backward node; records its result in `clones`.
  static void cloneBefore(Graph& g, const Node& anchor, const Node& op, std::map<ValueId, ValueId>& clones) {
    Node copy = op;
    forEachTensorArg(copy, [&](ValueId& v) {
      auto it = clones.find(v);
      if (it != clones.end()) v = it->second;
    });
    Value result = g.value(op.outputs[0]);
    result.name = g.freshName(result.name + ".recomputed");
    const ValueId id = g.addValue(result);
    clones[op.outputs[0]] = id;
    copy.outputs = {id};
    copy.meta = NodeMeta{op.meta.source, NodeRole::Backward, -1, -1, IterationTag::Every};
    g.insertBefore(anchor, std::move(copy));
  }
};

}  // namespace

std::unique_ptr<Pass> createRecomputePointwisePass(const PipelineOptions&) {
  return std::make_unique<RecomputePointwisePass>();
}

}  // namespace spmd

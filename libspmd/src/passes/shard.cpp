// shard: ZeRO's sharding of a bucketed step over `world` ranks (spmd-split
// --shard optimizer|gradients|parameters, after bucket).
//
// Layout: every parameter is cut along dim 0 into `world` equal shards of
// ceil(rows / world) rows, the last padded with zero rows, as FSDP2 does
// (a 0-dim parameter counts as one row). Rank r holds shard r of each.
// Every rank's shards then have the same static shapes, so the step stays
// one graph for all ranks and the optimizer stays per parameter: its nodes
// only take the shard's shape. Contiguous shards of a flat bucket (DeepSpeed)
// would put a rank-dependent piece of some parameters on each rank.
//
// The rewrite, per bucket:
//   - the bucket's flat all-reduce becomes a reduce-scatter: each gradient
//     is padded and laid out as [world, rows/world * rest], the bucket is
//     their concatenation along dim 1, so rank r's row of the flat result is
//     its shards of every gradient; spmd::reduce_scatter starts where
//     bucket_start did and spmd::bucket_wait ends it where its wait was;
//   - the optimizer's nodes read the parameter's shard (spmd::shard), and
//     the optimizer state inputs of the parameter take the shard's shape;
//     the nodes downstream are typed again on the meta device;
//   - after the bucket's last update, its updated shards are all-gathered
//     (spmd::all_gather) and unpacked into the full parameters, which are
//     the parameters' new values.
// Clipping: the total norm the clip computes from the shards is this rank's
// share; its square is summed across ranks and rooted (the maximum across
// ranks for the infinity norm), which every reader then takes.
//
// The full gradient dies at its bucket's reduce-scatter, the full optimizer
// state never exists: in a compiled step gradients are values, not buffers
// kept between steps, so ZeRO-1 (optimizer) and ZeRO-2 (gradients) are the
// same step; the mode is recorded in the graph.
//
// --shard parameters (ZeRO-3, FSDP): the parameter inputs themselves are
// this rank's shards, which the optimizer updates in place of a whole
// parameter (no all-gather of updates). The forward gathers each bucket's
// parameters whole (spmd::gather_start, started when the previous bucket's
// gather is waited for: a prefetch one bucket ahead; spmd::gather_wait
// right before the forward first reads the bucket); the whole parameters die
// after the forward's last reader (reshard after forward, FSDP's default),
// and the backward gathers them again the same way, in its own order.
// The nodes replaced are left for dce.
#include "spmd/ir/boxing.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/optimizer_state.h"
#include "spmd/ir/shard_layout.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <set>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName spmd_bucket_start = OpName::known("spmd::bucket_start");
  OpName spmd_bucket_wait = OpName::known("spmd::bucket_wait");
  OpName spmd_reduce_scatter = OpName::known("spmd::reduce_scatter");
};
const Ops& ops() { return opTable<Ops>(); }

// A parameter's dim-0 shard: `rows` (1 for a 0-dim tensor) padded to
// `shardRows * world`, each row `rest` elements.
struct ShardLayout {
  std::vector<int64_t> shape;       // the parameter's
  std::vector<int64_t> shardShape;  // shardRows, then the parameter's other dimensions
  int64_t rows = 1, rest = 1, shardRows = 1;
  int64_t shardNumel() const { return shardRows * rest; }
};

ShardLayout layoutOf(const Value& v, int64_t world) {
  ShardLayout l;
  l.shape = v.shape;
  l.rows = v.shape.empty() ? 1 : v.shape[0];
  for (size_t d = 1; d < v.shape.size(); ++d) l.rest *= v.shape[d];
  l.shardRows = shardRowsOf(v.shape, world);
  l.shardShape = shardShapeOf(v.shape, world);
  return l;
}

// `t` (a parameter's shape) as [shardRows * world, rest], zero rows added.
ValueId padded(GraphBuilder& b, ValueId t, const ShardLayout& l, int64_t world) {
  ValueId rows = b.reshape(t, {l.rows, l.rest});
  const int64_t pad = l.shardRows * world - l.rows;
  if (pad == 0) return rows;
  return b.call("aten::constant_pad_nd", {Arg::tensor(rows), intsArg({0, 0, 0, pad}), Arg::ofFloat(0.0)});
}

ValueId catAlong(GraphBuilder& b, const std::vector<ValueId>& parts, int64_t dim, const std::string& name) {
  if (parts.size() == 1) return parts[0];
  Arg list;
  list.kind = Arg::Kind::Values;
  list.values = parts;
  return b.call("aten::cat", {list, Arg::ofInt(dim)}, name);
}

// One bucket's parameters with gradients, in the order bucket packed them,
// and its two communication nodes.
struct ShardBucket {
  int index = 0;
  std::vector<Gradient*> grads;
  std::vector<ShardLayout> layouts;
  const Node* start = nullptr;
  const Node* wait = nullptr;
};

std::vector<ShardBucket> bucketsToShard(Graph& g, int64_t world) {
  std::map<ValueId, Gradient*> gradOf;
  for (Gradient& grad : g.gradients()) {
    if (grad.reduced != kNoValue) gradOf[grad.parameter] = &grad;
  }
  std::map<int64_t, const Node*> starts, waits;
  for (const Node& n : g.nodes()) {
    if (n.is(ops().spmd_bucket_start)) starts[n.args.back().i] = &n;
    if (n.is(ops().spmd_bucket_wait)) waits[n.args.back().i] = &n;
  }
  std::vector<ShardBucket> out;
  for (size_t k = 0; k < g.buckets().size(); ++k) {
    ShardBucket b;
    b.index = static_cast<int>(k);
    int64_t numel = 0;
    for (ValueId p : g.buckets()[k].parameters) {
      auto it = gradOf.find(p);
      if (it == gradOf.end()) continue;
      b.grads.push_back(it->second);
      b.layouts.push_back(layoutOf(g.value(p), world));
      numel += b.layouts.back().rows * b.layouts.back().rest;
    }
    if (b.grads.empty()) continue;
    auto s = starts.find(b.index), w = waits.find(b.index);
    if (s == starts.end() || w == waits.end()) throw std::logic_error("shard: bucket " + std::to_string(k) + " has no all-reduce");
    b.start = s->second;
    b.wait = w->second;
    const Value& flat = g.value(b.start->args[0].value);
    if (flat.shape.size() != 1 || flat.shape[0] != numel) {
      throw std::logic_error("shard: bucket " + std::to_string(k) + "'s all-reduce does not hold its gradients");
    }
    out.push_back(b);
  }
  return out;
}

// The bucket's reduce-scatter, started right after its all-reduce was.
ValueId startReduceScatter(Graph& g, const ShardBucket& b, int64_t world) {
  GraphBuilder builder(g);
  builder.setInsertionPointAfter(*b.start);
  builder.setMeta(b.start->meta);
  std::vector<ValueId> rows;
  for (size_t i = 0; i < b.grads.size(); ++i) {
    const ShardLayout& l = b.layouts[i];
    rows.push_back(builder.reshape(padded(builder, b.grads[i]->value, l, world), {world, l.shardNumel()}));
  }
  const std::string name = "bucket" + std::to_string(b.index);
  const ValueId laid = catAlong(builder, rows, 1, name + ".rows");
  ValueId flat = builder.reshape(laid, {numel(g.value(laid))});
  const c10::ScalarType sent = g.value(b.start->args[0].value).dtype;  // --reduce-dtype's
  if (g.value(flat).dtype != sent) flat = builder.cast(flat, sent, name + ".sent");
  return builder.call("spmd::reduce_scatter", {Arg::tensor(flat), b.start->args[1], Arg::ofInt(world), Arg::ofInt(b.index)},
                      name + ".reduce_scatter");
}

// The wait, where the all-reduce's was, and this rank's gradient shards,
// which the optimizer reads from then on.
void waitForShards(Graph& g, ShardBucket& b, ValueId inflight) {
  GraphBuilder builder(g);
  builder.setInsertionPoint(*b.wait);
  builder.setMeta(b.wait->meta);
  const std::string name = "bucket" + std::to_string(b.index);
  ValueId flat = builder.call("spmd::bucket_wait", {Arg::tensor(inflight), Arg::ofInt(b.index)}, name + ".shard");
  const c10::ScalarType own = g.value(b.grads.front()->value).dtype;
  if (g.value(flat).dtype != own) flat = builder.cast(flat, own, name + ".received");
  std::vector<int64_t> sizes;
  for (const ShardLayout& l : b.layouts) sizes.push_back(l.shardNumel());
  std::vector<ValueId> pieces = {flat};
  if (sizes.size() > 1) pieces = builder.callMulti("aten::split_with_sizes", {Arg::tensor(flat), intsArg(sizes), Arg::ofInt(0)});
  for (size_t i = 0; i < b.grads.size(); ++i) {
    Gradient* grad = b.grads[i];
    const ValueId shard = builder.call("aten::view", {Arg::tensor(pieces[i]), intsArg(b.layouts[i].shardShape)},
                                       g.value(grad->parameter).name + ".grad.shard");
    g.replaceAllUsesWith(grad->reduced, shard);
    grad->reduced = shard;
  }
}

// The optimizer's reads of the parameter become reads of this rank's shard,
// taken right before the first of them. Returns the shard, or kNoValue when
// the optimizer does not read the parameter.
ValueId readShardOfParameter(Graph& g, ValueId param, const ShardLayout& l, int64_t world, int bucket) {
  std::vector<const Node*> readers;
  for (const Node* n : g.users(param)) {
    if (n->meta.role == NodeRole::Optimizer) readers.push_back(n);
  }
  if (readers.empty()) return kNoValue;
  GraphBuilder builder(g);
  builder.setInsertionPoint(*readers.front());
  builder.setMeta(NodeMeta{"", NodeRole::Comm, bucket, -1, IterationTag::Every});
  const ValueId rows = builder.call("spmd::shard", {Arg::tensor(padded(builder, param, l, world)), Arg::ofInt(world)});
  const ValueId shard = builder.reshape(rows, l.shardShape);
  g.value(shard).name = g.freshName(g.value(param).name + ".shard");
  const std::set<const Node*> optimizer(readers.begin(), readers.end());
  g.replaceUsesWith(param, shard, [&](const Node& n) { return optimizer.count(&n) > 0; });
  return shard;
}

// The parameter's optimizer state inputs of its own shape (exp_avg, ...;
// not the 0-dim step) take the shard's shape. Returns them.
std::vector<ValueId> shardOptimizerState(Graph& g, ValueId param, const ShardLayout& l) {
  const std::string& name = g.value(param).name;
  std::vector<ValueId> sharded;
  for (const GraphInput& in : g.inputs()) {
    if (in.kind != InputKind::State) continue;
    Value& v = g.value(in.value);
    const auto state = optimizerStateOf(v.name);
    if (!state || *state == OptimizerState::Step || v.name != optimizerStateName(name, *state) || v.shape != l.shape) {
      continue;  // a 0-dim parameter's step has its shape, and is no shard
    }
    v.shape = l.shardShape;
    sharded.push_back(in.value);
  }
  return sharded;
}

// Types again, on the meta device, every optimizer node that reads a value
// whose shape changed, and what they make in turn.
void retypeOptimizer(Graph& g, std::set<ValueId> changed) {
  for (const Node& n : g.nodes()) {
    bool reads = false;
    forEachTensorArg(n, [&](ValueId v) { reads = reads || changed.count(v) > 0; });
    // The nodes this pass made (role comm) are typed already.
    if (!reads || n.meta.role == NodeRole::Comm) continue;
    if (n.meta.role != NodeRole::Optimizer) {
      throw Diagnostic(n.meta.source.empty() ? n.qualifiedName() : n.meta.source,
                       "--shard: " + n.qualifiedName() + " outside the optimizer reads a gradient or optimizer state");
    }
    auto op = findOperator(n);
    std::vector<at::Tensor> results;
    try {
      results = inferNodeOnMeta(n, *op, [&](ValueId v) { return metaTensorOf(g.value(v)); });
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw Diagnostic(n.meta.source.empty() ? n.qualifiedName() : n.meta.source,
                       "--shard: the optimizer's " + n.qualifiedName() + " cannot run on a parameter's shard: " +
                           what.substr(0, what.find('\n')));
    }
    for (size_t k = 0; k < n.outputs.size() && k < results.size(); ++k) {
      if (n.outputs[k] == kNoValue || !results[k].defined()) continue;
      g.value(n.outputs[k]).shape = results[k].sizes().vec();
      changed.insert(n.outputs[k]);
    }
  }
}

// Each rank's flat shards of a bucket's parameters, as spmd::all_gather
// returns them ([world * the shards' elements]), unpacked into the whole
// parameters, named after them with `suffix`.
std::vector<ValueId> unpackGathered(GraphBuilder& builder, ValueId gathered, const std::vector<ValueId>& params,
                                    const std::vector<ShardLayout>& layouts, int64_t world, const std::string& suffix) {
  Graph& g = builder.graph();
  std::vector<int64_t> sizes;
  for (const ShardLayout& l : layouts) sizes.push_back(l.shardNumel());
  const ValueId ranks = builder.reshape(gathered, {world, numel(g.value(gathered)) / world});
  std::vector<ValueId> pieces = {ranks};
  if (sizes.size() > 1) pieces = builder.callMulti("aten::split_with_sizes", {Arg::tensor(ranks), intsArg(sizes), Arg::ofInt(1)});
  std::vector<ValueId> whole;
  for (size_t k = 0; k < layouts.size(); ++k) {
    const ShardLayout& l = layouts[k];
    ValueId rows = builder.reshape(pieces[k], {l.shardRows * world, l.rest});
    if (l.shardRows * world != l.rows) {
      rows = builder.call("aten::slice.Tensor", {Arg::tensor(rows), Arg::ofInt(0), Arg::ofInt(0), Arg::ofInt(l.rows), Arg::ofInt(1)});
    }
    whole.push_back(builder.reshape(rows, l.shape));
    g.value(whole.back()).name = g.freshName(g.value(params[k]).name + suffix);
  }
  return whole;
}

// The shards `shards` (one per layout), flattened into one.
ValueId packShards(GraphBuilder& builder, const std::vector<ValueId>& shards, const std::vector<ShardLayout>& layouts,
                   const std::string& name) {
  std::vector<ValueId> flats;
  for (size_t k = 0; k < shards.size(); ++k) flats.push_back(builder.reshape(shards[k], {layouts[k].shardNumel()}));
  return catAlong(builder, flats, 0, name);
}

// After the bucket's last update, its updated shards all-gathered and
// unpacked into full parameters: the parameters' new values.
void gatherUpdates(Graph& g, const ShardBucket& b, int64_t world) {
  std::vector<StateUpdate*> updates;
  std::vector<ValueId> shards, params;
  std::vector<ShardLayout> layouts;
  const Node* last = nullptr;
  for (size_t i = 0; i < b.grads.size(); ++i) {
    for (StateUpdate& u : g.updates()) {
      if (u.input != b.grads[i]->parameter || g.value(u.value).shape != b.layouts[i].shardShape) continue;
      updates.push_back(&u);
      shards.push_back(u.value);
      params.push_back(u.input);
      layouts.push_back(b.layouts[i]);
      const Node* made = g.producer(u.value);
      if (!made) continue;
      // The update belongs to the bucket whose all-gather reads it:
      // adam-to-fused-kernel makes one call per bucket, before its gather.
      g.metaOf(*made).bucket = b.index;
      if (!last || g.indexOf(*made) > g.indexOf(*last)) last = made;
    }
  }
  if (updates.empty()) return;
  GraphBuilder builder(g);
  if (last) {
    builder.setInsertionPointAfter(*last);
  } else {
    builder.setInsertionPointToEnd();
  }
  builder.setMeta(NodeMeta{"", NodeRole::Comm, b.index, -1, IterationTag::Every});
  const std::string name = "bucket" + std::to_string(b.index);
  const ValueId shard = packShards(builder, shards, layouts, name + ".updated");
  const ValueId full = builder.call("spmd::all_gather", {Arg::tensor(shard), Arg::ofInt(world), Arg::ofInt(b.index)},
                                    name + ".gathered");
  const std::vector<ValueId> whole = unpackGathered(builder, full, params, layouts, world, ".gathered");
  for (size_t k = 0; k < updates.size(); ++k) updates[k]->value = whole[k];
}

// ---- --shard parameters ------------------------------------------------------

enum class Phase { Forward, Backward };

// A bucket's parameters' readers in one phase, and the first of them.
struct PhaseReaders {
  const ShardBucket* bucket = nullptr;
  std::vector<std::set<const Node*>> readers;  // per parameter of the bucket
  const Node* first = nullptr;
};

// The forward's and the backward's readers of each bucket's parameters, in
// the order each phase first reads the buckets. The optimizer reads the
// shards themselves; any other reader is refused.
std::vector<PhaseReaders> readersIn(const Graph& g, const std::vector<ShardBucket>& buckets, Phase phase) {
  const NodeRole role = phase == Phase::Forward ? NodeRole::Forward : NodeRole::Backward;
  std::vector<PhaseReaders> out;
  for (const ShardBucket& b : buckets) {
    PhaseReaders r{&b, std::vector<std::set<const Node*>>(b.grads.size()), nullptr};
    for (size_t i = 0; i < b.grads.size(); ++i) {
      for (const Node* n : g.users(b.grads[i]->parameter)) {
        const NodeRole own = n->meta.role;
        if (own != NodeRole::Forward && own != NodeRole::Backward && own != NodeRole::Optimizer) {
          throw Diagnostic(n->meta.source.empty() ? n->qualifiedName() : n->meta.source,
                           "--shard parameters: " + n->qualifiedName() + " (" + nodeRoleName(own) +
                               ") reads a parameter outside the forward, backward and optimizer");
        }
        if (own != role) continue;
        r.readers[i].insert(n);
        if (!r.first || g.indexOf(*n) < g.indexOf(*r.first)) r.first = n;
      }
    }
    if (r.first) out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(), [&](const PhaseReaders& x, const PhaseReaders& y) {
    return g.indexOf(*x.first) < g.indexOf(*y.first);
  });
  return out;
}

// Each bucket's whole parameters for one phase: the gather starts when the
// previous bucket's is waited for (one bucket ahead, FSDP's prefetch), and
// is waited for right before the phase first reads the bucket; the phase's
// readers read the whole parameters, which die after their last reader
// there (the forward's are gathered again for the backward).
void gatherForPhase(Graph& g, const std::vector<PhaseReaders>& order, int64_t world, Phase phase) {
  const std::string tag = phase == Phase::Forward ? ".forward" : ".backward";
  GraphBuilder builder(g);
  for (size_t k = 0; k < order.size(); ++k) {
    // Only the parameters the phase reads (the backward reads no bias).
    const ShardBucket& b = *order[k].bucket;
    std::vector<ValueId> params;
    std::vector<ShardLayout> layouts;
    std::vector<const std::set<const Node*>*> readers;
    for (size_t i = 0; i < b.grads.size(); ++i) {
      if (order[k].readers[i].empty()) continue;
      params.push_back(b.grads[i]->parameter);
      layouts.push_back(b.layouts[i]);
      readers.push_back(&order[k].readers[i]);
    }
    const std::string name = "bucket" + std::to_string(b.index) + tag;
    builder.setMeta(NodeMeta{"", NodeRole::Comm, b.index, -1, IterationTag::Every});
    builder.setInsertionPoint(*order[k == 0 ? 0 : k - 1].first);
    const ValueId shard = packShards(builder, params, layouts, name + ".shards");
    const ValueId inflight = builder.call("spmd::gather_start", {Arg::tensor(shard), Arg::ofInt(world), Arg::ofInt(b.index)},
                                          name + ".gathering");
    builder.setInsertionPoint(*order[k].first);
    const ValueId gathered = builder.call("spmd::gather_wait", {Arg::tensor(inflight), Arg::ofInt(b.index)}, name);
    const std::vector<ValueId> whole = unpackGathered(builder, gathered, params, layouts, world, tag);
    for (size_t i = 0; i < params.size(); ++i) {
      g.replaceUsesWith(params[i], whole[i], [&](const Node& n) { return readers[i]->count(&n) > 0; });
    }
  }
}

// --shard parameters: the parameter inputs become this rank's shards, which
// the optimizer updates; the forward and the backward gather them whole.
void shardParameters(Graph& g, const std::vector<ShardBucket>& buckets, int64_t world, std::set<ValueId>& changed) {
  const std::vector<PhaseReaders> forward = readersIn(g, buckets, Phase::Forward);
  const std::vector<PhaseReaders> backward = readersIn(g, buckets, Phase::Backward);
  for (const ShardBucket& b : buckets) {
    for (size_t i = 0; i < b.grads.size(); ++i) {
      g.value(b.grads[i]->parameter).shape = b.layouts[i].shardShape;
      changed.insert(b.grads[i]->parameter);
    }
  }
  gatherForPhase(g, forward, world, Phase::Forward);
  gatherForPhase(g, backward, world, Phase::Backward);
}

// The clip's total norm, computed from the shards, made the norm of the
// whole gradients: the ranks' shares combined by one all-reduce.
void combineClipNorm(Graph& g) {
  if (!g.training().clips() || g.outputs().size() < 2) return;
  const ValueId local = g.outputs()[1];
  const Node* made = g.producer(local);
  if (!made || made->meta.role != NodeRole::Optimizer) throw std::logic_error("shard: the clip's norm is not the step's second output");
  GraphBuilder builder(g);
  builder.setInsertionPointAfter(*made);
  builder.setMeta(NodeMeta{"", NodeRole::Comm, -1, -1, IterationTag::Every});
  const bool inf = g.training().clipNormType == kInfNorm;
  // The one new node that reads the local norm.
  const ValueId read = inf ? builder.call("spmd::all_reduce", {Arg::tensor(local), strArg("max")}, "grad_norm.max")
                           : builder.mul(local, local);
  const Node* reader = g.producer(read);
  ValueId total = read;
  if (!inf) {
    const ValueId sum = builder.call("spmd::all_reduce", {Arg::tensor(read), strArg("sum")}, "grad_norm.squared");
    total = builder.call("aten::sqrt", {Arg::tensor(sum)}, "grad_norm.total");
  }
  g.replaceUsesWith(local, total, [&](const Node& n) { return &n != reader; });
  for (ValueId& out : g.outputs()) {
    if (out == local) out = total;
  }
}

class ShardPass final : public Pass {
 public:
  explicit ShardPass(BucketOptions options) : options_(std::move(options)) {}
  bool run(Graph& g, DiagnosticEngine& diagnostics) override;

 private:
  BucketOptions options_;
};

bool ShardPass::run(Graph& g, DiagnosticEngine& diagnostics) {
  if (options_.shard == ShardMode::None) return false;
  const int64_t world = options_.worldSize;
  if (world < 1) throw Diagnostic("--shard", "needs --world-size: the shards' shapes depend on it");
  for (const Node& n : g.nodes()) {
    if (n.is(ops().spmd_reduce_scatter)) {
      diagnostics.note("the step is sharded already; it is left as it is");
      return false;
    }
  }
  g.training().worldSize = world;
  g.training().shard = options_.shard;
  std::vector<ShardBucket> buckets = bucketsToShard(g, world);
  if (buckets.empty()) {
    diagnostics.note("--shard: the graph has no bucketed gradients; only the world size and mode are recorded");
    return true;
  }
  const bool wholeParameters = options_.shard != ShardMode::Parameters;
  std::set<ValueId> changed;
  for (ShardBucket& b : buckets) {
    waitForShards(g, b, startReduceScatter(g, b, world));
    for (size_t i = 0; i < b.grads.size(); ++i) {
      changed.insert(b.grads[i]->reduced);
      const ValueId param = b.grads[i]->parameter;
      for (ValueId s : shardOptimizerState(g, param, b.layouts[i])) changed.insert(s);
      if (!wholeParameters) continue;
      const ValueId shard = readShardOfParameter(g, param, b.layouts[i], world, b.index);
      if (shard != kNoValue) changed.insert(shard);
    }
    count("buckets reduce-scattered");
    count("parameters sharded", static_cast<int64_t>(b.grads.size()));
  }
  if (!wholeParameters) shardParameters(g, buckets, world, changed);
  retypeOptimizer(g, changed);
  if (wholeParameters) {
    for (const ShardBucket& b : buckets) gatherUpdates(g, b, world);
  }
  combineClipNorm(g);
  return true;
}

}  // namespace

std::unique_ptr<Pass> createShardPass(const PipelineOptions& options) { return std::make_unique<ShardPass>(options.buckets); }

}  // namespace spmd

// bucket: DDPOptimizer's bucketing of gradients, and one flat all-reduce per
// bucket.
//
// The plan: walk the forward nodes (those the loss depends on) in reverse.
// Before adding a node, if the current bucket holds >= cap bytes, or it is
// the only bucket so far and holds >= first_cap bytes, start a new bucket,
// but only if the current one has an output used outside it (by a forward
// node of another bucket, or as a graph output); otherwise keep extending it.
// The node then joins the current bucket, and each trainable parameter it
// uses (itself or through a cast: autocast's) that no later node used adds
// its bytes. A leading bucket without parameters merges into the next.
// Ignored parameters are never bucketed.
//
// The rewrite: per-parameter all-reduces (grad-sync's) are removed; each
// bucket's gradients are packed into one flat tensor right after the last of
// them is produced, spmd::bucket_start launches its all-reduce there, and
// spmd::bucket_wait plus the unpack come just before the first node that
// reads one of them (the optimizer). Ignored parameters' gradients stay
// local. Forward graphs without gradients only get the plan. A graph bucketed
// already is left alone (a note says so); an unrolled one is an error.
#include "spmd/ir/builder.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName _to_copy = OpName::known("aten::_to_copy");
  OpName spmd_bucket_start = OpName::known("spmd::bucket_start");
};
const Ops& ops() { return opTable<Ops>(); }

// Indices of the nodes the loss (first output) depends on, in graph order.
std::vector<size_t> forwardNodes(const Graph& g) {
  std::vector<bool> needed(g.numValues(), false);
  if (!g.outputs().empty()) needed[g.outputs()[0]] = true;
  std::vector<size_t> forward;
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    bool feeds = false;
    for (ValueId o : n.outputs) feeds = feeds || (o != kNoValue && needed[o]);
    if (!feeds) continue;
    forward.push_back(i);
    forEachTensorArg(n, [&](ValueId v) { needed[v] = true; });
  }
  std::reverse(forward.begin(), forward.end());
  return forward;
}

struct PlanBucket {
  std::set<size_t> nodes;
  std::vector<ValueId> params;  // in the order the reverse walk met them
  int64_t bytes = 0;
};

std::set<ValueId> bucketableParams(const Graph& g, const BucketOptions& o) {
  std::set<std::string> ignored(o.ignored.begin(), o.ignored.end());
  std::set<ValueId> params;
  for (const auto& in : g.inputs()) {
    const std::string& name = g.value(in.value).name;
    if (in.kind == InputKind::Parameter && in.requiresGrad && !ignored.count(name)) params.insert(in.value);
  }
  for (const auto& name : o.ignored) {
    auto v = g.findValue(name);
    const GraphInput* in = v ? g.inputOf(*v) : nullptr;
    if (!in || in->kind != InputKind::Parameter) throw Diagnostic("--ignore-param " + name, "no parameter of that name");
  }
  return params;
}

bool hasExternalOutput(const Graph& g, const PlanBucket& b, const std::set<size_t>& forward) {
  for (size_t i : b.nodes) {
    for (ValueId o : g.nodes()[i].outputs) {
      if (o == kNoValue) continue;
      if (g.isGraphOutput(o)) return true;
      for (const Node* reader : g.users(o)) {
        const size_t u = g.indexOf(*reader);
        if (forward.count(u) && !b.nodes.count(u)) return true;
      }
    }
  }
  return false;
}

// The parameter `v` is a cast of (autocast's aten::_to_copy of a weight),
// else `v`: a parameter counts where the module's op reads it, cast or not.
ValueId throughCast(const Graph& g, ValueId v) {
  const Node* n = g.producer(v);
  if (n && n->is(ops()._to_copy) && n->args[0].kind == Arg::Kind::Value) {
    const GraphInput* in = g.inputOf(n->args[0].value);
    if (in && in->kind == InputKind::Parameter) return n->args[0].value;
  }
  return v;
}

bool isWeightCast(const Graph& g, const Node& n) {
  return n.outputs.size() == 1 && throughCast(g, n.outputs[0]) != n.outputs[0];
}

std::vector<PlanBucket> planBuckets(const Graph& g, const BucketOptions& o) {
  const std::vector<size_t> forward = forwardNodes(g);
  const std::set<size_t> forwardSet(forward.begin(), forward.end());
  const std::set<ValueId> trainable = bucketableParams(g, o);
  const double cap = o.capMb * 1048576.0, firstCap = o.firstCapMb * 1048576.0;

  std::vector<PlanBucket> buckets(1);  // buckets.front() is the one being filled
  std::set<ValueId> counted;
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    PlanBucket& current = buckets.front();
    const double held = static_cast<double>(current.bytes);
    const Node& node = g.nodes()[*it];
    // A weight's cast stays with the op that reads it.
    if (!isWeightCast(g, node) && (held >= cap || (buckets.size() == 1 && held >= firstCap)) && hasExternalOutput(g, current, forwardSet)) {
      buckets.insert(buckets.begin(), PlanBucket{});
    }
    PlanBucket& target = buckets.front();
    target.nodes.insert(*it);
    forEachTensorArg(node, [&](ValueId v) {
      v = throughCast(g, v);
      if (trainable.count(v) && counted.insert(v).second) {
        target.params.push_back(v);
        target.bytes += bytes(g.value(v));
      }
    });
  }
  if (buckets.size() > 1 && buckets.front().params.empty()) {
    buckets[1].nodes.insert(buckets.front().nodes.begin(), buckets.front().nodes.end());
    buckets.erase(buckets.begin());
  }
  return buckets;  // forward order
}

// `params` ordered by first use, and by argument position within a node
// (a weight's cast counts as a use of the weight where the cast is read).
std::vector<ValueId> inForwardOrder(const Graph& g, std::vector<ValueId>& params) {
  std::set<ValueId> wanted(params.begin(), params.end());
  std::vector<ValueId> ordered;
  for (const Node& n : g.nodes()) {
    if (isWeightCast(g, n)) continue;  // its reader places the weight
    forEachTensorArg(n, [&](ValueId v) {
      v = throughCast(g, v);
      if (wanted.erase(v)) ordered.push_back(v);
    });
  }
  ordered.insert(ordered.end(), wanted.begin(), wanted.end());  // read only by casts nothing reads
  params = ordered;  // the packing order follows the table's
  return ordered;
}

void stampBuckets(Graph& g, const std::vector<PlanBucket>& plan) {
  const std::vector<const Node*> nodes = snapshot(g.nodes());
  for (size_t b = 0; b < plan.size(); ++b) {
    for (size_t i : plan[b].nodes) {
      NodeMeta& meta = g.metaOf(*nodes[i]);
      meta.bucket = static_cast<int>(b);
      meta.partition = static_cast<int>(b);
    }
  }
}

// ---- the rewrite ---------------------------------------------------------------

// The all-reduce grad-sync put on a gradient, with the casts around it
// when --reduce-dtype sent the gradient in another dtype:
// [_to_copy(grad) ->] spmd::all_reduce [-> _to_copy back] = reduced.
struct PerParameterReduce {
  std::vector<const Node*> nodes;  // last first: the order to erase them in
  c10::ScalarType sentAs = c10::ScalarType::Undefined;
  std::string mode;  // "mean" or "sum", as grad-sync reduced it
};

std::string modeOf(const Node& allReduce) {
  return allReduce.args.size() > 1 && allReduce.args[1].kind == Arg::Kind::Str ? allReduce.args[1].s : std::string();
}

std::optional<PerParameterReduce> perParameterReduce(const Graph& g, const Gradient& grad) {
  auto single = [&](const Node* n, const char* op) { return n && n->op == op && n->outputs.size() == 1; };
  PerParameterReduce r;
  const Node* n = g.producer(grad.reduced);
  if (single(n, "aten::_to_copy") && n->args[0].kind == Arg::Kind::Value) {
    const Node* allReduce = g.producer(n->args[0].value);
    if (single(allReduce, "spmd::all_reduce") && allReduce->args[0].kind == Arg::Kind::Value) {
      const Node* sent = g.producer(allReduce->args[0].value);
      if (single(sent, "aten::_to_copy") && sent->args[0].kind == Arg::Kind::Value &&
          sent->args[0].value == grad.value) {
        r.nodes = {n, allReduce, sent};
        r.sentAs = g.value(allReduce->outputs[0]).dtype;
        r.mode = modeOf(*allReduce);
        return r;
      }
    }
  }
  if (single(n, "spmd::all_reduce")) {
    r.nodes = {n};
    r.mode = modeOf(*n);
    return r;
  }
  return std::nullopt;
}

// What the per-parameter all-reduces did, for the buckets to do the same:
// the dtype each parameter's gradient was sent in (--reduce-dtype), where it
// was not its own, and the reduction (spmd-expand's --grad-reduce), empty
// when there was none to read.
struct DroppedReduces {
  std::map<ValueId, c10::ScalarType> sentAs;
  std::string mode;
};

// Drops grad-sync's per-parameter all-reduces; readers of their results read
// the local gradient again (the bucket's all-reduce replaces them).
DroppedReduces dropPerParameterReduces(Graph& g) {
  DroppedReduces dropped;
  for (Gradient& grad : g.gradients()) {
    const ValueId reduced = grad.reduced;
    if (reduced == kNoValue) continue;
    const std::optional<PerParameterReduce> r = perParameterReduce(g, grad);
    grad.reduced = kNoValue;
    g.replaceAllUsesWith(reduced, grad.value);
    if (!r) continue;
    for (const Node* n : r->nodes) g.erase(*n);
    if (r->sentAs != c10::ScalarType::Undefined) dropped.sentAs[grad.parameter] = r->sentAs;
    if (!r->mode.empty()) dropped.mode = r->mode;
  }
  return dropped;
}

// A bucket's all-reduce: started right after its last gradient is made
// (before every node when none is made by a node), waited for right before
// the first node that reads one of its gradients after that (at the end
// when none does).
struct CommBucket {
  int index;
  std::vector<Gradient*> grads;
  const Node* startAfter = nullptr;  // nullptr: before every node
  const Node* waitBefore = nullptr;  // nullptr: at the end
  size_t startSlot = 0;              // program order of the start: 0 before every node, i + 1 after node i
  size_t waitSlot = 0;               // program order of the wait: i before node i, node count at the end
};

std::vector<CommBucket> placeBuckets(Graph& g, const std::vector<PlanBucket>& plan) {
  std::map<ValueId, Gradient*> gradOf;
  for (Gradient& grad : g.gradients()) gradOf[grad.parameter] = &grad;
  std::vector<CommBucket> comm;
  for (size_t b = 0; b < plan.size(); ++b) {
    CommBucket c{static_cast<int>(b), {}};
    for (ValueId p : plan[b].params) {
      auto it = gradOf.find(p);
      if (it == gradOf.end()) continue;  // a parameter the loss does not reach
      c.grads.push_back(it->second);
      if (const Node* made = g.producer(it->second->value)) {
        c.startSlot = std::max(c.startSlot, g.indexOf(*made) + 1);
      }
    }
    if (c.grads.empty()) continue;
    if (c.startSlot > 0) c.startAfter = &g.nodes()[c.startSlot - 1];
    c.waitSlot = g.nodes().size();
    for (Gradient* grad : c.grads) {
      for (const Node* reader : g.users(grad->value)) {
        const size_t at = g.indexOf(*reader);
        if (at + 1 > c.startSlot) {
          c.waitSlot = std::min(c.waitSlot, at);
          break;
        }
      }
    }
    if (c.waitSlot < g.nodes().size()) c.waitBefore = &g.nodes()[c.waitSlot];
    comm.push_back(c);
  }
  return comm;
}

// `comm` ordered by where `slot` puts them in the program, then by index.
std::vector<CommBucket*> inProgramOrder(std::vector<CommBucket>& comm, size_t CommBucket::*slot) {
  std::vector<CommBucket*> ordered;
  for (auto& c : comm) ordered.push_back(&c);
  std::stable_sort(ordered.begin(), ordered.end(), [&](const CommBucket* a, const CommBucket* b) { return a->*slot < b->*slot; });
  return ordered;
}

void rewrite(Graph& g, const std::vector<PlanBucket>& plan, GradReduce reduce,
             const std::map<ValueId, c10::ScalarType>& sentAs) {
  std::vector<CommBucket> comm = placeBuckets(g, plan);
  GraphBuilder builder(g);
  std::map<int, ValueId> inFlight;
  const std::string mode = reduce == GradReduce::Mean ? "mean" : "sum";
  // Starts first: a start after node i goes right after the previous start
  // there, so that it precedes any wait put before node i + 1.
  std::map<const Node*, const Node*> lastStartAfter;
  const Node* firstNode = g.nodes().empty() ? nullptr : &g.nodes().front();
  for (CommBucket* c : inProgramOrder(comm, &CommBucket::startSlot)) {
    if (!c->startAfter) {
      if (firstNode) builder.setInsertionPoint(*firstNode);
    } else {
      auto last = lastStartAfter.find(c->startAfter);
      builder.setInsertionPointAfter(last != lastStartAfter.end() ? *last->second : *c->startAfter);
    }
    builder.setMeta(NodeMeta{"", NodeRole::Comm, c->index, -1, IterationTag::Every});
    Arg flats;
    flats.kind = Arg::Kind::Values;
    for (Gradient* grad : c->grads) {
      flats.values.push_back(builder.reshape(grad->value, {numel(g.value(grad->value))}));
    }
    ValueId flat = c->grads.size() == 1 ? flats.values[0] : builder.call("aten::cat", {flats, Arg::ofInt(0)}, "bucket");
    // --reduce-dtype: the whole bucket is cast, as DDP's compression hooks cast its buffer.
    auto sent = sentAs.find(c->grads.front()->parameter);
    if (sent != sentAs.end()) flat = builder.cast(flat, sent->second, "bucket" + std::to_string(c->index) + ".sent");
    inFlight[c->index] = builder.call("spmd::bucket_start", {Arg::tensor(flat), strArg(mode), Arg::ofInt(c->index)},
                                      "bucket" + std::to_string(c->index) + ".inflight");
    if (c->startAfter) lastStartAfter[c->startAfter] = g.producer(inFlight[c->index]);
  }
  for (CommBucket* c : inProgramOrder(comm, &CommBucket::waitSlot)) {
    if (c->waitBefore) {
      builder.setInsertionPoint(*c->waitBefore);
    } else {
      builder.setInsertionPointToEnd();
    }
    builder.setMeta(NodeMeta{"", NodeRole::Comm, c->index, -1, IterationTag::Every});
    ValueId flat = builder.call("spmd::bucket_wait", {Arg::tensor(inFlight.at(c->index)), Arg::ofInt(c->index)},
                                "bucket" + std::to_string(c->index) + ".reduced");
    const c10::ScalarType own = g.value(c->grads.front()->value).dtype;
    if (g.value(flat).dtype != own) flat = builder.cast(flat, own, "bucket" + std::to_string(c->index) + ".received");
    std::vector<int64_t> sizes;
    for (Gradient* grad : c->grads) sizes.push_back(numel(g.value(grad->value)));
    std::vector<ValueId> pieces = {flat};
    if (c->grads.size() > 1) {
      pieces = builder.callMulti("aten::split_with_sizes", {Arg::tensor(flat), intsArg(sizes), Arg::ofInt(0)});
    }
    for (size_t k = 0; k < c->grads.size(); ++k) {
      Gradient* grad = c->grads[k];
      grad->reduced = builder.call("aten::view", {Arg::tensor(pieces[k]), intsArg(g.value(grad->value).shape)},
                                   g.value(grad->parameter).name + ".grad");
      // What runs after the wait reads the reduced gradient.
      const size_t after = g.indexOf(*g.producer(grad->reduced));
      g.replaceUsesWith(grad->value, grad->reduced, [&](const Node& n) { return g.indexOf(n) > after; });
    }
  }
}


class BucketPass final : public Pass {
 public:
  BucketPass(BucketOptions options, GradReduce reduce) : options_(std::move(options)), reduce_(reduce) {}
  bool run(Graph& g, DiagnosticEngine&) override;

 private:
  BucketOptions options_;
  GradReduce reduce_;
};

}  // namespace

std::unique_ptr<Pass> createBucketPass(const PipelineOptions& options) {
  return std::make_unique<BucketPass>(options.buckets, options.gradReduce);
}

bool BucketPass::run(Graph& g, DiagnosticEngine& diagnostics) {
  // Bucketing twice would put a second all-reduce on every bucket; an
  // unrolled graph's moved work reads values from the previous iteration.
  if (g.iters() > 0) throw Diagnostic("/iters", "the graph is unrolled already: run spmd-split before spmd-unroll");
  for (const Node& n : g.nodes()) {
    if (n.is(ops().spmd_bucket_start)) {
      diagnostics.note("the graph is bucketed already (spmd-split ran on it); it is left as it is");
      return false;
    }
  }
  if (options_.worldSize > 0) g.training().worldSize = options_.worldSize;
  std::vector<PlanBucket> plan = planBuckets(g, options_);
  std::vector<Bucket> table;
  for (auto& b : plan) table.push_back(Bucket{inForwardOrder(g, b.params), b.bytes});
  stampBuckets(g, plan);
  g.setBuckets(std::move(table));
  if (g.gradients().empty()) return true;
  // The graph's own reduction wins over --grad-reduce: spmd-expand chose it
  // (its --grad-reduce), and split's flag is for dumps without gradient sync.
  const DroppedReduces dropped = dropPerParameterReduces(g);
  GradReduce reduce = reduce_;
  if (!dropped.mode.empty()) reduce = dropped.mode == "sum" ? GradReduce::Sum : GradReduce::Mean;
  rewrite(g, plan, reduce, dropped.sentAs);
  return true;
}

}  // namespace spmd

// unroll: IterGraphModule's default cross-iteration move. The last bucket's
// all-reduce and the optimizer update of its parameters move into the next
// iteration, where they run on the gradients this iteration carried over.
//
// The last bucket is the one whose all-reduce starts last (the first layers'
// parameters): its communication cannot overlap the backward, which is done
// by then. The moved block is that bucket's bucket_start (a sharded step's
// reduce_scatter) and bucket_wait, everything computed from the reduced
// gradients (with a sharded step's all-gather of the updates), and the optimizer nodes
// that only feed those (step counters, bias corrections). See ir/iter_graph.h
// for how the unrolled graph holds setup, main and cleanup.
//
// Without buckets (spmd-split not run) or with --no-move, nothing moves and
// the graph is only marked unrolled; without buckets a note says so, as it
// does when a graph output depends on the block (the clipped step's norm).
#include "spmd/ir/iter_graph.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"


namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName spmd_bucket_wait = OpName::known("spmd::bucket_wait");
  OpName spmd_bucket_start = OpName::known("spmd::bucket_start");
  OpName spmd_reduce_scatter = OpName::known("spmd::reduce_scatter");  // a sharded step's bucket_start
};
const Ops& ops() { return opTable<Ops>(); }

// Index of the bucket_start (or a sharded step's reduce_scatter) node that
// comes last, or -1.
int lastBucketStart(const Graph& g) {
  int last = -1;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.is(ops().spmd_bucket_start) || n.is(ops().spmd_reduce_scatter)) last = static_cast<int>(i);
  }
  return last;
}

std::set<size_t> lastBucketBlock(const Graph& g, size_t start) {
  const int64_t bucket = g.nodes()[start].args.back().i;
  std::set<size_t> block = {start};
  auto inBlock = [&](ValueId v) {
    const Node* p = g.producer(v);
    return p && block.count(g.indexOf(*p)) > 0;
  };
  // Everything downstream of the bucket's all-reduce.
  for (size_t i = start + 1; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    bool reads = n.is(ops().spmd_bucket_wait) && n.args.back().i == bucket;
    forEachTensorArg(n, [&](ValueId v) { reads = reads || inBlock(v); });
    if (reads) block.insert(i);
  }
  // Optimizer nodes whose every reader moves (read only by moved nodes or
  // state updates) move too, until nothing changes.
  std::vector<bool> isOutput(g.numValues(), false);
  for (ValueId v : g.outputs()) isOutput[v] = true;
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = g.nodes().size(); i-- > 0;) {
      const Node& n = g.nodes()[i];
      if (block.count(i) || n.meta.role != NodeRole::Optimizer) continue;
      bool anyReader = false, allMove = true;
      for (ValueId o : n.outputs) {
        if (o == kNoValue) continue;
        allMove = allMove && !isOutput[o];
        for (const Node* u : g.users(o)) {
          anyReader = true;
          allMove = allMove && block.count(g.indexOf(*u));
        }
      }
      if (anyReader && allMove) {
        block.insert(i);
        grew = true;
      }
    }
  }
  return block;
}

// The name of a graph output a node of `block` makes, or "": an output
// cannot be a previous iteration's value.
std::string firstOutputIn(const Graph& g, const std::set<size_t>& block) {
  for (ValueId v : g.outputs()) {
    const Node* made = g.producer(v);
    if (made && block.count(g.indexOf(*made))) return g.value(v).name;
  }
  return "";
}

class UnrollPass final : public Pass {
 public:
  explicit UnrollPass(UnrollOptions options) : options_(options) {}

  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    if (options_.iters < 1) throw Diagnostic("--iters", "must be at least 1");
    IterGraph iter(g);
    const int start = options_.move ? lastBucketStart(g) : -1;
    const std::set<size_t> block = start >= 0 ? lastBucketBlock(g, static_cast<size_t>(start)) : std::set<size_t>();
    const std::string output = firstOutputIn(g, block);
    if (!output.empty()) {
      diagnostics.note("the last bucket's all-reduce stays in its iteration: the output %" + output +
                       " depends on it (--clip-grad-norm: every update waits for the global norm)");
    } else if (start >= 0) {
      iter.moveToNextIteration(block);
    } else if (options_.move) {
      diagnostics.note("no bucketed all-reduce to move (run spmd-split first); the graph is unrolled without moves");
    }
    iter.freeze(options_.iters);
    return true;  // the iteration count at least
  }

 private:
  UnrollOptions options_;
};

}  // namespace

std::unique_ptr<Pass> createUnrollPass(const PipelineOptions& options) {
  return std::make_unique<UnrollPass>(options.unroll);
}


}  // namespace spmd

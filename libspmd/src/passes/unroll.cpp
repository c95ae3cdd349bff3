// unroll: IterGraphModule's default cross-iteration move. The last bucket's
// all-reduce and the optimizer update of its parameters move into the next
// iteration, where they run on the gradients this iteration carried over.
//
// The last bucket is the one whose all-reduce starts last (the first layers'
// parameters): its communication cannot overlap the backward, which is done
// by then. The moved block is that bucket's bucket_start and bucket_wait,
// everything computed from the reduced gradients, and the optimizer nodes
// that only feed those (step counters, bias corrections). See ir/iter_graph.h
// for how the unrolled graph holds setup, main and cleanup.
//
// Without buckets (spmd-split not run) or with --no-move, nothing moves and
// the graph is only marked unrolled; a note says so.
#include "spmd/ir/iter_graph.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <map>

namespace spmd {
namespace {

// Index of the bucket_start node that comes last, or -1.
int lastBucketStart(const Graph& g) {
  int last = -1;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i].op == "spmd::bucket_start") last = static_cast<int>(i);
  }
  return last;
}

std::set<size_t> lastBucketBlock(const Graph& g, size_t start) {
  const int64_t bucket = g.nodes()[start].args.back().i;
  std::map<ValueId, size_t> producer;
  std::vector<std::vector<size_t>> users(g.numValues());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (ValueId o : g.nodes()[i].outputs) {
      if (o != kNoValue) producer[o] = i;
    }
    forEachTensorArg(g.nodes()[i], [&](ValueId v) { users[v].push_back(i); });
  }
  std::set<size_t> block = {start};
  // Everything downstream of the bucket's all-reduce.
  for (size_t i = start + 1; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    bool reads = n.op == "spmd::bucket_wait" && n.args.back().i == bucket;
    forEachTensorArg(n, [&](ValueId v) { reads = reads || (producer.count(v) && block.count(producer[v])); });
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
        for (size_t u : users[o]) {
          anyReader = true;
          allMove = allMove && block.count(u);
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

}  // namespace

bool runUnroll(Graph& g, const PipelineOptions& options) {
  const UnrollOptions& o = options.unroll;
  if (o.iters < 1) throw Diagnostic("--iters", "must be at least 1");
  IterGraph iter(g);
  const int start = o.move ? lastBucketStart(g) : -1;
  if (start >= 0) {
    iter.moveToNextIteration(lastBucketBlock(g, static_cast<size_t>(start)));
  } else if (o.move && options.notes) {
    options.notes->push_back("no bucketed all-reduce to move (run spmd-split first); the graph is unrolled without moves");
  }
  iter.freeze(o.iters);
  return true;
}


}  // namespace spmd

// IterGraphModule's setup, main and cleanup graphs, kept as one graph.
//
// An unrolled graph (Graph::iters() > 0) is the main iteration's graph plus
// two kinds of tagged nodes (NodeMeta::iteration):
//   previous (IterationTag::FromPrevious): work moved out of the previous iteration, run on the values it
//               carried over (state inputs named carry.<value>); the first
//               iteration (setup) has no previous one and skips these nodes.
//   last (IterationTag::LastOnly): the same moved work applied to this iteration's values, so
//               that the last iteration (cleanup) leaves nothing behind; other
//               iterations skip these nodes.
// One graph makes every edit apply to all three iterations at once, and keeps
// a single file that diffs well. graphForIteration() cuts out the graph one
// iteration runs.
#pragma once

#include "spmd/ir/graph.h"

#include <set>

namespace spmd {

enum class Iteration {
  First,   // setup: skips "previous" and "last" nodes
  Middle,  // main: skips "last" nodes
  Last,    // cleanup: runs everything
  Only,    // a run of one step: first and last at once
};

// Which iteration step `step` (0-based) of `steps` is.
Iteration iterationAt(int step, int steps);
const char* iterationName(Iteration it);

// The plain graph that iteration `it` runs. For "previous" nodes skipped in
// the first iteration, the parameters and state they would have updated keep
// their input values; updates from "last" nodes replace the others in the last
// iteration. A graph that is not unrolled is returned as is.
Graph graphForIteration(const Graph& graph, Iteration it);

// Edits a plain train step into an unrolled one. Moves are staged, then
// applied together by freeze(), after which the graph takes no more moves.
class IterGraph {
 public:
  explicit IterGraph(Graph& graph);

  // Stages moving these nodes (indices into the graph's nodes) into the next
  // iteration. Every reader of their results must move with them; state
  // updates of those results move too.
  void moveToNextIteration(const std::set<size_t>& nodes);

  // Rewrites the graph: the moved nodes run first, tagged "previous", on
  // values carried from the previous iteration; the rest of the step reads
  // the parameters and state they updated; a copy tagged "last" finishes this
  // iteration's share in the last iteration. Sets iters(). Throws Diagnostic
  // when a staged block cannot move.
  void freeze(int iters);

 private:
  Graph& graph_;
  std::set<size_t> staged_;
  bool frozen_ = false;
};

}  // namespace spmd

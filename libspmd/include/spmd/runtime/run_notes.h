// What spmd-run says before step 1 about a graph that runs but would
// surprise a user: it updates no parameter (a forward graph, so nothing
// trains), or it has no outputs (so there is no loss to print).
#pragma once

namespace spmd {

class DiagnosticEngine;
class Graph;

void noteRunOddities(const Graph& g, DiagnosticEngine& notes);

}  // namespace spmd

#include "spmd/runtime/run_notes.h"

#include "spmd/ir/graph.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>

namespace spmd {

void noteRunOddities(const Graph& g, DiagnosticEngine& notes) {
  const auto& updates = g.updates();
  const bool trains = std::any_of(updates.begin(), updates.end(), [&g](const StateUpdate& u) {
    const auto& inputs = g.inputs();
    return std::any_of(inputs.begin(), inputs.end(),
                       [&u](const GraphInput& in) { return in.value == u.input && in.kind == InputKind::Parameter; });
  });
  if (!trains) {
    notes.note("/updates", "the graph updates no parameter (a forward graph?): it runs, but trains nothing; "
                           "spmd-expand makes a train step of it");
  }
  if (g.outputs().empty()) notes.note("/outputs", "the graph has no outputs: there is no loss to print");
}

}  // namespace spmd

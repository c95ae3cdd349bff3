#include "spmd/ir/iter_graph.h"

#include "spmd/support/diagnostic.h"

#include <map>
#include <stdexcept>

namespace spmd {
namespace {

// The iteration tag of the node producing each value (Every for inputs).
std::vector<IterationTag> producerTags(const Graph& g) {
  std::vector<IterationTag> tags(g.numValues(), IterationTag::Every);
  for (const Node& n : g.nodes()) {
    for (ValueId o : n.outputs) {
      if (o != kNoValue) tags[o] = n.meta.iteration;
    }
  }
  return tags;
}

bool keepsNode(IterationTag tag, Iteration it) {
  switch (tag) {
    case IterationTag::FromPrevious: return it == Iteration::Middle || it == Iteration::Last;
    case IterationTag::LastOnly: return it == Iteration::Last || it == Iteration::Only;
    case IterationTag::Every: return true;
  }
  return true;
}

}  // namespace

Iteration iterationAt(int step, int steps) {
  if (steps == 1) return Iteration::Only;
  if (step == 0) return Iteration::First;
  return step == steps - 1 ? Iteration::Last : Iteration::Middle;
}

const char* iterationName(Iteration it) {
  switch (it) {
    case Iteration::First: return "setup";
    case Iteration::Middle: return "main";
    case Iteration::Last: return "cleanup";
    case Iteration::Only: return "single";
  }
  return "?";
}

Graph graphForIteration(const Graph& graph, Iteration it) {
  if (graph.iters() == 0) return graph;
  const std::vector<IterationTag> tags = producerTags(graph);
  const bool runsPrevious = keepsNode(IterationTag::FromPrevious, it), runsLast = keepsNode(IterationTag::LastOnly, it);
  Graph out = graph;
  out.setIters(0);
  // Without the previous iteration's moved work, what it would have updated
  // keeps its input value.
  std::map<ValueId, ValueId> keptInput;
  std::set<ValueId> updatedByLast;
  for (const auto& u : graph.updates()) {
    if (!runsPrevious && tags[u.value] == IterationTag::FromPrevious) keptInput[u.value] = u.input;
    if (tags[u.value] == IterationTag::LastOnly) updatedByLast.insert(u.input);
  }
  auto kept = [&](const Node& n) { return keepsNode(n.meta.iteration, it); };
  for (const auto& [value, input] : keptInput) out.replaceUsesWith(value, input, kept);
  std::set<ValueId> dropped;
  const std::vector<const Node*> nodes = snapshot(out.nodes());
  for (auto n = nodes.rbegin(); n != nodes.rend(); ++n) {  // readers first
    if (kept(**n)) {
      out.metaOf(**n).iteration = IterationTag::Every;
      continue;
    }
    dropped.insert((*n)->outputs.begin(), (*n)->outputs.end());
    out.erase(**n);
  }
  out.updates().clear();
  for (const auto& u : graph.updates()) {
    const IterationTag tag = tags[u.value];
    if (dropped.count(u.value)) continue;
    if (runsLast && tag != IterationTag::LastOnly && updatedByLast.count(u.input)) continue;
    out.addUpdate(u);
  }
  for (Gradient& g : out.gradients()) {
    if (dropped.count(g.reduced)) g.reduced = kNoValue;
  }
  return out;
}

IterGraph::IterGraph(Graph& graph) : graph_(graph) {
  if (graph.iters() > 0) throw Diagnostic("/iters", "the graph is unrolled already");
}

void IterGraph::moveToNextIteration(const std::set<size_t>& nodes) {
  if (frozen_) throw std::logic_error("IterGraph: moves after freeze()");
  for (size_t i : nodes) {
    if (i >= graph_.nodes().size()) throw std::logic_error("IterGraph: no node " + std::to_string(i));
  }
  staged_.insert(nodes.begin(), nodes.end());
}

void IterGraph::freeze(int iters) {
  if (frozen_) throw std::logic_error("IterGraph: freeze() twice");
  frozen_ = true;
  Graph& g = graph_;
  std::vector<bool> moved(g.numValues(), false);  // produced by a moved node
  for (size_t i : staged_) {
    for (ValueId o : g.nodes()[i].outputs) {
      if (o != kNoValue) moved[o] = true;
    }
  }
  // What stays must not read what moves: it would read last iteration's value.
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (staged_.count(i)) continue;
    forEachTensorArg(g.nodes()[i], [&](ValueId v) {
      if (moved[v]) {
        throw Diagnostic("/nodes/" + std::to_string(i), "'" + g.value(v).name +
                                                            "' cannot move to the next iteration: this node reads it and stays");
      }
    });
  }
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    if (moved[g.outputs()[k]]) throw Diagnostic("/outputs/" + std::to_string(k), "a graph output cannot move to the next iteration");
  }
  // Parameters and state the moved nodes update, with their new values.
  std::map<ValueId, ValueId> movedUpdate;
  std::set<ValueId> updatedByRest;
  for (const auto& u : g.updates()) {
    if (moved[u.value]) movedUpdate[u.input] = u.value;
    else updatedByRest.insert(u.input);
  }
  const std::vector<const Node*> nodes = snapshot(g.nodes());
  std::set<const Node*> staged;
  std::vector<Node> originals;  // the moved nodes as they were, for the last iteration's copies
  for (size_t i : staged_) {
    staged.insert(nodes[i]);
    originals.push_back(*nodes[i]);
  }
  auto isStaged = [&](const Node& n) { return staged.count(&n) > 0; };
  // What the moved nodes read from the rest of the step, from state the
  // rest updates, or from per-step inputs is carried over as it was in the
  // iteration that made it.
  std::map<ValueId, ValueId> carried;
  for (const Node& n : originals) {
    forEachTensorArg(n, [&](ValueId v) {
      if (moved[v] || carried.count(v)) return;
      // Parameters and state the rest does not update are still as the
      // previous iteration left them; per-step inputs (data, the scheduled
      // learning rate) are not: the moved work needs the previous step's.
      const GraphInput* in = g.inputOf(v);
      if (in && !isPerStepInput(in->kind) && !updatedByRest.count(v)) return;
      Value c = g.value(v);
      c.name = g.freshName("carry." + c.name);
      carried[v] = g.addInput(c, InputKind::State);
    });
  }
  for (const auto& [from, input] : carried) g.replaceUsesWith(from, input, isStaged);
  // The rest of the step reads what the moved nodes updated.
  for (const auto& [input, value] : movedUpdate) {
    g.replaceUsesWith(input, value, [&](const Node& n) { return !isStaged(n); });
  }
  // The moved nodes run first, on the previous iteration's values.
  std::vector<const Node*> order;
  for (const Node* n : nodes) {
    if (isStaged(*n)) {
      g.metaOf(*n).iteration = IterationTag::FromPrevious;
      order.push_back(n);
    }
  }
  for (const Node* n : nodes) {
    if (!isStaged(*n)) order.push_back(n);
  }
  g.reorder(order);
  // The last iteration's own share: moved values get copies; reads of what
  // the previous share updated see its results.
  std::map<ValueId, ValueId> lastCopy = movedUpdate;
  for (Node n : originals) {
    forEachTensorArg(n, [&](ValueId& v) {
      auto copy = lastCopy.find(v);
      if (copy != lastCopy.end()) v = copy->second;
    });
    for (ValueId& o : n.outputs) {
      if (o == kNoValue) continue;
      Value copy = g.value(o);
      copy.name = g.freshName(copy.name + ".last");
      const ValueId fresh = g.addValue(copy);
      lastCopy[o] = fresh;
      o = fresh;
    }
    n.meta.iteration = IterationTag::LastOnly;
    g.addNode(std::move(n));
  }
  for (const auto& [input, value] : movedUpdate) g.addUpdate({input, lastCopy.at(value)});
  for (const auto& [from, input] : carried) g.addUpdate({input, from});
  g.setIters(iters);
}

}  // namespace spmd

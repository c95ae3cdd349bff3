// cse: a node that computes what an earlier node already computed (the same
// op on the same values and constants, in the same part of the step) is
// dropped and its readers read the earlier results. Not merged: ops with the
// Random trait (two draws differ), collectives (each call talks to the other
// ranks), in-place and out= ops, and nodes whose results a gradient record
// or a state update names. The later node's results take the earlier's;
// their names go with the later node.
#include "spmd/ops/op_traits.h"
#include "spmd/passes/pass.h"

#include <cstdio>
#include <map>
#include <string>

namespace spmd {
namespace {

// Exact text for a double (hex float), so that 0.1 and 0.1000001 differ.
std::string exact(double f) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%a", f);
  return buf;
}

void appendArg(std::string& key, const Arg& a) {
  key += std::to_string(static_cast<int>(a.kind)) + ':';
  switch (a.kind) {
    case Arg::Kind::Value: key += std::to_string(a.value); break;
    case Arg::Kind::Values:
      for (ValueId v : a.values) key += std::to_string(v) + ',';
      break;
    case Arg::Kind::None: break;
    case Arg::Kind::Int:
    case Arg::Kind::DType:
    case Arg::Kind::Layout:
    case Arg::Kind::MemoryFormat: key += std::to_string(a.i); break;
    case Arg::Kind::Float: key += exact(a.f); break;
    case Arg::Kind::Bool: key += a.b ? '1' : '0'; break;
    case Arg::Kind::Str:
    case Arg::Kind::Device: key += std::to_string(a.s.size()) + '"' + a.s; break;
    case Arg::Kind::Ints:
      for (int64_t i : a.ints) key += std::to_string(i) + ',';
      break;
    case Arg::Kind::Floats:
      for (double f : a.floats) key += exact(f) + ',';
      break;
    case Arg::Kind::Bools:
      for (bool b : a.bools) key += b ? '1' : '0';
      break;
  }
  key += ';';
}

// What two nodes must share to compute the same thing at the same point of
// the schedule: op, arguments, role, bucket, partition and iteration.
std::string keyOf(const Node& n) {
  std::string key = n.qualifiedName() + '(';
  for (const Arg& a : n.args) appendArg(key, a);
  key += ')' + std::to_string(static_cast<int>(n.meta.role)) + '/' + std::to_string(n.meta.bucket) + '/' +
         std::to_string(n.meta.partition) + '/' + std::to_string(static_cast<int>(n.meta.iteration));
  return key;
}

bool mayMerge(const Node& n) {
  if (n.outputs.empty() || isRandom(n.op) || isCollective(n.op)) return false;
  if (!n.op.empty() && n.op.back() == '_') return false;  // in place
  return n.overload != "out" && n.overload.rfind("out", 0) != 0 && n.overload.find("_out") == std::string::npos;
}

// Whether a gradient record or a state update names one of n's results:
// each keeps a value of its own (a record would lose its value; two states
// updated to one value would share a buffer).
bool namedByRecord(const Graph& g, const Node& n) {
  for (ValueId o : n.outputs) {
    if (o == kNoValue) continue;
    for (const Gradient& gr : g.gradients()) {
      if (gr.value == o || gr.reduced == o) return true;
    }
    for (const StateUpdate& u : g.updates()) {
      if (u.value == o) return true;
    }
  }
  return false;
}

// Whether `later`'s results can all be read from `earlier`'s.
bool resultsCovered(const Node& earlier, const Node& later) {
  if (earlier.outputs.size() != later.outputs.size()) return false;
  for (size_t k = 0; k < later.outputs.size(); ++k) {
    if (later.outputs[k] != kNoValue && earlier.outputs[k] == kNoValue) return false;
  }
  return true;
}

class CsePass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    std::map<std::string, const Node*> seen;
    std::vector<const Node*> merged;
    for (const Node& n : g.nodes()) {
      if (!mayMerge(n)) continue;
      auto [it, fresh] = seen.emplace(keyOf(n), &n);
      if (fresh || !resultsCovered(*it->second, n) || namedByRecord(g, n)) continue;
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (n.outputs[k] != kNoValue) g.replaceAllUsesWith(n.outputs[k], it->second->outputs[k]);
      }
      merged.push_back(&n);
    }
    for (const Node* n : merged) g.erase(*n);
    return !merged.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createCsePass(const PipelineOptions&) { return std::make_unique<CsePass>(); }

}  // namespace spmd

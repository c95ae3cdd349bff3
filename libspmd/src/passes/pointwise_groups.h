// Element-wise ATen ops as the statements of a pointwise program
// (ops/pointwise_program.h), and a group of them as one spmd::fused node.
// Shared by fuse-pointwise and fuse-rows, which differ in how they group.
// Internal to passes/.
#pragma once
#include "spmd/ir/graph.h"
#include "spmd/ops/pointwise_program.h"

#include <functional>
#include <optional>
#include <set>
#include <vector>

namespace spmd {

// An operand of a translated statement before it is placed in a program: a
// graph value, an earlier statement of the same op, or a constant.
struct Source {
  enum class Kind { Value, Local, Constant } kind = Kind::Constant;
  ValueId value = -1;
  int local = 0;
  double constant = 0;
};
inline Source valueSource(ValueId v) { return {Source::Kind::Value, v, 0, 0}; }
inline Source localSource(int k) { return {Source::Kind::Local, -1, k, 0}; }
inline Source constantSource(double c) { return {Source::Kind::Constant, -1, 0, c}; }

struct Step {
  PointwiseOp op;
  std::vector<Source> operands;
  // What an inner step rounds to (Undefined: it stays float); the last
  // step rounds to the node's dtype.
  c10::ScalarType rounding = c10::ScalarType::Undefined;
};

// A node and its statements; the last step's result is the node's output.
struct Candidate {
  const Node* node;
  std::vector<Step> steps;
};

inline double scalarOf(const Arg& a) { return a.kind == Arg::Kind::Int ? static_cast<double>(a.i) : a.f; }
inline bool isScalar(const Arg& a) { return a.kind == Arg::Kind::Int || a.kind == Arg::Kind::Float; }

// The element-wise node as statements, or nullopt for ops fuse-pointwise
// does not fuse.
std::optional<std::vector<Step>> translatePointwise(const Node& n);
// Whether the statements draw a dropout mask (spmd::dropout_mul).
bool drawsMask(const std::vector<Step>& steps);

// Replaces each operand that is an aten::scalar_tensor of a number (a 0-dim
// CPU tensor, as the importer writes a Python float: RMSNorm's eps, a
// scale) by that number: a CPU pointer cannot reach a kernel, and the
// constant is in the generated source.
void foldScalarTensors(const Graph& g, std::vector<Step>& steps);

// Whether `n` has one result and it, and every tensor `n` reads, has a
// dtype that pointwise programs compute in (spmd::dropout_mul's seed aside).
bool hasPointwiseDtypes(const Graph& g, const Node& n);

// Whether two nodes run in the same part of the step (role and iteration):
// a group never spans them.
inline bool sameSchedule(const Node& a, const Node& b) {
  return a.meta.role == b.meta.role && a.meta.iteration == b.meta.iteration;
}

// Whether no node outside a group (`nodes`, `members` in program order),
// other than `n`, reads a member's value before `n`, where the fused node
// would stand if `n` joined.
bool canEndGroupAt(const Graph& g, const std::vector<Candidate>& members, const std::set<const Node*>& nodes,
                   const Node& n);

// Replaces `members` (in program order; `nodes` holds the same nodes) by one
// spmd::fused node in the last member's place. Its results are the members'
// values that the rest of the graph reads, keeping their names; `perRow`
// says which of them the program returns as row(tK).
void replaceWithFusedNode(Graph& g, const std::vector<Candidate>& members, const std::set<const Node*>& nodes,
                          const std::function<bool(ValueId)>& perRow = nullptr);

}  // namespace spmd

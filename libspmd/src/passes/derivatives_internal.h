// The argument readers and graph helpers that derivative_rules.cpp and
// decompositions.cpp share.
#pragma once

#include "spmd/ir/builder.h"
#include "spmd/ir/graph.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spmd {
namespace derivatives_detail {

// ---- reading a node's arguments --------------------------------------------

inline ValueId in(const Node& n, size_t i) { return n.args.at(i).value; }
inline bool isNone(const Node& n, size_t i) { return n.args.at(i).kind == Arg::Kind::None; }
inline int64_t intAt(const Node& n, size_t i) { return n.args.at(i).i; }
inline bool boolAt(const Node& n, size_t i) { return n.args.at(i).b; }
inline const std::vector<int64_t>& intsAt(const Node& n, size_t i) { return n.args.at(i).ints; }
inline double scalarAt(const Node& n, size_t i) {
  const Arg& a = n.args.at(i);
  return a.kind == Arg::Kind::Float ? a.f : a.kind == Arg::Kind::Bool ? (a.b ? 1.0 : 0.0) : static_cast<double>(a.i);
}
inline ValueId out(const Node& n, size_t k = 0) { return n.outputs.at(k); }

inline ValueId mT(GraphBuilder& b, ValueId v) { return b.transpose(v, -1, -2); }

}  // namespace derivatives_detail
}  // namespace spmd

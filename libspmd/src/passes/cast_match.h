// Matching autocast's casts: the fusion passes that take a pattern with an
// aten::_to_copy between its ops (layer-norm-to-kernel, cross-entropy-to-kernel) share
// what counts as a plain cast. Internal to passes/.
#pragma once
#include "spmd/ir/graph.h"

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

namespace spmd {

// aten::_to_copy(x, dtype) that only changes the dtype to `to` (strided,
// same memory format, blocking).
inline bool isCastTo(const Node& n, c10::ScalarType to) {
  static const OpName kToCopy = OpName::known("aten::_to_copy");
  if (!n.is(kToCopy) || n.args.size() != 7 || n.args[0].kind != Arg::Kind::Value ||
      n.args[1].kind != Arg::Kind::DType || n.args[1].i != static_cast<int64_t>(to)) {
    return false;
  }
  const Arg &layout = n.args[2], &nonBlocking = n.args[5], &format = n.args[6];
  return (layout.kind == Arg::Kind::None ||
          (layout.kind == Arg::Kind::Layout && layout.i == static_cast<int64_t>(c10::kStrided))) &&
         (nonBlocking.kind == Arg::Kind::None || !nonBlocking.b) &&
         (format.kind == Arg::Kind::None || (format.kind == Arg::Kind::MemoryFormat &&
                                             format.i == static_cast<int64_t>(c10::MemoryFormat::Preserve)));
}

}  // namespace spmd

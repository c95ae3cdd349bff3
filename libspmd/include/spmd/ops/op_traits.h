// What passes, analyses and the runtime need to know about an operator
// beyond its schema, in one table (ops/op_traits.cpp). To add a trait: add
// an OpTrait bit, give the ops that have it that bit in the table, and ask
// hasTrait() where it matters; nothing else matches op names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spmd {

enum class OpTrait : uint32_t {
  // An spmd collective: talks to the other ranks (runtime/collectives.h).
  Collective = 1u << 0,
  // Its CUDA kernel reads a result back to the host (a size that decides the
  // output's shape, or a value), which a CUDA graph cannot hold.
  SyncsWithHost = 1u << 1,
  // Returns its input (or a view of it) sometimes and a fresh tensor other
  // times, depending on strides, dtypes or arguments a static shape does not
  // decide, whatever its schema says (aten::reshape is CompositeImplicit and
  // copies when no view is possible). The memory plan gives such results a
  // buffer and keeps the input alive with them; the runtime never writes
  // into them in place.
  MayCopyOrAlias = 1u << 2,
  // Its Tensor[] result holds a view of each element of its Tensor[]
  // argument (expanded views), although the schema carries no alias sets.
  ViewsEachListElement = 1u << 3,
  // Its result is always a view of its first tensor argument, although its
  // schema declares a fresh tensor (aten::_unsafe_view, which autograd's
  // matmul uses on results it made).
  ViewOfFirstArgument = 1u << 4,
  // Draws from the random generator: two calls on the same arguments give
  // different results (dropout's mask), so no pass may share one call's
  // result for another.
  Random = 1u << 5,
  // Its result is a view with strides of its own (a transpose, an expand,
  // a slice): not laid out densely in its input's order, so a generated
  // kernel reading it reads strided.
  StridedView = 1u << 6,
  // An spmd op whose results are tensors it made (or, run in place, inputs
  // that owned theirs), never views: what the runtime may overwrite.
  OwnResults = 1u << 7,
};

// Whether `op` ("aten::reshape", without the overload) has `trait`.
bool hasTrait(const std::string& op, OpTrait trait);

inline bool isCollective(const std::string& op) { return hasTrait(op, OpTrait::Collective); }

// Which collective an op with the Collective trait is (runtime/collectives.h).
enum class CollectiveKind { None, AllReduce, Broadcast, BucketStart, BucketWait, ReduceScatter, AllGather, Shard, GatherStart, GatherWait };
CollectiveKind collectiveKind(const std::string& op);

// The list arguments the op's in-place form (its name with a trailing `_`)
// writes, whose tensors become its results in order; empty when it has no
// such form. Every `_foreach_` op: its first list; spmd::fused_adam: its
// parameters, moments and steps.
std::vector<size_t> listsWrittenInPlace(const std::string& op);
inline bool syncsWithHost(const std::string& op) { return hasTrait(op, OpTrait::SyncsWithHost); }
inline bool isRandom(const std::string& op) { return hasTrait(op, OpTrait::Random); }
inline bool mayCopyOrAlias(const std::string& op) { return hasTrait(op, OpTrait::MayCopyOrAlias); }

}  // namespace spmd

// Casts seen through views: what stack-to-kernel and cross-entropy-to-kernel
// read through to fold a cast into the kernel beside it. An exact upcast
// (bf16 or f16 to f32) under views is read as the same views of the 16-bit
// value; a cast to bf16 or f16 after views of a kernel's result is done by
// the kernel, the views standing over its 16-bit result. Internal to passes/.
#pragma once
#include "spmd/ir/builder.h"
#include "spmd/ir/graph.h"

#include <optional>
#include <vector>

namespace spmd {

// Whether `n` only reshapes or permutes its first argument (view, reshape,
// _unsafe_view, flatten, transpose, permute, t, unsqueeze): the same
// elements in any dtype.
bool isDtypeFreeView(const Node& n);

// Whether `n` casts a bf16 or f16 value up to f32 and does nothing else (a
// plain _to_copy, or fuse-pointwise's lone cast kernel): exact, so a kernel
// reading the 16-bit value as a float reads the same value.
bool isExactUpcast(const Graph& g, const Node& n);

// `v`, or, where `v` is views (those above, and selects) of an exact
// upcast, the same views of the 16-bit value, made at the builder's
// insertion point (each with its old view's source line and role; the
// builder keeps the last); the upcast dies where nothing else reads it.
ValueId readThroughUpcast(GraphBuilder& builder, ValueId v);

// The views of a value that end in a plain cast to bf16 or f16, each node
// the only reader of the one before (type_as to the same dtype counts as a
// view), and that cast.
struct CastAfterViews {
  std::vector<const Node*> views;
  const Node* cast = nullptr;
};
std::optional<CastAfterViews> castAfterViews(const Graph& g, ValueId v);

// Makes `chain.cast`'s value the same views (type_as left out) of `cast`, a
// value of the cast's dtype made before it, and erases the old views; the
// value they read must have no other reader left then.
void castAfterViewsOf(GraphBuilder& builder, const CastAfterViews& chain, ValueId cast);

}  // namespace spmd

// Rejects forward control flow that branches on tensor contents, before
// tracing would silently bake in one path.
#include "torchscript_internal.h"

#include <set>
#include <string>

namespace spmd {
namespace torchscript_detail {
namespace {

// ---- data-dependent control flow ------------------------------------------

// Ops that turn tensor contents into Python values.
bool readsTensorData(const jit::Node* n) {
  static const std::set<std::string> ops = {
      "aten::item", "aten::Bool", "aten::Int", "aten::Float", "aten::ScalarImplicit",
      "aten::IntImplicit", "aten::FloatImplicit", "aten::is_nonzero", "aten::_local_scalar_dense",
      "aten::equal", "aten::allclose", "aten::tolist", "prim::TensorToNum"};
  if (!ops.count(n->kind().toQualString())) return false;
  for (const jit::Value* in : n->inputs()) {
    if (in->type()->isSubtypeOf(*c10::TensorType::get())) return true;
  }
  return false;
}

}  // namespace

// Marks every non-tensor value computed from tensor contents, and rejects
// prim::If / prim::Loop that branch on one: tracing would bake in one path.
void markDataDependence(const jit::Block* block, std::set<const jit::Value*>& dependent) {
  for (const jit::Node* n : block->nodes()) {
    bool fromData = readsTensorData(n);
    for (const jit::Value* in : n->inputs()) fromData = fromData || dependent.count(in);
    const bool branches = n->kind() == c10::prim::If || n->kind() == c10::prim::Loop;
    if (branches) {
      // If: input 0 is the condition. Loop: inputs 0 and 1 are trip count and condition.
      size_t controls = n->kind() == c10::prim::If ? 1 : 2;
      for (size_t i = 0; i < controls && i < n->inputs().size(); ++i) {
        if (dependent.count(n->inputs()[i])) {
          throw Diagnostic(describe(n), std::string("data-dependent control flow: ") +
                                            n->kind().toQualString() +
                                            " branches on tensor values, which a static graph cannot express");
        }
      }
    }
    for (const jit::Block* b : n->blocks()) markDataDependence(b, dependent);
    if (!fromData) continue;
    for (const jit::Value* out : n->outputs()) {
      if (!out->type()->isSubtypeOf(*c10::TensorType::get())) dependent.insert(out);
    }
  }
}

}  // namespace torchscript_detail
}  // namespace spmd

// torch.vmap inside an exported program. A pre-dispatch program keeps a
// vmap as calls of torch._functorch.predispatch (transformers builds its
// attention masks from per-position functions this way when a model passes
// its own mask function: Falcon, Gemma 3, ...). Those calls are replayed
// through functorch's own C++ vmap: the ops between them then meet batched
// tensors, whose batching rules run ordinary ATen ops on the whole tensors,
// and those are what the tracer records.
#include "export_internal.h"

#include "spmd/support/diagnostic.h"

#include <ATen/functorch/BatchedTensorImpl.h>
#include <ATen/functorch/DynamicLayer.h>
#include <ATen/ops/movedim.h>

namespace spmd {
namespace export_detail {

namespace functorch = at::functorch;

VmapLevels::~VmapLevels() {
  while (!levels_.empty()) {  // a program that failed inside a vmap
    functorch::popDynamicLayerAndDeleteMetadata();
    levels_.pop_back();
  }
}

void VmapLevels::run(const ser::Node& node, const std::string& call,
                     const std::function<at::Tensor(const std::string&)>& tensorNamed,
                     const std::function<void(const std::string&, const at::Tensor&)>& bind,
                     const std::string& where) {
  using Tag = ser::Argument::Tag;
  const auto& in = node.get_inputs();
  auto argument = [&](size_t i, Tag tag, const char* what) -> const ser::Argument& {
    if (i >= in.size() || in[i].get_arg().tag() != tag) {
      throw Diagnostic(where, call + " without its argument " + std::to_string(i) + " as " + what);
    }
    return in[i].get_arg();
  };
  auto integer = [&](size_t i) { return argument(i, Tag::AS_INT, "an integer").get_as_int(); };
  auto input = [&](size_t i) { return tensorNamed(argument(i, Tag::AS_TENSOR, "a tensor").get_as_tensor().get_name()); };
  auto result = [&](const at::Tensor& t) {
    const auto& out = node.get_outputs();
    if (out.size() != 1 || out[0].tag() != Tag::AS_TENSOR) throw Diagnostic(where, call + " without a tensor result");
    bind(out[0].get_as_tensor().get_name(), t);
  };
  try {
    if (call == "lazy_load_decompositions") return;  // Python's decomposition tables: nothing to trace
    if (call == "_vmap_increment_nesting") return push(integer(0), argument(1, Tag::AS_STRING, "a string").get_as_string(), where);
    if (call == "_vmap_decrement_nesting") return pop(where);
    if (call == "_add_batch_dim") return result(addBatchDim(input(0), integer(1), integer(2), where));
    if (call == "_remove_batch_dim") return result(removeBatchDim(input(0), integer(1), integer(2), integer(3), where));
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw Diagnostic(where, what.substr(0, what.find('\n')));
  }
  throw Diagnostic(where, "'torch._functorch.predispatch." + call + "' is no vmap call spmd knows");
}

void VmapLevels::push(int64_t batchSize, const std::string& randomness, const std::string& where) {
  functorch::RandomnessType type;
  if (randomness == "error") type = functorch::RandomnessType::Error;
  else if (randomness == "same") type = functorch::RandomnessType::Same;
  else if (randomness == "different") type = functorch::RandomnessType::Different;
  else throw Diagnostic(where, "vmap with randomness '" + randomness + "', which functorch does not know");
  levels_.push_back(functorch::initAndPushDynamicLayer(functorch::TransformType::Vmap, c10::SymInt(batchSize), type));
}

void VmapLevels::pop(const std::string& where) {
  if (levels_.empty()) throw Diagnostic(where, "leaves a vmap it did not enter");
  functorch::popDynamicLayerAndDeleteMetadata();
  levels_.pop_back();
}

// The program names a vmap by its depth when exported (functorch numbers
// its levels from 1 in the order they are entered).
int64_t VmapLevels::level(int64_t recorded, const std::string& where) const {
  if (recorded < 1 || recorded > static_cast<int64_t>(levels_.size())) {
    throw Diagnostic(where, "names vmap level " + std::to_string(recorded) + " outside the " +
                                std::to_string(levels_.size()) + " it is inside");
  }
  return levels_[recorded - 1];
}

at::Tensor VmapLevels::addBatchDim(const at::Tensor& t, int64_t dim, int64_t recordedLevel, const std::string& where) {
  return functorch::addBatchDim(t, dim, level(recordedLevel, where));
}

// What torch._C._functorch._remove_batch_dim does: the batched dimension
// moved to `outDim`, or, for a result that does not vary along it, the
// result repeated `batchSize` times there.
at::Tensor VmapLevels::removeBatchDim(const at::Tensor& t, int64_t recordedLevel, int64_t batchSize, int64_t outDim,
                                      const std::string& where) {
  const int64_t ours = level(recordedLevel, where);
  const functorch::BatchedTensorImpl* batched = functorch::maybeGetBatchedImpl(t);
  if (batched == nullptr || batched->level() != ours) {
    std::vector<int64_t> sizes = t.sizes().vec();
    sizes.insert(sizes.begin() + outDim, batchSize);
    return t.unsqueeze(outDim).expand(sizes);
  }
  return at::movedim(batched->value(), batched->bdim(), outDim);
}

}  // namespace export_detail
}  // namespace spmd

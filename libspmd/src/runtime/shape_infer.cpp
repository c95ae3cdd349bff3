#include "spmd/runtime/shape_infer.h"

#include "spmd/runtime/op_call.h"

#include <ATen/ATen.h>
#include <torch/library.h>
#include <torch/version.h>

#include <optional>

namespace spmd {

at::Tensor metaTensorOf(const Value& v) {
  return at::empty(v.shape, at::TensorOptions().dtype(v.dtype).device(at::kMeta));
}

namespace {

std::vector<at::Tensor> toMeta(const std::vector<at::Tensor>& results) {
  std::vector<at::Tensor> meta;
  meta.reserve(results.size());
  for (const at::Tensor& t : results) {
    meta.push_back(t.defined() ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta))
                               : at::Tensor());
  }
  return meta;
}

}  // namespace

std::vector<at::Tensor> inferOnMeta(const Node& node, const c10::OperatorHandle& op,
                                    const std::function<at::Tensor(ValueId)>& metaOf) {
  // Below autograd: shapes need no graph, and spmd's own ops have no
  // autograd kernel for the meta device.
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  try {
    return toMeta(callOperator(op, boxArguments(node, metaOf)));
  } catch (const std::exception&) {
    // No meta kernel (or one that reads data): zero-filled CPU tensors, valid
    // indices and probabilities for any op.
    auto onCpu = [&](ValueId v) { return at::zeros_like(metaOf(v), at::TensorOptions().device(at::kCPU)); };
    return toMeta(callOperator(op, boxArguments(node, onCpu)));
  }
}

}  // namespace spmd

// LibTorch 1.13 has no meta kernel for many ops (relu, native_batch_norm,
// embedding_dense_backward, ...); 2.x has one for nearly all. There, those
// ops run on zero-filled CPU tensors and return meta tensors of the results'
// shapes, so that tracing and shape checks on the meta device work for every
// op. In-place and out= results return the meta argument they write, as the
// tracer expects.
#if TORCH_VERSION_MAJOR < 2
namespace spmd {
namespace {

c10::IValue metaToCpu(const c10::IValue& v) {
  auto cpu = [](const at::Tensor& t) {
    return t.defined() && t.is_meta() ? at::zeros_like(t, at::TensorOptions().device(at::kCPU)) : t;
  };
  if (v.isTensor()) return cpu(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorVector()) list.push_back(cpu(t));
    return list;
  }
  if (v.isDevice() && v.toDevice().is_meta()) return c10::Device(at::kCPU);
  return v;
}

c10::IValue cpuToMeta(const c10::IValue& v) {
  if (v.isTensor()) return toMeta({v.toTensor()})[0];
  if (v.isTensorList()) return c10::List<at::Tensor>(toMeta(v.toTensorVector()));
  return v;
}

// The argument a return writes into (in-place or out=), if any.
std::optional<size_t> writtenArgument(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* alias = schema.returns()[ret].alias_info();
  if (!alias || !alias->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite() && a->beforeSets() == alias->beforeSets()) return i;
  }
  return std::nullopt;
}

void metaByCpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t argc = schema.arguments().size();
  const std::vector<c10::IValue> args(stack->end() - argc, stack->end());
  for (auto it = stack->end() - argc; it != stack->end(); ++it) *it = metaToCpu(*it);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  const size_t retc = schema.returns().size();
  for (size_t k = 0; k < retc; ++k) {
    c10::IValue& out = (*stack)[stack->size() - retc + k];
    auto written = writtenArgument(schema, k);
    if (!written) {
      out = cpuToMeta(out);
      continue;
    }
    // An out= kernel may have resized its output: the meta argument takes
    // the new shape (on its TensorImpl: resize_ would come back here).
    at::Tensor meta = args[*written].toTensor();
    const at::Tensor cpu = out.toTensor();
    if (meta.sizes() != cpu.sizes() || meta.strides() != cpu.strides()) {
      meta.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides());
      c10::StorageImpl* storage = meta.storage().unsafeGetStorageImpl();
      if (storage->nbytes() < cpu.storage().nbytes()) storage->set_nbytes(cpu.storage().nbytes());
    }
    out = meta;
  }
}

}  // namespace
}  // namespace spmd

TORCH_LIBRARY_IMPL(_, Meta, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&spmd::metaByCpu>()); }
#endif

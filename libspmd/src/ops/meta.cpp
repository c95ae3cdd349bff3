#include "spmd/ops/meta.h"

#include "spmd/ops/dispatch.h"
#include "spmd/support/phase_times.h"

#include "meta_standins.h"

#include <ATen/ATen.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <set>
#include <optional>

namespace spmd {

at::Tensor metaTensor(c10::ScalarType dtype, const std::vector<int64_t>& shape) {
  return at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kMeta));
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

// CPU tensors filled with `fill` in place of meta ones. Zeros are valid
// indices and probabilities for any op, but no integer divisor: an op they
// make divide by zero (floor_divide by a number the trace made a tensor,
// as transformers' experts do) runs again on ones (dividedByZero).
c10::IValue filledOnCpu(const c10::IValue& v, int fill = 0) {
  return mapTensors(v, [fill](const at::Tensor& t) {
    return t.defined() && t.is_meta() ? at::full_like(t, fill, at::TensorOptions().device(at::kCPU)) : t;
  });
}

bool dividedByZero(const std::exception& e) { return std::string(e.what()).find("ZeroDivisionError") != std::string::npos; }

// filledOnCpu, and a meta device argument becomes the CPU.
c10::IValue metaToCpu(const c10::IValue& v, int fill) {
  if (v.isDevice() && v.toDevice().is_meta()) return c10::Device(at::kCPU);
  return filledOnCpu(v, fill);
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

}  // namespace

namespace {

// runMetaOnCpu on the stack's own sizes.
void runFullSizeOnCpu(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t argc = schema.arguments().size();
  const std::vector<c10::IValue> args(stack->end() - argc, stack->end());
  checkStandInBudget(op, args);
  const size_t base = stack->size() - argc;
  auto runOn = [&](int fill) {
    stack->resize(base);
    for (const c10::IValue& arg : args) stack->push_back(metaToCpu(arg, fill));
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  };
  try {
    runOn(0);
  } catch (const c10::Error& e) {
    if (!dividedByZero(e)) throw;
    runOn(1);
  }
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

void runMetaOnCpu(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack) {
  // Shapes that follow a batch are inferred on a batch of 2, so that their
  // cost does not grow with it; other ops run whole, within a bound.
  if (runOnSmallBatch(op, stack, [&op](std::vector<c10::IValue>* s) { runFullSizeOnCpu(op, s); })) return;
  runFullSizeOnCpu(op, stack);
}

std::vector<at::Tensor> inferOnMeta(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack) {
  // Below autograd: shapes need no graph, and spmd's own ops have no
  // autograd kernel for the meta device.
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  // A device argument names where a result lives (a traced cast's "cpu"):
  // for shapes, the meta device. Left as it is, _to_copy(meta, device=cpu)
  // would throw and take the CPU retry with tensors of full size.
  std::vector<c10::IValue> onMeta;
  onMeta.reserve(stack.size());
  for (const c10::IValue& v : stack) onMeta.push_back(v.isDevice() ? c10::IValue(c10::Device(at::kMeta)) : v);
  // Most ops have meta kernels all the way down and need no fallback. A
  // scope is taken only for those that do: the first live scope updates
  // every op's dispatch table (milliseconds), which a caller inferring node
  // after node outside any scope would otherwise pay per node.
  try {
    return toMeta(callOperator(op, onMeta));
  } catch (const std::exception&) {
    // No meta kernel somewhere below the op: again, with the fallback.
  }
  MetaFallbackScope metaFallback;
  try {
    return toMeta(callOperator(op, onMeta));
  } catch (const std::exception&) {
    // No meta kernel even so (or one that reads data).
    checkStandInBudget(op, stack);
    TimedPhase phase(phaseTimesEnabled() ? "shape inference on CPU tensors: " + op.schema().operator_name().name : "");
    auto onCpu = [&](int fill) {
      std::vector<c10::IValue> filled;
      filled.reserve(stack.size());
      for (const c10::IValue& v : stack) filled.push_back(filledOnCpu(v, fill));
      return filled;
    };
    try {
      return toMeta(callOperator(op, onCpu(0)));
    } catch (const std::exception& e) {
      if (!dividedByZero(e)) throw;
      return toMeta(callOperator(op, onCpu(1)));
    }
  }
}

}  // namespace spmd

// LibTorch 2.x has C++ meta kernels for most ops, but not for those whose
// meta function PyTorch writes in Python (relu, batch norm, layer norm and
// its backward, embedding and its gradient, where, the _foreach ops:
// measured on 2.6). While a MetaFallbackScope lives, those get shape
// functions of ours, with the shapes and dtypes their CPU kernels give, or
// run on zero-filled CPU stand-ins of a batch of 2 (meta_standins.h), so
// that tracing and shape checks on the meta device need no memory that
// grows with the step; any other op without a meta kernel takes
// inferOnMeta's retry on zero-filled CPU tensors, within a bound.
namespace spmd {
namespace {

void standInsOnCpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) { runMetaOnCpu(op, stack); }

void layerNormMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 5);  // input, normalized_shape, weight, bias, eps
  const at::Tensor input = args[0].toTensor();
  const auto normalized = args[1].toIntVector();
  std::vector<int64_t> stats(input.sizes().begin(), input.sizes().end() - static_cast<int64_t>(normalized.size()));
  stats.resize(input.dim(), 1);
  torch::jit::drop(*stack, 5);
  stack->emplace_back(at::empty(input.sizes(), input.options()));
  stack->emplace_back(at::empty(stats, input.options()));
  stack->emplace_back(at::empty(stats, input.options()));
}

void layerNormBackwardMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  // grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask
  auto args = torch::jit::last(*stack, 8);
  const at::Tensor input = args[1].toTensor();
  const c10::IValue weight = args[5], bias = args[6];
  const auto mask = args[7].toBoolList();
  auto like = [](const c10::IValue& v, bool wanted) {
    return wanted && v.isTensor() ? at::empty_like(v.toTensor()) : at::Tensor();
  };
  // Contiguous whatever the input's layout, as the CPU and CUDA kernels make
  // it: a transposed input (nn.MultiheadAttention's batch_first output) must
  // not give a transposed gradient that a later view would read wrongly.
  at::Tensor gradInput = mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor();
  at::Tensor gradWeight = like(weight, mask[1]), gradBias = like(bias, mask[2]);
  torch::jit::drop(*stack, 8);
  stack->emplace_back(gradInput);
  stack->emplace_back(gradWeight);
  stack->emplace_back(gradBias);
}

// Debian's LibTorch 2.6 runs convolution on meta tensors into the
// "overrideable" backend, which throws (pip's meta kernels pick a real one);
// on zero CPU tensors it would compute the whole convolution. The shape is
// conv_output_size's (conv_input_size's for a transposed one).
at::Tensor convolutionShaped(const at::ArrayRef<c10::IValue>& args) {
  // input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...
  const at::Tensor input = args[0].toTensor(), weight = args[1].toTensor();
  const auto stride = args[3].toIntVector(), padding = args[4].toIntVector(), dilation = args[5].toIntVector();
  const auto outputPadding = args[7].toIntVector();
  const bool transposed = args[6].toBool();
  const int64_t groups = args[8].toInt();
  const std::vector<int64_t> shape =
      transposed ? at::native::conv_input_size(input.sizes(), weight.sizes(), padding, outputPadding, stride, dilation,
                                               groups)
                 : at::native::conv_output_size(input.sizes(), weight.sizes(), padding, stride, dilation);
  c10::impl::ExcludeDispatchKeyGuard untraced(c10::DispatchKey::Tracer);
  return at::empty(shape, input.options().memory_format(input.suggest_memory_format()));
}

// aten::_convolution: what LibTorch's tracer records for every convolution.
void internalConvolutionMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  at::Tensor result = convolutionShaped(torch::jit::last(*stack, 13));
  torch::jit::drop(*stack, 13);
  stack->emplace_back(std::move(result));
}

// aten::convolution, which the tracer does not record (conv2d and the rest
// neither): it calls aten::_convolution, as its own kernel does, so that
// under the tracer (a TorchScript module's or a torch.export program's
// trace on the meta device) the result is a traced _convolution's.
void convolutionMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 9);
  at::Tensor result = at::_convolution(args[0].toTensor(), args[1].toTensor(), args[2].toOptional<at::Tensor>(),
                                       args[3].toIntVector(), args[4].toIntVector(), args[5].toIntVector(),
                                       args[6].toBool(), args[7].toIntVector(), args[8].toInt(), false, false, true,
                                       true);
  torch::jit::drop(*stack, 9);
  stack->emplace_back(std::move(result));
}

// Whether convolution fails on meta tensors in this LibTorch (asked once,
// before any scope's registrations exist).
bool convolutionFailsOnMeta() {
  static const bool fails = [] {
    try {
      at::convolution(metaTensor(at::kFloat, {1, 1, 3, 3}), metaTensor(at::kFloat, {1, 1, 1, 1}), {}, {1, 1}, {0, 0},
                      {1, 1}, false, {0, 0}, 1);
      return false;
    } catch (const c10::Error&) {
      return true;
    }
  }();
  return fails;
}

void embeddingBackwardMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  // grad_output, indices, num_weights, padding_idx, scale_grad_by_freq
  auto args = torch::jit::last(*stack, 5);
  const at::Tensor grad = args[0].toTensor();
  const int64_t rows = args[2].toInt();
  torch::jit::drop(*stack, 5);
  stack->emplace_back(at::empty({rows, grad.size(-1)}, grad.options()));
}

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): a
// row of the weight per index.
void embeddingMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 5);
  const at::Tensor weight = args[0].toTensor(), indices = args[1].toTensor();
  std::vector<int64_t> shape = indices.sizes().vec();
  shape.push_back(weight.size(-1));
  torch::jit::drop(*stack, 5);
  stack->emplace_back(at::empty(shape, weight.options()));
}

// The embedding's lookup: the index's elements along `dim`.
void indexSelectMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);  // self, dim, index
  const at::Tensor self = args[0].toTensor(), index = args[2].toTensor();
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape.at(c10::maybe_wrap_dim(args[1].toInt(), self.dim())) = index.numel();
  torch::jit::drop(*stack, 3);
  stack->emplace_back(at::empty(shape, self.options()));
}

// The _foreach ops optimizer-to-foreach emits: element i of the result takes the
// broadcast shape and promoted dtype of element i of every tensor list.
void foreachMeta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t argc = op.schema().arguments().size();
  std::vector<std::vector<at::Tensor>> lists;
  for (const c10::IValue& v : torch::jit::last(*stack, argc)) {
    if (v.isTensorList()) lists.push_back(v.toTensorVector());
  }
  c10::List<at::Tensor> results;
  for (size_t i = 0; i < lists.at(0).size(); ++i) {
    std::vector<int64_t> shape = lists[0][i].sizes().vec();
    at::native::ResultTypeState promotion{};
    for (size_t l = 0; l < lists.size(); ++l) {
      shape = at::infer_size(shape, lists[l][i].sizes());
      promotion = at::native::update_result_type_state(lists[l][i], promotion);
    }
    results.push_back(at::empty(shape, lists[0][i].options().dtype(at::native::result_type(promotion))));
  }
  torch::jit::drop(*stack, argc);
  stack->emplace_back(results);
}

// The shape where(condition, self, other) broadcasts its three to.
std::vector<int64_t> whereShape(const at::ArrayRef<c10::IValue>& args) {
  return at::infer_size(at::infer_size(args[0].toTensor().sizes(), args[1].toTensor().sizes()), args[2].toTensor().sizes());
}

// where(condition, self, other): self's and other's dtypes promoted. SDPA's
// math (an is_causal mask) calls it, and its meta function is Python's.
void whereMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  const std::vector<int64_t> shape = whereShape(args);
  const at::Tensor self = args[1].toTensor();
  const c10::ScalarType dtype = at::result_type(self, args[2].toTensor());
  torch::jit::drop(*stack, 3);
  c10::impl::ExcludeDispatchKeyGuard untraced(c10::DispatchKey::Tracer);
  stack->emplace_back(at::empty(shape, self.options().dtype(dtype)));
}

// where(condition, self, other, out=): into `out`, resized.
void whereOutMeta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  at::Tensor out = args[3].toTensor();
  const std::vector<int64_t> shape = whereShape(args);
  torch::jit::drop(*stack, 4);
  {
    c10::impl::ExcludeDispatchKeyGuard untraced(c10::DispatchKey::Tracer);
    out.resize_(shape);
  }
  stack->emplace_back(out);
}

// Whether `name` (an aten overload) has no Meta kernel in the linked
// LibTorch: only those get our shape functions, so that none replaces one.
bool lacksMetaKernel(const std::string& full) {
  const size_t dot = full.find('.');
  const auto op = c10::Dispatcher::singleton().findOp(
      {"aten::" + full.substr(0, dot), dot == std::string::npos ? "" : full.substr(dot + 1)});
  return op && !op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

// The registrations a live scope holds: destroying a Library deregisters
// what it registered.
struct MetaRegistrations {
  torch::Library shapes{torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__};

  template <void (*shapeFunction)(const c10::OperatorHandle&, torch::jit::Stack*)>
  void shapesFor(const std::string& name) {
    if (!lacksMetaKernel(name)) return;
    try {
      shapes.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<shapeFunction>());
    } catch (const c10::Error&) {
      // A LibTorch that refuses it: the op takes inferOnMeta's CPU retry, as without a scope.
    }
  }

  // The CPU stand-in as the Meta kernel of an aten op that fails on meta
  // tensors (MetaFallbackScope::standInOnCpu), once per op.
  void standIn(const c10::OperatorHandle& op) {
    const c10::OperatorName& name = op.operator_name();
    if (name.name.rfind("aten::", 0) != 0) return;
    const std::string key = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (!standIns.insert(key).second) return;
    try {
      shapes.impl(key.c_str(), torch::CppFunction::makeFromBoxedFunction<&standInsOnCpu>());
    } catch (const c10::Error&) {
      // A Meta kernel registered already (ours): the op fails for another reason.
    }
  }
  std::set<std::string> standIns;

  MetaRegistrations() {
    for (const char* name : {"_foreach_add.Scalar", "_foreach_mul.Scalar", "_foreach_add.List", "_foreach_sub.List",
                             "_foreach_mul.List", "_foreach_div.List", "_foreach_maximum.List",
                             "_foreach_addcmul.Scalar", "_foreach_addcdiv.Scalar", "_foreach_sqrt", "_foreach_neg"}) {
      shapesFor<&foreachMeta>(name);
    }
    shapesFor<&layerNormMeta>("native_layer_norm");
    shapesFor<&layerNormBackwardMeta>("native_layer_norm_backward");
    shapesFor<&embeddingBackwardMeta>("embedding_dense_backward");
    shapesFor<&indexSelectMeta>("index_select");
    shapesFor<&embeddingMeta>("embedding");
    shapesFor<&whereMeta>("where.self");
    shapesFor<&whereOutMeta>("where.self_out");
    if (convolutionFailsOnMeta()) {
      shapes.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&convolutionMeta>());
      shapes.impl("_convolution", torch::CppFunction::makeFromBoxedFunction<&internalConvolutionMeta>());
      shapes.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&standInsOnCpu>());
    }
    for (const std::string& qualified : smallBatchOps()) {
      if (qualified == "aten::convolution_backward" && convolutionFailsOnMeta()) continue;  // registered above
      shapesFor<&standInsOnCpu>(qualified.substr(qualified.find("::") + 2));
    }
  }
};

// How many scopes live, and the registrations while any does.
std::mutex scopesMutex;
int liveScopes = 0;
std::unique_ptr<MetaRegistrations> registrations;

}  // namespace

MetaFallbackScope::MetaFallbackScope() {
  std::lock_guard<std::mutex> lock(scopesMutex);
  if (liveScopes++ == 0) registrations = std::make_unique<MetaRegistrations>();
}

MetaFallbackScope::~MetaFallbackScope() {
  std::lock_guard<std::mutex> lock(scopesMutex);
  if (--liveScopes == 0) registrations.reset();
}

void MetaFallbackScope::standInOnCpu(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(scopesMutex);
  registrations->standIn(op);
}

std::optional<std::string> takeStandInRefusal() { return takeLastStandInRefusal(); }

}  // namespace spmd

#include "meta_standins.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/limits.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <string>

namespace spmd {
namespace {

constexpr int64_t kSmallBatch = 2;  // batch norm in training needs more than one value per channel

// An op whose shape rule scales with dimension 0: the arguments that carry the
// batch (the first one always; the others where their dimension 0 equals
// its) and the results that carry it. Nothing else of the op's results
// depends on the batch: each rule below was read from the op's definition.
struct BatchRule {
  const char* op;
  std::vector<size_t> batchedArgs;
  std::vector<size_t> batchedResults;
};

const std::vector<BatchRule>& batchRules() {
  static const std::vector<BatchRule> rules = {
      {"aten::relu", {0}, {0}},                                  // elementwise
      {"aten::native_batch_norm", {0}, {0}},                     // statistics per channel: [C]
      {"aten::native_batch_norm_backward", {1, 0}, {0}},         // weight and bias gradients: [C]
      {"aten::convolution_backward", {1, 0}, {0}},               // weight and bias gradients: the weight's
      {"aten::_adaptive_avg_pool2d", {0}, {0}},                  // per sample and channel
      {"aten::_adaptive_avg_pool2d_backward", {1, 0}, {0}},      // the input's shape
      {"aten::mse_loss_backward", {1, 0, 2}, {0}},               // the input's shape
  };
  return rules;
}

}  // namespace

std::vector<std::string> smallBatchOps() {
  std::vector<std::string> names;
  for (const BatchRule& r : batchRules()) names.emplace_back(r.op);
  return names;
}

namespace {

const BatchRule* ruleFor(const c10::OperatorHandle& op) {
  if (!op.schema().overload_name().empty()) return nullptr;  // functional forms only
  for (const BatchRule& r : batchRules()) {
    if (op.schema().name() == r.op) return &r;
  }
  return nullptr;
}

std::optional<at::MemoryFormat> scalableFormat(const at::Tensor& t) {
  if (t.is_contiguous()) return at::MemoryFormat::Contiguous;
  if (t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) return at::MemoryFormat::ChannelsLast;
  return std::nullopt;
}

// `t` (meta) with dimension 0 set to `batch`, in the same memory format.
std::optional<at::Tensor> withBatch(const at::Tensor& t, int64_t batch) {
  auto format = scalableFormat(t);
  if (!format) return std::nullopt;
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[0] = batch;
  return at::empty(sizes, t.options().memory_format(*format));
}

// Bytes a zero-filled CPU copy of `t` takes if it is a meta tensor (beyond
// the bound, without overflowing, for any shape).
int64_t metaBytes(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta()) return 0;
  auto numel = boundedNumel(t.sizes().vec());
  return numel ? *numel * static_cast<int64_t>(t.element_size()) : kMaxTensorElements * 16;
}

}  // namespace

// Set where checkStandInBudget refuses, read by takeLastStandInRefusal.
static thread_local std::optional<std::string> lastRefusal;

void checkStandInBudget(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  int64_t bytes = 0;
  // Each term is at most 2^52 bytes: capped at 2^62, the sum cannot overflow.
  const auto add = [&bytes](const at::Tensor& t) { bytes = std::min(bytes + metaBytes(t), int64_t{1} << 62); };
  for (const c10::IValue& v : args) {
    if (v.isTensor()) add(v.toTensor());
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) add(t);
    }
    if (v.isOptionalTensorList()) {
      for (const c10::optional<at::Tensor>& t : v.toOptionalTensorVector()) {
        if (t) add(*t);
      }
    }
  }
  if (bytes <= kMaxStandInBytes) return;
  lastRefusal = "shape inference for " + op.schema().name() + " would need " + std::to_string(bytes >> 20) +
                " MiB of zero-filled CPU tensors (this LibTorch has no meta kernel for it; the bound is " +
                std::to_string(kMaxStandInBytes >> 20) + " MiB): give smaller per-rank shapes";
  // A Diagnostic, not a c10::Error: the input is too large, nothing is
  // wrong inside; callers name the file and node.
  throw Diagnostic("", *lastRefusal);
}

std::optional<std::string> takeLastStandInRefusal() {
  std::optional<std::string> out;
  out.swap(lastRefusal);
  return out;
}

bool runOnSmallBatch(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack,
                     const std::function<void(std::vector<c10::IValue>*)>& run) {
  const BatchRule* rule = ruleFor(op);
  if (!rule) return false;
  const size_t argc = op.schema().arguments().size();
  const size_t base = stack->size() - argc;
  const c10::IValue& first = (*stack)[base + rule->batchedArgs[0]];
  if (!first.isTensor() || first.toTensor().dim() == 0 || !first.toTensor().is_meta()) return false;
  const int64_t batch = first.toTensor().size(0);
  if (batch <= kSmallBatch) return false;
  std::vector<c10::IValue> small(stack->begin() + base, stack->end());
  for (size_t i : rule->batchedArgs) {
    if (!small[i].isTensor()) continue;
    const at::Tensor t = small[i].toTensor();
    if (!t.defined() || t.dim() == 0 || t.size(0) != batch) continue;  // broadcast, or not batched
    auto cut = withBatch(t, kSmallBatch);
    if (!cut) return false;
    small[i] = *cut;
  }
  run(&small);
  std::vector<c10::IValue> results(small.end() - op.schema().returns().size(), small.end());
  for (size_t r : rule->batchedResults) {
    if (!results[r].isTensor()) continue;  // a result the output mask left out: None
    const at::Tensor t = results[r].toTensor();
    if (!t.defined()) continue;
    auto full = t.dim() > 0 && t.size(0) == kSmallBatch ? withBatch(t, batch) : std::nullopt;
    if (!full) return false;
    results[r] = *full;
  }
  stack->resize(base);
  stack->insert(stack->end(), results.begin(), results.end());
  return true;
}

}  // namespace spmd

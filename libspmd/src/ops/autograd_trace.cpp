#include "spmd/ops/autograd_trace.h"

#include "spmd/ops/meta.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <set>

namespace spmd {
namespace {

constexpr c10::DispatchKey kRecordKey = c10::DispatchKey::Fake;

// The innermost live trace. A dispatcher fallback is a plain function, so
// the trace it records into is found here; autograd's engine runs a
// meta-device backward on the thread that asked for it, but an atomic
// costs nothing and makes no assumption about that.
std::atomic<DispatchTrace*> activeTrace{nullptr};

bool noKernelFor(const c10::Error& e) {
  return dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr ||
         std::string(e.what()).find("meta") != std::string::npos;
}

thread_local RecordingKeyHandler firstHandler = nullptr;

void recordAndRun(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (firstHandler && firstHandler(op, stack)) return;
  const size_t argc = op.schema().arguments().size();
  const size_t base = stack->size() - argc;
  std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  {
    c10::impl::ExcludeDispatchKeyGuard below(kRecordKey);
    const c10::DispatchKeySet rest = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRecordKey);
    try {
      op.redispatchBoxed(rest, stack);
    } catch (const c10::Error& e) {
      // No meta kernel for this op (relu, for one) or one
      // that reads data: the shapes come from zero-filled CPU tensors.
      if (!noKernelFor(e)) throw;
      stack->resize(base);  // a kernel that failed part way may have taken its arguments
      stack->insert(stack->end(), args.begin(), args.end());
      runMetaOnCpu(op, stack);
    }
  }
  DispatchTrace* trace = activeTrace.load();
  if (!trace) return;
  const size_t retc = op.schema().returns().size();
  std::vector<c10::IValue> results(stack->end() - static_cast<std::ptrdiff_t>(retc), stack->end());
  trace->append(RecordedCall{op, std::move(args), std::move(results)});
}

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&recordAndRun>()); }

}  // namespace

RecordingKeyHandler setRecordingKeyHandler(RecordingKeyHandler handler) {
  RecordingKeyHandler previous = firstHandler;
  firstHandler = handler;
  return previous;
}

struct DispatchTrace::Guards {
  c10::impl::IncludeDispatchKeyGuard record{kRecordKey};
  MetaFallbackScope metaFallback;
};

DispatchTrace::DispatchTrace() : guards_(std::make_unique<Guards>()), previous_(activeTrace.exchange(this)) {}

DispatchTrace::~DispatchTrace() { activeTrace.store(previous_); }

std::vector<RecordedCall> DispatchTrace::take() {
  std::vector<RecordedCall> calls;
  calls.swap(calls_);
  return calls;
}

bool anyInputReadTwice(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) {
  std::map<const torch::autograd::Node*, int> edgesInto;  // by each input's gradient accumulator
  for (const at::Tensor& input : inputs) edgesInto[torch::autograd::impl::grad_accumulator(input).get()] = 0;
  std::vector<torch::autograd::Node*> work;
  std::set<torch::autograd::Node*> seen;
  for (const at::Tensor& out : outputs) {
    if (out.defined() && out.grad_fn()) work.push_back(out.grad_fn().get());
  }
  while (!work.empty()) {
    torch::autograd::Node* fn = work.back();
    work.pop_back();
    if (!seen.insert(fn).second) continue;
    for (const torch::autograd::Edge& e : fn->next_edges()) {
      if (!e.function) continue;
      auto it = edgesInto.find(e.function.get());
      if (it == edgesInto.end()) {
        work.push_back(e.function.get());
      } else if (++it->second >= 2) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace spmd

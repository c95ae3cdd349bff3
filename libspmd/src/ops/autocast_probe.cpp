#include "spmd/ops/autocast_probe.h"

#include "spmd/ops/dispatch.h"
#include "spmd/ops/meta.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace spmd {
namespace {

c10::DispatchKey autocastKey(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? c10::DispatchKey::AutocastCUDA : c10::DispatchKey::AutocastCPU;
}

// A tensor that reports `device` and holds no data: what autocast sees. Its
// meta twin is what the op runs on.
class StandInImpl final : public c10::TensorImpl {
 public:
  StandInImpl(at::Tensor meta, c10::Device device, c10::DispatchKeySet keys)
      : c10::TensorImpl(keys, meta.dtype(), device), meta_(std::move(meta)) {
    set_sizes_and_strides(meta_.sizes(), meta_.strides());
    // TensorImpl's constructor adds the autograd and autocast keys of the
    // backend; the probe decides which keys the stand-in has.
    key_set_ = keys;
  }
  const at::Tensor& meta() const { return meta_; }

 private:
  at::Tensor meta_;
};

const StandInImpl* standInOf(const at::Tensor& t) {
  return t.defined() ? dynamic_cast<const StandInImpl*>(t.unsafeGetTensorImpl()) : nullptr;
}

at::Tensor metaTwin(const at::Tensor& t) {
  const StandInImpl* s = standInOf(t);
  return s ? s->meta() : t;
}

// One live runUnderAutocast on this thread: the stand-ins' device and keys,
// and the calls recorded so far.
struct Probe {
  c10::Device device;
  c10::DispatchKeySet keys;
  std::vector<RecordedCall> calls;

  at::Tensor standIn(const at::Tensor& t) const {
    if (!t.defined()) return t;
    return at::detail::make_tensor<StandInImpl>(onMeta(t), device, keys);
  }

  // A factory that names a device (a trace's arange(..., device="cpu")) makes a
  // real tensor; every value of the step lives on the run's one device, so it
  // stands in as the others do. Were it left a CPU tensor, CUDA autocast would
  // not cast what is made from it, as it does in the run.
  static at::Tensor onMeta(const at::Tensor& t) {
    if (t.is_meta()) return t;
    c10::impl::ExcludeDispatchKeyGuard unrecorded(
        c10::DispatchKeySet({c10::DispatchKey::Fake, c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}));
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  }
};

thread_local Probe* activeProbe = nullptr;

bool noKernelFor(const c10::Error& e) {
  return dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr ||
         std::string(e.what()).find("meta") != std::string::npos;
}

// Runs the call on the stand-ins' meta twins; results that are an argument's
// twin (in-place ops, aten::to of the same dtype) come back as that argument.
void runOnMeta(Probe& probe, const c10::OperatorHandle& op, torch::jit::Stack* stack,
               const std::vector<c10::IValue>& args) {
  const size_t base = stack->size() - args.size();
  stack->resize(base);
  std::unordered_map<const c10::TensorImpl*, at::Tensor> argumentOfTwin;
  for (const c10::IValue& a : args) {
    stack->push_back(mapTensors(a, [&](const at::Tensor& t) {
      at::Tensor twin = metaTwin(t);
      if (twin.defined()) argumentOfTwin.emplace(twin.unsafeGetTensorImpl(), t);
      return twin;
    }));
  }
  const std::vector<c10::IValue> metaArgs(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  {
    c10::impl::ExcludeDispatchKeyGuard below(c10::DispatchKeySet({c10::DispatchKey::Fake, c10::DispatchKey::AutocastCPU,
                                                                   c10::DispatchKey::AutocastCUDA}));
    try {
      op.callBoxed(stack);
    } catch (const c10::Error& e) {
      if (!noKernelFor(e)) throw;
      stack->resize(base);
      stack->insert(stack->end(), metaArgs.begin(), metaArgs.end());
      runMetaOnCpu(op, stack);
    }
  }
  for (size_t i = base; i < stack->size(); ++i) {
    (*stack)[i] = mapTensors((*stack)[i], [&](const at::Tensor& t) {
      if (!t.defined()) return t;
      auto it = argumentOfTwin.find(t.unsafeGetTensorImpl());
      return it != argumentOfTwin.end() ? it->second : probe.standIn(t);
    });
  }
}

// Restores the thread's autocast state, the recording key and the probe on
// every way out.
// The recording key's first handler while a probe is live on this thread:
// the call runs on the stand-ins' meta twins and is recorded in the probe.
bool handledByAutocastProbe(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Probe* probe = activeProbe;
  if (!probe) return false;
  const size_t argc = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(argc), stack->end());
  runOnMeta(*probe, op, stack, args);
  const size_t retc = op.schema().returns().size();
  std::vector<c10::IValue> results(stack->end() - static_cast<std::ptrdiff_t>(retc), stack->end());
  probe->calls.push_back(RecordedCall{op, std::move(args), std::move(results)});
  return true;
}

class ProbeScope {
 public:
  ProbeScope(Probe& probe, AutocastPolicy policy)
      : key_(autocastKey(policy.device)),
        wasExcluded_(c10::impl::tls_is_dispatch_key_excluded(key_)),
        device_(policy.device),
        oldDtype_(at::autocast::get_autocast_dtype(policy.device)),
        oldCache_(at::autocast::is_autocast_cache_enabled()),
        previous_(activeProbe),
        previousHandler_(setRecordingKeyHandler(&handledByAutocastProbe)) {
    c10::impl::tls_set_dispatch_key_excluded(key_, false);
    at::autocast::set_autocast_dtype(device_, policy.dtype);
    at::autocast::set_autocast_cache_enabled(false);
    activeProbe = &probe;
  }
  ~ProbeScope() {
    setRecordingKeyHandler(previousHandler_);
    activeProbe = previous_;
    at::autocast::set_autocast_cache_enabled(oldCache_);
    at::autocast::set_autocast_dtype(device_, oldDtype_);
    c10::impl::tls_set_dispatch_key_excluded(key_, wasExcluded_);
  }
  ProbeScope(const ProbeScope&) = delete;
  ProbeScope& operator=(const ProbeScope&) = delete;

 private:
  c10::DispatchKey key_;
  bool wasExcluded_;
  c10::DeviceType device_;
  c10::ScalarType oldDtype_;
  bool oldCache_;
  Probe* previous_;
  RecordingKeyHandler previousHandler_;
  // Factory calls inside composites (zeros, empty) reach the recording key.
  c10::impl::IncludeDispatchKeyGuard record_{c10::DispatchKey::Fake};
  MetaFallbackScope metaFallback_;
};

std::vector<c10::IValue> toMetaTwins(const std::vector<c10::IValue>& values) {
  std::vector<c10::IValue> out;
  out.reserve(values.size());
  for (const c10::IValue& v : values) out.push_back(mapTensors(v, metaTwin));
  return out;
}

}  // namespace

AutocastEntry autocastEntry(const c10::OperatorHandle& op, c10::DeviceType device) {
  if (op.hasKernelForDispatchKey(autocastKey(device))) return AutocastEntry::Kernel;
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return AutocastEntry::Composite;
  return AutocastEntry::Untouched;
}

AutocastRun runUnderAutocast(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                             AutocastPolicy policy, bool decompose) {
  c10::DispatchKeySet keys({c10::DispatchKey::Fake, autocastKey(policy.device)});
  if (decompose) {
    // Autograd's keys, so that CompositeImplicitAutograd kernels run, as they
    // do under autograd in eager mode; nothing requires grad, so nothing is
    // recorded for a backward.
    keys = keys | c10::DispatchKeySet({policy.device == c10::DeviceType::CUDA ? c10::DispatchKey::AutogradCUDA
                                                                             : c10::DispatchKey::AutogradCPU,
                                       c10::DispatchKey::ADInplaceOrView});
  }
  Probe probe{c10::Device(policy.device, 0), keys, {}};
  if (policy.device == c10::DeviceType::CPU) probe.device = c10::Device(c10::DeviceType::CPU);
  torch::jit::Stack stack;
  for (const c10::IValue& a : args) stack.push_back(mapTensors(a, [&](const at::Tensor& t) { return probe.standIn(t); }));
  {
    ProbeScope scope(probe, policy);
    op.callBoxed(&stack);
  }
  AutocastRun run;
  for (RecordedCall& call : probe.calls) {
    run.calls.push_back(RecordedCall{call.op, toMetaTwins(call.args), toMetaTwins(call.results)});
  }
  run.results = toMetaTwins(stack);
  return run;
}

}  // namespace spmd

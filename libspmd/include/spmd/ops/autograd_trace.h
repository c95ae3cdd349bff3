// Recording what LibTorch's autograd runs, on meta tensors.
//
// While a DispatchTrace lives, every operator call that reaches the
// dispatcher below autograd on this process is recorded (operator, boxed
// arguments, boxed results) and then runs on the meta device as usual. Run
// an op with autograd on meta tensors that require grad and you record the
// ATen calls its forward is made of (CompositeImplicitAutograd ops such as
// linear or cross_entropy_loss arrive decomposed, as autograd sees them);
// call torch::autograd::grad in the same scope and you record the backward
// calls PyTorch's own derivative formulas (derivatives.yaml) make.
//
// The recording key is DispatchKey::Fake, which sits below Functionalize and
// the autograd keys and above the backends, and has no kernels or fallback
// in LibTorch; it is added to the thread's included dispatch keys, which
// autograd's engine carries into the backward it runs. A MetaFallbackScope
// (ops/meta.h) lives as long as the trace, for the ops whose meta function
// is Python's.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

namespace spmd {

struct RecordedCall {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;     // as the caller passed them (tensors kept alive)
  std::vector<c10::IValue> results;  // as the kernel returned them
};

// What the recording key's fallback asks first, on this thread: returns true
// when it took the call (ops/autocast_probe.cpp installs one while it
// probes, so that the key serves it without this file knowing it).
// setRecordingKeyHandler returns the handler it replaces (nullptr: none).
using RecordingKeyHandler = bool (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);
RecordingKeyHandler setRecordingKeyHandler(RecordingKeyHandler handler);

// Whether one of `inputs` (tensors requiring grad) receives gradients along
// two or more edges of the autograd graph `outputs` were made with: the
// engine then adds its gradients one at a time as they arrive (rms_norm
// reads its input in pow and in mul).
bool anyInputReadTwice(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs);

class DispatchTrace {
 public:
  DispatchTrace();
  ~DispatchTrace();
  DispatchTrace(const DispatchTrace&) = delete;
  DispatchTrace& operator=(const DispatchTrace&) = delete;

  // The calls recorded so far, in the order they were made.
  const std::vector<RecordedCall>& calls() const { return calls_; }
  // Hands the calls recorded so far to the caller and starts afresh.
  std::vector<RecordedCall> take();

  // Appends a call; for the dispatcher fallback only.
  void append(RecordedCall call) { calls_.push_back(std::move(call)); }

 private:
  struct Guards;
  std::unique_ptr<Guards> guards_;
  std::vector<RecordedCall> calls_;
  DispatchTrace* previous_;
};

}  // namespace spmd

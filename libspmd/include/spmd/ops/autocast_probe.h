// What torch.autocast does to one operator call, asked of the linked
// LibTorch's own autocast kernels rather than a copy of its op lists.
//
// The call runs on stand-in tensors that report the autocast device (cuda or
// cpu, so that autocast's eligibility checks pass on a machine without that
// device) and carry the recording key (DispatchKey::Fake, see
// ops/autograd_trace.h) below the autocast keys. Autocast's kernel casts the
// arguments its policy names (lower precision, fp32, widest type) and
// passes the call on; every call that reaches the recording key is recorded
// and computed on the meta device. Nothing needs the device itself.
#pragma once

#include "spmd/ops/autograd_trace.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace spmd {

struct AutocastPolicy {
  c10::DeviceType device = c10::DeviceType::CUDA;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;  // autocast's lower precision type
};

// How `op` meets autocast on `device`.
enum class AutocastEntry {
  Kernel,     // autocast has a kernel for the op (it may still cast nothing)
  Composite,  // none, but the op is CompositeImplicitAutograd: the ops it
              // is made of meet autocast one by one, as in eager mode
  Untouched,  // none: the op runs on whatever it is given
};
AutocastEntry autocastEntry(const c10::OperatorHandle& op, c10::DeviceType device);

// Runs `op` on `args` under autocast with `policy` and returns the calls
// that reached below autocast, in order, and the op's results. Tensor
// arguments are meta tensors; in the recorded calls and results each stands
// for itself (an argument passed on uncast is the very tensor given), new
// tensors are meta tensors of the dtypes and shapes the calls produce.
// With `decompose`, CompositeImplicitAutograd ops run as the calls they are
// made of (as under autograd in eager mode); without, they are recorded as
// one call. Throws c10::Error where LibTorch's autocast refuses the op
// (binary_cross_entropy on CUDA) or the op rejects its arguments.
struct AutocastRun {
  std::vector<RecordedCall> calls;
  std::vector<c10::IValue> results;
};
AutocastRun runUnderAutocast(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                             AutocastPolicy policy, bool decompose);

}  // namespace spmd

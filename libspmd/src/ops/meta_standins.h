// Zero-filled CPU stand-ins for ops without meta kernels in C++ (relu and
// batch norm on LibTorch 2.6, whose meta functions are Python's), kept small:
// shape inference must not allocate memory proportional to the step's
// tensors (issue #19). Used by meta.cpp only.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace spmd {

// Refuses (a Diagnostic naming the op, the bytes and the bound) when zero-
// filled CPU copies of the meta tensors on `args` would exceed
// kMaxStandInBytes (support/limits.h).
void checkStandInBudget(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args);
// The last refusal's message on this thread, cleared (meta.h's
// takeStandInRefusal answers with it).
std::optional<std::string> takeLastStandInRefusal();

// For the ops whose results' shapes follow their batch (dimension 0 of some
// arguments and results, everything else independent of it): runs `run` on
// the boxed `stack` with those arguments cut to a batch of 2, then gives the
// results back their full batch. False, with the stack untouched, when `op`
// is not such an op, the batch is small already, or a layout is not one that
// scales (contiguous or channels-last).
// The ops runOnSmallBatch takes ("aten::relu", ...).
std::vector<std::string> smallBatchOps();

bool runOnSmallBatch(const c10::OperatorHandle& op, std::vector<c10::IValue>* stack,
                     const std::function<void(std::vector<c10::IValue>*)>& run);

}  // namespace spmd

// What failed while a step ran, as a type of its own, so that spmd-run can
// word each failure for what it is: a collective (a peer gone, a timeout, a
// reset connection) or a kernel at a known node.
#pragma once

#include "spmd/support/diagnostic.h"

#include <cstddef>
#include <stdexcept>
#include <string>

namespace spmd {

// A process group failed to join or to run a collective (collectives.cpp
// wraps c10d's and Gloo's errors). what(): the cause's first line.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A rank could not form the group: a peer did not join within the timeout,
// or rank 0's store did not answer. Like CollectiveError, it most often
// follows a peer's own failure.
class JoinError : public Diagnostic {
 public:
  using Diagnostic::Diagnostic;
};

// A kernel threw while the interpreter ran node `node()`, an op named
// `op()` ("aten::embedding", "aten::add.Tensor"). what(): the first line of
// the kernel's message, without LibTorch's C++ trace.
class KernelError : public std::runtime_error {
 public:
  KernelError(size_t node, std::string op, const std::string& message)
      : std::runtime_error(message), node_(node), op_(std::move(op)) {}

  size_t node() const { return node_; }
  const std::string& op() const { return op_; }

 private:
  size_t node_;
  std::string op_;
};

}  // namespace spmd

// Bounds on what a reader accepts, so that no input can make a tool
// overflow, allocate without end or recurse without end. README's "Input
// bounds" lists them; readers refuse what exceeds them with a one-line
// error naming the file and place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spmd {

// Elements of one tensor: 2^48 (1 PiB of bytes at most per tensor), far
// beyond any device, and its bytes fit in int64 for every dtype.
constexpr int64_t kMaxTensorElements = int64_t{1} << 48;
// Steps of one run (spmd-run --steps), and so the step a checkpoint can be at.
constexpr int64_t kMaxRunSteps = 100000000;
// Bytes read from stdin, a pipe, a FIFO or a device (/dev/zero never ends);
// a regular file of any size is mapped instead. Graph dumps are weight-free,
// so only an artifact or module piped whole comes near it.
constexpr int64_t kMaxStreamBytes = int64_t{2} << 30;
// Dimensions of one tensor.
constexpr size_t kMaxTensorRank = 64;

// Zero-filled CPU memory that shape inference may take for one op that has
// no meta kernel in the linked LibTorch (relu, among others). Ops whose shape
// rule allows it run on stand-ins of a small batch instead (ops/meta.cpp);
// the rest are refused above this, with the op named, rather than allocating
// memory proportional to the step's tensors. The TorchScript import's
// fallback (tracing on real CPU inputs) is bounded by it too.
constexpr int64_t kMaxStandInBytes = int64_t{512} << 20;

// The number of elements of `shape`, or nullopt when a dimension is negative
// or the product exceeds kMaxTensorElements (checked without overflowing).
inline std::optional<int64_t> boundedNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    if (n > kMaxTensorElements / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// Why `shape` is out of bounds ("" when it is within them).
inline std::string shapeBoundProblem(const std::vector<int64_t>& shape) {
  if (shape.size() > kMaxTensorRank) {
    return std::to_string(shape.size()) + " dimensions (at most " + std::to_string(kMaxTensorRank) + ")";
  }
  for (int64_t d : shape) {
    if (d < 0) return "a negative dimension";
  }
  if (!boundedNumel(shape)) return "more than 2^48 elements in one tensor";
  return "";
}

}  // namespace spmd

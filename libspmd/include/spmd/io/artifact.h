// The compiled artifact spmd-lower writes and spmd-run executes: one
// self-contained zip (LibTorch's PyTorchStreamWriter) holding the graph (with
// its bucket plan), the device it was lowered for, and every parameter,
// buffer and initial optimizer-state tensor, under a header with a format
// name, a version and a checksum over all of it.
#pragma once

#include "spmd/ir/graph.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <set>
#include <string>

namespace spmd {

constexpr const char* kArtifactFormat = "spmd-artifact";
// 2: the checksum covers the header's fields (device, cudagraphs, ...) too;
// version 1 left them outside it. Older versions are refused: re-lower.
constexpr int kArtifactVersion = 2;

struct Artifact {
  Graph graph;
  std::string device = "cpu";                 // "cpu" or "cuda"
  bool cudagraphs = false;                    // spmd-lower --cudagraphs: spmd-run captures the step
  std::map<std::string, at::Tensor> state;    // parameters, buffers, optimizer state (CPU)
  // State that starts at zero (optimizer state, carried values): listed in
  // the artifact by dtype and shape only. Its entry in `state` is a
  // placeholder of that dtype and shape without memory of its own (a zero
  // expanded); spmd-run makes real zeros on its device.
  std::set<std::string> zeroState;
};

std::string writeArtifact(const Artifact& artifact);

// Whether `bytes` (a zip) is an artifact rather than a TorchScript module.
bool isArtifact(const std::string& bytes);

// The placeholder for state that starts at zero (see Artifact::zeroState).
at::Tensor zeroPlaceholder(c10::IntArrayRef shape, c10::ScalarType dtype);

// Throws Diagnostic for a truncated, altered or foreign file.
Artifact readArtifact(const std::string& bytes);

}  // namespace spmd

// The compiled artifact spmd-lower writes and spmd-run executes: one
// self-contained zip (LibTorch's PyTorchStreamWriter) holding the graph (with
// its bucket plan), the device it was lowered for, every parameter,
// buffer and initial optimizer-state tensor, and the generated kernels, under a header with a format
// name, a version and a checksum over all of it.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/ops/kernel_spec.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

namespace spmd {

constexpr const char* kArtifactFormat = "spmd-artifact";
// 2: the checksum covers the header's fields (device, cudagraphs, ...) too;
// version 1 left them outside it. 3: the checksum reads 8-byte words (a
// 650 MB artifact sums in a tenth of a second), not single bytes. 4: the
// generated kernels (kernels.json and their sources and images). Older
// versions are refused: re-lower.
constexpr int kArtifactVersion = 4;

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
  // The generated kernels' sources, each with its compiled image when
  // spmd-lower ran on a GPU (arch and image empty otherwise: spmd-run
  // compiles it at its first launch).
  std::vector<CompiledKernel> kernels;
};

class MappedFile;

// Writes `artifact` to `path` ("-" is stdout) record by record, never whole
// in memory; a failure leaves no file. Throws Diagnostic naming `path`.
void writeArtifact(const Artifact& artifact, const std::string& path);

// Whether `bytes` (a zip) is an artifact rather than a TorchScript module.
bool isArtifact(std::string_view bytes);

// The placeholder for state that starts at zero (see Artifact::zeroState).
at::Tensor zeroPlaceholder(c10::IntArrayRef shape, c10::ScalarType dtype);

// Throws Diagnostic for a truncated, altered or foreign file. When `bytes`
// is all of `mapping`, the tensors are copy-on-write views of it (nothing
// copied; the file never changes); else they are copies.
Artifact readArtifact(std::string_view bytes, const std::shared_ptr<MappedFile>& mapping = nullptr);

}  // namespace spmd

// The generated kernels of a graph: one per spmd::fused,
// spmd::cross_entropy(_backward), spmd::layer_norm(_backward) and
// spmd::column_sum node, and the softmax of each
// spmd::fused_attention(_backward) node of kernel "gemm",
// with what it reads and writes (spmd-inspect --kernels) and its CUDA
// source (what spmd-lower compiles and stores in the artifact).
#pragma once

#include "spmd/ir/graph.h"

#include <string>
#include <vector>

namespace spmd {

struct FusedKernel {
  size_t node = 0;             // its index in graph.nodes()
  std::string ops;             // what it computes: "add gelu cast", "attention-softmax"
  std::string program;         // the pointwise program text ("" for the attention softmax)
  std::vector<ValueId> inputs, outputs;
  int64_t bytesRead = 0;       // each input once, at its own size (the attention softmax: what it reads)
  int64_t bytesWritten = 0;
  std::string key;             // its spec's key (ops/kernel_spec.h): equal keys, equal sources
  std::string source;          // CUDA C (its spec's source())
};

// Throws Diagnostic naming the node for a program that does not parse or
// does not fit its inputs (the verifier catches both first).
std::vector<FusedKernel> fusedKernels(const Graph& graph);

// The table: index, node, ops, inputs, outputs, bytes moved; with `sources`,
// each kernel's CUDA source after it.
std::string printKernels(const Graph& graph, const std::vector<FusedKernel>& kernels, bool sources);
std::string printKernelsJson(const Graph& graph, const std::vector<FusedKernel>& kernels, bool sources);

}  // namespace spmd

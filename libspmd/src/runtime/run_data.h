// The data inputs of each training step on one rank: its rows of a slice of
// --data, or seeded random tensors without it.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/runtime/collectives.h"
#include "spmd/runtime/executor.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spmd {

class StepData {
 public:
  // `file`: --data, a torch.save'd {input name: tensor [S, G, ...]}, or empty
  // for random inputs seeded by `seed`, the rank and the step. The file is
  // read and checked against the graph's data inputs here, before step 1:
  // throws Diagnostic (in `file`) for a missing tensor or one that does not
  // slice into G / world-size rows of the graph's per-rank type.
  StepData(const Graph& g, const std::string& file, uint64_t seed, const RankInfo& rank, at::Device device);

  // Step `step`'s data inputs on the device: rank r takes rows
  // [r*G/N, (r+1)*G/N) of slice step % S.
  TensorMap forStep(int step) const;

 private:
  struct Input {
    std::string name;
    at::Tensor all;  // [S, G, ...]
  };

  const Graph& graph_;
  uint64_t seed_;
  RankInfo rank_;
  at::Device device_;
  std::vector<Input> data_;  // empty: random inputs
};

}  // namespace spmd

// Executing the graph's communication nodes across ranks with a LibTorch c10d
// process group: Gloo on CPU, NCCL on CUDA.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/runtime/errors.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace spmd {

class Collectives {
 public:
  virtual ~Collectives() = default;
  // Runs a communication node on its tensor arguments; returns its results.
  // `mayReuseInput`: the first tensor dies at this node and owns its
  // storage, so the reduction may run in it instead of in a copy.
  // Throws CollectiveError when the group fails (a peer gone, a timeout).
  virtual std::vector<at::Tensor> run(const Node& node, const std::vector<at::Tensor>& tensors,
                                      bool mayReuseInput = false) = 0;
  // Leaves the group once every rank's work is done, so that exit does not
  // wait on NCCL's abort path.
  virtual void shutdown() {}
};

struct RankInfo {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
};

// What every rank of a run must agree on, by name, in the order compared
// ({"the artifact's fingerprint", "0f3a..."}, {"--steps", "100"}, ...).
using RunAgreement = std::vector<std::pair<std::string, std::string>>;

// Joins the group through a c10d TCPStore at masterAddr:masterPort (rank 0
// serves it) and creates the process group for `device` ("cpu": Gloo,
// "cuda": NCCL). Every rank presents `agreed` at the join; rank 0 compares
// every rank's with its own, each other rank its own with rank 0's. Throws
// Diagnostic naming the cause (busy port, a peer that never joined within
// `timeout`, a rank that disagrees: naming both ranks and what differs),
// CollectiveError when the group's own set-up with its peers fails.
std::unique_ptr<Collectives> joinProcessGroup(const RankInfo& info, const std::string& device,
                                              std::chrono::milliseconds timeout, const RunAgreement& agreed = {});

}  // namespace spmd

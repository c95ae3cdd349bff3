// The data inputs of each training step on one rank: its rows of a slice of
// --data, windows of a --tokens stream, or seeded random tensors.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/runtime/collectives.h"
#include "spmd/runtime/executor.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace spmd {

class TokenFile;

// Where a run's data comes from (spmd-run's flags).
struct DataSource {
  std::string file;        // --data: a torch.save'd dict, a .npz or a folder of .npy files
  std::string tokens;      // --tokens: a token stream (nanoGPT's train.bin)
  std::string tokenDtype = "uint16";  // --token-dtype
  bool shuffle = false;    // --shuffle: --data's rows in a seeded order, a new one each epoch
};

class StepData {
 public:
  // Opens and checks the source against the graph's data inputs here,
  // before step 1 (Diagnostic naming the file):
  //  --data: one tensor per data input, [S, G, ...] (S steps of G rows, the
  //    global batch) or [N, ...] (rows: step s takes the s-th G rows, cycling
  //    over the N // G whole batches); rank r takes rows [r*G/W, (r+1)*G/W)
  //    of world size W. NumPy files are mapped, not read.
  //  --tokens: the graph's first two data inputs, integer [B, T], get B
  //    windows of T tokens and the same windows shifted by one (inputs and
  //    targets), from offsets drawn by a generator seeded by `seed`, the rank
  //    and the step (nanoGPT's get_batch).
  //  --data with shuffle: the file's S x G (or N // G x G) rows form epochs
  //    of that many rows; epoch e reads them in the order of a permutation
  //    seeded by `seed` and e (the same on every rank), G rows a step, rank
  //    r its rows [r*G/W, (r+1)*G/W) of them: a step's rows follow from the
  //    step and the seed, so a resumed run reads what the uninterrupted one
  //    would.
  //  neither: random inputs seeded by `seed`, the rank and the step.
  StepData(const Graph& g, const DataSource& source, uint64_t seed, const RankInfo& rank, at::Device device);
  ~StepData();

  // Step `step`'s data inputs on the device: the ones prefetch(step) made,
  // once the current stream has waited for their copy, or made now.
  TensorMap forStep(int step);

  // On CUDA: makes step `step`'s inputs on a worker thread, through pinned
  // staging buffers and a copy on a side stream, so that the next step's
  // batch is read and uploaded while the current one computes (at most one
  // step ahead; a step's inputs follow from the step and the seed alone, so
  // prefetched inputs are the ones forStep would make). Elsewhere nothing.
  void prefetch(int step);

 private:
  struct SideStream;
  struct Input {
    std::string name;
    at::Tensor all;  // [S, G, ...]
  };
  // --shuffle: the permutation of epoch `epoch`'s S * G rows (the last asked for is kept).
  const at::Tensor& permutation(int64_t epoch, int64_t rows) const;
  void checkTokenInputs() const;
  TensorMap inputsOf(int step) const;
  TensorMap uploadAhead(int step) const;
  void handOver(const TensorMap& inputs) const;

  const Graph& graph_;
  uint64_t seed_;
  RankInfo rank_;
  at::Device device_;
  std::vector<Input> data_;             // --data
  std::unique_ptr<TokenFile> tokens_;  // --tokens
  std::vector<const Value*> tokenInputs_;
  bool shuffle_ = false;
  mutable int64_t permutationEpoch_ = -1;
  mutable at::Tensor permutation_;
  std::unique_ptr<SideStream> side_;  // CUDA: prefetch's stream and its copy's event
  int prefetched_ = -1;               // the step next_ makes
  std::future<TensorMap> next_;       // last: joined before the members it reads go
};

}  // namespace spmd

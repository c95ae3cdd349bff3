// Per-op derivatives from LibTorch's own autograd (derivatives.yaml as
// compiled into libtorch), recorded on the meta device and written into the
// graph. autodiff.cpp keeps the reverse-mode structure (which values need
// gradients, fan-out accumulation, frozen parameters); this file supplies
// what one node contributes.
#pragma once

#include "spmd/ir/graph.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace spmd {

// A gradient flowing into one input value of a forward node.
struct Contribution {
  ValueId input;
  ValueId grad;
};

class Differentiator {
 public:
  explicit Differentiator(Graph& graph);
  ~Differentiator();
  Differentiator(const Differentiator&) = delete;
  Differentiator& operator=(const Differentiator&) = delete;

  // Differentiates the forward node `node` given the gradients of its outputs
  // (`outGrads`, one per output, kNoValue where none flows): runs its op with
  // autograd on meta tensors (one per tensor argument, requiring grad where
  // `needsGrad` says so), asks torch::autograd::grad for the input gradients,
  // and appends the backward calls LibTorch made, with `backwardMeta`, at the
  // end of the graph. Where that backward reads results the node does not
  // return (layer_norm's mean and rstd, cross_entropy's log-probabilities),
  // the node is replaced in the forward by the calls its op is made of
  // (native_layer_norm; _log_softmax and nll_loss_forward), which then
  // invalidates `node`; views of its arguments are rebuilt in the backward
  // instead. Returns one contribution per tensor argument that received a
  // gradient. Throws Diagnostic when LibTorch cannot differentiate the op.
  std::vector<Contribution> differentiate(const Node& node, const std::vector<ValueId>& outGrads,
                                          const std::function<bool(ValueId)>& needsGrad, const NodeMeta& backwardMeta);

  // For a composite op (CompositeImplicitAutograd: autograd differentiates
  // the ops it calls) whose backward gives one of its inputs gradients along
  // two or more paths (rms_norm reads its input in pow and in mul): replaces
  // `node` in the forward by the calls its op is made of and returns them in
  // program order, so that each is differentiated on its own and the
  // input's gradients are added to the others it receives one at a time,
  // as eager's engine adds them as they arrive. Otherwise returns nothing
  // and leaves `node` as it is. Taken for rms_norm only (see the .cpp).
  std::vector<const Node*> decomposeIfInputReadTwice(const Node& node, const std::vector<ValueId>& outGrads,
                                                     const std::function<bool(ValueId)>& needsGrad);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Where the derivative of every aten and spmd operator this LibTorch has
// comes from, one
// "aten::op.overload<TAB>source" line each, sorted: "composite"
// (CompositeImplicitAutograd: differentiated through the ops it calls),
// "autograd" (LibTorch's autograd kernel, generated from derivatives.yaml;
// it may declare the op not differentiable, as for histc, which spmd-expand
// reports where such an op cuts a parameter off the loss), "none" (no
// autograd kernel at all).
std::vector<std::string> derivativeSources();

}  // namespace spmd

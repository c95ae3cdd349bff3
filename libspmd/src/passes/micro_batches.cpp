// micro-batches: gradient accumulation (spmd-expand --micro-batches N).
//
// Runs on the step autodiff made from one micro-batch (whose loss autodiff
// divided by N). Every data input grows to N micro-batches of rows along
// dimension 0; the forward and backward run N times, in sequence, each copy
// on its slice of the rows (aten::slice: a view, no copy), and each copy's
// gradients are added to the running sums right after they are made, in
// micro-batch order, as autograd accumulates into .grad. The step's loss
// (first output) is the sum of the scaled micro-batch losses; its other
// outputs are the last copy's. What a copy updates (BatchNorm's running
// statistics) the next copy reads, as the module's buffers carry over
// between DDP's no_sync forwards; rank 0's buffers are broadcast once, at
// the start of the step (grad-sync), as DDP does for the first forward only.
//
// Peak memory grows with one micro-batch: copy k+1 reads nothing copy k
// made but the gradient sums and updated buffers, so the static memory plan
// reuses copy k's activations for copy k+1. Work that depends on parameters
// alone and draws no random numbers (autocast's weight casts, masks built
// from constants) runs once and is shared by every copy.
//
// Does not reduce gradients (grad-sync, once, on the sums) or update
// parameters (optimizer). N = 1: nothing changes.
#include "spmd/ir/builder.h"
#include "spmd/ir/printer.h"
#include "spmd/ops/op_traits.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <map>
#include <string>

namespace spmd {
namespace {

// Values that are the same in every copy: parameters and what is computed
// from them (and from constants) without drawing random numbers.
std::vector<bool> sharedByCopies(const Graph& g) {
  std::vector<bool> shared(g.numValues(), false);
  for (const auto& in : g.inputs()) shared[in.value] = in.kind == InputKind::Parameter;
  for (const Node& n : g.nodes()) {
    bool all = !isRandom(n.op) && !isCollective(n.op);
    forEachTensorArg(n, [&](ValueId v) { all = all && shared[v]; });
    for (ValueId o : n.outputs) {
      if (o != kNoValue) shared[o] = all;
    }
  }
  return shared;
}

class MicroBatches {
 public:
  MicroBatches(Graph& g, int64_t n) : g_(g), n_(n), b_(g), shared_(sharedByCopies(g)) {}

  void run() {
    const std::vector<const Node*> step = snapshot(g_.nodes());
    const std::vector<ValueId> outputs = g_.outputs();
    const std::vector<StateUpdate> updates = g_.updates();
    growDataInputs();
    // Copy 0 is the step's own nodes, reading the first slices.
    std::map<ValueId, ValueId> first;
    if (!step.empty()) b_.setInsertionPoint(*step.front());
    for (const auto& [input, rows] : rowsPerCopy_) first[input] = slice(input, 0);
    for (const auto& [input, slice0] : first) {
      const Node* slicer = g_.producer(slice0);
      g_.replaceUsesWith(input, slice0, [&](const Node& n) { return &n != slicer; });
    }
    std::vector<Node> nodes;  // the step as copy 0 runs it
    for (const Node* n : step) nodes.push_back(*n);
    std::vector<std::map<ValueId, ValueId>> copies(1);  // copy k's value for each value of copy 0
    for (int64_t k = 1; k < n_; ++k) copies.push_back(addCopy(nodes, updates, copies.back(), first, k));
    accumulateGradients(copies);
    finishOutputs(outputs, copies);
    finishUpdates(updates, copies.back());
  }

 private:
  // Every data input holds N micro-batches of rows: f32[b, ...] -> f32[N*b, ...].
  void growDataInputs() {
    for (const auto& in : g_.inputs()) {
      if (in.kind != InputKind::Data) continue;
      Value& v = g_.value(in.value);
      if (v.shape.empty()) {
        throw Diagnostic("--micro-batches", "the data input %" + v.name + ": " + typeText(v) +
                                                " has no batch dimension to split into micro-batches");
      }
      rowsPerCopy_[in.value] = v.shape[0];
      v.shape[0] *= n_;
    }
  }

  ValueId slice(ValueId input, int64_t k) {
    const int64_t rows = rowsPerCopy_.at(input);
    b_.setMeta(NodeMeta{"", NodeRole::Forward, -1, -1, IterationTag::Every});
    return b_.call("aten::slice.Tensor", {Arg::tensor(input), Arg::ofInt(0), Arg::ofInt(k * rows),
                                          Arg::ofInt((k + 1) * rows), Arg::ofInt(1)},
                   g_.value(input).name + ".mb" + std::to_string(k));
  }

  // Appends copy k of `nodes`: data inputs read slice k, updated state the
  // previous copy's result, shared values themselves.
  std::map<ValueId, ValueId> addCopy(const std::vector<Node>& nodes, const std::vector<StateUpdate>& updates,
                                     const std::map<ValueId, ValueId>& previous,
                                     const std::map<ValueId, ValueId>& firstSlices, int64_t k) {
    std::map<ValueId, ValueId> copy;
    b_.setInsertionPointToEnd();
    for (const auto& [input, slice0] : firstSlices) copy[slice0] = slice(input, k);
    for (const StateUpdate& u : updates) copy[u.input] = valueIn(previous, u.value);
    const std::string suffix = ".mb" + std::to_string(k);
    for (Node n : nodes) {
      bool sharedNode = true;
      for (ValueId o : n.outputs) sharedNode = sharedNode && (o == kNoValue || shared_[o]);
      if (sharedNode) continue;  // copy 0's results serve every copy
      forEachTensorArg(n, [&](ValueId& v) { v = valueIn(copy, v); });
      for (ValueId& o : n.outputs) {
        if (o == kNoValue) continue;
        Value fresh = g_.value(o);
        fresh.name = g_.freshName(fresh.name + suffix);
        const ValueId id = g_.addValue(fresh);
        copy[o] = id;
        o = id;
      }
      g_.addNode(std::move(n));
    }
    return copy;
  }

  static ValueId valueIn(const std::map<ValueId, ValueId>& copy, ValueId v) {
    auto it = copy.find(v);
    return it == copy.end() ? v : it->second;
  }

  // sum = sum + gradient of copy k, right after that gradient is made (so
  // that the last copy's sums are ready as its backward goes, for buckets).
  void accumulateGradients(const std::vector<std::map<ValueId, ValueId>>& copies) {
    b_.setMeta(NodeMeta{"", NodeRole::Backward, -1, -1, IterationTag::Every});
    for (Gradient& grad : g_.gradients()) {
      ValueId sum = grad.value;
      for (size_t k = 1; k < copies.size(); ++k) {
        const ValueId next = valueIn(copies[k], grad.value);
        const Node* made = g_.producer(next);
        if (made) {
          b_.setInsertionPointAfter(*made);
        } else {
          b_.setInsertionPointToEnd();
        }
        sum = b_.call("aten::add.Tensor", {Arg::tensor(sum), Arg::tensor(next), Arg::ofInt(1)},
                      g_.value(grad.parameter).name + ".grad_sum");
      }
      grad.value = sum;
    }
  }

  void finishOutputs(const std::vector<ValueId>& outputs, const std::vector<std::map<ValueId, ValueId>>& copies) {
    if (outputs.empty()) return;
    b_.setInsertionPointToEnd();
    b_.setMeta(NodeMeta{"", NodeRole::Forward, -1, -1, IterationTag::Every});
    ValueId total = outputs[0];
    for (size_t k = 1; k < copies.size(); ++k) {
      total = b_.call("aten::add.Tensor", {Arg::tensor(total), Arg::tensor(valueIn(copies[k], outputs[0])), Arg::ofInt(1)},
                      "loss_sum");
    }
    g_.outputs()[0] = total;
    for (size_t i = 1; i < outputs.size(); ++i) g_.outputs()[i] = valueIn(copies.back(), outputs[i]);
  }

  void finishUpdates(const std::vector<StateUpdate>& updates, const std::map<ValueId, ValueId>& last) {
    g_.updates().clear();
    for (const StateUpdate& u : updates) g_.addUpdate({u.input, valueIn(last, u.value)});
  }

  Graph& g_;
  int64_t n_;
  GraphBuilder b_;
  std::vector<bool> shared_;
  std::map<ValueId, int64_t> rowsPerCopy_;  // data input -> rows of one micro-batch
};

// The step holds a copy of its forward and backward per micro-batch: past
// this many nodes in all (--micro-batches 2000 of a small LM took 36 s and
// 100000 grew to 2.9 GB), take fewer micro-batches of more rows instead.
constexpr int64_t kMaxAccumulatedNodes = int64_t{1} << 21;

class MicroBatchesPass final : public Pass {
 public:
  explicit MicroBatchesPass(int64_t n) : n_(n) {}

  bool run(Graph& g, DiagnosticEngine&) override {
    if (n_ < 1) throw Diagnostic("--micro-batches", "must be at least 1");
    if (n_ == 1) return false;
    if (g.gradients().empty()) throw Diagnostic("--micro-batches", "the graph has no gradients to accumulate (run autodiff first)");
    if (g.training().microBatches != 1) throw Diagnostic("/training", "the step accumulates micro-batches already");
    for (const Gradient& grad : g.gradients()) {
      if (grad.reduced != kNoValue) throw Diagnostic("--micro-batches", "the gradients are reduced already: accumulate before grad-sync");
    }
    const auto nodes = static_cast<int64_t>(g.nodes().size());
    if (n_ > kMaxAccumulatedNodes / std::max<int64_t>(nodes, 1)) {
      throw Diagnostic("--micro-batches", std::to_string(n_) + " copies of the step's " + std::to_string(nodes) +
                                              " nodes pass the bound of " + std::to_string(kMaxAccumulatedNodes) +
                                              " nodes: take fewer micro-batches of more rows (--input)");
    }
    MicroBatches(g, n_).run();
    g.training().microBatches = n_;
    return true;
  }

 private:
  int64_t n_;
};

}  // namespace

std::unique_ptr<Pass> createMicroBatchesPass(const PipelineOptions& options) {
  return std::make_unique<MicroBatchesPass>(options.training.microBatches);
}

}  // namespace spmd

// Rewrite patterns and the driver that applies them, after MLIR's
// OpRewritePattern, notifyMatchFailure and greedy driver. A pattern names the
// ops its root may be (interned, checked against the dispatcher when the
// pattern is made) and either rewrites the graph at a root or says why not;
// the driver offers it every node of those ops until no pattern applies.
//
//   class ReluOfLinear final : public RewritePattern {
//    public:
//     ReluOfLinear() : RewritePattern("relu-of-linear", {"aten::relu"}) {}
//     MatchResult matchAndRewrite(Graph& g, const Node& relu) override {
//       const Node* linear = producerOf(g, relu, 0, kLinear);
//       if (!linear) return MatchResult::skip();             // not this pattern's shape: no note
//       if (!g.hasOneReader(relu.args[0].value))
//         return MatchResult::failure("the Linear's result is read by more than the ReLU");
//       ... rewrite through the graph API or GraphBuilder ...
//       return MatchResult::success();
//     }
//   };
//
// A pattern that fails must leave the graph as it found it.
#pragma once

#include "spmd/ir/graph.h"
#include "spmd/ir/op_name.h"

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

class DiagnosticEngine;

// The outcome of a pattern at one node: applied, not applicable (skip, the
// node is not the pattern's business), or not applied for a reason worth a
// note ("not fused: the input is not fp32").
class MatchResult {
 public:
  static MatchResult success() { return MatchResult(true, {}); }
  static MatchResult skip() { return MatchResult(false, {}); }
  static MatchResult failure(std::string why) { return MatchResult(false, std::move(why)); }
  explicit operator bool() const { return applied_; }
  const std::string& reason() const { return reason_; }  // "" for success and skip

 private:
  MatchResult(bool applied, std::string reason) : applied_(applied), reason_(std::move(reason)) {}
  bool applied_;
  std::string reason_;
};

class RewritePattern {
 public:
  // `roots`: qualified op names ("aten::native_layer_norm"); each must be
  // known to the dispatcher (std::logic_error otherwise).
  RewritePattern(std::string name, std::initializer_list<const char*> roots);
  virtual ~RewritePattern() = default;
  const std::string& name() const { return name_; }
  const std::vector<OpName>& roots() const { return roots_; }
  // Rewrites at `root` (a node of one of roots()) and returns success, or
  // returns skip or failure having changed nothing.
  virtual MatchResult matchAndRewrite(Graph& g, const Node& root) = 0;

 private:
  std::string name_;
  std::vector<OpName> roots_;
};

// Where a note about `node` points: "aten::relu at model.py:3".
std::string noteWhere(const Node& node);

// The position of argument `name` in the schema of `op` ("dim" of
// aten::sum.dim_IntList is 1), so that patterns read arguments by the names
// PyTorch gives them. Throws std::logic_error when the schema has no such
// argument (a misspelt name fails the pattern's first use).
size_t argumentIndex(OpName op, std::string_view name);
// Argument `name` of `n`, by its op's schema (std::logic_error as above, or
// when `n` has fewer arguments than the schema).
const Arg& argument(const Node& n, std::string_view name);

// The node making argument `index` of `n` when that argument is a tensor made
// by an `op` node; nullptr otherwise.
const Node* producerOf(const Graph& g, const Node& n, size_t index, OpName op);

struct PatternFailure {
  const Node* node;
  const RewritePattern* pattern;
  std::string why;
};

// How many times each pattern applied, in the order of the patterns given.
struct RewriteCounts {
  std::vector<int> applied;
  int total() const;
};

// Applies `patterns` to `g` until none applies: each sweep offers every node
// (and each node a rewrite adds) to the patterns rooted at its op, in the
// order given, the first that applies wins; sweeps repeat until one applies
// nothing (at most 64, else std::logic_error). The failures with a reason of
// that last sweep go to `onFailure` in program order.
RewriteCounts applyPatternsGreedily(Graph& g, const std::vector<RewritePattern*>& patterns,
                                    const std::function<void(const PatternFailure&)>& onFailure);
// The same, each failure a note on `diagnostics` about its node (noteWhere;
// one note per place and reason, "(N nodes)" where it is about several):
// `failurePrefix` + why, as "layer-norm-to-kernel: not fused: " + why.
RewriteCounts applyPatternsNotingFailures(Graph& g, const std::vector<RewritePattern*>& patterns,
                                          DiagnosticEngine& diagnostics, const std::string& failurePrefix);

}  // namespace spmd

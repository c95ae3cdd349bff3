// Rewrite patterns (ir/rewrite.h) and interned op names (ir/op_name.h): the
// driver applies patterns to a fixpoint, offers the nodes rewrites add,
// reports the last sweep's failures in program order, and a pattern naming
// an op the dispatcher does not know fails when it is made.
#include "spmd/ir/builder.h"
#include "spmd/ir/op_name.h"
#include "spmd/ir/printer.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ir/verify.h"
#include "spmd/passes/pass.h"

#include <stdexcept>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

// relu(relu(x)) -> relu(x): the outer relu's readers read the inner one.
class ReluOfRelu final : public RewritePattern {
 public:
  ReluOfRelu() : RewritePattern("relu-of-relu", {"aten::relu"}), relu_(OpName::known("aten::relu")) {}
  MatchResult matchAndRewrite(Graph& g, const Node& outer) override {
    const Node* inner = producerOf(g, outer, 0, relu_);
    if (!inner) return MatchResult::skip();
    if (g.isGraphOutput(outer.args[0].value)) return MatchResult::failure("the inner ReLU is an output");
    g.replaceAllUsesWith(outer.outputs[0], inner->outputs[0]);
    g.erase(outer);
    return MatchResult::success();
  }

 private:
  OpName relu_;
};

// neg(x) -> x * -1, as a new node: what a rewrite adds is offered too.
class NegToMul final : public RewritePattern {
 public:
  NegToMul() : RewritePattern("neg-to-mul", {"aten::neg"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& neg) override {
    GraphBuilder b(g);
    b.replace(neg, "aten::mul.Scalar", {neg.args[0], Arg::ofFloat(-1.0)});
    return MatchResult::success();
  }
};

// mul.Scalar(x, -1) -> a relu, to see NegToMul's node offered to it.
class MulToRelu final : public RewritePattern {
 public:
  MulToRelu() : RewritePattern("mul-to-relu", {"aten::mul.Scalar"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& mul) override {
    GraphBuilder b(g);
    b.replace(mul, "aten::relu", {mul.args[0]});
    return MatchResult::success();
  }
};

std::string bodyOf(const Graph& g) {
  std::string listing = printListing(g);
  return listing.substr(listing.find('\n', listing.find("input")) + 1);
}

}  // namespace

TEST_CASE("op names are interned once, and a misspelt one fails when it is made", "[rewrite]") {
  CHECK(OpName::of("aten::add.Tensor") == OpName::of("aten::add", "Tensor"));
  CHECK(OpName::of("aten::add.Tensor") != OpName::of("aten::add"));
  CHECK(OpName::of("aten::add.Tensor").str() == "aten::add.Tensor");
  CHECK(OpName::known("spmd::all_reduce").valid());
  CHECK_THROWS_AS(OpName::known("aten::rellu"), std::logic_error);
  CHECK_THROWS_AS(OpName::known("aten::add.NoSuchOverload"), std::logic_error);
  Graph g;
  const ValueId x = g.addInput({"x", c10::ScalarType::Float, {4}}, InputKind::Data);
  GraphBuilder b(g);
  const ValueId y = b.call("aten::add.Tensor", {Arg::tensor(x), Arg::tensor(x), Arg::ofInt(1)});
  CHECK(g.producer(y)->is(OpName::known("aten::add.Tensor")));
  CHECK_FALSE(g.producer(y)->is(OpName::known("aten::add.Scalar")));
}

TEST_CASE("the driver applies a pattern until it applies no more", "[rewrite]") {
  Graph g;
  const ValueId x = g.addInput({"x", c10::ScalarType::Float, {4}}, InputKind::Data);
  GraphBuilder b(g);
  ValueId v = x;
  for (int i = 0; i < 4; ++i) v = b.call("aten::relu", {Arg::tensor(v)});
  g.addOutput(v);
  ReluOfRelu pattern;
  std::vector<PatternFailure> failures;
  const RewriteCounts counts = applyPatternsGreedily(g, {&pattern}, [&](const PatternFailure& f) { failures.push_back(f); });
  CHECK(counts.total() == 3);
  CHECK(failures.empty());
  CHECK(bodyOf(g) == "  %relu: f32[4] = aten::relu(%x)\n  return (%relu)\n");
  CHECK(verifyGraph(g).empty());
}

TEST_CASE("the last sweep's failures come in program order, skips without a note", "[rewrite]") {
  Graph g;
  const ValueId x = g.addInput({"x", c10::ScalarType::Float, {4}}, InputKind::Data);
  GraphBuilder b(g);
  const ValueId a = b.call("aten::relu", {Arg::tensor(x)});
  const ValueId c = b.call("aten::relu", {Arg::tensor(a)});
  const ValueId d = b.call("aten::relu", {Arg::tensor(x)});
  const ValueId e = b.call("aten::relu", {Arg::tensor(d)});
  g.addOutput(a);  // the first pair fails: its inner ReLU is an output
  g.addOutput(c);
  g.addOutput(e);
  ReluOfRelu pattern;
  std::vector<std::string> seen;
  const RewriteCounts counts = applyPatternsGreedily(
      g, {&pattern}, [&](const PatternFailure& f) { seen.push_back(g.value(f.node->outputs[0]).name + ": " + f.why); });
  CHECK(counts.total() == 1);
  CHECK(seen == std::vector<std::string>{g.value(c).name + ": the inner ReLU is an output"});
}

TEST_CASE("nodes a rewrite adds are offered to the patterns", "[rewrite]") {
  Graph g;
  const ValueId x = g.addInput({"x", c10::ScalarType::Float, {4}}, InputKind::Data);
  GraphBuilder b(g);
  g.addOutput(b.call("aten::neg", {Arg::tensor(x)}));
  NegToMul neg;
  MulToRelu mul;
  const RewriteCounts counts = applyPatternsGreedily(g, {&neg, &mul}, nullptr);
  CHECK(counts.applied == std::vector<int>{1, 1});
  CHECK(bodyOf(g) == "  %neg: f32[4] = aten::relu(%x)\n  return (%neg)\n");
}

TEST_CASE("every registered pass can be made: the ops its patterns name exist", "[rewrite]") {
  for (const PassInfo& p : registeredPasses()) {
    INFO(p.name);
    CHECK_NOTHROW(p.create(PipelineOptions{}));
  }
}

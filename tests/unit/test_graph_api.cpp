// The graph's mutation API: def-use links, replaceAllUsesWith, erase,
// insertion, replacement, reordering, and the builder's insertion point.
// Each rewrite is checked on the printed listing and by the verifier.
#include "spmd/ir/builder.h"
#include "spmd/ir/graph.h"
#include "spmd/ir/printer.h"
#include "spmd/ir/verify.h"

#include <stdexcept>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

// %y = mul.Scalar(%x, 2); %z = relu(%y); return (%z)
struct MulRelu {
  Graph g;
  ValueId x, y, z;
  MulRelu() {
    x = g.addInput({"x", c10::ScalarType::Float, {4}}, InputKind::Data);
    GraphBuilder b(g);
    y = b.mulScalar(x, 2.0);
    z = b.call("aten::relu", {Arg::tensor(y)});
    g.addOutput(z);
  }
  const Node& node(ValueId v) const { return *g.producer(v); }
};

std::string bodyOf(const Graph& g) {
  std::string listing = printListing(g);
  return listing.substr(listing.find('\n', listing.find("input")) + 1);
}

}  // namespace

TEST_CASE("def-use links follow every change", "[graph]") {
  MulRelu m;
  REQUIRE(m.g.producer(m.x) == nullptr);
  REQUIRE(m.g.producer(m.y) == &m.node(m.y));
  REQUIRE(m.g.users(m.y) == std::vector<const Node*>{&m.node(m.z)});
  CHECK(m.g.users(m.z).empty());  // read by the graph output only
  CHECK(m.g.indexOf(m.node(m.z)) == 1);
}

TEST_CASE("the documented rewrite: replaceAllUsesWith, then erase", "[graph]") {
  MulRelu m;
  CHECK(bodyOf(m.g) ==
        "  %mul: f32[4] = aten::mul.Scalar(%x, 2.0)\n"
        "  %relu: f32[4] = aten::relu(%mul)\n"
        "  return (%relu)\n");
  GraphBuilder b(m.g);
  const Node& mul = m.node(m.y);
  b.setInsertionPoint(mul);
  const ValueId sum = b.call("aten::add.Tensor", {Arg::tensor(m.x), Arg::tensor(m.x), Arg::ofInt(1)});
  CHECK_THROWS_AS(m.g.erase(mul), std::logic_error);  // relu still reads %mul
  m.g.replaceAllUsesWith(m.y, sum);
  m.g.erase(mul);
  CHECK(bodyOf(m.g) ==
        "  %add: f32[4] = aten::add.Tensor(%x, %x, 1)\n"
        "  %relu: f32[4] = aten::relu(%add)\n"
        "  return (%relu)\n");
  CHECK(m.g.users(sum).size() == 1);
  CHECK(m.g.producer(m.y) == nullptr);
  CHECK(verifyGraph(m.g).empty());
}

TEST_CASE("replaceAllUsesWith reaches outputs and state updates, replaceUsesWith only chosen nodes", "[graph]") {
  MulRelu m;
  m.g.replaceAllUsesWith(m.z, m.y);
  CHECK(m.g.outputs() == std::vector<ValueId>{m.y});
  GraphBuilder b(m.g);
  const ValueId again = b.call("aten::relu", {Arg::tensor(m.y)}, "again");
  const Node& first = *m.g.users(m.y).front();
  m.g.replaceUsesWith(m.y, m.x, [&](const Node& n) { return &n == &first; });
  CHECK(first.args[0].value == m.x);
  CHECK(m.g.producer(again)->args[0].value == m.y);
  // setArg moves the read: %x gains a reader, %mul loses one.
  const size_t readersOfX = m.g.users(m.x).size();
  m.g.setArg(*m.g.producer(again), 0, Arg::tensor(m.x));
  CHECK(m.g.users(m.x).size() == readersOfX + 1);
  CHECK(m.g.users(m.y).empty());
}

TEST_CASE("the builder inserts before or after a node, in order, with inferred types", "[graph]") {
  MulRelu m;
  GraphBuilder b(m.g);
  b.setInsertionPointAfter(m.node(m.y));
  const ValueId s = b.call("aten::sum", {Arg::tensor(m.y), Arg::none()});
  const ValueId t = b.call("aten::neg", {Arg::tensor(s)});
  CHECK(m.g.value(s).shape.empty());
  CHECK(m.g.indexOf(*m.g.producer(s)) == 1);
  CHECK(m.g.indexOf(*m.g.producer(t)) == 2);
  CHECK(m.g.indexOf(m.node(m.z)) == 3);
  b.setInsertionPoint(m.node(m.y));
  const ValueId first = b.call("aten::abs", {Arg::tensor(m.x)});
  CHECK(m.g.indexOf(*m.g.producer(first)) == 0);
  CHECK(verifyGraph(m.g).empty());
}

TEST_CASE("replace keeps the values and their names; extract leaves readers for a new producer", "[graph]") {
  MulRelu m;
  GraphBuilder b(m.g);
  b.replace(m.node(m.y), "aten::add.Tensor", {Arg::tensor(m.x), Arg::tensor(m.x), Arg::ofInt(1)});
  CHECK(bodyOf(m.g) ==
        "  %mul: f32[4] = aten::add.Tensor(%x, %x, 1)\n"
        "  %relu: f32[4] = aten::relu(%mul)\n"
        "  return (%relu)\n");
  // A replacement of another type is a bug in the pass.
  CHECK_THROWS_AS(b.replace(m.node(m.y), "aten::sum", {Arg::tensor(m.x), Arg::none()}), std::logic_error);

  Node taken = m.g.extract(m.node(m.y));
  CHECK(m.g.producer(m.y) == nullptr);
  CHECK(!verifyGraph(m.g).empty());  // %mul has no producer now
  m.g.insertBefore(m.node(m.z), std::move(taken));
  CHECK(verifyGraph(m.g).empty());
}

TEST_CASE("a node cannot define a value that has a producer", "[graph]") {
  MulRelu m;
  Node twice = m.node(m.y);
  CHECK_THROWS_AS(m.g.addNode(twice), std::logic_error);
}

TEST_CASE("reorder takes a permutation; copies keep their own links", "[graph]") {
  MulRelu m;
  GraphBuilder b(m.g);
  const ValueId other = b.call("aten::abs", {Arg::tensor(m.x)});
  const Node* abs = m.g.producer(other);
  m.g.reorder({abs, &m.node(m.y), &m.node(m.z)});
  CHECK(m.g.indexOf(*abs) == 0);
  CHECK_THROWS_AS(m.g.reorder({abs, abs, &m.node(m.z)}), std::logic_error);

  Graph copy = m.g;
  CHECK(printListing(copy) == printListing(m.g));
  CHECK(copy.producer(m.y) != m.g.producer(m.y));  // its own nodes
  copy.replaceAllUsesWith(m.y, m.x);
  CHECK(m.g.users(m.y).size() == 1);  // the original is untouched
  CHECK(copy.users(m.y).empty());
}

TEST_CASE("soleReader counts every read: arguments, outputs, updates, gradient records", "[graph]") {
  MulRelu m;
  CHECK(m.g.soleReader(m.y) == &m.node(m.z));  // relu alone reads %mul
  CHECK(m.g.soleReader(m.z) == nullptr);       // a graph output only, no node
  GraphBuilder b(m.g);
  const ValueId twice = b.call("aten::abs", {Arg::tensor(m.x)});
  b.call("aten::add.Tensor", {Arg::tensor(twice), Arg::tensor(twice), Arg::ofInt(1)});
  CHECK_FALSE(m.g.hasOneReader(twice));  // one node, two arguments
  m.g.addOutput(m.y);
  CHECK(m.g.soleReader(m.y) == nullptr);  // relu and the graph's outputs
  const ValueId kept = b.call("aten::neg", {Arg::tensor(m.x)});
  const ValueId read = b.call("aten::exp", {Arg::tensor(kept)});
  CHECK(m.g.soleReader(kept) == m.g.producer(read));
  const ValueId w = m.g.addInput({"w", c10::ScalarType::Float, {4}}, InputKind::Parameter);
  m.g.addGradient(Gradient{w, kept});
  CHECK(m.g.soleReader(kept) == nullptr);  // a gradient record reads it too
  const ValueId s = m.g.addInput({"s", c10::ScalarType::Float, {4}}, InputKind::Buffer);
  const ValueId updated = b.call("aten::sin", {Arg::tensor(m.x)});
  b.call("aten::cos", {Arg::tensor(updated)});
  CHECK(m.g.hasOneReader(updated));
  m.g.addUpdate(StateUpdate{s, updated});
  CHECK_FALSE(m.g.hasOneReader(updated));  // and a state update
}

TEST_CASE("eliminateDeadNodes erases what reaches no output, readers first", "[graph]") {
  MulRelu m;
  GraphBuilder b(m.g);
  const ValueId dead = b.call("aten::abs", {Arg::tensor(m.y)});
  b.call("aten::neg", {Arg::tensor(dead)});
  CHECK(m.g.nodes().size() == 4);
  CHECK(eliminateDeadNodes(m.g));
  CHECK(m.g.nodes().size() == 2);
  CHECK(m.g.users(m.y).size() == 1);
  CHECK_FALSE(eliminateDeadNodes(m.g));
}

// The verifier against hand-built graphs with one defect each.
#include "catch.h"

#include "spmd/ir/graph.h"
#include "spmd/ir/verify.h"

using namespace spmd;

namespace {

struct Builder {
  Graph g;
  ValueId input(const std::string& name, std::vector<int64_t> shape, c10::ScalarType t = c10::ScalarType::Float,
                InputKind kind = InputKind::Data) {
    return g.addInput({name, t, std::move(shape)}, kind);
  }
  ValueId node(const std::string& op, const std::string& overload, std::vector<Arg> args,
               std::vector<int64_t> shape, c10::ScalarType t = c10::ScalarType::Float) {
    Node n;
    n.op = op;
    n.overload = overload;
    n.args = std::move(args);
    n.outputs = {g.addValue({g.freshName("v"), t, std::move(shape)})};
    g.addNode(n);
    return n.outputs[0];
  }
};

std::string firstProblem(const Graph& g) {
  auto problems = verifyGraph(g);
  return problems.empty() ? "ok" : problems[0].where + ": " + problems[0].what;
}

Arg ints(std::vector<int64_t> v) {
  Arg a;
  a.kind = Arg::Kind::Ints;
  a.ints = std::move(v);
  return a;
}

}  // namespace

TEST_CASE("a well-formed graph verifies") {
  Builder b;
  ValueId x = b.input("x", {4, 3});
  ValueId w = b.input("w", {5, 3}, c10::ScalarType::Float, InputKind::Parameter);
  ValueId y = b.node("aten::linear", "", {Arg::tensor(x), Arg::tensor(w), Arg::none()}, {4, 5});
  ValueId t = b.node("aten::t", "", {Arg::tensor(y)}, {5, 4});
  ValueId r = b.node("aten::reshape", "", {Arg::tensor(t), ints({20})}, {20});
  ValueId s = b.node("aten::sum", "", {Arg::tensor(r), Arg::none()}, {});
  b.g.addOutput(s);
  CHECK(firstProblem(b.g) == "ok");
}

TEST_CASE("unknown operators and overloads") {
  Builder b;
  ValueId x = b.input("x", {4});
  b.node("aten::frobnicate", "", {Arg::tensor(x)}, {4});
  CHECK(firstProblem(b.g) == "/nodes/0/op: unknown operator 'aten::frobnicate' in this LibTorch");
  Builder c;
  ValueId y = c.input("y", {4});
  c.node("aten::add", "Nope", {Arg::tensor(y)}, {4});
  CHECK(firstProblem(c.g) == "/nodes/0/op: unknown operator 'aten::add.Nope' in this LibTorch");
}

TEST_CASE("wrong arity and wrong argument kinds") {
  Builder b;
  ValueId x = b.input("x", {4});
  b.node("aten::relu", "", {Arg::tensor(x), Arg::ofInt(1)}, {4});
  CHECK(firstProblem(b.g) == "/nodes/0/args: aten::relu takes 1 arguments, got 2");
  Builder c;
  ValueId y = c.input("y", {4});
  c.node("aten::add", "Tensor", {Arg::tensor(y), Arg::ofInt(2), Arg::ofInt(1)}, {4});
  CHECK(firstProblem(c.g) == "/nodes/0/args/1: aten::add.Tensor: argument 'other' must be Tensor, got int");
  Builder d;
  ValueId z = d.input("z", {4});
  d.node("aten::softmax", "int", {Arg::tensor(z), Arg::ofFloat(0.5), Arg::none()}, {4});
  CHECK(firstProblem(d.g) == "/nodes/0/args/1: aten::softmax.int: argument 'dim' must be int, got float");
}

TEST_CASE("shape and dtype mismatches") {
  Builder b;
  ValueId x = b.input("x", {4, 3});
  ValueId w = b.input("w", {5, 3});
  b.node("aten::mm", "", {Arg::tensor(x), Arg::tensor(w)}, {4, 5});
  CHECK(firstProblem(b.g).rfind("/nodes/0: aten::mm rejects its arguments: ", 0) == 0);
  Builder c;
  ValueId u = c.input("u", {4, 3});
  c.node("aten::relu", "", {Arg::tensor(u)}, {4, 4});
  CHECK(firstProblem(c.g) == "/nodes/0/outputs/0: aten::relu gives shape [4,3], the graph says [4,4]");
  Builder d;
  ValueId v = d.input("v", {4});
  d.node("aten::relu", "", {Arg::tensor(v)}, {4}, c10::ScalarType::Double);
  CHECK(firstProblem(d.g) == "/nodes/0/outputs/0: aten::relu gives dtype float32, the graph says float64");
}

TEST_CASE("strides flow between nodes: a view of a transpose is rejected as in eager") {
  Builder b;
  ValueId x = b.input("x", {4, 6});
  ValueId t = b.node("aten::transpose", "int", {Arg::tensor(x), Arg::ofInt(0), Arg::ofInt(1)}, {6, 4});
  b.node("aten::view", "", {Arg::tensor(t), ints({24})}, {24});
  CHECK(firstProblem(b.g).rfind("/nodes/1: aten::view rejects its arguments", 0) == 0);
}

TEST_CASE("use before definition, outputs and updates") {
  Builder b;
  ValueId x = b.input("x", {4});
  Value late{"late", c10::ScalarType::Float, {4}};
  ValueId lateId = b.g.addValue(late);
  b.node("aten::relu", "", {Arg::tensor(lateId)}, {4});
  Node def;
  def.op = "aten::relu";
  def.args = {Arg::tensor(x)};
  def.outputs = {lateId};
  b.g.addNode(def);
  CHECK(firstProblem(b.g) == "/nodes/0/args/0/value: value 'late' is used before it is defined");

  Builder c;
  ValueId buf = c.input("buf", {3}, c10::ScalarType::Float, InputKind::Buffer);
  ValueId data = c.input("d", {4});
  ValueId r = c.node("aten::relu", "", {Arg::tensor(data)}, {4});
  c.g.addUpdate({buf, r});
  CHECK(firstProblem(c.g) == "/updates/0: update of 'buf' f32[3] with 'v' f32[4]");
  Builder e;
  ValueId d2 = e.input("d", {4});
  ValueId r2 = e.node("aten::relu", "", {Arg::tensor(d2)}, {4});
  e.g.addUpdate({d2, r2});
  CHECK(firstProblem(e.g) == "/updates/0/input: 'd' is not a parameter, buffer or state input");
}

TEST_CASE("all problems are listed, not only the first") {
  Builder b;
  ValueId x = b.input("x", {4});
  b.node("aten::relu", "", {Arg::tensor(x)}, {5});
  b.node("aten::nothing", "", {Arg::tensor(x)}, {4});
  b.node("aten::neg", "", {Arg::tensor(x)}, {4}, c10::ScalarType::Long);
  CHECK(verifyGraph(b.g).size() == 3);
}

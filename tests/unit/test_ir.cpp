// The graph, dtype names, --input specs and the JSON reader/writer.
#include "catch.h"

#include "spmd/io/graph_json.h"
#include "spmd/io/input_spec.h"
#include "spmd/ops/dtype.h"
#include "spmd/ir/graph.h"
#include "spmd/support/diagnostic.h"

#include <cmath>
#include <limits>

using namespace spmd;

namespace {

// x: f32[2,3] -> relu -> sum, with a buffer updated by an add.
Graph smallGraph() {
  Graph g;
  g.setWeights({"w.pt", "torchscript"});
  ValueId x = g.addInput({"x", c10::ScalarType::Float, {2, 3}}, InputKind::Data);
  ValueId steps = g.addInput({"steps", c10::ScalarType::Long, {}}, InputKind::Buffer);
  Node relu;
  relu.op = "aten::relu";
  relu.args = {Arg::tensor(x)};
  relu.outputs = {g.addValue({g.freshName("relu"), c10::ScalarType::Float, {2, 3}})};
  relu.meta.source = "model.py:3";
  relu.meta.role = NodeRole::Forward;
  g.addNode(relu);
  Node sum;
  sum.op = "aten::sum";
  sum.args = {Arg::tensor(relu.outputs[0]), Arg::none()};
  sum.outputs = {g.addValue({g.freshName("sum"), c10::ScalarType::Float, {}})};
  g.addNode(sum);
  Node add;
  add.op = "aten::add";
  add.overload = "Scalar";
  add.args = {Arg::tensor(steps), Arg::ofInt(1), Arg::ofInt(1)};
  add.outputs = {g.addValue({g.freshName("add"), c10::ScalarType::Long, {}})};
  g.addNode(add);
  g.addOutput(sum.outputs[0]);
  g.addUpdate({steps, add.outputs[0]});
  return g;
}

std::string errorWhere(const std::string& json) {
  try {
    readGraphJson(json);
  } catch (const Diagnostic& d) {
    return d.where() + ": " + d.message();
  }
  return "no error";
}

const char* kHeader = R"({"format": "spmd-graph", "version": 1, )";

}  // namespace

TEST_CASE("fresh names follow FX's pattern") {
  Graph g;
  g.addValue({"relu", c10::ScalarType::Float, {}});
  CHECK(g.freshName("relu") == "relu_1");
  g.addValue({"relu_1", c10::ScalarType::Float, {}});
  CHECK(g.freshName("relu") == "relu_2");
  CHECK(g.freshName("linear") == "linear");
  CHECK_THROWS(g.addValue({"relu", c10::ScalarType::Float, {}}));
}

TEST_CASE("value sizes") {
  Value v{"w", c10::ScalarType::BFloat16, {3, 5}};
  CHECK(numel(v) == 15);
  CHECK(bytes(v) == 30);
  CHECK(numel(Value{"s", c10::ScalarType::Float, {}}) == 1);
}

TEST_CASE("dtype names: torch's, short forms and aliases") {
  CHECK(parseDtype("float32") == c10::ScalarType::Float);
  CHECK(parseDtype("f32") == c10::ScalarType::Float);
  CHECK(parseDtype("torch.bfloat16") == c10::ScalarType::BFloat16);
  CHECK(parseDtype("long") == c10::ScalarType::Long);
  CHECK_FALSE(parseDtype("float31"));
  CHECK(dtypeName(c10::ScalarType::Half) == "float16");
  CHECK(dtypeShortName(c10::ScalarType::Long) == "i64");
}

TEST_CASE("--input specs") {
  InputSpec s = parseInputSpec("x:f32[100,100]");
  CHECK(s.name == "x");
  CHECK(s.dtype == c10::ScalarType::Float);
  CHECK(s.shape == std::vector<int64_t>{100, 100});
  CHECK(parseInputSpec("t:int64[]").shape.empty());
  CHECK(parseInputSpec("tokens:i64[4,16]").dtype == c10::ScalarType::Long);
  for (const char* bad : {"x", "x:f32", "x:f32[1,", "x:f99[1]", ":f32[1]", "x:f32[a]", "x:f32[1,,2]", "x:f32[-1]"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parseInputSpec(bad), Diagnostic);
  }
  CHECK_THROWS_AS(parseInputSpecs({"x:f32[1]", "x:f32[2]"}), Diagnostic);
}

TEST_CASE("JSON dump: write, read, write is byte-identical") {
  Graph g = smallGraph();
  std::string once = writeGraphJson(g);
  Graph back = readGraphJson(once);
  CHECK(writeGraphJson(back) == once);
  REQUIRE(back.nodes().size() == 3);
  CHECK(back.nodes()[2].qualifiedName() == "aten::add.Scalar");
  CHECK(back.nodes()[0].meta.source == "model.py:3");
  CHECK(back.nodes()[0].meta.role == NodeRole::Forward);
  CHECK(back.updates().size() == 1);
  CHECK(back.inputs()[1].kind == InputKind::Buffer);
  CHECK(back.weights().file == "w.pt");
}

TEST_CASE("JSON dump: non-finite floats and every constant kind survive") {
  Graph g;
  ValueId x = g.addInput({"x", c10::ScalarType::Float, {2}}, InputKind::Data);
  Node n;
  n.op = "spmd::anything";
  Arg ints; ints.kind = Arg::Kind::Ints; ints.ints = {1, -2};
  Arg floats; floats.kind = Arg::Kind::Floats; floats.floats = {0.1, -std::numeric_limits<double>::infinity()};
  Arg bools; bools.kind = Arg::Kind::Bools; bools.bools = {true, false};
  Arg str; str.kind = Arg::Kind::Str; str.s = "tanh";
  Arg dtype; dtype.kind = Arg::Kind::DType; dtype.i = static_cast<int64_t>(c10::ScalarType::BFloat16);
  Arg device; device.kind = Arg::Kind::Device; device.s = "cuda:1";
  Arg layout; layout.kind = Arg::Kind::Layout; layout.i = 0;
  Arg format; format.kind = Arg::Kind::MemoryFormat; format.i = 2;
  Arg list; list.kind = Arg::Kind::Values; list.values = {x, x};
  n.args = {Arg::tensor(x), list, Arg::none(), Arg::ofInt(-7), Arg::ofFloat(std::nan("")), Arg::ofFloat(1e-5),
            Arg::ofBool(true), ints, floats, bools, str, dtype, device, layout, format};
  n.outputs = {g.addValue({"y", c10::ScalarType::Float, {2}})};
  g.addNode(n);
  g.addOutput(n.outputs[0]);
  std::string once = writeGraphJson(g);
  CHECK(once.find("\"-inf\"") != std::string::npos);
  CHECK(once.find("\"nan\"") != std::string::npos);
  Graph back = readGraphJson(once);
  CHECK(writeGraphJson(back) == once);
  CHECK(std::isnan(back.nodes()[0].args[4].f));
  CHECK(back.nodes()[0].args[8].floats[1] == -std::numeric_limits<double>::infinity());
  CHECK(back.nodes()[0].args[11].i == static_cast<int64_t>(c10::ScalarType::BFloat16));
}

TEST_CASE("JSON reader names the first problem with a JSON pointer") {
  std::string inputs = R"("inputs": [{"name": "x", "kind": "data", "dtype": "float32", "shape": [2]}], )";
  auto node = [](const std::string& args) {
    return R"("nodes": [{"op": "aten::relu", "args": )" + args +
           R"(, "outputs": [{"name": "y", "dtype": "float32", "shape": [2]}]}], )";
  };
  CHECK(errorWhere(std::string(kHeader) + inputs + node(R"([{"value": "x9"}])") + R"("outputs": ["y"]})") ==
        "/nodes/0/args/0/value: unknown value 'x9'");
  CHECK(errorWhere(std::string(kHeader) + inputs + node(R"([{"value": "x", "int": 1}])") + R"("outputs": ["y"]})")
            .rfind("/nodes/0/args/0: ", 0) == 0);
  CHECK(errorWhere(std::string(kHeader) + inputs + node(R"([{"tensor": "x"}])") + R"("outputs": ["y"]})") ==
        "/nodes/0/args/0/tensor: unknown argument kind 'tensor'");
  CHECK(errorWhere(std::string(kHeader) + inputs + node(R"([{"value": "x"}])") + R"("outputs": ["z"]})") ==
        "/outputs/0: unknown value 'z'");
  CHECK(errorWhere(R"({"format": "spmd-graph", "version": 7, "inputs": [], "nodes": [], "outputs": []})")
            .rfind("/version: unsupported version 7", 0) == 0);
  CHECK(errorWhere(R"({"format": "onnx", "version": 1, "inputs": [], "nodes": [], "outputs": []})") ==
        "/format: expected \"spmd-graph\"");
  CHECK(errorWhere(std::string(kHeader) + R"("inputs": [{"name": "x", "kind": "weight", "dtype": "float32", "shape": [2]}], "nodes": [], "outputs": []})") ==
        "/inputs/0/kind: unknown input kind 'weight'");
  CHECK(errorWhere(std::string(kHeader) + R"("inputs": [{"name": "x", "kind": "data", "dtype": "float32", "shape": [-2]}], "nodes": [], "outputs": []})") ==
        "/inputs/0/shape/0: negative dimension -2");
  CHECK(errorWhere(std::string(kHeader) + R"("inputs": [], "nodes": [], "outputs": [], "extra": 1})") ==
        "/extra: unknown key 'extra'");
  CHECK(errorWhere(R"({"format": "spmd-graph", "version": 1, "inputs": [)").rfind("/: invalid JSON", 0) != 0);
}

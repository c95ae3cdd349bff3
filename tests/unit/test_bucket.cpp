// spmd-split's bucket plan against DDPOptimizer's rules, on graphs built by
// hand; expected sizes are derived by hand from the rules (DESIGN.md). And
// spmd-lower's pack-buckets: the interpreter packs the same bits with it.
#include "spmd/ir/verify.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/parser.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"

#include <ATen/ATen.h>

#include <map>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

// ToyModel from DDPOptimizer's tests: Linear 10->5000->5000->5000->5, each
// followed by ReLU; loss = sum. `leadingRelu` puts a parameter-less ReLU on
// the input first.
Graph toyModel(bool leadingRelu) {
  Graph g;
  GraphBuilder b(g);
  ValueId h = g.addInput(Value{"x", c10::ScalarType::Float, {20, 10}}, InputKind::Data);
  if (leadingRelu) h = b.call("aten::relu", {Arg::tensor(h)});
  const std::vector<std::pair<int64_t, int64_t>> layers = {{10, 5000}, {5000, 5000}, {5000, 5000}, {5000, 5}};
  for (size_t i = 0; i < layers.size(); ++i) {
    auto [in, out] = layers[i];
    ValueId w = g.addInput(Value{"net." + std::to_string(2 * i) + ".weight", c10::ScalarType::Float, {out, in}},
                           InputKind::Parameter);
    ValueId bias = g.addInput(Value{"net." + std::to_string(2 * i) + ".bias", c10::ScalarType::Float, {out}},
                              InputKind::Parameter);
    h = b.call("aten::relu", {Arg::tensor(b.call("aten::linear", {Arg::tensor(h), Arg::tensor(w), Arg::tensor(bias)}))});
  }
  g.addOutput(b.call("aten::sum", {Arg::tensor(h), Arg::none()}));
  return g;
}

std::vector<int64_t> bucketBytes(Graph& g, double capMb, std::vector<std::string> ignored = {}) {
  PipelineOptions options;
  options.buckets.capMb = capMb;
  options.buckets.ignored = std::move(ignored);
  runPasses(g, {"bucket"}, options, DebugOptions{});
  std::vector<int64_t> sizes;
  for (const auto& bucket : g.buckets()) sizes.push_back(bucket.bytes);
  return sizes;
}

}  // namespace

TEST_CASE("DDPOptimizer's ToyModel at cap 25 gives its reference buckets", "[bucket]") {
  Graph g = toyModel(false);
  CHECK(bucketBytes(g, 25) == std::vector<int64_t>{220000, 100020000, 100120020});
  CHECK(g.value(g.buckets()[0].parameters[0]).name == "net.0.weight");
  CHECK(g.buckets()[2].parameters.size() == 4);
}

TEST_CASE("a parameter-less leading bucket merges into the next", "[bucket]") {
  // cap 0.1 MiB: net.0 alone (220000 bytes) fills a bucket, so the leading
  // ReLU would open a bucket of its own, which merges into net.0's.
  Graph g = toyModel(true);
  CHECK(bucketBytes(g, 0.1) == std::vector<int64_t>{220000, 100020000, 100120020});
  CHECK(g.nodes()[0].meta.bucket == 0);  // the leading ReLU
}

TEST_CASE("the first bucket filled uses the first-bucket cap", "[bucket]") {
  // Everything is far below 25 MiB but net.3 + net.2 exceed the 1 MiB first cap:
  // reverse walk: net.3 (100020) stays under 1 MiB, net.2 takes it to 100120020;
  // then a new bucket, which at 25 MiB cap takes net.1 (100020000) and stops; net.0 last.
  Graph g = toyModel(false);
  PipelineOptions options;
  options.buckets.capMb = 1000;  // only the first-bucket cap can split
  runPasses(g, {"bucket"}, options, DebugOptions{});
  std::vector<int64_t> sizes;
  for (const auto& bucket : g.buckets()) sizes.push_back(bucket.bytes);
  CHECK(sizes == std::vector<int64_t>{100240000, 100120020});
}

TEST_CASE("ignored parameters are never bucketed", "[bucket]") {
  // Without net.2.weight and net.6.bias: reverse walk: net.6 weight (100000),
  // net.4 (100020000) -> 100120000 >= cap; then net.2 bias (20000) and net.0
  // (220000) stay under the cap together -> 240000.
  Graph g = toyModel(false);
  CHECK(bucketBytes(g, 25, {"net.2.weight", "net.6.bias"}) == std::vector<int64_t>{240000, 100120000});
  Graph bad = toyModel(false);
  CHECK_THROWS(bucketBytes(bad, 25, {"net.9.weight"}));
}

// A bucket of autocast's gradients: bf16 ones (one read through a
// transpose) cast to f32 and a run of f32 ones (flat_cat's one cat_out),
// packed by a cat.
constexpr const char* kUpcastBucket = R"(graph
  input %gw: bf16[5,7] data
  input %gb: bf16[7] data
  input %gn: f32[6] data
  input %gm: f32[3,2] data
  %tw: bf16[7,5] = aten::t(%gw)
  %cw: f32[7,5] = aten::_to_copy(%tw, torch.float32, None, None, None, False, None)
  %rw: f32[35] = aten::reshape(%cw, [35])
  %cb: f32[7] = aten::_to_copy(%gb, torch.float32, None, None, None, False, None)
  %rm: f32[6] = aten::reshape(%gm, [6])
  %bucket: f32[54] = aten::cat([%rw, %cb, %gn, %rm], 0)
  return (%bucket)
)";

TEST_CASE("pack-buckets: flat_cat packs the bucket's bits from the 16-bit gradients", "[bucket][passes]") {
  const Graph plain = parseListing(kUpcastBucket);
  Graph packed = plain;
  runPasses(packed, {"pack-buckets", "dce"}, PipelineOptions{}, DebugOptions{});
  CHECK(verifyGraph(packed).empty());
  int casts = 0, flatCats = 0;
  for (const Node& n : packed.nodes()) {
    casts += n.op == "aten::_to_copy" || n.op == "aten::cat";
    flatCats += n.op == "spmd::flat_cat";
  }
  CHECK(casts == 0);
  CHECK(flatCats == 1);
  at::manual_seed(5);
  std::map<std::string, at::Tensor> inputs;
  for (const auto& in : plain.inputs()) {
    const Value& v = plain.value(in.value);
    inputs[v.name] = at::randn(v.shape, at::TensorOptions().dtype(v.dtype));
  }
  const at::Tensor want = Interpreter(plain).run(inputs).outputs.at(0), got = Interpreter(packed).run(inputs).outputs.at(0);
  CHECK(got.scalar_type() == at::kFloat);
  CHECK(at::equal(want, got));
  // The reference by hand: the transpose's elements in row-major order first.
  CHECK(at::equal(got.narrow(0, 0, 35), inputs.at("gw").t().reshape({35}).to(at::kFloat)));
  CHECK(at::equal(got.narrow(0, 48, 6), inputs.at("gm").reshape({6})));
}

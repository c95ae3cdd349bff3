// The static memory plan: hand-computed lifetimes, offsets and peaks on small
// graphs, and on the samples' train steps the plan's invariants and an
// oracle that finds views by running the step and comparing storages.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/torchscript.h"
#include "spmd/analysis/memory_plan.h"
#include "spmd/ir/builder.h"
#include "spmd/passes/pass.h"
#include "spmd/ir/boxing.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ops/op_traits.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <set>

#include "test_support.h"

using namespace spmd;
using spmd::testing::readFile;
using spmd::testing::sampleSpecs;

namespace {

const c10::ScalarType kF32 = c10::ScalarType::Float;

// value name -> {offset, bytes, first, last}
std::map<std::string, std::vector<int64_t>> assignments(const Graph& g, const MemoryPlan& plan) {
  std::map<std::string, std::vector<int64_t>> byName;
  for (const auto& b : plan.buffers) byName[g.value(b.value).name] = {b.offset, b.bytes, b.first, b.last};
  return byName;
}

using Expected = std::map<std::string, std::vector<int64_t>>;

// ----- hand-built graphs; every f32[32,32] value is 4096 bytes -----

// x -> a -> b -> c -> d: each value dies at the next node, so two buffers
// serve all four.
Graph chain() {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.addInput(Value{"x", kF32, {32, 32}}, InputKind::Data);
  ValueId a = b.call("aten::relu", {Arg::tensor(x)}, "a");
  ValueId v = b.call("aten::neg", {Arg::tensor(a)}, "b");
  v = b.call("aten::relu", {Arg::tensor(v)}, "c");
  g.addOutput(b.call("aten::neg", {Arg::tensor(v)}, "d"));
  return g;
}

}  // namespace

TEST_CASE("a chain reuses buffers as soon as values die", "[memory]") {
  Graph g = chain();
  MemoryPlan plan = planMemory(g);
  // a [0,1] at 0; b [1,2] overlaps a: 4096; c [2,3] overlaps only b: 0; d [3,3] overlaps only c: 4096.
  CHECK(assignments(g, plan) == Expected{{"a", {0, 4096, 0, 1}},
                                         {"b", {4096, 4096, 1, 2}},
                                         {"c", {0, 4096, 2, 3}},
                                         {"d", {4096, 4096, 3, 3}}});
  CHECK(plan.peakBytes == 8192);
  CHECK(plan.liveBytesBound == 8192);
  CHECK(plan.unplannedBytes == 16384);
  CHECK(plan.inputBytes == 4096);
}

TEST_CASE("the largest buffers are placed first", "[memory]") {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.addInput(Value{"x", kF32, {8, 128}}, InputKind::Data);
  ValueId a = b.call("aten::relu", {Arg::tensor(x)}, "a");  // 4096 bytes, [0, 1]
  Arg parts;
  parts.kind = Arg::Kind::Values;
  parts.values = {a, a, a, a};
  ValueId big = b.call("aten::cat", {parts, Arg::ofInt(0)}, "big");  // f32[32,128]: 16384 bytes, [1, 2]
  ValueId small = b.call("aten::sum.dim_IntList", {Arg::tensor(big), intsArg({0}), Arg::ofBool(false), Arg::none()},
                         "small");  // f32[128]: 512 bytes, [2, 2]
  g.addOutput(small);
  MemoryPlan plan = planMemory(g);
  // big first at 0; then a, which is live with big, above it; then small,
  // live with big only, at the same place as a.
  CHECK(assignments(g, plan) == Expected{{"big", {0, 16384, 1, 2}},
                                         {"a", {16384, 4096, 0, 1}},
                                         {"small", {16384, 512, 2, 2}}});
  CHECK(plan.peakBytes == 20480);
  CHECK(plan.liveBytesBound == 20480);
  CHECK(plan.unplannedBytes == 20992);
}

TEST_CASE("views own no memory and keep their base alive", "[memory]") {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.addInput(Value{"x", kF32, {16, 64}}, InputKind::Data);
  ValueId a = b.call("aten::relu", {Arg::tensor(x)}, "a");       // 0
  ValueId v = b.call("aten::t", {Arg::tensor(a)}, "v");          // 1: view of a
  ValueId w = b.call("aten::t", {Arg::tensor(v)}, "w");          // 2: view of a view of a
  b.call("aten::neg", {Arg::tensor(x)}, "unread");               // 3: nothing reads it
  ValueId c = b.call("aten::mul.Tensor", {Arg::tensor(w), Arg::tensor(w)}, "c");  // 4: last use of a, through w
  ValueId xt = b.call("aten::t", {Arg::tensor(x)}, "xt");        // 5: view of an input
  ValueId e = b.call("aten::relu", {Arg::tensor(xt)}, "e");      // 6
  g.addOutput(c);
  g.addOutput(e);
  MemoryPlan plan = planMemory(g);
  // a lives until w's use at 4; the unread value only during its node; c, an
  // output, until the end. a at 0; unread above a; c live with a above it;
  // e live with c only, at 0.
  CHECK(assignments(g, plan) == Expected{{"a", {0, 4096, 0, 4}},
                                         {"unread", {4096, 4096, 3, 3}},
                                         {"c", {4096, 4096, 4, 6}},
                                         {"e", {0, 4096, 6, 6}}});
  CHECK(plan.peakBytes == 8192);
  CHECK(plan.liveBytesBound == 8192);
}

TEST_CASE("list views from split keep their base alive", "[memory]") {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.addInput(Value{"x", kF32, {32, 64}}, InputKind::Data);
  ValueId a = b.call("aten::relu", {Arg::tensor(x)}, "a");  // 8192 bytes
  auto parts = b.callMulti("aten::split.Tensor", {Arg::tensor(a), Arg::ofInt(8), Arg::ofInt(0)}, "part");
  REQUIRE(parts.size() == 4);
  g.addOutput(b.call("aten::neg", {Arg::tensor(parts[0])}, "first"));  // 2048 bytes
  g.addOutput(b.call("aten::neg", {Arg::tensor(parts[3])}, "last"));   // 2048 bytes
  MemoryPlan plan = planMemory(g);
  CHECK(assignments(g, plan) == Expected{{"a", {0, 8192, 0, 3}},
                                         {"first", {8192, 2048, 2, 3}},
                                         {"last", {10240, 2048, 3, 3}}});
  CHECK(plan.peakBytes == 12288);
  CHECK(plan.liveBytesBound == 12288);
}

TEST_CASE("outputs and state updates live to the end of the step", "[memory]") {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.addInput(Value{"x", kF32, {32, 32}}, InputKind::Data);
  ValueId s = g.addInput(Value{"s", kF32, {32, 32}}, InputKind::State);
  ValueId a = b.call("aten::relu", {Arg::tensor(x)}, "a");
  ValueId v = b.call("aten::neg", {Arg::tensor(a)}, "b");
  ValueId u = b.call("aten::add.Tensor", {Arg::tensor(v), Arg::tensor(s), Arg::ofInt(1)}, "u");
  ValueId c = b.call("aten::neg", {Arg::tensor(v)}, "c");
  g.addOutput(a);
  g.addOutput(c);
  g.addUpdate({s, u});
  MemoryPlan plan = planMemory(g);
  // Nothing dies before the end: no reuse.
  CHECK(assignments(g, plan) == Expected{{"a", {0, 4096, 0, 3}},
                                         {"b", {4096, 4096, 1, 3}},
                                         {"u", {8192, 4096, 2, 3}},
                                         {"c", {12288, 4096, 3, 3}}});
  CHECK(plan.peakBytes == 16384);
  CHECK(plan.liveBytesBound == 16384);
  CHECK(plan.unplannedBytes == 16384);
  CHECK(plan.inputBytes == 8192);
}

TEST_CASE("reshape owns a buffer and keeps its input alive", "[memory]") {
  // reshape copies when it cannot view, so it gets memory of its own, and
  // views when it can, so `a` must outlive it.
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.addInput(Value{"x", kF32, {16, 64}}, InputKind::Data);
  ValueId a = b.call("aten::relu", {Arg::tensor(x)}, "a");
  ValueId r = b.call("aten::reshape", {Arg::tensor(a), intsArg({1024})}, "r");
  g.addOutput(b.call("aten::neg", {Arg::tensor(r)}, "n"));
  MemoryPlan plan = planMemory(g);
  CHECK(assignments(g, plan) == Expected{{"a", {0, 4096, 0, 2}},
                                         {"r", {4096, 4096, 1, 2}},
                                         {"n", {8192, 4096, 2, 2}}});
}

TEST_CASE("sizes round up to 512 bytes; results left undefined take none", "[memory]") {
  Graph g;
  GraphBuilder b(g);
  ValueId x = g.addInput(Value{"x", kF32, {4, 8}}, InputKind::Data);  // 128 bytes
  auto norm = b.callMulti("aten::native_layer_norm", {Arg::tensor(x), intsArg({8}), Arg::none(), Arg::none(),
                                                      Arg::ofFloat(1e-5)});
  auto grads = b.callMulti("aten::native_layer_norm_backward",
                           {Arg::tensor(norm[0]), Arg::tensor(x), intsArg({8}), Arg::tensor(norm[1]),
                            Arg::tensor(norm[2]), Arg::none(), Arg::none(), boolsArg({true, false, false})});
  REQUIRE(grads.size() == 3);
  REQUIRE(grads[1] == kNoValue);
  g.addOutput(grads[0]);
  MemoryPlan plan = planMemory(g);
  REQUIRE(plan.buffers.size() == 4);  // output, mean, rstd, grad_input
  for (const auto& buffer : plan.buffers) {
    CHECK(buffer.value != kNoValue);
    CHECK(buffer.bytes == 512);
  }
  CHECK(plan.inputBytes == 512);
  CHECK(plan.peakBytes == 2048);
}

TEST_CASE("the plan prints as a summary and table, and as JSON", "[memory]") {
  Graph g = chain();
  // a and b made by the forward, c and d by the backward: b is kept for it.
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    g.metaOf(g.nodes()[k]).role = k < 2 ? NodeRole::Forward : NodeRole::Backward;
  }
  MemoryPlan plan = planMemory(g);
  CHECK(printMemoryPlan(g, plan) ==
        "memory plan: 4 buffers, peak 8192 bytes (0.01 MiB), live-bytes bound 8192, without reuse 16384 bytes "
        "(saves 50.0%), inputs 4096 bytes\n"
        "model state per rank: parameters 0 bytes, gradients 0 bytes, optimizer state 0 bytes\n"
        "kept from the forward for the backward: 1 buffers, 4096 bytes (0.00 MiB); results computed again in the "
        "backward: 0\n"
        "largest buffers:\n"
        "  value       bytes      offset  lifetime\n"
        "  %a           4096           0  [0, 1]\n"
        "  %b           4096        4096  [1, 2]\n"
        "  %c           4096           0  [2, 3]\n"
        "  %d           4096        4096  [3, 3]\n");
  CHECK(printMemoryPlanJson(g, plan) ==
        "{\n"
        "  \"peak_bytes\": 8192,\n"
        "  \"live_bytes_bound\": 8192,\n"
        "  \"unplanned_bytes\": 16384,\n"
        "  \"input_bytes\": 4096,\n"
        "  \"model_state\": {\"parameters\": 0, \"gradients\": 0, \"optimizer_state\": 0},\n"
        "  \"kept_for_backward\": {\"buffers\": 1, \"bytes\": 4096, \"recomputed_values\": 0},\n"
        "  \"buffers\": [\n"
        "    {\"name\": \"a\", \"bytes\": 4096, \"offset\": 0, \"first\": 0, \"last\": 1},\n"
        "    {\"name\": \"b\", \"bytes\": 4096, \"offset\": 4096, \"first\": 1, \"last\": 2},\n"
        "    {\"name\": \"c\", \"bytes\": 4096, \"offset\": 0, \"first\": 2, \"last\": 3},\n"
        "    {\"name\": \"d\", \"bytes\": 4096, \"offset\": 4096, \"first\": 3, \"last\": 3}\n"
        "  ]\n"
        "}\n");
  Graph empty;
  CHECK(printMemoryPlan(empty, planMemory(empty)) ==
        "memory plan: 0 buffers, peak 0 bytes (0.00 MiB), live-bytes bound 0, without reuse 0 bytes (saves 0.0%), "
        "inputs 0 bytes\n"
        "model state per rank: parameters 0 bytes, gradients 0 bytes, optimizer state 0 bytes\n");
}

// ----- the samples' train steps -----

namespace {

Graph trainStep(const std::string& sample, double bucketCapMb = 0) {
  const std::string path = std::string(SPMD_SOURCE_DIR) + "/samples/" + sample + ".pt";
  Graph graph = importTorchScript(readFile(path), path, sampleSpecs(sample));
  PipelineOptions options;
  options.optimizer.kind = OptimizerKind::Adam;
  options.optimizer.lr = 0.01;
  runPasses(graph, expandPipeline(options), options, DebugOptions{});
  if (bucketCapMb > 0) {
    options.buckets.capMb = bucketCapMb;
    options.buckets.firstCapMb = bucketCapMb;
    runPasses(graph, splitPipeline(options), options, DebugOptions{});
  }
  return graph;
}

int64_t rounded(int64_t n) { return (n + 511) / 512 * 512; }

void checkInvariants(const Graph& g, const MemoryPlan& plan) {
  int64_t sum = 0;
  int64_t end = 0;
  std::set<ValueId> seen;
  for (const auto& b : plan.buffers) {
    INFO("buffer %" << g.value(b.value).name);
    CHECK(seen.insert(b.value).second);
    CHECK(b.bytes == rounded(bytes(g.value(b.value))));
    CHECK(b.bytes > 0);
    CHECK(b.offset % 512 == 0);
    CHECK(b.first <= b.last);
    CHECK(std::find(g.nodes()[b.first].outputs.begin(), g.nodes()[b.first].outputs.end(), b.value) !=
          g.nodes()[b.first].outputs.end());
    sum += b.bytes;
    end = std::max(end, b.offset + b.bytes);
  }
  CHECK(plan.unplannedBytes == sum);
  CHECK(plan.peakBytes == end);
  CHECK(plan.peakBytes >= plan.liveBytesBound);
  CHECK(plan.peakBytes <= plan.unplannedBytes);
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    for (size_t j = i + 1; j < plan.buffers.size(); ++j) {
      const auto& p = plan.buffers[i];
      const auto& q = plan.buffers[j];
      bool together = p.first <= q.last && q.first <= p.last;
      bool shareBytes = p.offset < q.offset + q.bytes && q.offset < p.offset + p.bytes;
      if (together && shareBytes) FAIL_CHECK("%" << g.value(p.value).name << " and %" << g.value(q.value).name << " clash");
    }
  }
}

// Every value's tensor after one run of the step on CPU, all kept alive so
// that no storage is recycled and sharing a storage means aliasing.
std::vector<at::Tensor> runKeepingEverything(const Graph& g) {
  std::vector<at::Tensor> env(g.numValues());
  at::manual_seed(0);
  for (const auto& in : g.inputs()) {
    const Value& v = g.value(in.value);
    auto options = at::TensorOptions().dtype(v.dtype);
    env[in.value] = c10::isFloatingType(v.dtype) ? at::randn(v.shape, options) : at::zeros(v.shape, options);
  }
  for (const Node& node : g.nodes()) {
    auto op = findOperator(node);
    REQUIRE(op);
    auto results = callOperator(*op, boxArguments(node, op->schema(), [&](ValueId v) { return env[v]; }));
    for (size_t k = 0; k < node.outputs.size() && k < results.size(); ++k) {
      if (node.outputs[k] != kNoValue) env[node.outputs[k]] = results[k];
    }
  }
  return env;
}


std::vector<ValueId> tensorArgs(const Node& node) {
  std::vector<ValueId> values;
  for (const Arg& a : node.args) {
    if (a.kind == Arg::Kind::Value) values.push_back(a.value);
    values.insert(values.end(), a.values.begin(), a.values.end());
  }
  return values;
}

// The oracle: which outputs own memory and what they alias, found by running
// the step (an output that shares an argument's storage is a view of it),
// then, for each node i, the bytes of owned values defined at or before i
// that are used at or after i, directly or through values aliasing them.
struct Oracle {
  std::vector<bool> owns;
  std::vector<ValueId> parent;
  int64_t maxLiveBytes = 0;
};

Oracle runtimeOracle(const Graph& g) {
  const auto env = runKeepingEverything(g);
  const int numNodes = static_cast<int>(g.nodes().size());
  Oracle o{std::vector<bool>(g.numValues(), false), std::vector<ValueId>(g.numValues(), kNoValue), 0};
  std::vector<int> defined(g.numValues(), -1);
  for (int i = 0; i < numNodes; ++i) {
    const Node& node = g.nodes()[i];
    auto args = tensorArgs(node);
    for (ValueId out : node.outputs) {
      if (out == kNoValue) continue;
      defined[out] = i;
      if (mayCopyOrAlias(node.op)) {
        o.parent[out] = args.front();
      } else {
        for (ValueId a : args) {
          if (env[out].is_alias_of(env[a])) {
            o.parent[out] = a;
            break;
          }
        }
      }
      o.owns[out] = bytes(g.value(out)) > 0 && (o.parent[out] == kNoValue || mayCopyOrAlias(node.op));
    }
  }
  // What each node reads; the step's results are read after the last node.
  std::vector<std::vector<ValueId>> reads(numNodes);
  for (int i = 0; i < numNodes; ++i) reads[i] = tensorArgs(g.nodes()[i]);
  for (ValueId v : g.outputs()) reads[numNodes - 1].push_back(v);
  for (const auto& u : g.updates()) reads[numNodes - 1].push_back(u.value);
  for (int i = 0; i < numNodes; ++i) {
    std::set<ValueId> live;
    for (ValueId out : g.nodes()[i].outputs) {
      if (out != kNoValue && o.owns[out]) live.insert(out);
    }
    for (int j = i; j < numNodes; ++j) {
      for (ValueId u : reads[j]) {
        for (ValueId a = u; a != kNoValue; a = o.parent[a]) {
          if (o.owns[a] && defined[a] <= i) live.insert(a);
        }
      }
    }
    int64_t sum = 0;
    for (ValueId v : live) sum += rounded(bytes(g.value(v)));
    o.maxLiveBytes = std::max(o.maxLiveBytes, sum);
  }
  return o;
}

void checkSample(const std::string& sample, double bucketCapMb = 0) {
  INFO(sample);
  Graph g = trainStep(sample, bucketCapMb);
  MemoryPlan plan = planMemory(g);
  checkInvariants(g, plan);
  CHECK(plan.peakBytes < plan.unplannedBytes);  // a train step always has something to reuse

  Oracle oracle = runtimeOracle(g);
  std::set<ValueId> planned;
  for (const auto& b : plan.buffers) planned.insert(b.value);
  for (const Node& node : g.nodes()) {
    for (ValueId out : node.outputs) {
      if (out == kNoValue) continue;
      INFO("%" << g.value(out).name << " = " << node.qualifiedName());
      CHECK(planned.count(out) == (oracle.owns[out] ? 1u : 0u));
    }
  }
  CHECK(plan.liveBytesBound == oracle.maxLiveBytes);
}

}  // namespace

TEST_CASE("the samples' train steps: a sound plan that agrees with the runtime oracle", "[memory]") {
  checkSample("mlp");
  checkSample("lm");
  checkSample("cnn");
  checkSample("lm", 0.05);  // with spmd-split's bucketed all-reduces
}

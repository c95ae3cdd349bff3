// spmd-unroll and the lowering passes against the plain train step: S steps
// of the unrolled graph (setup, main, cleanup), and of the step with its
// optimizer fused into _foreach calls, must leave every parameter, buffer and
// optimizer state bit-identical to S plain steps on one rank (the interpreter
// runs the same kernels in the same order per element).
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/input_spec.h"
#include "spmd/io/torchscript.h"
#include "spmd/ir/iter_graph.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"
#include "spmd/io/weights.h"
#include "spmd/ir/parser.h"
#include "spmd/support/diagnostic.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

#include "test_support.h"

using namespace spmd;
using spmd::testing::readFile;
using spmd::testing::sampleSpecs;

namespace {

Graph trainStep(const std::string& sample, const std::string& optimizer, double bucketCapMb, double eps = 0,
                double lr = 0.05) {
  const std::string path = std::string(SPMD_SOURCE_DIR) + "/samples/" + sample + ".pt";
  Graph graph = importTorchScript(readFile(path), path, sampleSpecs(sample));
  PipelineOptions options;
  parseOptimizerKind(optimizer, options.optimizer.kind);
  options.optimizer.lr = lr;
  options.optimizer.momentum = optimizer == "sgd" ? 0.9 : 0.0;
  if (eps > 0) options.optimizer.eps = eps;
  options.buckets.capMb = bucketCapMb;
  options.buckets.firstCapMb = bucketCapMb;
  runPasses(graph, expandPipeline(options), options, DebugOptions{});
  runPasses(graph, splitPipeline(options), options, DebugOptions{});
  return graph;
}

Graph withPasses(Graph graph, const std::vector<std::string>& passes, int iters = 0) {
  PipelineOptions options;
  options.unroll.iters = iters;
  runPasses(graph, passes, options, DebugOptions{});
  return graph;
}

std::map<std::string, at::Tensor> initialState(const Graph& g) {
  auto weights = loadWeights(g.weights());
  std::map<std::string, at::Tensor> state;
  for (const auto& in : g.inputs()) {
    const Value& v = g.value(in.value);
    if (in.kind == InputKind::Data) continue;
    auto it = weights.find(v.name);
    state[v.name] = it != weights.end() ? it->second.clone() : at::zeros(v.shape, at::TensorOptions().dtype(v.dtype));
  }
  return state;
}

std::map<std::string, at::Tensor> batch(const Graph& g, int step) {
  torch::manual_seed(7 + step);
  std::map<std::string, at::Tensor> data;
  for (const auto& in : g.inputs()) {
    if (in.kind != InputKind::Data) continue;
    const Value& v = g.value(in.value);
    auto opts = at::TensorOptions().dtype(v.dtype);
    data[v.name] = c10::isFloatingType(v.dtype) ? torch::randn(v.shape, opts) : torch::randint(0, 4, v.shape, opts);
  }
  return data;
}

// Runs `steps` steps as spmd-run does (one graph per kind of iteration).
// With Buffers::Reuse, returns the nodes that ran in place (over all graphs).
// On `device` the state and batches are copied there first.
std::map<std::string, at::Tensor> train(const Graph& g, int steps,
                                        Interpreter::Buffers buffers = Interpreter::Buffers::Keep,
                                        size_t* inPlaceNodes = nullptr, c10::Device device = at::kCPU) {
  std::map<std::string, at::Tensor> state = initialState(g);
  for (auto& [name, t] : state) t = t.to(device);
  std::map<Iteration, Graph> graphs;
  for (int s = 0; s < steps; ++s) {
    const Iteration it = iterationAt(s, steps);
    if (!graphs.count(it)) graphs.emplace(it, graphForIteration(g, it));
    std::map<std::string, at::Tensor> inputs = state;
    for (auto& [name, t] : batch(g, s)) inputs[name] = t.to(device);
    Interpreter interpreter(graphs.at(it), buffers);
    if (inPlaceNodes) *inPlaceNodes += interpreter.inPlaceNodes();
    RunResult r = interpreter.run(inputs);
    for (auto& [name, t] : r.updates) state[name] = t;
  }
  return state;
}

void requireSameState(const std::map<std::string, at::Tensor>& plain, const std::map<std::string, at::Tensor>& other) {
  for (const auto& [name, t] : plain) {
    INFO(name);
    REQUIRE(other.count(name));
    CHECK(at::equal(t, other.at(name)));
  }
}

}  // namespace

TEST_CASE("unrolled steps equal plain steps", "[unroll]") {
  const Graph mlp = trainStep("mlp", "adam", 0.05);  // several buckets: only the last moves
  const Graph cnn = trainStep("cnn", "sgd", 0.002);  // SGD's shared first_step is carried
  for (const Graph* g : {&mlp, &cnn}) {
    const Graph unrolled = withPasses(*g, unrollPipeline({}), 4);
    REQUIRE(unrolled.iters() == 4);
    for (int steps : {1, 2, 4}) {
      INFO(steps << " steps");
      requireSameState(train(*g, steps), train(unrolled, steps));
    }
  }
}

TEST_CASE("the fused optimizer updates exactly as the per-parameter one", "[unroll]") {
  const Graph step = trainStep("mlp", "adam", 0.05);
  const Graph fused = withPasses(step, {"optimizer-to-foreach"});
  size_t foreachCalls = 0;
  for (const Node& n : fused.nodes()) foreachCalls += n.op.rfind("aten::_foreach_", 0) == 0;
  CHECK(foreachCalls > 0);
  CHECK(fused.nodes().size() < step.nodes().size());
  requireSameState(train(step, 3), train(fused, 3));
  const Graph both = withPasses(withPasses(step, unrollPipeline({}), 3), {"optimizer-to-foreach"});
  requireSameState(train(step, 3), train(both, 3));
}

TEST_CASE("a block moves only with every node that reads it", "[unroll]") {
  Graph g = trainStep("mlp", "adam", 25);
  size_t firstForward = 0;
  while (g.nodes()[firstForward].meta.role != NodeRole::Forward) ++firstForward;
  IterGraph iter(g);
  iter.moveToNextIteration({firstForward});
  REQUIRE_THROWS_AS(iter.freeze(2), Diagnostic);
}

TEST_CASE("optimizer updates run in place over their state, with the same result", "[unroll]") {
  const Graph mlp = trainStep("mlp", "adam", 0.05);
  const Graph cnn = trainStep("cnn", "sgd", 0.002);
  for (const Graph* g : {&mlp, &cnn}) {
    const Graph lowered = withPasses(withPasses(*g, unrollPipeline({}), 3), {"optimizer-to-foreach"});
    for (int steps : {1, 3}) {
      INFO(steps << " steps");
      size_t inPlace = 0;
      requireSameState(train(*g, steps), train(lowered, steps, Interpreter::Buffers::Reuse, &inPlace));
      CHECK(inPlace > 0);
    }
  }
  // Parameters and Adam's moments are written where they live, also in the
  // iteration that repeats once the last bucket's update moved into it.
  const Graph fused = withPasses(mlp, {"optimizer-to-foreach"});
  const Graph middle = graphForIteration(withPasses(withPasses(mlp, unrollPipeline({}), 3), {"optimizer-to-foreach"}), Iteration::Middle);
  for (const Graph* g : {&fused, &middle}) {
    Interpreter interpreter(*g, Interpreter::Buffers::Reuse);
    const auto& written = interpreter.overwrittenInputs();
    for (const char* name : {"mod.0.weight", "mod.0.weight.exp_avg", "mod.0.weight.exp_avg_sq", "mod.0.weight.step",
                             "mod.18.bias", "mod.18.bias.exp_avg", "mod.18.bias.exp_avg_sq", "mod.18.bias.step"}) {
      INFO(name);
      CHECK(std::find(written.begin(), written.end(), name) != written.end());
    }
  }
  CHECK(Interpreter(fused).overwrittenInputs().empty());
}

// The cnn's BatchNorm running statistics reach the forward through
// spmd::broadcast (DDP's buffer broadcast from rank 0), which they die at:
// with Buffers::Reuse one rank's broadcast hands the state tensor on as it
// is (no copy a step) and names it overwritten, and the states agree with
// the reference semantics' (train() above compares every tensor).
TEST_CASE("a one-rank broadcast of state the step replaces copies nothing", "[unroll]") {
  const Graph cnn = trainStep("cnn", "sgd", 0.002);
  Interpreter reuse(cnn, Interpreter::Buffers::Reuse);
  const auto& written = reuse.overwrittenInputs();
  int broadcasts = 0;
  for (const Node& n : cnn.nodes()) {
    if (n.op != "spmd::broadcast") continue;
    ++broadcasts;
    const std::string& name = cnn.value(n.args[0].value).name;
    INFO(name);
    CHECK(std::find(written.begin(), written.end(), name) != written.end());
  }
  REQUIRE(broadcasts > 0);
  std::map<std::string, at::Tensor> inputs = initialState(cnn);
  for (auto& [name, t] : batch(cnn, 0)) inputs[name] = t;
  const RunResult kept = Interpreter(cnn).run(inputs);
  const RunResult reused = reuse.run(inputs);
  for (const auto& [name, t] : kept.updates) {
    INFO(name);
    CHECK(at::equal(t, reused.updates.at(name)));
  }
}

// spmd::fused_adam (lowered for CUDA; its kernel runs only there, see
// bench/gpu_precision_parity.sh) runs in place over the parameters, moments
// and steps when the update is their last reader, and on copies otherwise.
TEST_CASE("fused Adam runs in place over the state it replaces", "[unroll]") {
  const std::string head = R"(graph
  input %x: f32[4,3] data
  input %w: f32[3,2] parameter
  input %w.step: f32[] state
  input %w.exp_avg: f32[3,2] state
  input %w.exp_avg_sq: f32[3,2] state
  %mm: f32[4,2] = aten::mm(%x, %w)  # role=forward
  %loss: f32[] = aten::sum(%mm, None)  # role=forward
  %g: f32[3,2] = aten::mul.Scalar(%w, 2.0)  # role=backward
  %w.new: f32[3,2], %m: f32[3,2], %v: f32[3,2], %s: f32[] = spmd::fused_adam([%w], [%g], [%w.exp_avg], [%w.exp_avg_sq], [%w.step], 0.01, 0.9, 0.999, 0.0, 1e-08, False)  # role=optimizer
)";
  const std::string updates = R"(  update %w <- %w.new
  update %w.step <- %s
  update %w.exp_avg <- %m
  update %w.exp_avg_sq <- %v
)";
  const Graph last = parseListing(head + "  return (%loss)\n" + updates);
  Interpreter inPlace(last, Interpreter::Buffers::Reuse);
  CHECK(inPlace.inPlaceNodes() == 1);
  std::vector<std::string> written = inPlace.overwrittenInputs();
  std::sort(written.begin(), written.end());
  CHECK(written == std::vector<std::string>{"w", "w.exp_avg", "w.exp_avg_sq", "w.step"});
  CHECK(Interpreter(last).inPlaceNodes() == 0);
  // A node after the update still reads the old parameter: copies.
  const Graph readAfter =
      parseListing(head + "  %old: f32[] = aten::sum(%w, None)  # role=optimizer\n  return (%loss, %old)\n" + updates);
  CHECK(Interpreter(readAfter, Interpreter::Buffers::Reuse).inPlaceNodes() == 0);
}

// On one rank a collective is the identity: where its input dies there and
// owns its storage, the input is its result (no copy of the bucket); a
// bucket that is read again later is copied, so nothing aliases it.
TEST_CASE("one-rank collectives pass a dying bucket through uncopied", "[unroll]") {
  auto listing = [](const std::string& returns) {
    return parseListing(R"(graph
  input %x: f32[6] data
  %flat: f32[6] = aten::mul.Scalar(%x, 2.0)  # role=backward
  %inflight: f32[6] = spmd::bucket_start(%flat, "mean", 0)  # role=comm bucket=0
  %reduced: f32[6] = spmd::bucket_wait(%inflight, 0)  # role=comm bucket=0
  return ()" + returns + ")\n");
  };
  const at::Tensor x = at::arange(6, at::kFloat);
  const Graph dies = listing("%reduced");
  const Interpreter reuse(dies, Interpreter::Buffers::Reuse);
  CHECK(reuse.collectivesInPlace() == 2);
  CHECK(Interpreter(dies).collectivesInPlace() == 0);
  CHECK(at::equal(reuse.run({{"x", x}}).outputs.at(0), x * 2));

  const Graph lives = listing("%reduced, %flat");
  const Interpreter keepFlat(lives, Interpreter::Buffers::Reuse);
  CHECK(keepFlat.collectivesInPlace() == 1);  // only bucket_wait: its input is bucket_start's copy
  const std::vector<at::Tensor> out = keepFlat.run({{"x", x}}).outputs;
  CHECK(at::equal(out.at(0), x * 2));
  CHECK(out.at(0).data_ptr() != out.at(1).data_ptr());
}

namespace {

// embedding_dense_backward(grad [2,3,4], indices [2,3], 5 rows, padding_idx).
Graph embeddingBackward(int64_t paddingIdx) {
  Graph g;
  const ValueId grad = g.addInput({"grad", c10::ScalarType::Float, {2, 3, 4}}, InputKind::Data);
  const ValueId indices = g.addInput({"indices", c10::ScalarType::Long, {2, 3}}, InputKind::Data);
  const ValueId out = g.addValue({"weight_grad", c10::ScalarType::Float, {5, 4}});
  Node n;
  n.op = "aten::embedding_dense_backward";
  n.args = {Arg::tensor(grad), Arg::tensor(indices), Arg::ofInt(5), Arg::ofInt(paddingIdx), Arg::ofBool(false)};
  n.outputs = {out};
  g.addNode(std::move(n));
  g.addOutput(out);
  return g;
}

Graph forCudaGraphs(Graph g, const std::vector<std::string>& passes) {
  PipelineOptions options;
  options.lower.device = "cuda";
  options.lower.cudagraphs = true;
  runPasses(g, passes, options, DebugOptions{});
  return g;
}

}  // namespace

TEST_CASE("embedding-grad computes LibTorch's embedding gradient with index_add", "[unroll]") {
  torch::manual_seed(3);
  const std::map<std::string, at::Tensor> inputs = {{"grad", torch::randn({2, 3, 4})},
                                                    {"indices", torch::tensor({1, 3, 1, 0, 4, 1}).reshape({2, 3})}};
  for (int64_t padding : {-1, 1}) {
    INFO("padding_idx " << padding);
    const Graph original = embeddingBackward(padding);
    const Graph rewritten = forCudaGraphs(original, {"embedding-grad"});
    size_t indexAdds = 0;
    for (const Node& n : rewritten.nodes()) {
      CHECK(n.op != "aten::embedding_dense_backward");
      indexAdds += n.op == "aten::index_add";
    }
    CHECK(indexAdds == 1);
    const at::Tensor want = Interpreter(original).run(inputs).outputs.at(0);
    const at::Tensor got = Interpreter(rewritten).run(inputs).outputs.at(0);
    CHECK(at::allclose(got, want, 1e-6, 1e-7));
    if (padding >= 0) CHECK(at::equal(got[padding], at::zeros({4})));
  }
  // Only for CUDA graphs: a CPU or eager lowering keeps LibTorch's kernel
  // (the lowering pipeline leaves the pass out).
  auto lowering = [](const std::string& device, bool cudagraphs) {
    PipelineOptions options;
    options.lower.device = device;
    options.lower.cudagraphs = cudagraphs;
    return lowerPipeline(options);
  };
  auto has = [](const std::vector<std::string>& names, const std::string& pass) {
    return std::find(names.begin(), names.end(), pass) != names.end();
  };
  CHECK(has(lowering("cuda", true), "embedding-grad"));
  CHECK_FALSE(has(lowering("cuda", false), "embedding-grad"));
  CHECK_FALSE(has(lowering("cpu", true), "embedding-grad"));
}

TEST_CASE("with embedding-grad the LM trains as with LibTorch's embedding gradient", "[unroll]") {
  const Graph step = trainStep("lm", "adamw", 25);
  const Graph rewritten = forCudaGraphs(step, {"embedding-grad"});
  REQUIRE(rewritten.nodes().size() > step.nodes().size());
  const auto want = train(step, 3);
  const auto got = train(rewritten, 3);
  for (const auto& [name, t] : want) {
    INFO(name);
    CHECK(at::allclose(got.at(name), t, 1e-5, 1e-7));
  }
}

TEST_CASE("adam-to-capturable-foreach trains as torch.optim's formulas do, to rounding", "[unroll]") {
  // eps 1e-2, as the parity tests: with 1e-8, Adam turns the rounding noise of
  // gradients that are zero in exact arithmetic (the attention's key bias)
  // into steps of a good part of lr, differently for any change of rounding.
  const Graph mlp = trainStep("mlp", "adam", 0.05, 1e-2);
  const Graph lm = trainStep("lm", "adamw", 25, 1e-2);
  for (const Graph* g : {&mlp, &lm}) {
    size_t parameters = 0;
    for (const auto& in : g->inputs()) parameters += in.kind == InputKind::Parameter;
    const Graph rewritten = forCudaGraphs(*g, {"adam-to-capturable-foreach"});
    size_t lerps = 0, addcdivsOfMoments = 0;
    for (const Node& n : rewritten.nodes()) {
      lerps += n.op == "aten::lerp";
      if (n.op == "aten::addcdiv") {
        const std::string& m = rewritten.value(n.args[1].value).name;
        addcdivsOfMoments += rewritten.findValue(m) && n.args[1].value != n.args[0].value &&
                             rewritten.nodes().end() != std::find_if(rewritten.nodes().begin(), rewritten.nodes().end(),
                                                                     [&](const Node& p) {
                                                                       return p.op == "aten::lerp" &&
                                                                              p.outputs[0] == n.args[1].value;
                                                                     });
      }
    }
    CHECK(lerps == parameters);
    CHECK(addcdivsOfMoments == parameters);
    const auto want = train(*g, 3);
    const auto got = train(withPasses(rewritten, {"optimizer-to-foreach"}), 3, Interpreter::Buffers::Reuse);
    for (const auto& [name, t] : want) {
      INFO(name);
      CHECK(at::allclose(got.at(name), t, 1e-5, 1e-6));
    }
  }
  // The CPU lowering keeps the optimizer pass's formulas (torch.optim's
  // single-tensor ones, the parity oracle), bit for bit: its pipeline leaves
  // the pass out.
  PipelineOptions cpu;
  const std::vector<std::string> cpuLowering = lowerPipeline(cpu);
  CHECK(std::find(cpuLowering.begin(), cpuLowering.end(), "adam-to-capturable-foreach") == cpuLowering.end());
  PipelineOptions cuda;
  cuda.lower.device = "cuda";
  const std::vector<std::string> cudaLowering = lowerPipeline(cuda);
  CHECK(std::find(cudaLowering.begin(), cudaLowering.end(), "adam-to-capturable-foreach") != cudaLowering.end());
  // With lr 0 the step size stays a factor (dividing by it would give NaN
  // where v is 0); the parameters do not move.
  const Graph frozen = trainStep("mlp", "adam", 0.05, 1e-2, 0.0);
  const Graph frozenRewritten = forCudaGraphs(frozen, {"adam-to-capturable-foreach"});
  size_t stepSizeFactors = 0;
  for (const Node& n : frozenRewritten.nodes()) stepSizeFactors += n.op == "aten::mul" && n.overload == "Tensor";
  CHECK(stepSizeFactors > 0);
  const auto before = initialState(frozen), after = train(frozenRewritten, 2);
  for (const auto& in : frozen.inputs()) {
    if (in.kind != InputKind::Parameter) continue;
    const std::string& name = frozen.value(in.value).name;
    INFO(name);
    CHECK(at::equal(after.at(name), before.at(name)));
  }
}

TEST_CASE("relu-to-gemm-epilogue trains the MLP as the unfused step does", "[unroll]") {
  // On the CPU _addmm_activation is addmm and relu, the kernels aten::linear
  // and aten::relu run: bit for bit.
  const Graph step = trainStep("mlp", "adam", 0.05);
  const Graph fused = forCudaGraphs(step, {"relu-to-gemm-epilogue"});
  size_t relus = 0, epilogues = 0;
  for (const Node& n : step.nodes()) relus += n.op == "aten::relu";
  for (const Node& n : fused.nodes()) epilogues += n.op == "aten::_addmm_activation";
  CHECK(relus > 0);
  CHECK(epilogues == relus);
  requireSameState(train(step, 3), train(fused, 3));
}

#ifdef SPMD_WITH_CUDA
// With a GPU only (the fused Adam this takes is ATen's CUDA kernel): the update spmd-unroll moves into the next iteration, whose forward
// reads the new parameters, becomes one spmd::fused_adam call too. Its
// oracle is the plain step lowered the same way. They agree to rounding, not
// bit for bit: the last update is the moved block's per-parameter copy, and
// the gradients of the two graphs differ at about 5e-6 relative (seen on an
// H200; not traced to a node), which exp_avg_sq, a square, doubles. A wrong
// update would be off by a good part of lr (0.05).
TEST_CASE("adam-to-fused-kernel takes the update that spmd-unroll moved", "[unroll][cuda]") {
  if (!torch::cuda::is_available()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  const Graph step = trainStep("mlp", "adam", 25, 1e-2);  // one bucket: every update moves
  const std::vector<std::string> lowering = {"relu-to-gemm-epilogue", "adam-to-fused-kernel", "dce"};
  const Graph plain = forCudaGraphs(step, lowering);
  const Graph moved = forCudaGraphs(withPasses(step, unrollPipeline({}), 4), lowering);
  for (const Graph* g : {&plain, &moved}) {
    size_t calls = 0, addcdivs = 0;
    for (const Node& n : g->nodes()) {
      calls += n.op == "spmd::fused_adam";
      addcdivs += n.op == "aten::addcdiv" && n.meta.iteration != IterationTag::LastOnly;
    }
    CHECK(calls == 1);
    CHECK(addcdivs == 0);
  }
  for (int steps : {1, 2, 4}) {
    INFO(steps << " steps");
    // Both with the memory plan's buffers: where a GEMM's operands lie can
    // change the kernel cuBLAS picks, and with it the rounding.
    const auto want = train(plain, steps, Interpreter::Buffers::Reuse, nullptr, at::kCUDA);
    const auto got = train(moved, steps, Interpreter::Buffers::Reuse, nullptr, at::kCUDA);
    double worst = 0;
    for (const auto& [name, t] : want) {
      const at::Tensor a = got.at(name).cpu().to(at::kDouble), b = t.cpu().to(at::kDouble);
      const double diff = (a - b).abs().max().item<double>();
      INFO(name << ": largest difference " << diff << ", largest |value| " << b.abs().max().item<double>());
      worst = std::max(worst, diff);
      CHECK(at::allclose(a, b, 1e-4, 1e-6));
    }
    std::printf("adam-to-fused-kernel (moved update), %d steps: largest difference from the plain fused step %.3g\n", steps,
                worst);
  }
}
#endif

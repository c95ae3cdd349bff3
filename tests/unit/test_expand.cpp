// spmd-expand's train step against LibTorch's own training loop on the same
// TorchScript module: forward, backward(), torch::optim. N steps of the
// expanded graph on one rank, run by the interpreter, must leave parameters,
// buffers and optimizer state equal to LibTorch's within 1e-5 relative.
#include "spmd/pipelines/pipelines.h"
#include "spmd/io/input_spec.h"
#include "spmd/io/torchscript.h"
#include "spmd/ir/verify.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"
#include "spmd/io/weights.h"

#include <cmath>
#include <set>
#include <torch/script.h>
#include <torch/torch.h>

#include "test_support.h"

using namespace spmd;
using spmd::testing::readFile;
using spmd::testing::sampleSpecs;

namespace {

std::map<std::string, at::Tensor> batch(const std::vector<InputSpec>& specs, int step) {
  torch::manual_seed(100 + step);
  std::map<std::string, at::Tensor> data;
  for (const auto& s : specs) {
    auto opts = at::TensorOptions().dtype(s.dtype);
    data[s.name] = c10::isFloatingType(s.dtype) ? torch::randn(s.shape, opts) : torch::randint(0, 4, s.shape, opts);
  }
  return data;
}

void requireClose(const at::Tensor& ours, const at::Tensor& ref, const std::string& what) {
  testing::requireClose(ours, ref, what, 1e-5, 1e-7);
}

// Python's torch.optim.Adam and AdamW (torch/optim/adam.py's single-tensor
// step, not capturable) in ATen's in-place calls: LibTorch's C++ torch::optim
// computes the first moment as mul + add, where torch.optim (and spmd) use
// lerp, which rounds otherwise and which Adam then amplifies.
struct TorchOptimAdam {
  struct State {
    at::Tensor expAvg, expAvgSq, maxExpAvgSq;
    int64_t step = 0;
  };
  std::vector<at::Tensor> params;
  OptimizerOptions o;
  std::vector<State> states;

  TorchOptimAdam(std::vector<at::Tensor> ps, const OptimizerOptions& options) : params(std::move(ps)), o(options) {
    for (const at::Tensor& p : params) {
      states.push_back({at::zeros_like(p), at::zeros_like(p), at::zeros_like(p), 0});
    }
  }

  void zeroGrad() {
    for (at::Tensor& p : params) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }

  void step() {
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i];
      if (!p.grad().defined()) continue;
      State& s = states[i];
      at::Tensor grad = p.grad();
      s.step += 1;
      if (o.kind == OptimizerKind::AdamW) {
        p.mul_(1 - o.lr * o.weightDecay);
      } else if (o.weightDecay != 0) {
        grad = grad.add(p, o.weightDecay);
      }
      s.expAvg.lerp_(grad, 1 - o.beta1);
      s.expAvgSq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
      const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(s.step));
      const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(s.step));
      const double stepSize = o.lr / bc1, bc2Sqrt = std::sqrt(bc2);
      at::Tensor second = s.expAvgSq;
      if (o.amsgrad) {
        at::maximum_out(s.maxExpAvgSq, s.maxExpAvgSq, s.expAvgSq);
        second = s.maxExpAvgSq;
      }
      const at::Tensor denom = (second.sqrt() / bc2Sqrt).add_(o.eps);
      p.addcdiv_(s.expAvg, denom, -stepSize);
    }
  }
};

// The reference: LibTorch training the TorchScript module itself, with
// torch::optim's SGD or torch.optim's Adam/AdamW.
struct Reference {
  torch::jit::Module module;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<TorchOptimAdam> adam;

  Reference(const std::string& path, const OptimizerOptions& o) : module(torch::jit::load(path)) {
    module.train();
    // A tied parameter once, as Python's named_parameters() names it (the
    // LM's head is its token embedding): twice, the optimizer would step it twice.
    std::set<const c10::TensorImpl*> seen;
    for (const auto& p : module.named_parameters()) {
      if (!seen.insert(p.value.unsafeGetTensorImpl()).second) continue;
      names.push_back(p.name);
      params.push_back(p.value);
    }
    if (o.kind == OptimizerKind::Sgd) {
      optimizer = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).dampening(o.dampening).nesterov(o.nesterov).weight_decay(o.weightDecay));
    } else {
      adam = std::make_unique<TorchOptimAdam>(params, o);
    }
  }

  at::Tensor step(const std::vector<InputSpec>& specs, const std::map<std::string, at::Tensor>& data) {
    if (optimizer) optimizer->zero_grad();
    if (adam) adam->zeroGrad();
    std::vector<c10::IValue> args;
    for (const auto& s : specs) args.emplace_back(data.at(s.name));
    at::Tensor loss = module.forward(args).toTensor();
    loss.backward();
    if (optimizer) optimizer->step();
    if (adam) adam->step();
    return loss.detach();
  }

  // The optimizer state of parameter i under spmd's names for it.
  std::map<std::string, at::Tensor> state(size_t i, const OptimizerOptions& o) {
    const std::string& n = names[i];
    if (adam) {
      const TorchOptimAdam::State& s = adam->states[i];
      if (s.step == 0) return {};
      std::map<std::string, at::Tensor> out = {{n + ".exp_avg", s.expAvg}, {n + ".exp_avg_sq", s.expAvgSq},
                                               {n + ".step", torch::tensor(static_cast<float>(s.step))}};
      if (o.amsgrad) out[n + ".max_exp_avg_sq"] = s.maxExpAvgSq;
      return out;
    }
    auto& all = optimizer->state();
    auto it = testing::findOptimizerState(all, params[i]);
    std::map<std::string, at::Tensor> out;
    if (it == all.end()) return out;
    out[n + ".momentum_buffer"] = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
    return out;
  }
};

// While one lives, PyTorch's CPU attention runs its math backend.
class MathAttentionOnly {
 public:
  MathAttentionOnly() : flash_(at::globalContext().userEnabledFlashSDP()) { at::globalContext().setSDPUseFlash(false); }
  ~MathAttentionOnly() { at::globalContext().setSDPUseFlash(flash_); }
  MathAttentionOnly(const MathAttentionOnly&) = delete;
  MathAttentionOnly& operator=(const MathAttentionOnly&) = delete;

 private:
  bool flash_;
};

// `bucketCapMb` > 0 also runs spmd-split's passes: on one rank the bucketed
// all-reduces must not change a thing.
void trainInLockstep(const std::string& sample, const OptimizerOptions& o, int steps, double bucketCapMb = 0) {
  const std::string path = std::string(SPMD_SOURCE_DIR) + "/samples/" + sample + ".pt";
  const auto specs = sampleSpecs(sample);
  Graph graph = importTorchScript(readFile(path), path, specs);
  PipelineOptions options;
  options.optimizer = o;
  runPasses(graph, expandPipeline(options), options, DebugOptions{});
  if (bucketCapMb > 0) {
    options.buckets.capMb = bucketCapMb;
    runPasses(graph, splitPipeline(options), options, DebugOptions{});
    REQUIRE(graph.buckets().size() > 1);
  }
  REQUIRE(verifyGraph(graph).empty());

  // Graph state: weights from the file, optimizer state at zero.
  std::map<std::string, at::Tensor> state = loadWeights(graph.weights());
  for (const auto& in : graph.inputs()) {
    const Value& v = graph.value(in.value);
    if (in.kind == InputKind::State) state[v.name] = torch::zeros(v.shape, at::TensorOptions().dtype(v.dtype));
  }
  Interpreter interpreter(graph);
  // scaled_dot_product_attention by its math backend, which spmd records
  // and runs on the CPU: PyTorch's fused CPU kernel rounds otherwise, and
  // Adam turns such differences (the key bias's gradient is rounding noise)
  // into lr-sized ones.
  MathAttentionOnly mathAttention;
  Reference ref(path, o);
  for (int step = 0; step < steps; ++step) {
    auto data = batch(specs, step);
    std::map<std::string, at::Tensor> inputs = state;
    for (const auto& [name, t] : data) inputs[name] = t;
    RunResult got = interpreter.run(inputs);
    for (const auto& [name, t] : got.updates) state[name] = t;
    at::Tensor refLoss = ref.step(specs, data);
    requireClose(got.outputs.at(0), refLoss, sample + " loss at step " + std::to_string(step));
  }
  for (size_t i = 0; i < ref.params.size(); ++i) {
    requireClose(state.at(ref.names[i]), ref.params[i], "parameter " + ref.names[i]);
    for (const auto& [name, t] : ref.state(i, o)) requireClose(state.at(name), t, "optimizer state " + name);
  }
  for (const auto& b : ref.module.named_buffers()) requireClose(state.at(b.name), b.value, "buffer " + b.name);
}

OptimizerOptions sgd(double lr, double momentum, double dampening, bool nesterov, double wd) {
  OptimizerOptions o;
  o.kind = OptimizerKind::Sgd;
  o.lr = lr;
  o.momentum = momentum;
  o.dampening = dampening;
  o.nesterov = nesterov;
  o.weightDecay = wd;
  return o;
}

OptimizerOptions adam(OptimizerKind kind, double lr, double wd, bool amsgrad) {
  OptimizerOptions o;
  o.kind = kind;
  o.lr = lr;
  o.weightDecay = wd;
  o.amsgrad = amsgrad;
  return o;
}

}  // namespace

TEST_CASE("expanded samples train in lockstep with LibTorch", "[expand]") {
  SECTION("mlp adam") { trainInLockstep("mlp", adam(OptimizerKind::Adam, 1e-2, 0.0, false), 5); }
  SECTION("mlp adam amsgrad weight decay") { trainInLockstep("mlp", adam(OptimizerKind::Adam, 1e-3, 0.1, true), 4); }
  SECTION("mlp sgd plain") { trainInLockstep("mlp", sgd(1e-3, 0.0, 0.0, false, 0.0), 4); }
  SECTION("lm adamw") { trainInLockstep("lm", adam(OptimizerKind::AdamW, 1e-2, 1e-2, false), 5); }
  SECTION("lm sgd nesterov") { trainInLockstep("lm", sgd(0.05, 0.9, 0.0, true, 1e-4), 4); }
  SECTION("cnn sgd momentum") { trainInLockstep("cnn", sgd(0.05, 0.9, 0.1, false, 5e-4), 5); }
  SECTION("cnn adam") { trainInLockstep("cnn", adam(OptimizerKind::Adam, 1e-2, 0.0, false), 4); }
  SECTION("cnn adamw amsgrad") { trainInLockstep("cnn", adam(OptimizerKind::AdamW, 1e-2, 0.05, true), 4); }
  SECTION("mlp adam, bucketed") { trainInLockstep("mlp", adam(OptimizerKind::Adam, 1e-2, 0.0, false), 3, 0.05); }
  SECTION("lm adamw, bucketed") { trainInLockstep("lm", adam(OptimizerKind::AdamW, 1e-2, 1e-2, false), 3, 0.02); }
  SECTION("cnn sgd, bucketed") { trainInLockstep("cnn", sgd(0.05, 0.9, 0.0, false, 0.0), 3, 0.002); }
}

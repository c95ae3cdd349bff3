// The recorded derivatives against LibTorch autograd run on real tensors: a
// one-op forward graph, loss = sum_k sum(output_k * w_k), differentiated by
// the autodiff pass and run by the interpreter, must give the gradients
// autograd computes through the same forward graph, in float64, with
// broadcasting and odd shapes. The ops include composites whose backward
// reads results they do not return (layer_norm, cross_entropy) and ops the
// project once had no rule for (hardtanh, baddbmm, index, unflatten).
#include "spmd/ir/verify.h"
#include "spmd/ir/builder.h"
#include "spmd/passes/derivatives.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"

#include <torch/torch.h>

#include <set>

// Last: glog (via LibTorch) defines CHECK too, and Catch's must win.
#include "catch.h"

using namespace spmd;

namespace {

using Shape = std::vector<int64_t>;
using Ids = std::vector<ValueId>;

struct Case {
  std::string name;
  std::string op;
  std::vector<Shape> params;                           // float64 parameters p0, p1, ...
  std::function<std::vector<Arg>(const Ids& p, const Ids& d)> args;
  std::vector<at::Tensor> data = {};                   // data inputs d0, d1, ... (fixed tensors)
  bool positive = false;                               // parameters drawn from (0.5, 1.5)
  std::vector<at::Tensor> buffers = {};                // buffer inputs, appended to d
};

Arg v(ValueId id) { return Arg::tensor(id); }
Arg i(int64_t x) { return Arg::ofInt(x); }
Arg f(double x) { return Arg::ofFloat(x); }
Arg b(bool x) { return Arg::ofBool(x); }
Arg none() { return Arg::none(); }
Arg ints(Shape s) { return intsArg(std::move(s)); }
Arg list(Ids ids) {
  Arg a;
  a.kind = Arg::Kind::Values;
  a.values = std::move(ids);
  return a;
}
at::Tensor indices(Shape shape, int64_t high) { return torch::randint(0, high, shape, torch::kLong); }

struct Built {
  Graph graph;
  Ids params;
  std::map<std::string, at::Tensor> inputs;
};

Built build(const Case& c) {
  Built out;
  Graph& g = out.graph;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  for (size_t k = 0; k < c.params.size(); ++k) {
    std::string name = "p" + std::to_string(k);
    out.params.push_back(g.addInput(Value{name, c10::ScalarType::Double, c.params[k]}, InputKind::Parameter));
    at::Tensor t = torch::randn(c.params[k], opts);
    out.inputs[name] = c.positive ? t.abs().add(0.5) : t;
  }
  Ids data;
  auto addData = [&](const at::Tensor& t, InputKind kind) {
    std::string name = "d" + std::to_string(data.size());
    data.push_back(g.addInput(Value{name, t.scalar_type(), t.sizes().vec()}, kind));
    out.inputs[name] = t;
  };
  for (const auto& t : c.data) addData(t, InputKind::Data);
  for (const auto& t : c.buffers) addData(t, InputKind::Buffer);

  GraphBuilder builder(g);
  auto results = builder.callMulti(c.op, c.args(out.params, data));
  ValueId loss = kNoValue;
  for (size_t k = 0; k < results.size(); ++k) {
    if (results[k] == kNoValue || !c10::isFloatingType(g.value(results[k]).dtype)) continue;
    std::string name = "w" + std::to_string(k);
    ValueId w = g.addInput(Value{name, c10::ScalarType::Double, g.value(results[k]).shape}, InputKind::Data);
    out.inputs[name] = torch::randn(g.value(results[k]).shape, opts);
    ValueId term = builder.call("aten::sum", {v(builder.mul(results[k], w)), none()});
    loss = loss == kNoValue ? term : builder.add(loss, term);
  }
  g.addOutput(loss);
  return out;
}

void checkCase(const Case& c) {
  INFO(c.name);
  torch::manual_seed(7);
  Built built = build(c);
  const Graph forward = built.graph;

  // Oracle: LibTorch autograd through the forward graph.
  std::map<std::string, at::Tensor> leaves = built.inputs;
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < built.params.size(); ++k) {
    at::Tensor& t = leaves["p" + std::to_string(k)];
    t = t.detach().clone().requires_grad_(true);
    params.push_back(t);
  }
  at::Tensor loss = Interpreter(forward).run(leaves).outputs.at(0);
  auto expected = torch::autograd::grad({loss}, params, {}, false, false, /*allow_unused=*/true);

  // Ours: the autodiff pass, gradients exposed as outputs.
  Graph& g = built.graph;
  runPasses(g, {"autodiff"}, PipelineOptions{}, DebugOptions{});
  auto problems = verifyGraph(g);
  INFO((problems.empty() ? std::string() : problems[0].where + ": " + problems[0].what));
  REQUIRE(problems.empty());
  std::map<ValueId, ValueId> gradOf;
  for (const auto& grad : g.gradients()) gradOf[grad.parameter] = grad.value;
  for (ValueId p : built.params) {
    if (gradOf.count(p)) g.addOutput(gradOf[p]);
  }
  RunResult got = Interpreter(g).run(built.inputs);
  CHECK(torch::allclose(got.outputs.at(0), loss.detach(), 1e-12, 1e-12));
  size_t next = 1;
  for (size_t k = 0; k < built.params.size(); ++k) {
    INFO("gradient of p" << k);
    if (!expected[k].defined()) {
      CHECK_FALSE(gradOf.count(built.params[k]));
      continue;
    }
    REQUIRE(gradOf.count(built.params[k]));
    const at::Tensor& ours = got.outputs.at(next++);
    REQUIRE(ours.sizes() == expected[k].sizes());
    CHECK(torch::allclose(ours, expected[k], 1e-9, 1e-10));
  }
}

std::vector<Case> cases() {
  at::Tensor targets = torch::tensor({0, 3, 6, 2, 3}, torch::kLong);
  at::Tensor ignored = torch::tensor({0, -100, 6, 2, -100}, torch::kLong);
  return {
      {"linear 3-D input with bias", "aten::linear", {{2, 3, 5}, {4, 5}, {4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2])}; }},
      {"linear without bias", "aten::linear", {{7, 5}, {3, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), none()}; }},
      {"linear 1-D input", "aten::linear", {{5}, {3, 5}, {3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2])}; }},
      {"addmm with broadcast bias", "aten::addmm", {{4}, {3, 5}, {5, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2]), f(0.5), i(2)}; }},
      {"mm", "aten::mm", {{3, 5}, {5, 2}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }},
      {"bmm", "aten::bmm", {{2, 3, 5}, {2, 5, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }},
      {"matmul batched broadcast", "aten::matmul", {{2, 1, 3, 4}, {5, 4, 2}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }},
      {"matmul 1-D @ 3-D", "aten::matmul", {{4}, {2, 4, 3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }},
      {"matmul 3-D @ 1-D", "aten::matmul", {{2, 3, 4}, {4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }},
      {"matmul dot", "aten::matmul", {{6}, {6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }},
      {"t", "aten::t", {{3, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"transpose", "aten::transpose.int", {{2, 3, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(0), i(-1)}; }},
      {"permute", "aten::permute", {{2, 3, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({2, 0, 1})}; }},
      {"view", "aten::view", {{2, 3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({6, -1})}; }},
      {"reshape", "aten::reshape", {{2, 3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({4, 6})}; }},
      {"flatten", "aten::flatten.using_ints", {{2, 3, 4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1), i(2)}; }},
      {"unsqueeze", "aten::unsqueeze", {{3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1)}; }},
      {"squeeze.dim", "aten::squeeze.dim", {{3, 1, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1)}; }},
      {"contiguous", "aten::contiguous", {{3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), Arg{Arg::Kind::MemoryFormat}}; }},
      {"expand", "aten::expand", {{3, 1}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({2, 3, 4}), b(false)}; }},
      {"slice with step", "aten::slice.Tensor", {{4, 7}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1), i(1), i(6), i(2)}; }},
      {"select", "aten::select.int", {{4, 7}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(0), i(-1)}; }},
      {"cat", "aten::cat", {{2, 3}, {2, 1}, {2, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{list({p[0], p[1], p[2]}), i(1)}; }},
      {"split uneven", "aten::split.Tensor", {{7, 2}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(3), i(0)}; }},
      {"chunk", "aten::chunk", {{2, 6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(3), i(-1)}; }},
      {"broadcast_tensors", "aten::broadcast_tensors", {{3, 1}, {4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{list({p[0], p[1]})}; }},
      {"add broadcast alpha", "aten::add.Tensor", {{3, 1}, {4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), f(2.5)}; }},
      {"add same operand", "aten::add.Tensor", {{3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[0]), i(1)}; }},
      {"sub broadcast", "aten::sub.Tensor", {{2, 3}, {3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), i(1)}; }},
      {"mul broadcast", "aten::mul.Tensor", {{2, 1, 3}, {4, 1}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }},
      {"div broadcast", "aten::div.Tensor", {{2, 3}, {3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1])}; }, {}, true},
      {"add scalar", "aten::add.Scalar", {{3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), f(1.5), i(1)}; }},
      {"sub scalar", "aten::sub.Scalar", {{3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), f(1.5), i(1)}; }},
      {"rsub scalar", "aten::rsub.Scalar", {{3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1), f(2.0)}; }},
      {"mul scalar", "aten::mul.Scalar", {{3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), f(-0.25)}; }},
      {"div scalar", "aten::div.Scalar", {{3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), f(3.0)}; }},
      {"neg", "aten::neg", {{3, 2}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"pow 3", "aten::pow.Tensor_Scalar", {{3, 2}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(3)}; }},
      {"pow 0.5", "aten::pow.Tensor_Scalar", {{3, 2}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), f(0.5)}; }, {}, true},
      {"sqrt", "aten::sqrt", {{5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }, {}, true},
      {"rsqrt", "aten::rsqrt", {{5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }, {}, true},
      {"exp", "aten::exp", {{5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"log", "aten::log", {{5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }, {}, true},
      {"relu", "aten::relu", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"gelu exact", "aten::gelu", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), strArg("none")}; }},
      {"gelu tanh", "aten::gelu", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), strArg("tanh")}; }},
      {"silu", "aten::silu", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"tanh", "aten::tanh", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"sigmoid", "aten::sigmoid", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"softmax", "aten::softmax.int", {{3, 4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1), none()}; }},
      {"log_softmax", "aten::log_softmax.int", {{3, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(-1), none()}; }},
      {"layer_norm affine", "aten::layer_norm", {{2, 3, 6}, {6}, {6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({6}), v(p[1]), v(p[2]), f(1e-5), b(true)}; }},
      {"layer_norm plain 2 dims", "aten::layer_norm", {{2, 3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({3, 4}), none(), none(), f(1e-5), b(true)}; }},
      {"embedding", "aten::embedding", {{10, 4}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), i(-1), b(false), b(false)}; }, {torch::tensor({{1, 3, 3}, {9, 0, 1}}, torch::kLong)}},
      {"embedding padding_idx", "aten::embedding", {{10, 4}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), i(3), b(false), b(false)}; }, {torch::tensor({1, 3, 3, 0}, torch::kLong)}},
      {"dropout p=0", "aten::dropout", {{4, 3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), f(0.0), b(true)}; }},
      {"cross_entropy mean", "aten::cross_entropy_loss", {{5, 7}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), none(), i(1), i(-100), f(0.0)}; }, {targets}},
      {"cross_entropy sum ignore_index", "aten::cross_entropy_loss", {{5, 7}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), none(), i(2), i(-100), f(0.0)}; }, {ignored}},
      {"cross_entropy class weights", "aten::cross_entropy_loss", {{5, 7}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), v(d[1]), i(1), i(-100), f(0.0)}; }, {targets, torch::rand({7}, torch::kFloat64).add(0.5)}},
      {"nll_loss", "aten::nll_loss", {{5, 7}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), none(), i(1), i(-100)}; }, {targets}},
      {"mse_loss both sides", "aten::mse_loss", {{3, 4}, {3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), i(1)}; }},
      {"mse_loss sum", "aten::mse_loss", {{3, 4}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), i(2)}; }, {torch::randn({3, 4}, torch::kFloat64)}},
      {"sum", "aten::sum", {{3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), none()}; }},
      {"sum dims", "aten::sum.dim_IntList", {{3, 4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({0, -1}), b(false), none()}; }},
      {"sum keepdim", "aten::sum.dim_IntList", {{3, 4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({1}), b(true), none()}; }},
      {"mean", "aten::mean", {{3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), none()}; }},
      {"mean dims", "aten::mean.dim", {{3, 4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({1, 2}), b(false), none()}; }},
      {"conv2d stride padding groups", "aten::conv2d", {{2, 4, 7, 6}, {6, 2, 3, 3}, {6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2]), ints({2, 1}), ints({1, 0}), ints({1, 1}), i(2)}; }},
      {"conv2d no bias", "aten::conv2d", {{1, 3, 5, 5}, {2, 3, 2, 2}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), none(), ints({1, 1}), ints({0, 0}), ints({2, 2}), i(1)}; }},
      {"conv1d", "aten::conv1d", {{2, 3, 9}, {4, 3, 3}, {4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2]), ints({2}), ints({1}), ints({1}), i(1)}; }},
      {"convolution transposed", "aten::convolution", {{2, 4, 5, 5}, {4, 3, 3, 3}, {3}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2]), ints({2, 2}), ints({1, 1}), ints({1, 1}), b(true), ints({1, 1}), i(1)}; }},
      {"batch_norm_train", "spmd::batch_norm_train", {{4, 3, 5, 5}, {3}, {3}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2]), v(d[0]), v(d[1]), f(0.1), f(1e-5)}; }, {}, false, {torch::zeros({3}, torch::kFloat64), torch::ones({3}, torch::kFloat64)}},
      {"max_pool2d", "aten::max_pool2d", {{2, 3, 7, 6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({3, 2}), ints({2, 2}), ints({1, 0}), ints({1, 1}), b(true)}; }},
      {"avg_pool2d", "aten::avg_pool2d", {{2, 3, 7, 6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({3, 3}), ints({2, 2}), ints({1, 1}), b(false), b(false), none()}; }},
      {"adaptive_avg_pool2d", "aten::adaptive_avg_pool2d", {{2, 3, 7, 6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({2, 3})}; }},
      {"adaptive_avg_pool2d to 1x1", "aten::adaptive_avg_pool2d", {{2, 3, 5, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({1, 1})}; }},
      {"triu", "aten::triu", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1)}; }},
      {"masked_fill", "aten::masked_fill.Scalar", {{3, 4}}, [](const Ids& p, const Ids& d) { return std::vector<Arg>{v(p[0]), v(d[0]), f(-1e9)}; }, {torch::rand({3, 4}) > 0.5}},
      {"hardtanh (mobilenet_v2's ReLU6)", "aten::hardtanh", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), f(0.0), f(0.6)}; }},
      {"hardswish", "aten::hardswish", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0])}; }},
      {"baddbmm (TransformerEncoder attention)", "aten::baddbmm", {{2, 3, 4}, {2, 3, 5}, {2, 5, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[1]), v(p[2]), f(0.5), f(2.0)}; }},
      {"index with a None and a tensor index", "aten::index.Tensor", {{3, 5, 4}}, [](const Ids& p, const Ids& d) { Arg idx = list({kNoValue, d[0]}); return std::vector<Arg>{v(p[0]), idx}; }, {torch::tensor({4, 0, 4, 2}, torch::kLong)}},
      {"unflatten", "aten::unflatten.int", {{3, 12}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1), ints({3, 4})}; }},
      {"cumsum", "aten::cumsum", {{3, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(1), none()}; }},
      {"group_norm", "aten::group_norm", {{2, 6, 3}, {6}, {6}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), i(3), v(p[1]), v(p[2]), f(1e-5), b(true)}; }},
      {"stack", "aten::stack", {{3, 4}, {3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{list({p[0], p[1]}), i(1)}; }},
      {"as_strided (its backward copies through a view of a zeroed buffer)", "aten::as_strided", {{4, 5}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), ints({3, 2}), ints({1, 4}), i(1)}; }},
      {"the same value twice (mul x*x)", "aten::mul.Tensor", {{3, 4}}, [](const Ids& p, const Ids&) { return std::vector<Arg>{v(p[0]), v(p[0])}; }},
  };
}

}  // namespace

TEST_CASE("recorded derivatives equal LibTorch autograd", "[autodiff]") {
  for (const Case& c : cases()) checkCase(c);
}

TEST_CASE("ops LibTorch cannot differentiate are reported together with their source lines", "[autodiff]") {
  Graph g;
  ValueId p = g.addInput(Value{"p", c10::ScalarType::Float, {3}}, InputKind::Parameter);
  ValueId q = g.addInput(Value{"q", c10::ScalarType::Float, {3}}, InputKind::Parameter);
  GraphBuilder builder(g);
  builder.setMeta(NodeMeta{"model.py:4", NodeRole::Forward});
  ValueId a = builder.call("aten::histc", {v(p), i(4), f(0.0), f(1.0)});
  builder.setMeta(NodeMeta{"model.py:5", NodeRole::Forward});
  ValueId c = builder.call("aten::histc", {v(q), i(4), f(0.0), f(1.0)});
  builder.setMeta(NodeMeta{"model.py:6", NodeRole::Forward});
  ValueId s = builder.call("aten::sum", {v(builder.add(a, c)), none()});
  g.addOutput(s);
  try {
    runPasses(g, {"autodiff"}, PipelineOptions{}, DebugOptions{});
    FAIL("expected a diagnostic");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what ==
          "cannot differentiate the path from the parameters to the loss: aten::histc at model.py:4 (LibTorch's "
          "autograd gives %p no gradient); aten::histc at model.py:5 (LibTorch's autograd gives %q no gradient); "
          "parameters that reach the loss without a gradient: p, q");
  }
}

TEST_CASE("frozen parameters, integer paths and unused parameters get no gradient", "[autodiff]") {
  Graph g;
  ValueId w = g.addInput(Value{"w", c10::ScalarType::Float, {3}}, InputKind::Parameter);
  ValueId frozen = g.addInput(Value{"frozen", c10::ScalarType::Float, {3}}, InputKind::Parameter, false);
  g.addInput(Value{"unused", c10::ScalarType::Float, {3}}, InputKind::Parameter);
  GraphBuilder builder(g);
  ValueId s = builder.call("aten::sum", {v(builder.mul(w, frozen)), none()});
  g.addOutput(s);
  runPasses(g, {"autodiff"}, PipelineOptions{}, DebugOptions{});
  REQUIRE(g.gradients().size() == 1);
  CHECK(g.gradients()[0].parameter == w);
  CHECK(verifyGraph(g).empty());
}

TEST_CASE("a non-scalar loss is rejected", "[autodiff]") {
  Graph g;
  ValueId w = g.addInput(Value{"w", c10::ScalarType::Float, {3}}, InputKind::Parameter);
  GraphBuilder builder(g);
  g.addOutput(builder.call("aten::relu", {v(w)}));
  try {
    runPasses(g, {"autodiff"}, PipelineOptions{}, DebugOptions{});
    FAIL("expected a diagnostic");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()) == "the loss must be a floating-point scalar, got %relu: f32[3]");
  }
}

// Its recorded derivative (through the ops it is made of on the meta device)
// against autograd through the op itself.
TEST_CASE("scaled_dot_product_attention", "[autodiff]") {
  auto schema = c10::Dispatcher::singleton().findSchema({"aten::scaled_dot_product_attention", ""});
  REQUIRE(schema);
  const size_t arity = schema->schema().arguments().size();
  auto sdpaArgs = [arity](const Ids& p, std::optional<ValueId> mask, bool causal) {
    std::vector<Arg> args{v(p[0]), v(p[1]), v(p[2]), mask ? v(*mask) : none(), f(0.0), b(causal)};
    if (arity > 6) args.push_back(none());     // scale
    if (arity > 7) args.push_back(b(false));   // enable_gqa
    return args;
  };
  checkCase({"sdpa causal", "aten::scaled_dot_product_attention", {{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}},
             [&](const Ids& p, const Ids&) { return sdpaArgs(p, std::nullopt, true); }});
  checkCase({"sdpa float mask, cross lengths", "aten::scaled_dot_product_attention", {{2, 6, 4}, {2, 7, 4}, {2, 7, 3}},
             [&](const Ids& p, const Ids& d) { return sdpaArgs(p, d[0], false); }, {torch::randn({6, 7}, torch::kFloat64)}});
  checkCase({"sdpa bool mask", "aten::scaled_dot_product_attention", {{2, 6, 4}, {2, 6, 4}, {2, 6, 4}},
             [&](const Ids& p, const Ids& d) { return sdpaArgs(p, d[0], false); },
             {torch::ones({6, 6}, torch::kBool).tril()}});
}

// Dropout with p > 0 in training mode: the mask LibTorch's decomposition
// draws is random, so the check is statistical, plus the exact relation
// between the forward and the recorded backward: with x = 1, d sum(dropout(x))
// / dx is the scaled mask the forward applied.
TEST_CASE("dropout with p > 0 trains with the mask its forward drew", "[autodiff]") {
  Graph g;
  ValueId x = g.addInput(Value{"x", c10::ScalarType::Float, {4000}}, InputKind::Parameter);
  GraphBuilder builder(g);
  ValueId dropped = builder.call("aten::dropout", {v(x), f(0.3), b(true)});
  g.addOutput(builder.call("aten::sum", {v(dropped), none()}));
  runPasses(g, {"autodiff"}, PipelineOptions{}, DebugOptions{});
  REQUIRE(verifyGraph(g).empty());
  REQUIRE(g.gradients().size() == 1);
  g.addOutput(dropped);
  g.addOutput(g.gradients()[0].value);
  torch::manual_seed(3);
  RunResult got = Interpreter(g).run({{"x", torch::ones({4000})}});
  const at::Tensor out = got.outputs.at(1), grad = got.outputs.at(2);
  CHECK(torch::equal(out, grad));
  const double zeros = (out == 0).to(torch::kDouble).mean().item<double>();
  CHECK(zeros > 0.25);
  CHECK(zeros < 0.35);
  CHECK(torch::allclose(out.masked_select(out != 0), torch::full({1}, 1.0 / 0.7)));
}

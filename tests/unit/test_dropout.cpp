// Dropout's mask drawn inside the generated kernels (spmd-lower's
// dropout-mask-in-kernel; the `bernoulli` statement of ops/pointwise_program.h):
//  - on the CPU (CI): the reference kernel's words against Philox4x32-10's
//    published known answer; a dropout that LibTorch's autograd
//    differentiated, lowered, trains with the mask its forward drew, and its
//    products are ATen's products with that mask;
//  - on CUDA (builds against a CUDA LibTorch, with a GPU; not in CI): the
//    generated kernels draw the CPU reference's masks bit for bit.
#include "spmd/ir/builder.h"
#include "spmd/ir/verify.h"
#include "spmd/backend/generated_kernels.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <exception>
#include <string>
#include <vector>

#include "test_support.h"

using namespace spmd;

namespace {

std::vector<at::Tensor> runFused(const std::vector<at::Tensor>& inputs, const std::string& program) {
  ensureSpmdOpsRegistered();
  static const auto fused = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("spmd::fused", "")
                                .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view)>();
  return fused.call(inputs, program);
}

at::Tensor seedTensor(int64_t seed, const at::Device& device = at::kCPU) {
  return at::scalar_tensor(seed, at::TensorOptions().dtype(at::kLong).device(device));
}

// mask * in1 over in1's shape: the mask itself where in1 is ones.
std::string maskProgram(const std::string& dtype, double keep) {
  return "t0:" + dtype + " = bernoulli(in0, " + std::to_string(keep) + ", 1.0); t1:" + dtype + " = mul(in1, t0); return t1";
}

// The message of what `f` throws ("" if nothing).
template <typename F>
std::string errorOf(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

int countOps(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.qualifiedName() == op;
  return n;
}

// sum(dropout(x, p)) as a training step, differentiated and lowered as
// spmd-lower does for CUDA; outputs: the loss, the dropped x, x's gradient.
Graph loweredDropout(c10::ScalarType dtype, std::vector<int64_t> shape, double p) {
  Graph g;
  const ValueId x = g.addInput(Value{"x", dtype, std::move(shape)}, InputKind::Parameter);
  GraphBuilder builder(g);
  const ValueId dropped = builder.call("aten::dropout", {Arg::tensor(x), Arg::ofFloat(p), Arg::ofBool(true)});
  g.addOutput(builder.call("aten::sum", {Arg::tensor(dropped), dtypeArg(at::kFloat)}));
  runPasses(g, {"autodiff"}, PipelineOptions{}, DebugOptions{});
  REQUIRE(g.gradients().size() == 1);
  g.addOutput(dropped);
  g.addOutput(g.gradients()[0].value);
  REQUIRE(countOps(g, "aten::bernoulli.p") == 1);
  runPasses(g, {"dropout-mask-in-kernel", "fuse-pointwise"}, PipelineOptions{}, DebugOptions{});
  REQUIRE(verifyGraph(g).empty());
  return g;
}

}  // namespace

// Random123's known answer for Philox4x32-10 with key 0 and counter 0 is
// 6627e8d5 e169c58d bc57ac4c 9b00dbd8: as fractions of 2^24 of their top
// 24 bits, 0.3990, 0.8805, 0.7357, 0.6055, the first four elements' draws.
TEST_CASE("a bernoulli program draws Philox4x32-10's words in element order", "[dropout]") {
  const at::Tensor ones = at::ones({4});
  struct Expect {
    double keep;
    std::vector<float> mask;
  };
  for (const Expect& e : {Expect{0.39, {0, 0, 0, 0}}, Expect{0.40, {1, 0, 0, 0}}, Expect{0.61, {1, 0, 0, 1}},
                          Expect{0.74, {1, 0, 1, 1}}, Expect{0.89, {1, 1, 1, 1}}}) {
    INFO("keep " << e.keep);
    const at::Tensor mask = runFused({seedTensor(0), ones}, maskProgram("f32", e.keep))[0];
    CHECK(at::equal(mask, at::tensor(e.mask)));
  }
}

// The generated kernels keep an element by one integer compare of its word
// with keepBound; the CPU reference by keepsElement's float compare.
TEST_CASE("keepBound is where keepsElement stops keeping", "[dropout]") {
  for (float p : {0.9f, 0.75f, 0.5f, 0.1f, 1e-7f, 0.3333333f, 0.99999994f}) {
    INFO("p " << p);
    const uint64_t bound = keepBound(p);
    REQUIRE(bound > 0);
    REQUIRE(bound < (uint64_t{1} << 32));
    CHECK(keepsElement(static_cast<uint32_t>(bound - 1), p));
    CHECK(!keepsElement(static_cast<uint32_t>(bound), p));
    CHECK(keepsElement(0, p));
    CHECK(!keepsElement(0xffffffffu, p));
  }
  CHECK(keepBound(0.0f) == 0);
  CHECK(keepBound(1.0f) == uint64_t{1} << 32);
  CHECK(keepsElement(0xffffffffu, 1.0f));
}

TEST_CASE("a bernoulli program's seed must be a 0-dim int64 input", "[dropout]") {
  CHECK(errorOf([] { parsePointwiseProgram("t0:f32 = bernoulli(0.5, 0.5, 1.0); return t0"); })
            .find("bernoulli takes a seed input") != std::string::npos);
  CHECK(errorOf([] { runFused({at::ones({4}), at::ones({4})}, maskProgram("f32", 0.5)); })
            .find("a 0-dim int64 tensor") != std::string::npos);
}

TEST_CASE("a lowered dropout trains with the mask its forward drew", "[dropout]") {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    const Graph g = loweredDropout(dtype, {64, 64}, 0.25);
    CHECK(countOps(g, "aten::bernoulli.p") == 0);
    CHECK(countOps(g, "spmd::dropout_seed") == 1);
    CHECK(countOps(g, "spmd::fused") == 2);  // the forward's product and the backward's

    at::manual_seed(11);
    const RunResult ones = Interpreter(g).run({{"x", at::ones({64, 64}, dtype)}});
    const at::Tensor dropped = ones.outputs.at(1), grad = ones.outputs.at(2);
    // With x = 1 and d loss / d dropped = 1, both are the scaled mask.
    CHECK(at::equal(dropped, grad));
    const double zeros = (dropped == 0).to(at::kDouble).mean().item<double>();
    CHECK(zeros > 0.22);
    CHECK(zeros < 0.28);
    const at::Tensor scale = at::scalar_tensor(1 / 0.75, at::kDouble).to(dtype);
    CHECK(at::equal(dropped.masked_select(dropped != 0), scale.expand({(dropped != 0).sum().item<int64_t>()})));

    // Random x: the products are ATen's, with that mask, rounded in dtype.
    const at::Tensor x = (at::rand({64, 64}) * 4 - 2).to(dtype);
    at::manual_seed(11);
    const RunResult random = Interpreter(g).run({{"x", x}});
    CHECK(at::equal(random.outputs.at(1), at::mul(x, dropped)));

    // The seed comes from the default generator: another seed, another mask.
    at::manual_seed(12);
    CHECK(!at::equal(Interpreter(g).run({{"x", at::ones({64, 64}, dtype)}}).outputs.at(1), dropped));
  }
}

#ifdef SPMD_WITH_CUDA
// GPU only: the device's Philox (pointwise_formulas.cpp) against LibTorch's
// at::philox_engine, through the CPU reference, for both kernels: the
// vector one (aligned, element count a multiple of the width) and the
// scalar one (an odd count).
TEST_CASE("generated kernels draw the CPU reference's masks", "[dropout][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  const at::Device gpu(at::kCUDA, 0);
  for (const std::string dtype : {"f32", "bf16"}) {
    const at::ScalarType t = dtype == "f32" ? at::kFloat : at::kBFloat16;
    for (int64_t numel : {int64_t{1} << 20, int64_t{1} * 1000 * 1001 + 3}) {
      for (int64_t seed : {int64_t{0}, int64_t{0x1234567890abcdef}, int64_t{-5}}) {
        INFO(dtype << ", " << numel << " elements, seed " << seed);
        const at::Tensor ones = at::ones({numel}, t);
        const at::Tensor cpu = runFused({seedTensor(seed), ones}, maskProgram(dtype, 0.9))[0];
        const at::Tensor cuda = runFused({seedTensor(seed, gpu), ones.to(gpu)}, maskProgram(dtype, 0.9))[0].cpu();
        CHECK(at::equal(cpu, cuda));
        const double kept = cpu.to(at::kDouble).mean().item<double>();
        CHECK(kept > 0.89);
        CHECK(kept < 0.91);
      }
    }
  }
}
#endif

// spmd::layer_norm(_backward) against the ATen ops layer-norm-to-kernel replaces
// (LayerNorm, the bf16 cast after it, its backward with the incoming
// gradient's cast and the residual gradient's add), and spmd::column_sum
// against the sums column-sum-to-kernel replaces. The interpreter runs the
// unfused and the fused graph on the same random inputs:
//  - on the CPU (CI): the fused ops' reference kernels (ATen's own LayerNorm
//    and sum kernels) must give the same values, so the pass's rewiring (which value
//    goes where, which casts and adds it took in) is what is tested;
//  - on CUDA (a CUDA LibTorch and a GPU; not in CI): the generated kernels
//    against ATen's CUDA kernels, within fp32 rounding.
#include "spmd/ir/parser.h"
#include "spmd/ops/column_sum_codegen.h"
#include "spmd/backend/generated_kernels.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <string>

#include "test_support.h"

using namespace spmd;

namespace {

// LayerNorm over [B, T, C] (rows = B * T) of a sum with a bf16 residual,
// its cast to bf16, and the backward with dy arriving in bf16, a residual
// gradient added to dx and that sum cast to bf16 too; then an f32 LayerNorm
// of the sum.
Graph layerNormGraph(int64_t b, int64_t t, int64_t c) {
  std::string text = R"(graph
  input %x0: f32[B,T,C] data
  input %r16: bf16[B,T,C] data
  input %w: f32[C] parameter
  input %bias: f32[C] parameter
  input %dy16: bf16[B,T,C] data
  input %res: f32[B,T,C] data
  %x: f32[B,T,C] = aten::add.Tensor(%x0, %r16, 1)
  %y: f32[B,T,C], %mean: f32[B,T,1], %rstd: f32[B,T,1] = aten::native_layer_norm(%x, [C], %w, %bias, 1e-05)
  %y16: bf16[B,T,C] = aten::_to_copy(%y, torch.bfloat16, None, None, None, False, None)
  %dy: f32[B,T,C] = aten::_to_copy(%dy16, torch.float32, None, None, None, False, None)
  %dx: f32[B,T,C], %dw: f32[C], %db: f32[C] = aten::native_layer_norm_backward(%dy, %x, [C], %mean, %rstd, %w, %bias, [True, True, True])
  %sum: f32[B,T,C] = aten::add.Tensor(%dx, %res, 1)
  %sum16: bf16[B,T,C] = aten::_to_copy(%sum, torch.bfloat16, None, None, None, False, None)
  %y2: f32[B,T,C], %mean2: f32[B,T,1], %rstd2: f32[B,T,1] = aten::native_layer_norm(%sum, [C], %w, %bias, 1e-05)
  return (%y16, %sum, %dw, %db, %y2, %mean2, %rstd2, %x, %sum16)
)";
  text = std::regex_replace(text, std::regex("\\bB\\b"), std::to_string(b));
  text = std::regex_replace(text, std::regex("\\bT\\b"), std::to_string(t));
  return parseListing(std::regex_replace(text, std::regex("\\bC\\b"), std::to_string(c)));
}

int countOps(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

struct Ran {
  std::vector<at::Tensor> unfused, fused;
};

Ran runBoth(int64_t b, int64_t t, int64_t c, const at::Device& device) {
  const Graph plain = layerNormGraph(b, t, c);
  Graph fused = plain;
  runPasses(fused, {"layer-norm-to-kernel"}, PipelineOptions{}, DebugOptions{});
  // Both LayerNorms, the backward, the three casts and both adds: none of them left as ATen's.
  REQUIRE(countOps(fused, "spmd::layer_norm") == 2);
  REQUIRE(countOps(fused, "spmd::layer_norm_backward") == 1);
  REQUIRE(countOps(fused, "aten::_to_copy") == 0);
  REQUIRE(countOps(fused, "aten::add") == 0);
  at::manual_seed(11);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // Rows with a mean far from 0 and a spread of their own, as a residual stream has.
  const at::Tensor x = at::randn({b, t, c}, f32) * (at::rand({b, t, 1}, f32) * 3 + 0.1) + 2;
  const std::map<std::string, at::Tensor> inputs = {
      {"x0", x.to(device)},
      {"r16", at::randn({b, t, c}, f32).to(at::kBFloat16).to(device)},
      {"w", (at::randn({c}, f32) * 0.2 + 1).to(device)},
      {"bias", (at::randn({c}, f32) * 0.1).to(device)},
      {"dy16", at::randn({b, t, c}, f32).to(at::kBFloat16).to(device)},
      {"res", at::randn({b, t, c}, f32).to(device)}};
  return {Interpreter(plain).run(inputs).outputs, Interpreter(fused).run(inputs).outputs};
}

const char* kOutputs[] = {"y (bf16)", "dx + residual", "dw", "db", "y", "mean", "rstd", "x0 + r16", "dx+res (bf16)"};

}  // namespace

TEST_CASE("layer-norm-to-kernel takes LayerNorm, its casts and the residual gradient (CPU reference)", "[fused]") {
  for (auto [b, t, c] : {std::tuple<int64_t, int64_t, int64_t>{2, 9, 24}, {1, 37, 100}}) {
    INFO(b << " x " << t << " x " << c);
    const Ran ran = runBoth(b, t, c, at::kCPU);
    REQUIRE(ran.fused.size() == ran.unfused.size());
    for (size_t k = 0; k < ran.fused.size(); ++k) {
      INFO(kOutputs[k]);
      CHECK(ran.fused[k].scalar_type() == ran.unfused[k].scalar_type());
      testing::requireClose(ran.fused[k], ran.unfused[k], kOutputs[k], 0, 0);
    }
  }
}

TEST_CASE("layer-norm-to-kernel leaves what its kernels do not take, with a note", "[fused]") {
  const Graph plain = parseListing(R"(graph
  input %x: f32[4,6] data
  input %w: f32[6] parameter
  input %b: f32[6] parameter
  input %h: bf16[4,8] data
  input %v: bf16[8] parameter
  input %z: f32[4,2000] data
  input %u: f32[2000] parameter
  %y: f32[4,6], %m: f32[4,1], %r: f32[4,1] = aten::native_layer_norm(%x, [6], %w, %b, 1e-05)
  %y1: bf16[4,8], %m1: f32[4,1], %r1: f32[4,1] = aten::native_layer_norm(%h, [8], %v, %v, 1e-05)
  %y2: f32[4,2000], %m2: f32[4,1], %r2: f32[4,1] = aten::native_layer_norm(%z, [2000], %u, %u, 1e-05)
  %y3: f32[4,6], %m3: f32[4,1], %r3: f32[4,1] = aten::native_layer_norm(%x, [6], None, None, 1e-05)
  return (%y, %y1, %y2, %y3)
)");
  Graph g = plain;
  DiagnosticEngine diagnostics;
  PipelineOptions options;
  options.diagnostics = &diagnostics;
  runPasses(g, {"layer-norm-to-kernel"}, options, DebugOptions{});
  CHECK(countOps(g, "aten::native_layer_norm") == 4);
  std::string notes;
  for (const auto& d : diagnostics.notes()) notes += d.message() + "\n";
  CHECK(notes.find("6 features, not a multiple of 4") != std::string::npos);
  CHECK(notes.find("the input is not fp32") != std::string::npos);
  CHECK(notes.find("2000 features, more than the 1024") != std::string::npos);
  CHECK(notes.find("no weight or no bias") != std::string::npos);
}

namespace {

// Bias gradients as Linear's backward records them: f32 [rows, 96] over
// dim 0 kept, bf16 [4, rows / 4, 64] over dims 0 and 1 (negative) not kept.
Graph columnSumGraph(int64_t rows) {
  std::string text = R"(graph
  input %g: f32[R,96] data
  input %h: bf16[4,Q,64] data
  %s: f32[1,96] = aten::sum.dim_IntList(%g, [0], True, None)
  %t: bf16[64] = aten::sum.dim_IntList(%h, [-3, 1], False, None)
  return (%s, %t)
)";
  text = std::regex_replace(text, std::regex("\\bR\\b"), std::to_string(rows));
  return parseListing(std::regex_replace(text, std::regex("\\bQ\\b"), std::to_string(rows / 4)));
}

Ran runColumnSums(int64_t rows, const at::Device& device) {
  const Graph plain = columnSumGraph(rows);
  Graph fused = plain;
  runPasses(fused, {"column-sum-to-kernel"}, PipelineOptions{}, DebugOptions{});
  REQUIRE(countOps(fused, "spmd::column_sum") == 2);
  at::manual_seed(5);
  const std::map<std::string, at::Tensor> inputs = {{"g", at::randn({rows, 96}).to(device)},
                                                    {"h", at::randn({4, rows / 4, 64}).to(at::kBFloat16).to(device)}};
  return {Interpreter(plain).run(inputs).outputs, Interpreter(fused).run(inputs).outputs};
}

}  // namespace

TEST_CASE("column-sum-to-kernel takes the sums over the leading dimensions (CPU reference)", "[fused]") {
  const Ran ran = runColumnSums(2048, at::kCPU);
  for (size_t k = 0; k < 2; ++k) {
    CHECK(ran.fused[k].scalar_type() == ran.unfused[k].scalar_type());
    testing::requireClose(ran.fused[k], ran.unfused[k], k == 0 ? "f32 kept" : "bf16", 0, 0);
  }
  // One row (a copy), other dimensions, a dtype argument: left alone.
  Graph g = parseListing(R"(graph
  input %g: f32[1,96] data
  input %x: f32[2048,96] data
  %s: f32[1,96] = aten::sum.dim_IntList(%g, [0], True, None)
  %t: f32[2048] = aten::sum.dim_IntList(%x, [1], False, None)
  %u: f64[96] = aten::sum.dim_IntList(%x, [0], False, torch.float64)
  return (%s, %t, %u)
)");
  DiagnosticEngine diagnostics;
  PipelineOptions options;
  options.diagnostics = &diagnostics;
  runPasses(g, {"column-sum-to-kernel"}, options, DebugOptions{});
  CHECK(countOps(g, "spmd::column_sum") == 0);
  REQUIRE(diagnostics.notes().size() == 1);
  CHECK(diagnostics.notes()[0].message() == "column-sum-to-kernel: not fused: a dtype argument");
}

#ifdef SPMD_WITH_CUDA
TEST_CASE("generated column sums match ATen's CUDA sums", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  // The one-kernel sum (100 rows: the seeds' MLP; 512, its most), a part's
  // rows short of full, and 8192 rows (gpt's tokens a step).
  for (int64_t rows : {int64_t{100}, kColumnSumWholeRows, int64_t{1100}, int64_t{8192}}) {
    const Ran ran = runColumnSums(rows, at::Device(at::kCUDA, 0));
    for (size_t k = 0; k < 2; ++k) {
      const at::Tensor ours = ran.fused[k].cpu().to(at::kDouble), ref = ran.unfused[k].cpu().to(at::kDouble);
      const double worst = (ours - ref).abs().max().item<double>(), scale = ref.abs().max().item<double>();
      std::printf("column sum %lld rows %s largest difference %.3g (largest |value| %.3g)\n",
                  static_cast<long long>(rows), k == 0 ? "f32 " : "bf16", worst, scale);
      INFO(rows << " rows, " << (k == 0 ? "f32" : "bf16"));
      CHECK(worst <= (k == 0 ? 2e-6 * std::sqrt(static_cast<double>(rows)) * (1 + scale) : scale / 128));
    }
  }
}
#endif

#ifdef SPMD_WITH_CUDA
// GPU only: prints one line per shape and output with the largest
// difference to ATen's CUDA kernels, which bench/RESULTS.md records.
TEST_CASE("generated LayerNorm kernels match ATen's CUDA kernels", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  // Rows not a multiple of a block's, rows shorter than a warp's lanes, the largest row.
  for (auto [b, t, c] : {std::tuple<int64_t, int64_t, int64_t>{8, 128, 768}, {1, 37, 100}, {3, 11, 1024}, {2, 5, 4}}) {
    const Ran ran = runBoth(b, t, c, at::Device(at::kCUDA, 0));
    for (size_t k = 0; k < ran.fused.size(); ++k) {
      INFO(b << " x " << t << " x " << c << ": " << kOutputs[k]);
      const at::Tensor ours = ran.fused[k].cpu().to(at::kDouble), ref = ran.unfused[k].cpu().to(at::kDouble);
      const double worst = (ours - ref).abs().max().item<double>(), scale = ref.abs().max().item<double>();
      std::printf("layer norm %lld x %lld x %lld %-14s largest difference %.3g (largest |value| %.3g)\n",
                  static_cast<long long>(b), static_cast<long long>(t), static_cast<long long>(c), kOutputs[k], worst,
                  scale);
      // bf16 y and dx: one rounding apart at most; the gradients' sums
      // over rows are added in other orders than ATen's.
      const double rows = static_cast<double>(b * t);
      const double tolerance = k == 0 || k == 8 ? scale / 128 : k == 2 || k == 3 ? 1e-6 * (1 + scale) * std::sqrt(rows) : 2e-5 * (1 + scale);
      CHECK(worst <= tolerance);
    }
  }
}
#endif

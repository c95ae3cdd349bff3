// The generated kernels' specs (ops/kernel_spec.h): keys that name the
// attributes making a source, one rule from an op's arguments whether they
// are tensors (the CUDA ops) or graph values (analysis/kernels.h), the
// source generated once, and the launches as functions of the sizes.
#include "spmd/analysis/kernels.h"
#include "spmd/ir/parser.h"
#include "spmd/ops/attention_codegen.h"
#include "spmd/ops/column_sum_codegen.h"
#include "spmd/ops/cross_entropy_codegen.h"
#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/ivalue_call_args.h"
#include "spmd/ops/layer_norm_codegen.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "test_support.h"

using namespace spmd;

TEST_CASE("kernel spec keys name the attributes that make the source", "[kernels]") {
  const LayerNormKernelSpec ln(768, 1e-5, c10::ScalarType::BFloat16, c10::ScalarType::Float);
  CHECK(ln.key() == "layer_norm f=768 eps=1e-05 out=bf16 res=f32");
  CHECK(LayerNormKernelSpec(768, 1e-5, c10::ScalarType::Float, std::nullopt).key() ==
        "layer_norm f=768 eps=1e-05 out=f32 res=none");
  CHECK(LayerNormBackwardKernelSpec(768, c10::ScalarType::BFloat16, true).key() ==
        "layer_norm_backward f=768 grad=bf16 res=1");
  CHECK(ColumnSumKernelSpec(3072, c10::ScalarType::Float).key() == "column_sum c=3072 in=f32");
  CHECK(CrossEntropyKernelSpec(50304, 1, -100, c10::ScalarType::BFloat16).key() ==
        "cross_entropy c=50304 red=mean ignore=-100 logits=BFloat16");
  CHECK(CrossEntropyWithGradKernelSpec(10, 2, -100, 1.0, c10::ScalarType::Float).key() ==
        "cross_entropy_with_grad c=10 red=sum ignore=-100 scale=1.0 logits=Float");
  CHECK(AttentionSoftmaxKernelSpec(1024, 1024, 0.125, true).key() ==
        "attention_softmax q=1024 k=1024 scale=0.125 causal=1");
  CHECK(PointwiseKernelSpec("t0:f32 = add(in0, in1); return t0", {{at::kFloat, {4, 8}}, {at::kFloat, {8}}}).key() ==
        "pointwise t0:f32 = add(in0, in1); return t0 in=f32[4,8],f32[8]");
}

TEST_CASE("a kernel spec generates its source once, and refuses what no kernel takes", "[kernels]") {
  const LayerNormKernelSpec ln(64, 1e-5, c10::ScalarType::Float, std::nullopt);
  const std::string& first = ln.source();
  CHECK(&first == &ln.source());
  CHECK(first.find("constexpr int kFeatures = 64;") != std::string::npos);
  CHECK_THROWS_WITH(LayerNormKernelSpec(7, 1e-5, c10::ScalarType::Float, std::nullopt),
                    "layer norm: 7 features, not a multiple of 4");
  CHECK_THROWS_AS(ColumnSumKernelSpec(3, c10::ScalarType::Float), std::invalid_argument);
  CHECK_THROWS_AS(CrossEntropyKernelSpec(10, 0, -100, c10::ScalarType::Float), std::invalid_argument);
  CHECK_THROWS_AS(AttentionSoftmaxKernelSpec(8, 4096, 1.0, false), std::invalid_argument);
  // Inputs that do not fit a program are the source's to refuse.
  const PointwiseKernelSpec bad("t0:f32 = add(in0, in1); return t0", {{at::kFloat, {4}}});
  CHECK_THROWS_AS(bad.source(), std::invalid_argument);
}

TEST_CASE("a spec made from tensors equals the one spmd-inspect makes from the graph", "[kernels]") {
  const Graph g = parseListing(R"(graph
  input %x: f32[6,64] data
  input %r: bf16[6,64] data
  input %w: f32[64] parameter
  input %b: f32[64] parameter
  %y: bf16[6,64], %mean: f32[6,1], %rstd: f32[6,1], %sum: f32[6,64] = spmd::layer_norm(%x, %r, %w, %b, 1e-05, torch.bfloat16)
  return (%y)
)");
  const std::vector<FusedKernel> kernels = fusedKernels(g);
  REQUIRE(kernels.size() == 1);
  const at::Tensor x = at::zeros({6, 64}), r = at::zeros({6, 64}, at::kBFloat16), w = at::zeros({64});
  const LayerNormKernelSpec spec = LayerNormKernelSpec::forCall(
      IValueCallArgs({x, c10::optional<at::Tensor>(r), w, w, 1e-5, c10::ScalarType::BFloat16}));
  CHECK(spec.key() == kernels[0].key);
  CHECK(spec.source() == kernels[0].source);
}

TEST_CASE("kernel specs give their launches for the run-time sizes", "[kernels]") {
  const ColumnSumKernelSpec sums(256, c10::ScalarType::Float);
  CHECK(sums.launches(0).empty());
  REQUIRE(sums.launches(100).size() == 1);
  CHECK(std::string(sums.launches(100)[0].kernel) == kColumnSumWholeKernelName);
  const std::vector<KernelLaunch> parts = sums.launches(1000);
  REQUIRE(parts.size() == 2);
  CHECK(parts[0].blocks == columnSumParts(1000) * columnSumTiles(256, c10::ScalarType::Float));
  CHECK(parts[1].count == columnSumParts(1000));
  const LayerNormBackwardKernelSpec back(768, c10::ScalarType::Float, false);
  CHECK(back.paramsLaunch(1000).count == layerNormBackwardBlocks(1000));
  CHECK(back.rowsLaunch(1000).blocks == layerNormBackwardBlocks(1000));
  const CrossEntropyWithGradKernelSpec ce(50304, 1, -100, 1.0, c10::ScalarType::BFloat16);
  CHECK(ce.fitsOneKernel(crossEntropyRowBytes(50304, c10::ScalarType::BFloat16)));
  CHECK(!ce.fitsOneKernel(1024));
  CHECK(ce.withGradLaunch(8).sharedBytes == crossEntropyRowBytes(50304, c10::ScalarType::BFloat16));
  const PointwiseKernelSpec pw("t0:f32 = add(in0, in1); return t0", {{at::kFloat, {4, 8}}, {at::kFloat, {8}}});
  CHECK(std::string(pw.launch(132, true).kernel) == kFusedVectorKernelName);
  CHECK(std::string(pw.launch(132, false).kernel) == kFusedKernelName);
  CHECK(!pw.launch(132, true).count);
}

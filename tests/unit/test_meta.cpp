// MetaFallbackScope: LibTorch 1.13's meta fallback is there only while a
// scope lives; on 2.x a scope does nothing.
#include "spmd/ops/dispatch.h"
#include "spmd/ops/meta.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

// aten::relu has no meta kernel on LibTorch 1.13 (only relu_ has one);
// native_layer_norm gets one of spmd's shape functions.
at::Tensor reluOnMeta() { return at::relu(metaTensor(at::kFloat, {2, 3})); }

}  // namespace

TEST_CASE("relu runs on meta tensors inside a MetaFallbackScope", "[meta]") {
#if TORCH_VERSION_MAJOR < 2
  // LibTorch 1.13 only: no kernel outside a scope, the fallback inside one,
  // and none again once the last scope has ended.
  CHECK_THROWS_AS(reluOnMeta(), c10::Error);
  {
    MetaFallbackScope outer;
    CHECK(reluOnMeta().sizes() == at::IntArrayRef({2, 3}));
    {
      MetaFallbackScope inner;
      CHECK(reluOnMeta().is_meta());
    }
    // The inner scope's end leaves the outer one's fallback in place.
    const at::Tensor r = reluOnMeta();
    CHECK(r.is_meta());
    CHECK(r.sizes() == at::IntArrayRef({2, 3}));
    auto [out, mean, rstd] = at::native_layer_norm(metaTensor(at::kFloat, {4, 5, 6}), {6}, {}, {}, 1e-5);
    CHECK(out.is_meta());
    CHECK(out.sizes() == at::IntArrayRef({4, 5, 6}));
    CHECK(mean.sizes() == at::IntArrayRef({4, 5, 1}));
  }
  CHECK_THROWS_AS(reluOnMeta(), c10::Error);
#else
  // LibTorch 2.x: the scope registers nothing. relu has no C++ meta kernel
  // there either (its meta function is Python's), so it fails on meta with
  // or without a scope; inferOnMeta's CPU retry (below) covers it. A
  // structured op has a meta kernel of its own.
  CHECK_THROWS_AS(reluOnMeta(), c10::Error);
  {
    MetaFallbackScope scope;
    CHECK_THROWS_AS(reluOnMeta(), c10::Error);
  }
  const at::Tensor sum = at::add(metaTensor(at::kFloat, {2, 3}), metaTensor(at::kFloat, {3}));
  CHECK(sum.is_meta());
  CHECK(sum.sizes() == at::IntArrayRef({2, 3}));
#endif
}

TEST_CASE("inferOnMeta takes a scope of its own", "[meta]") {
  auto relu = findOperator("aten::relu", "");
  REQUIRE(relu);
  const auto results = inferOnMeta(*relu, {metaTensor(at::kFloat, {2, 3})});
  REQUIRE(results.size() == 1);
  CHECK(results[0].is_meta());
  CHECK(results[0].sizes() == at::IntArrayRef({2, 3}));
#if TORCH_VERSION_MAJOR < 2
  // LibTorch 1.13 only: its scope ended when it returned.
  CHECK_THROWS_AS(reluOnMeta(), c10::Error);
#endif
}

// Convolutions on meta tensors (1.13 gets a shape function; 2.x has meta
// kernels) give the shapes and memory formats the CPU kernels give, plain,
// strided, grouped, transposed and channels-last.
TEST_CASE("convolution on meta tensors has the CPU's shapes", "[meta]") {
  MetaFallbackScope scope;
  struct Conv {
    std::vector<int64_t> input, weight, stride, padding, dilation, outputPadding;
    bool transposed;
    int64_t groups;
    bool channelsLast;
  };
  const std::vector<Conv> convs = {
      {{2, 3, 9, 8}, {6, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, false, 1, false},
      {{2, 4, 11, 9}, {8, 2, 3, 2}, {2, 3}, {1, 0}, {2, 1}, {0, 0}, false, 2, false},
      {{2, 4, 5, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 0}, true, 1, false},
      {{2, 3, 8, 8}, {5, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, {0, 0}, false, 1, true},
      {{2, 3, 10}, {4, 3, 3}, {2}, {1}, {1}, {0}, false, 1, false},
  };
  for (const Conv& c : convs) {
    auto format = c.channelsLast ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    at::Tensor x = at::randn(c.input).contiguous(format), w = at::randn(c.weight);
    at::Tensor cpu = at::convolution(x, w, {}, c.stride, c.padding, c.dilation, c.transposed, c.outputPadding, c.groups);
    at::Tensor meta = at::convolution(x.to(at::kMeta), w.to(at::kMeta), {}, c.stride, c.padding, c.dilation,
                                      c.transposed, c.outputPadding, c.groups);
    CHECK(meta.is_meta());
    CHECK(meta.sizes() == cpu.sizes());
    CHECK(meta.strides() == cpu.strides());
  }
}

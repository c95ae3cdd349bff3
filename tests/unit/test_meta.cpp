// MetaFallbackScope: the shape functions and small-batch stand-ins for the
// ops without a C++ meta kernel (their meta functions are Python's) are there
// only while a scope lives.
#include "spmd/ops/dispatch.h"
#include "spmd/ops/meta.h"

#include <ATen/ATen.h>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

// aten::relu has no C++ meta kernel in LibTorch 2.x; native_layer_norm gets
// one of spmd's shape functions, relu the CPU stand-ins of a batch of 2.
at::Tensor reluOnMeta(int64_t batch = 2) { return at::relu(metaTensor(at::kFloat, {batch, 3})); }

}  // namespace

TEST_CASE("relu runs on meta tensors inside a MetaFallbackScope", "[meta]") {
  // No kernel outside a scope, ours inside one, and none again once the last
  // scope has ended.
  CHECK_THROWS_AS(reluOnMeta(), c10::Error);
  {
    MetaFallbackScope outer;
    CHECK(reluOnMeta().sizes() == at::IntArrayRef({2, 3}));
    {
      MetaFallbackScope inner;
      CHECK(reluOnMeta().is_meta());
    }
    // The inner scope's end leaves the outer one's registrations in place;
    // a batch far beyond memory costs a batch of 2.
    const at::Tensor r = reluOnMeta(int64_t{1} << 40);
    CHECK(r.is_meta());
    CHECK(r.sizes() == at::IntArrayRef({int64_t{1} << 40, 3}));
    auto [out, mean, rstd] = at::native_layer_norm(metaTensor(at::kFloat, {4, 5, 6}), {6}, {}, {}, 1e-5);
    CHECK(out.is_meta());
    CHECK(out.sizes() == at::IntArrayRef({4, 5, 6}));
    CHECK(mean.sizes() == at::IntArrayRef({4, 5, 1}));
  }
  CHECK_THROWS_AS(reluOnMeta(), c10::Error);
  // A structured op has a meta kernel of its own.
  const at::Tensor sum = at::add(metaTensor(at::kFloat, {2, 3}), metaTensor(at::kFloat, {3}));
  CHECK(sum.is_meta());
  CHECK(sum.sizes() == at::IntArrayRef({2, 3}));
}

TEST_CASE("inferOnMeta takes a scope of its own", "[meta]") {
  auto relu = findOperator("aten::relu", "");
  REQUIRE(relu);
  const auto results = inferOnMeta(*relu, {metaTensor(at::kFloat, {2, 3})});
  REQUIRE(results.size() == 1);
  CHECK(results[0].is_meta());
  CHECK(results[0].sizes() == at::IntArrayRef({2, 3}));
  // Its scope ended when it returned.
  CHECK_THROWS_AS(reluOnMeta(), c10::Error);
}

// floor_divide has no meta kernel; zero-filled integer stand-ins would
// divide by zero (transformers' experts divide a sort's indices by top-k).
TEST_CASE("an integer division on meta tensors takes stand-ins that divide", "[meta]") {
  auto divide = findOperator("aten::floor_divide", "");
  REQUIRE(divide);
  const auto results = inferOnMeta(*divide, {metaTensor(at::kLong, {6}), metaTensor(at::kLong, {})});
  REQUIRE(results.size() == 1);
  CHECK(results[0].is_meta());
  CHECK(results[0].scalar_type() == at::kLong);
  CHECK(results[0].sizes() == at::IntArrayRef({6}));
}

// Convolutions on meta tensors (LibTorch's meta kernels) give the shapes and memory formats the CPU kernels give, plain,
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

// Layer norm's shape functions give the CPU kernels' layouts, also for a
// transposed input (nn.MultiheadAttention's batch_first output): a
// transposed gradient on meta would make autodiff record a view of it that
// fails at run time.
TEST_CASE("layer norm on meta tensors has the CPU's strides", "[meta]") {
  MetaFallbackScope scope;
  const at::Tensor x = at::randn({17, 2, 32}).transpose(0, 1), w = at::randn({32}), b = at::randn({32});
  auto [out, mean, rstd] = at::native_layer_norm(x, {32}, w, b, 1e-5);
  auto [mOut, mMean, mRstd] = at::native_layer_norm(x.to(at::kMeta), {32}, w.to(at::kMeta), b.to(at::kMeta), 1e-5);
  CHECK(mOut.strides() == out.strides());
  CHECK(mMean.sizes() == mean.sizes());
  const at::Tensor grad = at::randn({17, 2, 32}).transpose(0, 1);
  auto [gx, gw, gb] = at::native_layer_norm_backward(grad, x, {32}, mean, rstd, w, b, {true, true, true});
  auto [mGx, mGw, mGb] = at::native_layer_norm_backward(grad.to(at::kMeta), x.to(at::kMeta), {32}, mMean, mRstd,
                                                        w.to(at::kMeta), b.to(at::kMeta), {true, true, true});
  CHECK(mGx.is_meta());
  CHECK(mGx.sizes() == gx.sizes());
  CHECK(mGx.strides() == gx.strides());
  CHECK(mGw.sizes() == gw.sizes());
  CHECK(mGb.sizes() == gb.sizes());
}

// where (SDPA's math calls it for an is_causal mask; its meta function is
// Python's): the CPU kernel's shapes and dtypes, broadcast and promoted, for
// the op and its out= form.
TEST_CASE("where on meta tensors has the CPU's shapes and dtypes", "[meta]") {
  MetaFallbackScope scope;
  struct Case {
    std::vector<int64_t> condition, self, other;
    c10::ScalarType selfType, otherType;
  };
  for (const Case& c : {Case{{4, 1}, {1, 5}, {5}, at::kFloat, at::kFloat},
                        Case{{3, 1, 1}, {2, 1}, {1, 7}, at::kBFloat16, at::kFloat},
                        Case{{6}, {}, {6}, at::kDouble, at::kLong}}) {
    const auto cpu = [](const std::vector<int64_t>& s, c10::ScalarType t) { return at::zeros(s, at::TensorOptions().dtype(t)); };
    const auto meta = [](const std::vector<int64_t>& s, c10::ScalarType t) { return metaTensor(t, s); };
    const at::Tensor want = at::where(cpu(c.condition, at::kBool), cpu(c.self, c.selfType), cpu(c.other, c.otherType));
    const at::Tensor got = at::where(meta(c.condition, at::kBool), meta(c.self, c.selfType), meta(c.other, c.otherType));
    CHECK(got.is_meta());
    CHECK(got.sizes() == want.sizes());
    CHECK(got.scalar_type() == want.scalar_type());
    at::Tensor out = metaTensor(want.scalar_type(), {1});
    at::where_out(out, meta(c.condition, at::kBool), meta(c.self, c.selfType), meta(c.other, c.otherType));
    CHECK(out.sizes() == want.sizes());
  }
}

// ir/view_pieces.h against ATen: a view of x.contiguous(), remade by the
// recipe from a strided x, holds the same elements; where the recipe says
// nothing can be made, none is. And the passes that change layouts around
// attention: the interpreter runs graphs with and without each, copies-to-
// views to the same bits, repeat-kv-to-gqa to within the gradients' rounding.
#include "spmd/ir/parser.h"
#include "spmd/ir/verify.h"
#include "spmd/ir/view_pieces.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <regex>

#include "catch.h"  // after LibTorch's headers (see catch.h)

using namespace spmd;

namespace {

// The recipe applied to `x` with ATen's view ops.
at::Tensor applyRecipe(const at::Tensor& x, const ViewRecipe& r) {
  at::Tensor t = x;
  for (const ViewStep& s : r.steps) t = s.select ? t.select(s.dim, s.index) : t.unflatten(s.dim, s.sizes);
  return t.permute(r.permutation);
}

// The view `chain` makes of x.contiguous(), remade from x; checks the values
// and returns the recipe.
std::optional<ViewRecipe> remade(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& chain) {
  const at::Tensor copy = x.contiguous();
  const at::Tensor view = chain(copy);
  std::optional<ViewRecipe> r =
      viewOfContiguousCopy(x.sizes().vec(), view.sizes().vec(), view.strides().vec(), view.storage_offset());
  if (!r) return r;
  const at::Tensor made = applyRecipe(x, *r);
  REQUIRE(made.sizes().vec() == r->finerShape);
  REQUIRE(made.is_alias_of(x));  // views of x, no copy
  REQUIRE(at::equal(made.reshape(view.sizes()), view));
  return r;
}

}  // namespace

TEST_CASE("nn.MultiheadAttention's q/k/v made contiguous are views of the packed projection") {
  // [L, B, 3E] projection (its rows transposed from [B, L]), split into
  // q/k/v and heads as torch.nn.functional.multi_head_attention_forward does.
  const int64_t L = 5, B = 3, E = 12, H = 4, D = E / H;
  const at::Tensor rows = at::randn({B, L, 3 * E}).transpose(0, 1);
  const at::Tensor packed = rows.unflatten(-1, {3, E}).unsqueeze(0).transpose(0, -2).squeeze(-2);
  for (int64_t which = 0; which < 3; ++which) {
    std::optional<ViewRecipe> r = remade(packed, [&](const at::Tensor& c) {
      return c.select(0, which).view({L, B * H, D}).transpose(0, 1).view({B, H, L, D});
    });
    REQUIRE(r);
    CHECK_FALSE(r->split);
    CHECK(r->lastIsUnitStepOfLastDim);
  }
}

TEST_CASE("a merge of two strided dimensions is given as its pieces") {
  // Attention's q gradient, [B, H, L, D], back to [L, B, H * D].
  const int64_t L = 5, B = 3, H = 4, D = 6;
  const at::Tensor grad = at::randn({B, H, L, D});
  const at::Tensor x = grad.view({B * H, L, D}).transpose(0, 1);
  std::optional<ViewRecipe> r = remade(x, [&](const at::Tensor& c) { return c.view({L, B, H * D}); });
  REQUIRE(r);
  CHECK(r->split);
  CHECK(r->finerShape == std::vector<int64_t>{L, B, H, D});
  CHECK(r->piecesPerDim == std::vector<int64_t>{1, 1, 2});
}

TEST_CASE("selects, narrows, size-1 dimensions and a permutation") {
  const at::Tensor x = at::randn({6, 4, 10}).permute({2, 0, 1});  // [10, 6, 4], strided
  REQUIRE(remade(x, [](const at::Tensor& c) { return c.select(1, 2).unsqueeze(0).transpose(1, 2); }));
  REQUIRE(remade(x, [](const at::Tensor& c) { return c.narrow(0, 5, 5).view({5, 24}).select(1, 7); }));
  REQUIRE(remade(x, [](const at::Tensor& c) { return c.view({2, 5, 6, 4}).permute({3, 1, 0, 2}); }));
  // A factor below the pieces: every second element of the last dimension.
  REQUIRE(remade(x, [](const at::Tensor& c) { return c.view({10, 6, 2, 2}).select(3, 1); }));
}

TEST_CASE("no recipe where no view of a strided tensor holds the elements") {
  const at::Tensor x = at::randn({6, 4, 10}).permute({2, 0, 1});
  // A broadcast, a dimension walked by two view dimensions, a step that does not tile.
  CHECK_FALSE(remade(x, [](const at::Tensor& c) { return c.unsqueeze(0).expand({3, 10, 6, 4}); }));
  CHECK_FALSE(remade(x, [](const at::Tensor& c) { return c.as_strided({4, 4}, {1, 1}); }));
  CHECK_FALSE(remade(x, [](const at::Tensor& c) { return c.view({240}).slice(0, 0, 240, 7); }));
}

TEST_CASE("a permutation of a contiguous tensor's dimensions, with size-1 ones") {
  const at::Tensor s = at::empty({3, 5, 1, 4});
  const at::Tensor p = s.unsqueeze(3).transpose(0, -2).squeeze(0);  // [5, 1, 3, 4]
  std::optional<std::vector<int64_t>> walks =
      permutationOfContiguous(s.sizes().vec(), p.sizes().vec(), p.strides().vec(), p.storage_offset());
  REQUIRE(walks);
  CHECK(*walks == std::vector<int64_t>{1, -1, 0, 3});
  const at::Tensor sliced = s.narrow(0, 1, 2);
  CHECK_FALSE(permutationOfContiguous(s.sizes().vec(), sliced.sizes().vec(), sliced.strides().vec(), 20));
  const at::Tensor merged = s.view({15, 4});
  CHECK_FALSE(permutationOfContiguous(s.sizes().vec(), merged.sizes().vec(), merged.strides().vec(), 0));
}

// ---- copies-to-views on graphs -------------------------------------------

namespace {

// nn.MultiheadAttention's backward from the head gradients to the packed
// projection's (B 2, L 8, H 2, D 32): each gradient made contiguous to be
// reshaped, the three stacked, the stack permuted and made contiguous.
const char* kHeadGradients = R"(graph
  input %dq: {D}[2,2,8,32] data
  input %dk: {D}[2,2,8,32] data
  input %dv: {D}[2,2,8,32] data
  %vq: {D}[4,8,32] = aten::view(%dq, [4, 8, 32])
  %tq: {D}[8,4,32] = aten::transpose.int(%vq, 0, 1)
  %cq: {D}[8,4,32] = aten::clone(%tq, torch.contiguous_format)
  %q: {D}[8,2,64] = aten::_unsafe_view(%cq, [8, 2, 64])
  %vk: {D}[4,8,32] = aten::view(%dk, [4, 8, 32])
  %tk: {D}[8,4,32] = aten::transpose.int(%vk, 0, 1)
  %ck: {D}[8,4,32] = aten::clone(%tk, torch.contiguous_format)
  %k: {D}[8,2,64] = aten::_unsafe_view(%ck, [8, 2, 64])
  %vv: {D}[4,8,32] = aten::view(%dv, [4, 8, 32])
  %tv: {D}[8,4,32] = aten::transpose.int(%vv, 0, 1)
  %cv: {D}[8,4,32] = aten::clone(%tv, torch.contiguous_format)
  %v: {D}[8,2,64] = aten::_unsafe_view(%cv, [8, 2, 64])
  %s: {D}[3,8,2,64] = aten::stack([%q, %k, %v], 0)
  %u: {D}[3,8,2,1,64] = aten::unsqueeze(%s, 3)
  %p: {D}[1,8,2,3,64] = aten::transpose.int(%u, 0, -2)
  %sq: {D}[8,2,3,64] = aten::squeeze.dim(%p, 0)
  %c: {D}[8,2,3,64] = aten::clone(%sq, torch.contiguous_format)
  %g: {D}[8,2,192] = aten::_unsafe_view(%c, [8, 2, 192])
  return (%g)
)";

// Its forward: the packed projection (rows in [B, L] order, read as [L, B])
// made contiguous and split into heads for cuDNN's attention, and the
// attention's backward reading the same heads.
const char* kPackedAttention = R"(graph
  input %x: {D}[2,8,192] data
  input %grad: {D}[2,2,8,32] data
  %xt: {D}[8,2,192] = aten::transpose.int(%x, 0, 1)
  %un: {D}[8,2,3,64] = aten::unflatten.int(%xt, -1, [3, 64])
  %us: {D}[1,8,2,3,64] = aten::unsqueeze(%un, 0)
  %tr: {D}[3,8,2,1,64] = aten::transpose.int(%us, 0, -2)
  %sq: {D}[3,8,2,64] = aten::squeeze.dim(%tr, -2)
  %c: {D}[3,8,2,64] = aten::contiguous(%sq, torch.contiguous_format)
  %s0: {D}[8,2,64] = aten::select.int(%c, 0, 0)
  %s1: {D}[8,2,64] = aten::select.int(%c, 0, 1)
  %s2: {D}[8,2,64] = aten::select.int(%c, 0, 2)
  %w0: {D}[8,4,32] = aten::view(%s0, [8, 4, 32])
  %w1: {D}[8,4,32] = aten::view(%s1, [8, 4, 32])
  %w2: {D}[8,4,32] = aten::view(%s2, [8, 4, 32])
  %t0: {D}[4,8,32] = aten::transpose.int(%w0, 0, 1)
  %t1: {D}[4,8,32] = aten::transpose.int(%w1, 0, 1)
  %t2: {D}[4,8,32] = aten::transpose.int(%w2, 0, 1)
  %q: {D}[2,2,8,32] = aten::view(%t0, [2, 2, 8, 32])
  %k: {D}[2,2,8,32] = aten::view(%t1, [2, 2, 8, 32])
  %v: {D}[2,2,8,32] = aten::view(%t2, [2, 2, 8, 32])
  %o: {D}[2,2,8,32], %lse: f32[2,2,8], %seed: i64[], %offset: i64[] = spmd::fused_attention(%q, %k, %v, None, 0.125, False, 0.0, "cudnn")
  %dq: {D}[2,2,8,32], %dk: {D}[2,2,8,32], %dv: {D}[2,2,8,32] = spmd::fused_attention_backward(%grad, %q, %k, %v, None, %o, %lse, %seed, %offset, 0.125, False, 0.0, "cudnn")
  return (%o, %dq, %dk, %dv)
)";

Graph listingIn(const char* listing, c10::ScalarType dtype) {
  const std::string name = dtype == at::kFloat ? "f32" : "bf16";
  return parseListing(std::regex_replace(listing, std::regex("\\{D\\}"), name));
}

int copiesIn(const Graph& g) {
  int copies = 0;
  for (const Node& n : g.nodes()) copies += n.op == "aten::clone" || n.op == "aten::contiguous";
  return copies;
}

// The graph's outputs with and without copies-to-views, on the same inputs;
// checks that the pass took every copy out.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> runWithAndWithout(const char* listing,
                                                                                c10::ScalarType dtype,
                                                                                const at::Device& device) {
  const Graph plain = listingIn(listing, dtype);
  Graph viewed = plain;
  runPasses(viewed, {"copies-to-views", "dce"}, PipelineOptions{}, DebugOptions{});
  CHECK(copiesIn(plain) > 0);
  CHECK(copiesIn(viewed) == 0);
  at::manual_seed(3);
  std::map<std::string, at::Tensor> inputs;
  for (const auto& in : plain.inputs()) {
    const Value& v = plain.value(in.value);
    inputs[v.name] = at::randn(v.shape, at::TensorOptions().dtype(v.dtype).device(device));
  }
  return {Interpreter(plain).run(inputs).outputs, Interpreter(viewed).run(inputs).outputs};
}

void requireSameValues(const std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>& ran) {
  REQUIRE(ran.first.size() == ran.second.size());
  for (size_t k = 0; k < ran.first.size(); ++k) {
    INFO("output " << k);
    CHECK(at::equal(ran.first[k].cpu(), ran.second[k].cpu()));
  }
}

}  // namespace

TEST_CASE("copies-to-views: attention's head gradients stacked without their copies", "[passes]") {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    requireSameValues(runWithAndWithout(kHeadGradients, dtype, at::kCPU));
  }
}

TEST_CASE("copies-to-views: the packed projection's copy goes, the graph verifying", "[passes]") {
  // The rewrite itself needs no GPU: the attention reads views of %sq.
  Graph g = listingIn(kPackedAttention, at::kBFloat16);
  runPasses(g, {"copies-to-views", "dce"}, PipelineOptions{}, DebugOptions{});
  CHECK(copiesIn(g) == 0);
  CHECK(verifyGraph(g).empty());
  for (const Node& n : g.nodes()) {
    if (n.op != "spmd::fused_attention") continue;
    for (size_t k = 0; k < 3; ++k) CHECK(g.producer(n.args[k].value)->op == "aten::permute");
  }
}

// Two convolutions, a residual add between them, and the first one's
// backward, as autodiff writes them: channels-last converts each 4-D
// argument once (the cast that only convolutions read writes channels-last
// itself; the ReLU of a channels-last result needs no conversion), and the
// interpreter gets the same values, laid out channels-last.
constexpr const char* kConvolutions = R"(graph
  input %x: f32[2,3,8,8] data
  input %w: f32[4,3,3,3] data
  input %w2: f32[4,4,3,3] data
  input %g: f32[2,4,8,8] data
  %wc: f32[4,3,3,3] = aten::_to_copy(%w, torch.float32, None, None, None, False, None)
  %y: f32[2,4,8,8] = aten::conv2d(%x, %wc, None, [1, 1], [1, 1], [1, 1], 1)
  %r: f32[2,4,8,8] = aten::relu(%y)
  %z: f32[2,4,8,8] = aten::conv2d(%r, %w2, None, [1, 1], [1, 1], [1, 1], 1)
  %s: f32[2,4,8,8] = aten::add.Tensor(%z, %y, 1)
  %gx: f32[2,3,8,8], %gw: f32[4,3,3,3], _ = aten::convolution_backward(%g, %x, %wc, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
  return (%s, %gx, %gw)
)";

TEST_CASE("channels-last: convolutions read channels-last tensors and compute the same", "[passes]") {
  const Graph plain = parseListing(kConvolutions);
  Graph laid = plain;
  PipelineOptions options;
  options.lower.memoryFormat = "channels-last";
  runPasses(laid, {"channels-last", "dce"}, options, DebugOptions{});
  CHECK(verifyGraph(laid).empty());
  int conversions = 0, castsToChannelsLast = 0;
  for (const Node& n : laid.nodes()) {
    conversions += n.op == "aten::contiguous";
    castsToChannelsLast += n.op == "aten::_to_copy" && n.args[6].kind == Arg::Kind::MemoryFormat &&
                           n.args[6].i == static_cast<int64_t>(c10::MemoryFormat::ChannelsLast);
  }
  // %x, %w2 and %g converted, once each; %r is channels-last as the first
  // convolution left it; %wc cast channels-last.
  CHECK(conversions == 3);
  CHECK(castsToChannelsLast == 1);
  // auto takes a graph of two forward convolutions; contiguous none.
  Graph automatic = plain, untouched = plain;
  options.lower.memoryFormat = "auto";
  runPasses(automatic, {"channels-last", "dce"}, options, DebugOptions{});
  CHECK(automatic.nodes().size() == laid.nodes().size());
  options.lower.memoryFormat = "contiguous";
  runPasses(untouched, {"channels-last"}, options, DebugOptions{});
  CHECK(untouched.nodes().size() == plain.nodes().size());

  at::manual_seed(7);
  std::map<std::string, at::Tensor> inputs;
  for (const auto& in : plain.inputs()) {
    const Value& v = plain.value(in.value);
    inputs[v.name] = at::randn(v.shape, at::TensorOptions().dtype(v.dtype));
  }
  const std::vector<at::Tensor> a = Interpreter(plain).run(inputs).outputs, b = Interpreter(laid).run(inputs).outputs;
  REQUIRE(a.size() == b.size());
  CHECK(b[0].is_contiguous(at::MemoryFormat::ChannelsLast));
  for (size_t k = 0; k < a.size(); ++k) {
    INFO("output " << k);
    CHECK(at::allclose(a[k], b[k], 1e-5, 1e-5));
  }
}

#ifdef SPMD_WITH_CUDA
// GPU only: cuDNN's attention on views of the packed projection, and its
// gradients, against the graph with the copies.
TEST_CASE("copies-to-views: cuDNN attention reads the packed projection's heads in place", "[passes][cuda]") {
  REQUIRE(at::hasCUDA());
  requireSameValues(runWithAndWithout(kPackedAttention, at::kBFloat16, at::kCUDA));
  requireSameValues(runWithAndWithout(kHeadGradients, at::kBFloat16, at::kCUDA));
}

// transformers' repeat_kv before cuDNN's attention (B 2, 4 query heads, 2
// kv heads, L 64, D 32), k upcast in the backward as autocast leaves it.
const char* kRepeatedKv = R"(graph
  input %q: bf16[2,4,64,32] data
  input %k: f32[2,2,64,32] data
  input %v: bf16[2,2,64,32] data
  input %g: bf16[2,4,64,32] data
  %ku: f32[2,2,1,64,32] = aten::unsqueeze(%k, 2)
  %ke: f32[2,2,2,64,32] = aten::expand(%ku, [2, 2, 2, 64, 32], False)
  %kr: f32[2,4,64,32] = aten::reshape(%ke, [2, 4, 64, 32])
  %kb: bf16[2,4,64,32] = aten::_to_copy(%kr, torch.bfloat16, None, None, None, False, None)
  %vu: bf16[2,2,1,64,32] = aten::unsqueeze(%v, 2)
  %ve: bf16[2,2,2,64,32] = aten::expand(%vu, [2, 2, 2, 64, 32], False)
  %vr: bf16[2,4,64,32] = aten::reshape(%ve, [2, 4, 64, 32])
  %o: bf16[2,4,64,32], %lse: f32[2,4,64], %seed: i64[], %off: i64[] = spmd::fused_attention(%q, %kb, %vr, None, 0.125, True, 0.0, "cudnn")
  %dq: bf16[2,4,64,32], %dk: bf16[2,4,64,32], %dv: bf16[2,4,64,32] = spmd::fused_attention_backward(%g, %q, %kb, %vr, None, %o, %lse, %seed, %off, 0.125, True, 0.0, "cudnn")
  %dk32: f32[2,4,64,32] = aten::_to_copy(%dk, torch.float32, None, None, None, False, None)
  %dkv: f32[2,2,2,64,32] = aten::view(%dk32, [2, 2, 2, 64, 32])
  %dks: f32[2,2,1,64,32] = aten::sum.dim_IntList(%dkv, [2], True, None)
  %dkk: f32[2,2,64,32] = aten::squeeze.dim(%dks, 2)
  %dvv: bf16[2,2,2,64,32] = aten::view(%dv, [2, 2, 2, 64, 32])
  %dvs: bf16[2,2,1,64,32] = aten::sum.dim_IntList(%dvv, [2], True, None)
  %dvk: bf16[2,2,64,32] = aten::squeeze.dim(%dvs, 2)
  return (%o, %dq, %dkk, %dvk)
)";

TEST_CASE("repeat-kv-to-gqa: cuDNN attention on grouped heads equals it on their repeats", "[passes][cuda]") {
  REQUIRE(at::hasCUDA());
  const Graph repeated = parseListing(kRepeatedKv);
  Graph grouped = repeated;
  runPasses(grouped, {"repeat-kv-to-gqa", "dce"}, PipelineOptions{}, DebugOptions{});
  int expands = 0;
  for (const Node& n : grouped.nodes()) expands += n.op == "aten::expand";
  CHECK(expands == 0);
  at::manual_seed(3);
  std::map<std::string, at::Tensor> inputs;
  for (const auto& in : repeated.inputs()) {
    const Value& v = repeated.value(in.value);
    inputs[v.name] = at::randn(v.shape, at::TensorOptions().dtype(v.dtype).device(at::kCUDA));
  }
  const std::vector<at::Tensor> a = Interpreter(repeated).run(inputs).outputs, b = Interpreter(grouped).run(inputs).outputs;
  REQUIRE(a.size() == b.size());
  // The output and dq: the same bits (each query head reads its kv head's
  // values). dk and dv: summed in fp32 inside the kernel and rounded once,
  // where the repeats' gradients were rounded to bf16 and then summed.
  CHECK(at::equal(a[0], b[0]));
  CHECK(at::equal(a[1], b[1]));
  for (size_t k = 2; k < a.size(); ++k) {
    INFO("output " << k);
    CHECK(at::allclose(a[k].to(at::kFloat), b[k].to(at::kFloat), 2e-2, 2e-2));
  }
}
#endif

// Generated kernels against the ATen ops they replace. Each case is a graph
// of one kind of group (bias + GELU, residual add + cast, the backward ops,
// broadcasting); fuse-pointwise turns it into spmd::fused nodes, and the
// interpreter runs both graphs on the same random inputs:
//  - on the CPU (CI): spmd::fused's reference kernel, which must equal the
//    unfused ATen ops bit for bit in f32 and within two units in bf16;
//  - on CUDA (builds against a CUDA LibTorch, with a GPU; not in CI): the
//    NVRTC-compiled kernels against ATen's CUDA kernels.
#include "spmd/io/artifact.h"
#include "spmd/ir/parser.h"
#include "spmd/ops/cuda_codegen.h"
#include "spmd/backend/generated_kernels.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/passes/pass.h"
#include "spmd/runtime/interpreter.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>

#include "test_support.h"

using namespace spmd;

namespace {

struct FusionCase {
  const char* name;
  const char* listing;  // {D}: the dtype under test
  int groups;           // spmd::fused nodes the pass must make
};

const FusionCase kCases[] = {
    {"bias + gelu + scale", R"(graph
  input %x: {D}[64,96] data
  input %b: {D}[96] data
  %a: {D}[64,96] = aten::add.Tensor(%x, %b, 1)
  %g: {D}[64,96] = aten::gelu(%a, "none")
  %y: {D}[64,96] = aten::mul.Scalar(%g, 0.5)
  return (%y)
)", 1},
    {"residual add in f32 + cast", R"(graph
  input %res: f32[32,80] data
  input %y: {D}[32,80] data
  %s: f32[32,80] = aten::add.Tensor(%res, %y, 1)
  %c: {D}[32,80] = aten::_to_copy(%s, torch.{T}, None, None, None, False, None)
  return (%s, %c)
)", 1},
    {"gelu backward (tanh) + relu backward, broadcast", R"(graph
  input %dy: {D}[4,6,40] data
  input %x: {D}[4,6,40] data
  input %m: {D}[4,1,40] data
  %g: {D}[4,6,40] = aten::gelu_backward(%dy, %x, "tanh")
  %r: {D}[4,6,40] = aten::threshold_backward(%g, %m, 0)
  %t: {D}[4,6,40] = aten::gelu(%r, "tanh")
  return (%t)
)", 1},
    {"tanh, sigmoid, silu and their backward", R"(graph
  input %x: {D}[50,30] data
  input %dy: {D}[50,30] data
  %t: {D}[50,30] = aten::tanh(%x)
  %tb: {D}[50,30] = aten::tanh_backward(%dy, %t)
  %s: {D}[50,30] = aten::sigmoid(%tb)
  %sb: {D}[50,30] = aten::sigmoid_backward(%dy, %s)
  %u: {D}[50,30] = aten::silu(%sb)
  %ub: {D}[50,30] = aten::silu_backward(%dy, %u)
  %n: {D}[50,30] = aten::neg(%ub)
  %e: {D}[50,30] = aten::relu(%n)
  return (%e)
)", 1},
    {"exp, log, sqrt, rsqrt, pow, rsub, div; column broadcast", R"(graph
  input %x: {D}[40,24] data
  input %col: {D}[40,1] data
  %p: {D}[40,24] = aten::pow.Tensor_Scalar(%x, 2)
  %q: {D}[40,24] = aten::add.Scalar(%p, 1, 1)
  %l: {D}[40,24] = aten::log(%q)
  %e: {D}[40,24] = aten::exp(%l)
  %z: {D}[40,24] = aten::pow.Tensor_Scalar(%e, 1.5)
  %r: {D}[40,24] = aten::rsqrt(%z)
  %s: {D}[40,24] = aten::sqrt(%r)
  %d: {D}[40,24] = aten::div.Tensor(%s, %col)
  %u: {D}[40,24] = aten::rsub.Scalar(%d, 2, 1)
  %v: {D}[40,24] = aten::div.Scalar(%u, 3)
  %w: {D}[40,24] = aten::sub.Tensor(%v, %x, 0.5)
  return (%w)
)", 1},
    // Adam's first moment (torch.optim's lerp, from both ends: weights under
    // and over one half) with its neighbours.
    {"lerp from both ends, with a scale", R"(graph
  input %m: {D}[24,40] data
  input %g: {D}[24,40] data
  %l: {D}[24,40] = aten::lerp.Scalar(%m, %g, 0.09999999999999998)
  %h: {D}[24,40] = aten::lerp.Scalar(%l, %g, 0.75)
  %y: {D}[24,40] = aten::mul.Scalar(%h, -0.5)
  return (%l, %y)
)", 1},
    // ConvNeXt's layer scale: ATen's mul and add keep the permuted operand's
    // layout, and the view after the permute back relies on it.
    {"permuted operands keep their layout (ConvNeXt's layer scale)", R"(graph
  input %x: {D}[2,3,5,16] data
  input %r: {D}[2,16,3,5] data
  input %g: {D}[16,1,1] data
  %p: {D}[2,16,3,5] = aten::permute(%x, [0, 3, 1, 2])
  %m: {D}[2,16,3,5] = aten::mul.Tensor(%g, %p)
  %y: {D}[2,16,3,5] = aten::add.Tensor(%m, %r, 1)
  %q: {D}[2,3,5,16] = aten::permute(%m, [0, 2, 3, 1])
  %v: {D}[30,16] = aten::view(%q, [30, 16])
  return (%y, %v)
)", 1},
    // llama's apply_rope: the products and their sums read select views of
    // a reshape (every other element), which the kernels read in place.
    {"rotary embedding over select views (strided inputs)", R"(graph
  input %x: {D}[2,8,3,16] data
  input %rope: f32[8,8,2] data
  %pairs: {D}[2,8,3,8,2] = aten::view(%x, [2, 8, 3, 8, 2])
  %r: f32[1,8,1,8,2] = aten::view(%rope, [1, 8, 1, 8, 2])
  %x0: {D}[2,8,3,8] = aten::select.int(%pairs, 4, 0)
  %x1: {D}[2,8,3,8] = aten::select.int(%pairs, 4, 1)
  %c: f32[1,8,1,8] = aten::select.int(%r, 4, 0)
  %s: f32[1,8,1,8] = aten::select.int(%r, 4, 1)
  %a: f32[2,8,3,8] = aten::mul.Tensor(%x0, %c)
  %b: f32[2,8,3,8] = aten::mul.Tensor(%x1, %s)
  %o0: f32[2,8,3,8] = aten::sub.Tensor(%a, %b, 1)
  %d: f32[2,8,3,8] = aten::mul.Tensor(%x1, %c)
  %e: f32[2,8,3,8] = aten::mul.Tensor(%x0, %s)
  %o1: f32[2,8,3,8] = aten::add.Tensor(%d, %e, 1)
  return (%o0, %o1)
)", 2},
    {"a transposed input beside a contiguous one", R"(graph
  input %x: {D}[4,6,10] data
  input %y: {D}[6,4,10] data
  %t: {D}[6,4,10] = aten::transpose.int(%x, 0, 1)
  %m: {D}[6,4,10] = aten::mul.Tensor(%y, %t)
  %z: {D}[6,4,10] = aten::add.Tensor(%m, %y, 1)
  return (%z)
)", 1},
};

// Stacks of generated kernels' results (fuse-pointwise, then
// stack-to-kernel): llama's apply_rope, q.float() to the cast back,
// as one kernel writing the pairs.
const std::vector<std::string> kStackPasses = {"fuse-pointwise", "stack-to-kernel", "cse", "dce"};
const FusionCase kStackCases[] = {
    {"rotary embedding as one kernel writing the pairs, cast included", R"(graph
  input %x: {D}[2,8,3,16] data
  input %rope: f32[8,8,2] data
  %f: f32[2,8,3,16] = aten::_to_copy(%x, torch.float32, None, None, None, False, None)
  %pairs: f32[2,8,3,8,2] = aten::reshape(%f, [2, 8, 3, -1, 2])
  %r: f32[1,8,1,8,2] = aten::view(%rope, [1, 8, 1, 8, 2])
  %x0: f32[2,8,3,8] = aten::select.int(%pairs, 4, 0)
  %x1: f32[2,8,3,8] = aten::select.int(%pairs, 4, 1)
  %c: f32[1,8,1,8] = aten::select.int(%r, 4, 0)
  %s: f32[1,8,1,8] = aten::select.int(%r, 4, 1)
  %a: f32[2,8,3,8] = aten::mul.Tensor(%x0, %c)
  %b: f32[2,8,3,8] = aten::mul.Tensor(%x1, %s)
  %o0: f32[2,8,3,8] = aten::sub.Tensor(%a, %b, 1)
  %d: f32[2,8,3,8] = aten::mul.Tensor(%x1, %c)
  %e: f32[2,8,3,8] = aten::mul.Tensor(%x0, %s)
  %o1: f32[2,8,3,8] = aten::add.Tensor(%d, %e, 1)
  %st: f32[2,8,3,8,2] = aten::stack([%o0, %o1], -1)
  %fl: f32[2,8,3,16] = aten::flatten.using_ints(%st, 3, -1)
  %ta: f32[2,8,3,16] = aten::type_as(%fl, %f)
  %tr: f32[2,3,8,16] = aten::transpose.int(%ta, 1, 2)
  %q: {D}[2,3,8,16] = aten::_to_copy(%tr, torch.{T}, None, None, None, False, None)
  return (%q)
)", 1},
};

// A forward and its backward whose element-wise values recompute-pointwise
// computes again in the backward: transformers' GPT-2 MLP (gelu_new in fp32
// on a GEMM's {D} rows, cast back for the next GEMM) and llama's SwiGLU.
const FusionCase kRecomputeCase = {"gelu_new and SwiGLU with their backward", R"(graph
  input %h: {D}[6,40,96] data
  input %w: {D}[96,32] data
  input %gy: {D}[240,32] data
  input %gg: f32[6,40,96] data
  input %gate: {D}[6,40,96] data
  input %up: {D}[6,40,96] data
  input %gs: {D}[6,40,96] data
  %x: f32[6,40,96] = aten::_to_copy(%h, torch.float32, None, None, None, False, None)  # role=forward
  %c: f32[6,40,96] = aten::pow.Tensor_Scalar(%x, 3.0)  # role=forward
  %k: f32[6,40,96] = aten::mul.Scalar(%c, 0.044715)  # role=forward
  %i: f32[6,40,96] = aten::add.Tensor(%x, %k, 1)  # role=forward
  %j: f32[6,40,96] = aten::mul.Scalar(%i, 0.7978845608028654)  # role=forward
  %t: f32[6,40,96] = aten::tanh(%j)  # role=forward
  %a: f32[6,40,96] = aten::add.Scalar(%t, 1.0, 1)  # role=forward
  %hx: f32[6,40,96] = aten::mul.Scalar(%x, 0.5)  # role=forward
  %g: f32[6,40,96] = aten::mul.Tensor(%hx, %a)  # role=forward
  %g.low: {D}[6,40,96] = aten::_to_copy(%g, torch.{T}, None, None, None, False, None)  # role=forward
  %rows: {D}[240,96] = aten::view(%g.low, [240, 96])  # role=forward
  %y: {D}[240,32] = aten::mm(%rows, %w)  # role=forward
  %s: {D}[6,40,96] = aten::silu(%gate)  # role=forward
  %p: {D}[6,40,96] = aten::mul.Tensor(%s, %up)  # role=forward
  %rt: {D}[96,240] = aten::t(%rows)  # role=backward
  %gw: {D}[96,32] = aten::mm(%rt, %gy)  # role=backward
  %da: f32[6,40,96] = aten::mul.Tensor(%gg, %hx)  # role=backward
  %dt: f32[6,40,96] = aten::tanh_backward(%da, %t)  # role=backward
  %dx: f32[6,40,96] = aten::mul.Tensor(%gg, %a)  # role=backward
  %dx2: f32[6,40,96] = aten::mul.Tensor(%dt, %x)  # role=backward
  %d: f32[6,40,96] = aten::add.Tensor(%dx, %dx2, 1)  # role=backward
  %dup: {D}[6,40,96] = aten::mul.Tensor(%gs, %s)  # role=backward
  %dp: {D}[6,40,96] = aten::mul.Tensor(%gs, %p)  # role=backward
  return (%y, %p, %gw, %d, %dup, %dp)
)", 0};

// Row programs (fuse-rows): reductions over the last dimension with the
// element-wise ops around them, in the forms the importer and autograd
// record (tests/zoo's llama_hf_style: RMSNorm in fp32 inside, attention's
// scale, causal mask and softmax, and their backward).
const FusionCase kRowCases[] = {
    {"RMSNorm (fp32 inside, weight after the cast back)", R"(graph
  input %h: {D}[6,40,96] data
  input %w: {D}[96] data
  %x: f32[6,40,96] = aten::_to_copy(%h, torch.float32, None, None, None, False, None)
  %p: f32[6,40,96] = aten::pow.Tensor_Scalar(%x, 2)
  %m: f32[6,40,1] = aten::mean.dim(%p, [-1], True, None)
  %e: f32[] = aten::scalar_tensor(1e-06, torch.float32, None, None, None)
  %a: f32[6,40,1] = aten::add.Tensor(%m, %e, 1)
  %r: f32[6,40,1] = aten::rsqrt(%a)
  %n: f32[6,40,96] = aten::mul.Tensor(%x, %r)
  %c: {D}[6,40,96] = aten::_to_copy(%n, torch.{T}, None, None, None, False, None)
  %y: {D}[6,40,96] = aten::mul.Tensor(%w, %c)
  return (%y, %r)
)", 1},
    {"RMSNorm backward as autograd records it", R"(graph
  input %dy16: {D}[6,40,96] data
  input %x: f32[6,40,96] data
  input %w: f32[96] data
  input %r: f32[6,40,1] data
  %dy: f32[6,40,96] = aten::_to_copy(%dy16, torch.float32, None, None, None, False, None)
  %g: f32[6,40,96] = aten::mul.Tensor(%dy, %w)
  %gx: f32[6,40,96] = aten::mul.Tensor(%g, %x)
  %gr: f32[6,40,96] = aten::mul.Tensor(%g, %r)
  %s: f32[6,40,1] = aten::sum.dim_IntList(%gx, [2], True, None)
  %r3: f32[6,40,1] = aten::pow.Tensor_Scalar(%r, 3)
  %h: f32[6,40,1] = aten::mul.Scalar(%s, -0.5)
  %hr: f32[6,40,1] = aten::mul.Tensor(%h, %r3)
  %b: f32[6,40,96] = aten::expand(%hr, [6, 40, 96], False)
  %d: f32[6,40,96] = aten::div.Scalar(%b, 96)
  %x1: f32[6,40,96] = aten::pow.Tensor_Scalar(%x, 1.0)
  %x2: f32[6,40,96] = aten::mul.Scalar(%x1, 2.0)
  %dd: f32[6,40,96] = aten::mul.Tensor(%d, %x2)
  %out: f32[6,40,96] = aten::add.Tensor(%gr, %dd, 1)
  %out16: {D}[6,40,96] = aten::_to_copy(%out, torch.{T}, None, None, None, False, None)
  return (%out16)
)", 1},
    {"scaled, masked softmax in fp32, cast back, and its backward", R"(graph
  input %scores: {D}[3,4,24,24] data
  input %causal_mask: f32[24,24] data
  input %dp: {D}[3,4,24,24] data
  %sf: f32[3,4,24,24] = aten::_to_copy(%scores, torch.float32, None, None, None, False, None)
  %k: f32[] = aten::scalar_tensor(2.8284271247461903, torch.float32, None, None, None)
  %z: f32[3,4,24,24] = aten::div.Tensor(%sf, %k)
  %zm: f32[3,4,24,24] = aten::add.Tensor(%z, %causal_mask, 1)
  %p: f32[3,4,24,24] = aten::softmax.int(%zm, -1, torch.float32)
  %p16: {D}[3,4,24,24] = aten::to.dtype(%p, torch.{T}, False, False, None)
  %dpf: f32[3,4,24,24] = aten::_to_copy(%dp, torch.float32, None, None, None, False, None)
  %dz: f32[3,4,24,24] = aten::_softmax_backward_data(%dpf, %p, -1, torch.float32)
  %ds: f32[3,4,24,24] = aten::div.Tensor(%dz, %k)
  return (%p16, %ds)
)", 1},
    {"log_softmax, its backward, amax and a plain sum over the last dimension", R"(graph
  input %x: {D}[33,70] data
  input %g: {D}[33,70] data
  %l: {D}[33,70] = aten::_log_softmax(%x, 1, False)
  %gl: {D}[33,70] = aten::_log_softmax_backward_data(%g, %l, 1, torch.{T})
  %m: {D}[33,1] = aten::amax(%x, [-1], True)
  %d: {D}[33,70] = aten::sub.Tensor(%x, %m, 1)
  %s: {D}[33,1] = aten::sum.dim_IntList(%d, [-1], True, None)
  return (%gl, %s)
)", 2},
    {"softmax and its backward over rows too long for a lane's registers", R"(graph
  input %x: {D}[5,2000] data
  input %g: {D}[5,2000] data
  %z: {D}[5,2000] = aten::mul.Scalar(%x, 0.5)
  %y: {D}[5,2000] = aten::_softmax(%z, 1, False)
  %gx: {D}[5,2000] = aten::_softmax_backward_data(%g, %y, 1, torch.{T})
  return (%y, %gx)
)", 1},
};

Graph caseGraph(const FusionCase& c, c10::ScalarType dtype) {
  const std::string shortName = dtype == at::kFloat ? "f32" : dtype == at::kBFloat16 ? "bf16" : "f16";
  const std::string torchName = dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
  std::string text = std::regex_replace(c.listing, std::regex("\\{D\\}"), shortName);
  return parseListing(std::regex_replace(text, std::regex("\\{T\\}"), torchName));
}

int fusedNodes(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == "spmd::fused";
  return n;
}

// Inputs in [-2, 2); one named causal_mask is attention's: -inf above the diagonal.
std::map<std::string, at::Tensor> randomInputs(const Graph& g, const at::Device& device) {
  at::manual_seed(7);
  std::map<std::string, at::Tensor> inputs;
  for (const auto& in : g.inputs()) {
    const Value& v = g.value(in.value);
    at::Tensor t = at::rand(v.shape, at::kDouble) * 4 - 2;
    if (v.name == "causal_mask") t = at::full(v.shape, -INFINITY, at::kDouble).triu(1);
    inputs[v.name] = t.to(v.dtype).to(device);
  }
  return inputs;
}

struct Ran {
  std::vector<at::Tensor> unfused, fused;
};

// Whether the fused result is laid out as ATen's ops lay it out (strides of
// size-1 dimensions aside).
bool sameLayout(const at::Tensor& ours, const at::Tensor& ref) {
  if (ours.sizes() != ref.sizes()) return false;
  for (int64_t d = 0; d < ref.dim(); ++d) {
    if (ref.size(d) != 1 && ours.stride(d) != ref.stride(d)) return false;
  }
  return true;
}

Ran runBoth(const FusionCase& c, c10::ScalarType dtype, const at::Device& device,
            const std::vector<std::string>& passes = {"fuse-pointwise"}) {
  Graph plain = caseGraph(c, dtype);
  Graph fused = plain;
  runPasses(fused, passes, PipelineOptions{}, DebugOptions{});
  REQUIRE(fusedNodes(fused) == c.groups);
  const auto inputs = randomInputs(plain, device);
  return {Interpreter(plain).run(inputs).outputs, Interpreter(fused).run(inputs).outputs};
}

// One unit in the last place of `dtype` at 1.0, relative.
double ulp(c10::ScalarType dtype) {
  return dtype == at::kBFloat16 ? 1.0 / 128 : dtype == at::kHalf ? 1.0 / 1024 : 1.2e-7;
}

}  // namespace

TEST_CASE("pointwise programs print as they parse", "[fused]") {
  const std::string text = "t0:f32 = add(in0, in1); t1:bf16 = gelu_tanh(t0); t2:f16 = pow(t1, -0.5); return t0, t2";
  const PointwiseProgram p = parsePointwiseProgram(text);
  CHECK(p.numInputs == 2);
  CHECK(p.statements.size() == 3);
  CHECK(p.results == std::vector<int>{0, 2});
  CHECK(printPointwiseProgram(p) == text);
  CHECK(constantText(0.1) == "0.1");
  CHECK(constantText(-3) == "-3.0");
  CHECK(constantText(1e-5) == "1e-05");
  CHECK(constantText(0.70710678118654752) == "0.70710677");
}

TEST_CASE("bad pointwise programs are refused with the place", "[fused]") {
  auto error = [](const std::string& text) {
    try {
      parsePointwiseProgram(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error("t0:f32 = add(in0); return t0") == "at character 9: add takes 2 operand(s)");
  CHECK(error("t0:f32 = frob(in0); return t0") == "at character 9: unknown operation");
  CHECK(error("t0:i64 = neg(in0); return t0") == "at character 3: expected f32, bf16 or f16");
  CHECK(error("t0:f32 = neg(t1); return t0") == "at character 13: t1 is not defined before this point");
  CHECK(error("t0:f32 = neg(in0); return in0") == "at character 26: a result must be a statement's value (tK)");
  CHECK(error("t0:f32 = neg(in0) return t0") == "at character 18: expected ';'");
  CHECK(error("t0:f32 = neg(in0); return t0 x") == "at character 29: unexpected text after the results");
}

TEST_CASE("the generated source broadcasts by static index arithmetic", "[fused]") {
  const PointwiseProgram p = parsePointwiseProgram("t0:f32 = mul(in0, in1); return t0");
  const std::string src = pointwiseKernelSource(p, {{at::kFloat, {4, 6, 8}}, {at::kFloat, {4, 1, 8}}});
  CHECK(src.find("in1[(i / 48u) * 8u + (i % 8u)]") != std::string::npos);
  CHECK_THROWS_AS(pointwiseKernelSource(p, {{at::kFloat, {4, 6}}, {at::kFloat, {5}}}), std::invalid_argument);
  CHECK_THROWS_AS(pointwiseKernelSource(p, {{at::kFloat, {4}}}), std::invalid_argument);
}

TEST_CASE("a strided input is read in place through its strides", "[fused]") {
  const PointwiseProgram p = parsePointwiseProgram("t0:f32 = mul(in0, in1); return t0");
  // A transpose of a [6, 4] tensor, and a select of every other element broadcast over rows.
  const std::vector<KernelTensor> in = {{at::kFloat, {4, 6}}, {at::kFloat, {4, 6}, {1, 4}}};
  const std::string src = pointwiseKernelSource(p, in);
  CHECK(src.find("in1[(i / 6u) + (i % 6u) * 4u]") != std::string::npos);
  CHECK(src.find("f32[4,6] strides [1,4]") != std::string::npos);
  // Read an element at a time, also in the vector kernel.
  CHECK(src.find("reinterpret_cast<const spmd_f32x4*>(in1)") == std::string::npos);
  const std::string select = pointwiseKernelSource(p, {{at::kFloat, {4, 6}}, {at::kFloat, {1, 6}, {0, 2}}});
  CHECK(select.find("in1[(i % 6u) * 2u]") != std::string::npos);
  // Nested strides act as one dimension: [2, 3, 4] sliced from [2, 3, 8].
  const std::string nested = pointwiseKernelSource(p, {{at::kFloat, {2, 3, 4}}, {at::kFloat, {2, 3, 4}, {24, 8, 1}}});
  CHECK(nested.find("in1[(i / 4u) * 8u + (i % 4u)]") != std::string::npos);
  CHECK(PointwiseKernelSpec("t0:f32 = mul(in0, in1); return t0", in).key() ==
        "pointwise t0:f32 = mul(in0, in1); return t0 in=f32[4,6],f32[4,6]:[1,4]");
  CHECK_THROWS_AS(pointwiseKernelSource(p, {{at::kFloat, {4, 6}}, {at::kFloat, {4, 6}, {1}}}), std::invalid_argument);
}

// A convolution net's BatchNorm output, channels-last: its ReLU + residual
// add keeps that layout (the meta run of ops with no C++ meta kernel, relu's,
// takes spmd's fallback).
TEST_CASE("a program's result takes its channels-last operands' layout", "[fused]") {
  const PointwiseProgram p = parsePointwiseProgram("t0:f32 = relu(in0); t1:f32 = add(t0, in1); return t1");
  const at::Tensor a = at::randn({2, 8, 4, 4}).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor b = at::randn({2, 8, 4, 4}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto strides = fusedResultStrides(p, {a, b});
  REQUIRE(strides.size() == 1);
  CHECK(strides[0] == a.strides().vec());
}

TEST_CASE("a bias is read a vector at a time where its rows are whole vectors", "[fused]") {
  const PointwiseProgram p = parsePointwiseProgram("t0:bf16 = add(in0, in1); return t0");
  const std::string whole = pointwiseKernelSource(p, {{at::kBFloat16, {4, 32}}, {at::kBFloat16, {32}}});
  CHECK(whole.find("l1 = reinterpret_cast<const spmd_u16x8*>(in1)[((n * 8u) % 32u) / 8u];") != std::string::npos);
  CHECK(whole.substr(whole.find("spmd_fused_vec")).find("in1[(i % 32u)]") == std::string::npos);
  // Rows of 12: a vector of 8 would cross a row's end.
  const std::string partial = pointwiseKernelSource(p, {{at::kBFloat16, {4, 12}}, {at::kBFloat16, {12}}});
  CHECK(partial.find("spmd_fused_vec") != std::string::npos);
  CHECK(partial.find("reinterpret_cast<const spmd_u16x8*>(in1)") == std::string::npos);
  // A column broadcast varies along no vector.
  const std::string column = pointwiseKernelSource(p, {{at::kBFloat16, {4, 32}}, {at::kBFloat16, {4, 1}}});
  CHECK(column.find("in1[(i / 32u)]") != std::string::npos);
}

TEST_CASE("the tanh GELU of a 16-bit step is computed without tanhf", "[fused]") {
  const std::vector<KernelTensor> in = {{at::kBFloat16, {4, 32}}, {at::kBFloat16, {4, 32}}};
  const std::string sixteen = pointwiseKernelSource(
      parsePointwiseProgram("t0:bf16 = gelu_tanh(in0); t1:bf16 = gelu_tanh_grad(in1, in0); return t0, t1"), in);
  CHECK(sixteen.find("tanhf") == std::string::npos);
  CHECK(sixteen.find("const unsigned short h0 = spmd_f32_to_bf16(spmd_gelu_tanh16(a0));") != std::string::npos);
  CHECK(sixteen.find("spmd_gelu_tanh16_grad(a1, a0)") != std::string::npos);
  // An f32 step keeps ATen's formula.
  const std::string f32 = pointwiseKernelSource(parsePointwiseProgram("t0:f32 = gelu_tanh(in0); return t0"), {in[0]});
  CHECK(f32.find("tanhf(inner)") != std::string::npos);
  CHECK(f32.find("spmd_gelu_tanh16") == std::string::npos);
}

// f16 on CUDA only (tests/unit's GPU cases).
TEST_CASE("fused groups equal their ATen ops on the CPU", "[fused]") {
  for (const FusionCase& c : kCases) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      INFO(c.name << " in " << c10::toString(dtype));
      const Ran ran = runBoth(c, dtype, at::kCPU);
      REQUIRE(ran.fused.size() == ran.unfused.size());
      for (size_t k = 0; k < ran.fused.size(); ++k) {
        REQUIRE(ran.fused[k].scalar_type() == ran.unfused[k].scalar_type());
        CHECK(sameLayout(ran.fused[k], ran.unfused[k]));
        if (dtype == at::kFloat) {
          CHECK(at::equal(ran.fused[k], ran.unfused[k]));
        } else {
          // Two units, and 2^-6 absolute: some of LibTorch's CPU bf16
          // kernels round inner steps too (gelu_backward with tanh is up to
          // 0.0156 off computing in float and rounding once, near 1.0).
          testing::requireClose(ran.fused[k], ran.unfused[k], c.name, 2 * ulp(dtype), 1.0 / 64);
        }
      }
    }
  }
}

TEST_CASE("a stack of generated kernels' results equals its ATen ops on the CPU", "[fused]") {
  for (const FusionCase& c : kStackCases) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      INFO(c.name << " in " << c10::toString(dtype));
      const Ran ran = runBoth(c, dtype, at::kCPU, kStackPasses);
      REQUIRE(ran.fused.size() == ran.unfused.size());
      for (size_t k = 0; k < ran.fused.size(); ++k) {
        REQUIRE(ran.fused[k].scalar_type() == ran.unfused[k].scalar_type());
        CHECK(sameLayout(ran.fused[k], ran.unfused[k]));
        CHECK(at::equal(ran.fused[k], ran.unfused[k]));
      }
    }
  }
}

namespace {

// The same graph fused with and without recompute-pointwise before: the
// recomputed values are the same ops on the same inputs, so every result is
// the same, bit for bit, and the backward reads no value the forward kept
// but the GEMM's input and the SwiGLU's gate and up.
Ran runRecomputed(c10::ScalarType dtype, const at::Device& device) {
  Graph kept = caseGraph(kRecomputeCase, dtype);
  Graph recomputed = kept;
  runPasses(kept, {"fuse-pointwise", "dce"}, PipelineOptions{}, DebugOptions{});
  runPasses(recomputed, {"recompute-pointwise", "dce", "fuse-pointwise", "dce"}, PipelineOptions{}, DebugOptions{});
  int clones = 0;
  for (const Node& n : recomputed.nodes()) {
    for (ValueId v : n.outputs) clones += recomputed.value(v).name.find(".recomputed") != std::string::npos;
  }
  REQUIRE(clones > 0);
  for (const Node& n : recomputed.nodes()) {
    if (n.meta.role != NodeRole::Backward) continue;
    forEachTensorArg(n, [&](ValueId v) {
      const Node* p = recomputed.producer(v);
      INFO("backward node " << n.op << " reads " << recomputed.value(v).name);
      CHECK((!p || p->meta.role != NodeRole::Forward || recomputed.value(v).name == "rows" ||
             recomputed.value(v).name == "y"));
    });
  }
  const auto inputs = randomInputs(kept, device);
  return {Interpreter(kept).run(inputs).outputs, Interpreter(recomputed).run(inputs).outputs};
}

void requireSameBits(const Ran& ran) {
  REQUIRE(ran.fused.size() == ran.unfused.size());
  for (size_t k = 0; k < ran.fused.size(); ++k) {
    INFO("output " << k);
    CHECK(at::equal(ran.fused[k].cpu(), ran.unfused[k].cpu()));
  }
}

}  // namespace

TEST_CASE("values recomputed in the backward equal the kept ones on the CPU", "[fused]") {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    requireSameBits(runRecomputed(dtype, at::kCPU));
  }
}

namespace {

// The reductions add in another order than ATen's (a warp's lanes, then a
// shuffle tree; on the CPU softmax as exp, sum and div): f32 within a few
// units, bf16 and f16 within two units of their rounding.
void requireRowsClose(const Ran& ran, const FusionCase& c, c10::ScalarType dtype) {
  REQUIRE(ran.fused.size() == ran.unfused.size());
  for (size_t k = 0; k < ran.fused.size(); ++k) {
    const at::Tensor ours = ran.fused[k].cpu(), ref = ran.unfused[k].cpu();
    REQUIRE(ours.scalar_type() == ref.scalar_type());
    std::printf("[rows-numerics] %-72s %-9s output %zu: max abs diff %.3g (max |ref| %.3g)\n", c.name,
                c10::toString(dtype), k, (ours.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>(),
                ref.to(at::kDouble).abs().max().item<double>());
    if (ref.scalar_type() == at::kFloat) {
      testing::requireClose(ours, ref, c.name, 1e-5, 1e-6);
    } else {
      testing::requireClose(ours, ref, c.name, 2 * ulp(ref.scalar_type()), 1.0 / 64);
    }
  }
}

}  // namespace

TEST_CASE("fused row programs equal their ATen ops on the CPU", "[fused]") {
  for (const FusionCase& c : kRowCases) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      INFO(c.name << " in " << c10::toString(dtype));
      requireRowsClose(runBoth(c, dtype, at::kCPU, {"fuse-rows"}), c, dtype);
    }
  }
}

TEST_CASE("row programs print as they parse and return per-row values", "[fused]") {
  const std::string text =
      "t0:f32 = mul(in0, in0); t1:f32 = row_sum(t0); t2:f32 = add(t1, in1); t3:bf16 = mul(in0, t2); "
      "return t3, row(t2)";
  const PointwiseProgram p = parsePointwiseProgram(text);
  CHECK(printPointwiseProgram(p) == text);
  CHECK(hasRowReductions(p));
  CHECK(resultShape(p, 0, {4, 8}) == std::vector<int64_t>{4, 8});
  CHECK(resultShape(p, 1, {4, 8}) == std::vector<int64_t>{4, 1});
  // in1 of [4, 1] is the same along a row, so t2 is a row's value; of [4, 8] it is not.
  CHECK(rowLevelStatements(p, {{4, 8}, {4, 1}}, {4, 8}) == std::vector<bool>{false, true, true, false});
  CHECK_THROWS_WITH(rowLevelStatements(p, {{4, 8}, {4, 8}}, {4, 8}), "row(t2) of a statement not at row level");
  const std::string source = pointwiseKernelSource(p, {{at::kFloat, {4, 8}}, {at::kFloat, {4, 1}}});
  CHECK(source.find(kFusedRowsKernelName) != std::string::npos);
  CHECK(fusedVectorWidth(p, {{at::kFloat, {4, 8}}, {at::kFloat, {4, 1}}}) == 0);
}

namespace {

// Cross entropy as F.cross_entropy records itnamespace {

// Cross entropy as F.cross_entropy records it, and its backward, over
// `rows` x `classes` logits: fp32, or bf16 in autocast's form (log_softmax
// in bf16, cast to fp32 for nll_loss, its gradient cast back).
// `seeded`: the backward starts from ones_like(loss), as a train step's does
// (one fused kernel for both); else from an input (two kernels).
Graph crossEntropyGraph(int64_t rows, int64_t classes, int reduction, bool seeded, bool bf16) {
  std::string text = bf16 ? R"(graph
  input %x: bf16[R,C] data
  input %t: i64[R] data
  input %scale: f32[] data
  %lp16: bf16[R,C] = aten::_log_softmax(%x, 1, False)
  %lp: f32[R,C] = aten::_to_copy(%lp16, torch.float32, None, None, None, False, None)
  %loss: f32[], %total: f32[] = aten::nll_loss_forward(%lp, %t, None, RED, -100)
  %g: f32[] = SEED
  %glp: f32[R,C] = aten::nll_loss_backward(%g, %lp, %t, None, RED, -100, %total)
  %glp16: bf16[R,C] = aten::_to_copy(%glp, torch.bfloat16, None, None, None, False, None)
  %gx: bf16[R,C] = aten::_log_softmax_backward_data(%glp16, %lp16, 1, torch.bfloat16)
  return (%loss, %gx)
)"
                          : R"(graph
  input %x: f32[R,C] data
  input %t: i64[R] data
  input %scale: f32[] data
  %lp: f32[R,C] = aten::_log_softmax(%x, 1, False)
  %loss: f32[], %total: f32[] = aten::nll_loss_forward(%lp, %t, None, RED, -100)
  %g: f32[] = SEED
  %glp: f32[R,C] = aten::nll_loss_backward(%g, %lp, %t, None, RED, -100, %total)
  %gx: f32[R,C] = aten::_log_softmax_backward_data(%glp, %lp, 1, torch.float32)
  return (%loss, %gx)
)";
  text = std::regex_replace(text, std::regex("R,C"), std::to_string(rows) + "," + std::to_string(classes));
  text = std::regex_replace(text, std::regex("\\[R\\]"), "[" + std::to_string(rows) + "]");
  text = std::regex_replace(text, std::regex("SEED"),
                            seeded ? "aten::ones_like(%loss, None, None, None, None, None)" : "aten::mul.Scalar(%scale, 3)");
  return parseListing(std::regex_replace(text, std::regex("RED"), std::to_string(reduction)));
}

// Unfused and fused on the same logits (spread wide: |x| up to 12) and
// targets, every fifth row ignored (-100).
Ran runCrossEntropy(int64_t rows, int64_t classes, int reduction, bool seeded, const at::Device& device,
                    bool bf16 = false) {
  const Graph plain = crossEntropyGraph(rows, classes, reduction, seeded, bf16);
  Graph fused = plain;
  runPasses(fused, {"cross-entropy-to-kernel"}, PipelineOptions{}, DebugOptions{});
  int ops = 0;
  for (const Node& n : fused.nodes()) ops += n.op.rfind("spmd::cross_entropy", 0) == 0;
  REQUIRE(ops == (seeded ? 1 : 2));
  REQUIRE(fused.nodes().size() == (seeded ? 1u : 3u));  // the casts went with the ops
  at::manual_seed(3);
  at::Tensor t = at::randint(0, classes, {rows}, at::kLong);
  t.index_put_({at::arange(0, rows, 5)}, -100);
  const at::Tensor x = at::randn({rows, classes}) * 4;
  const std::map<std::string, at::Tensor> inputs = {{"x", (bf16 ? x.to(at::kBFloat16) : x).to(device)},
                                                    {"t", t.to(device)},
                                                    {"scale", at::full({}, 0.25).to(device)}};
  return {Interpreter(plain).run(inputs).outputs, Interpreter(fused).run(inputs).outputs};
}

// A model's logits.float() before F.cross_entropy under autocast: bf16
// logits cast up and viewed, the fp32 loss and its backward, the gradient
// viewed back and cast to bf16 (what autocast's backward records).
Ran runUpcastCrossEntropy(int64_t rows, int64_t classes, int reduction, const at::Device& device) {
  std::string text = R"(graph
  input %x: bf16[R,C] data
  input %t: i64[R] data
  %xf: f32[R,C] = aten::_to_copy(%x, torch.float32, None, None, None, False, None)
  %xv: f32[R,C] = aten::view(%xf, [R, C])
  %lp: f32[R,C] = aten::_log_softmax(%xv, 1, False)
  %loss: f32[], %total: f32[] = aten::nll_loss_forward(%lp, %t, None, RED, -100)
  %g: f32[] = aten::ones_like(%loss, None, None, None, None, None)
  %glp: f32[R,C] = aten::nll_loss_backward(%g, %lp, %t, None, RED, -100, %total)
  %gx: f32[R,C] = aten::_log_softmax_backward_data(%glp, %lp, 1, torch.float32)
  %gv: f32[R,C] = aten::view(%gx, [R, C])
  %gx16: bf16[R,C] = aten::_to_copy(%gv, torch.bfloat16, None, None, None, False, None)
  return (%loss, %gx16)
)";
  text = std::regex_replace(text, std::regex("R,C"), std::to_string(rows) + "," + std::to_string(classes));
  text = std::regex_replace(text, std::regex("R, C"), std::to_string(rows) + ", " + std::to_string(classes));
  text = std::regex_replace(text, std::regex("\\[R\\]"), "[" + std::to_string(rows) + "]");
  const Graph plain = parseListing(std::regex_replace(text, std::regex("RED"), std::to_string(reduction)));
  Graph fused = plain;
  runPasses(fused, {"cross-entropy-to-kernel", "dce"}, PipelineOptions{}, DebugOptions{});
  int upcast = 0, casts = 0;
  for (const Node& n : fused.nodes()) {
    upcast += n.qualifiedName() == "spmd::cross_entropy_with_grad.upcast";
    casts += n.op == "aten::_to_copy";
  }
  REQUIRE(upcast == 1);
  REQUIRE(casts == 0);
  at::manual_seed(3);
  at::Tensor t = at::randint(0, classes, {rows}, at::kLong);
  t.index_put_({at::arange(0, rows, 5)}, -100);
  const at::Tensor x = (at::randn({rows, classes}) * 4).to(at::kBFloat16);
  const std::map<std::string, at::Tensor> inputs = {{"x", x.to(device)}, {"t", t.to(device)}};
  return {Interpreter(plain).run(inputs).outputs, Interpreter(fused).run(inputs).outputs};
}

}  // namespace

TEST_CASE("cross entropy over upcast bf16 logits equals the fp32 ops and the cast back on the CPU", "[fused]") {
  for (int reduction : {1, 2}) {
    INFO("reduction " << reduction);
    const Ran ran = runUpcastCrossEntropy(23, 37, reduction, at::kCPU);
    REQUIRE(ran.fused[1].scalar_type() == at::kBFloat16);
    testing::requireClose(ran.fused[0], ran.unfused[0], "loss", 0, 0);
    testing::requireClose(ran.fused[1], ran.unfused[1], "gradient", 0, 0);
  }
}

TEST_CASE("fused cross entropy equals log_softmax + nll_loss on the CPU", "[fused]") {
  for (bool seeded : {true, false}) {
    for (int reduction : {1, 2}) {
      INFO("reduction " << reduction << (seeded ? ", from ones_like" : ", from an input"));
      const Ran ran = runCrossEntropy(23, 37, reduction, seeded, at::kCPU);
      testing::requireClose(ran.fused[0], ran.unfused[0], "loss", 0, 0);
      testing::requireClose(ran.fused[1], ran.unfused[1], "gradient", 0, 0);
    }
  }
}

// The CPU kernel runs the replaced ATen ops, so this checks the rewrite:
// which casts go, what the fused op reads, its results' types.
TEST_CASE("fused bf16 cross entropy equals autocast's log_softmax + nll_loss on the CPU", "[fused]") {
  for (bool seeded : {true, false}) {
    for (int reduction : {1, 2}) {
      INFO("reduction " << reduction << (seeded ? ", from ones_like" : ", from an input"));
      const Ran ran = runCrossEntropy(23, 37, reduction, seeded, at::kCPU, true);
      REQUIRE(ran.fused[0].scalar_type() == at::kFloat);
      REQUIRE(ran.fused[1].scalar_type() == at::kBFloat16);
      testing::requireClose(ran.fused[0], ran.unfused[0], "loss", 0, 0);
      testing::requireClose(ran.fused[1], ran.unfused[1], "gradient", 0, 0);
    }
  }
}

TEST_CASE("an artifact keeps its generated kernels, checksummed", "[fused]") {
  Graph g = caseGraph(kCases[0], at::kFloat);
  runPasses(g, {"fuse-pointwise"}, PipelineOptions{}, DebugOptions{});
  Artifact a;
  a.graph = g;
  a.device = "cuda";
  a.kernels = {{"// source 0\n", "sm_90", std::string("\x7f" "ELF\0\1", 6)}, {"// source 1\n", "", ""}};
  const std::string path = (std::filesystem::temp_directory_path() / "spmd-fused-artifact.art").string();
  writeArtifact(a, path);
  std::string bytes = testing::readFile(path);
  Artifact back = readArtifact(bytes);
  REQUIRE(back.kernels.size() == 2);
  CHECK(back.kernels[0].source == a.kernels[0].source);
  CHECK(back.kernels[0].arch == "sm_90");
  CHECK(back.kernels[0].image == a.kernels[0].image);
  CHECK(back.kernels[1].source == a.kernels[1].source);
  CHECK(back.kernels[1].image.empty());
  // One changed byte of a kernel's source is a damaged artifact.
  const size_t at = bytes.find("// source 1");
  REQUIRE(at != std::string::npos);
  bytes[at + 3] = 'S';
  std::string error;
  try {
    readArtifact(bytes);
  } catch (const Diagnostic& d) {
    error = d.message();
  }
  CHECK(error.find("checksum mismatch") != std::string::npos);
  std::filesystem::remove(path);
}

#ifdef SPMD_WITH_CUDA
// GPU only (a CUDA LibTorch and a device): prints one line per case and
// dtype with the largest difference, which bench/RESULTS.md records.
TEST_CASE("generated kernels match ATen's CUDA kernels", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  for (const FusionCase& c : kCases) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      INFO(c.name << " in " << c10::toString(dtype));
      const Ran ran = runBoth(c, dtype, at::Device(at::kCUDA, 0));
      for (size_t k = 0; k < ran.fused.size(); ++k) {
        CHECK(sameLayout(ran.fused[k], ran.unfused[k]));
        const at::Tensor ours = ran.fused[k].cpu().to(at::kDouble), ref = ran.unfused[k].cpu().to(at::kDouble);
        const double worst = (ours - ref).abs().max().item<double>();
        const double scale = ref.abs().max().item<double>();
        std::printf("[fused-numerics] %-56s %-9s output %zu: max abs diff %.3g (max |ref| %.3g)\n", c.name,
                    c10::toString(dtype), k, worst, scale);
        // f32: a few ulps (ATen's kernels contract to FMA, ours may not);
        // bf16/f16: one unit of the dtype's rounding.
        testing::requireClose(ran.fused[k].cpu(), ran.unfused[k].cpu(), c.name, dtype == at::kFloat ? 1e-5 : ulp(dtype),
                              dtype == at::kFloat ? 1e-6 : 1e-3);
      }
    }
  }
}

TEST_CASE("generated pair kernels match ATen's CUDA kernels", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  for (const FusionCase& c : kStackCases) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      INFO(c.name << " in " << c10::toString(dtype));
      const Ran ran = runBoth(c, dtype, at::Device(at::kCUDA, 0), kStackPasses);
      for (size_t k = 0; k < ran.fused.size(); ++k) {
        CHECK(sameLayout(ran.fused[k], ran.unfused[k]));
        const double worst = (ran.fused[k].cpu().to(at::kDouble) - ran.unfused[k].cpu().to(at::kDouble)).abs().max().item<double>();
        std::printf("[fused-numerics] %-56s %-9s output %zu: max abs diff %.3g\n", c.name, c10::toString(dtype), k, worst);
        testing::requireClose(ran.fused[k].cpu(), ran.unfused[k].cpu(), c.name, dtype == at::kFloat ? 1e-5 : ulp(dtype),
                              dtype == at::kFloat ? 1e-6 : 1e-3);
      }
    }
  }
}

TEST_CASE("values recomputed in the backward equal the kept ones on CUDA", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    INFO(c10::toString(dtype));
    requireSameBits(runRecomputed(dtype, at::Device(at::kCUDA, 0)));
  }
}

TEST_CASE("generated row kernels match ATen's CUDA kernels", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  for (const FusionCase& c : kRowCases) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      INFO(c.name << " in " << c10::toString(dtype));
      requireRowsClose(runBoth(c, dtype, at::Device(at::kCUDA, 0), {"fuse-rows"}), c, dtype);
    }
  }
}
#endif

#ifdef SPMD_WITH_CUDA
// GPU only: what spmd-run relies on to compile nothing, an installed image
// found by the launch that generates the same source.
TEST_CASE("a launch uses an installed kernel image instead of compiling", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  ensureFusedKernelOpsRegistered();
  ensureFusedKernelsCudaRegistered();
  const auto fused = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("spmd::fused", "")
                         .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view)>();
  const at::Tensor x = at::rand({37, 5}, at::TensorOptions().device(at::kCUDA));
  // Programs no other test launches, so that no earlier launch cached them.
  const std::string installed = "t0:f32 = neg(in0); t1:f32 = exp(t0); return t1";
  const std::string notInstalled = "t0:f32 = exp(in0); t1:f32 = neg(t0); return t1";
  installCompiledKernel(compileKernel(pointwiseKernelSource(parsePointwiseProgram(installed), {{at::kFloat, {37, 5}}})));
  const size_t before = kernelsCompiledAtLaunch();
  const at::Tensor y = fused.call({x}, installed)[0];
  CHECK(kernelsCompiledAtLaunch() == before);
  CHECK(at::allclose(y.cpu(), at::exp(-x).cpu()));
  fused.call({x}, notInstalled);
  CHECK(kernelsCompiledAtLaunch() == before + 1);
}
#endif

#ifdef SPMD_WITH_CUDA
namespace {

// The tanh GELU and its gradient in float64 without cancellation anywhere:
// 0.5 x (1 + tanh u) = x s and its derivative s + 2 x s (1 - s) u', with
// s = sigmoid(2u) and 1 - s = e^-2u s.
std::vector<at::Tensor> exactGeluTanh(const at::Tensor& x, const at::Tensor& g) {
  const double c = std::sqrt(2.0 / M_PI), kappa = 0.044715;
  const at::Tensor u = c * (x + kappa * x.pow(3)), du = c * (1 + 3 * kappa * x * x);
  const at::Tensor e = at::exp(-2 * u), s = 1 / (1 + e);
  return {x * s, g * (s + 2 * x * s * (e * s) * du), g * (s + (2 * x * s * (e * s) * du).abs())};
}

// Elements of `ours` farther from `ref` than `units` of the dtype's rounding
// relative to `ref`, plus float's error on terms of size `terms`, plus
// `floor` (values below it may underflow), among those where `where` holds.
int64_t farFrom(const at::Tensor& ours, const at::Tensor& ref, const at::Tensor& terms, const at::Tensor& where,
                double units, double unit, double floor) {
  const at::Tensor allowed = units * unit * ref.abs() + 1e-6 * terms.abs() + floor;
  return ((ours.to(at::kDouble) - ref).abs().gt(allowed) & where).sum().item<int64_t>();
}

}  // namespace

// The 16-bit steps' form, x * sigmoid(2u), against the exact value over
// [-20, 20], the negative tail included (where ATen's 1 + tanh(u) cancels),
// and against ATen's CUDA kernels where ATen's form does not cancel.
TEST_CASE("the 16-bit tanh GELU is within a rounding of the exact value", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  ensureFusedKernelOpsRegistered();
  ensureFusedKernelsCudaRegistered();
  const auto fused = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("spmd::fused", "")
                         .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view)>();
  for (c10::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    INFO(c10::toString(dtype));
    const std::string d = dtype == at::kBFloat16 ? "bf16" : "f16";
    const at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    at::manual_seed(11);
    const at::Tensor x = at::linspace(-20, 20, 1 << 18, at::kDouble).to(cuda);
    const at::Tensor g = (at::rand({1 << 18}, at::kDouble) * 4 - 2).to(cuda);
    const std::vector<at::Tensor> ours =
        fused.call({x, g}, "t0:" + d + " = gelu_tanh(in0); t1:" + d + " = gelu_tanh_grad(in1, in0); return t0, t1");
    const at::Tensor xd = x.cpu().to(at::kDouble), gd = g.cpu().to(at::kDouble);
    const std::vector<at::Tensor> exact = exactGeluTanh(xd, gd);
    const at::Tensor aten = at::gelu(x, "tanh").cpu(), atenGrad = at::gelu_backward(g, x, "tanh").cpu();
    // bf16 keeps float's range: below x = -9.7 the clamped exponent gives 0 for values under 1e-34.
    const double floor = dtype == at::kBFloat16 ? 1e-30 : std::ldexp(1.0, -24);
    const at::Tensor all = at::ones_like(xd, at::kBool), atenExact = xd.ge(-3.5);
    CHECK(farFrom(ours[0].cpu(), exact[0], exact[0], all, 1, ulp(dtype), floor) == 0);
    CHECK(farFrom(ours[1].cpu(), exact[1], exact[2], all, 1, ulp(dtype), floor) == 0);
    CHECK(farFrom(ours[0].cpu(), aten.to(at::kDouble), exact[0], atenExact, 2, ulp(dtype), floor) == 0);
    CHECK(farFrom(ours[1].cpu(), atenGrad.to(at::kDouble), exact[2], atenExact, 2, ulp(dtype), floor) == 0);
    // Where ATen's own result is more than a unit off the exact value (printed, not checked).
    const at::Tensor atenOff = (aten.to(at::kDouble) - exact[0]).abs().gt(ulp(dtype) * exact[0].abs() + floor);
    const at::Tensor offAt = xd.masked_select(atenOff);
    std::printf("[gelu-tanh] %-9s ATen's forward more than a unit off the exact value at %lld of %d inputs, the largest x %.4g\n",
                c10::toString(dtype), static_cast<long long>(offAt.numel()), 1 << 18,
                offAt.numel() ? offAt.max().item<double>() : NAN);
  }
}
#endif

#ifdef SPMD_WITH_CUDA
namespace {

// Attention as a model writes it (causal: keys after the query masked out,
// top-left aligned), with autograd's gradients: the reference for the gemm kernel.
std::vector<at::Tensor> mathAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& grad, double scale, bool causal) {
  const at::Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
                   vv = v.detach().requires_grad_(true);
  at::Tensor scores = at::matmul(qq, kk.transpose(-2, -1)).mul(scale);
  if (causal) {
    const at::Tensor later = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu(1);
    scores = scores.masked_fill(later, -std::numeric_limits<double>::infinity());
  }
  const at::Tensor out = at::matmul(at::softmax(scores, -1), vv);
  out.backward(grad);
  return {out.detach(), qq.grad(), kk.grad(), vv.grad()};
}

}  // namespace

// GPU only: spmd::fused_attention(_backward) with kernel "gemm" (fp32 GEMMs
// and the generated softmax) against autograd over the math, TF32 off.
TEST_CASE("gemm attention equals autograd over the math", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  ensureAttentionOpsRegistered();
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto forward = dispatcher.findSchemaOrThrow("spmd::fused_attention", "")
                           .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                               const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const c10::optional<at::Tensor>&, double, bool, double, c10::string_view)>();
  const auto backward =
      dispatcher.findSchemaOrThrow("spmd::fused_attention_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const c10::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, double, bool, double, c10::string_view)>();
  const auto opts = at::TensorOptions().device(at::kCUDA);
  // (queries, keys): equal, more keys than queries, rows longer than 1024,
  // and causal GEMMs in 2 and 4 blocks (256 and 512 queries).
  for (const auto& [queries, keys] :
       std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {50, 70}, {8, 1100}, {256, 256}, {512, 512}}) {
    for (bool causal : {true, false}) {
      INFO(queries << " queries, " << keys << " keys, causal " << causal);
      at::manual_seed(11);
      // q in a transposed layout, as a model's [batch, length, heads, size] view gives it.
      const at::Tensor q = at::randn({2, queries, 3, 16}, opts).transpose(1, 2);
      const at::Tensor k = at::randn({2, 3, keys, 16}, opts), v = at::randn({2, 3, keys, 16}, opts);
      const at::Tensor grad = at::randn({2, 3, queries, 16}, opts);
      const double scale = 0.25;
      const auto [out, probs, seed, offset] = forward.call(q, k, v, c10::nullopt, scale, causal, 0.0, "gemm");
      const auto [dq, dk, dv] = backward.call(grad, q, k, v, c10::nullopt, out, probs, seed, offset, scale, causal, 0.0, "gemm");
      const std::vector<at::Tensor> ref = mathAttention(q, k, v, grad, scale, causal);
      const std::vector<at::Tensor> ours = {out, dq, dk, dv};
      const char* names[] = {"out", "grad q", "grad k", "grad v"};
      for (size_t i = 0; i < ours.size(); ++i) {
        const double worst = (ours[i] - ref[i]).abs().max().item<double>();
        std::printf("[attention-numerics] gemm %3lld x %4lld causal %d %-7s max abs diff %.3g\n",
                    static_cast<long long>(queries), static_cast<long long>(keys), causal, names[i], worst);
        testing::requireClose(ours[i].cpu(), ref[i].cpu(), names[i], 1e-4, 1e-5);
      }
      // The layouts the meta kernel promises (those of autograd over the math).
      auto onMeta = [](const at::Tensor& t) { return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)); };
      const auto [mq, mk, mv] = backward.call(onMeta(grad), onMeta(q), onMeta(k), onMeta(v), c10::nullopt, onMeta(out),
                                              onMeta(probs), onMeta(seed), onMeta(offset), scale, causal, 0.0, "gemm");
      CHECK(dq.strides() == mq.strides());
      CHECK(dk.strides() == mk.strides());
      CHECK(dv.strides() == mv.strides());
      CHECK(dk.transpose(-2, -1).is_contiguous());
    }
  }
}
#endif

#ifdef SPMD_WITH_CUDA
// GPU only: the generated cross-entropy kernels against ATen's CUDA
// log_softmax, nll_loss and their backward, over fp32 and (autocast's form)
// bf16 logits.
TEST_CASE("generated cross entropy matches ATen's CUDA kernels", "[fused][cuda]") {
  if (!canCompileKernels()) FAIL("this CUDA build sees no GPU: run the [cuda] tests on the GPU machine");
  for (bool bf16 : {false, true}) {
    for (const auto& [rows, classes] : std::vector<std::pair<int64_t, int64_t>>{{64, 50304}, {100, 1000}, {7, 3}}) {
      for (int reduction : {1, 2}) {
        for (bool seeded : {true, false}) {
          INFO((bf16 ? "bf16 " : "fp32 ") << rows << " x " << classes << ", reduction " << reduction
                                          << (seeded ? ", one kernel" : ", two kernels"));
          const Ran ran = runCrossEntropy(rows, classes, reduction, seeded, at::Device(at::kCUDA, 0), bf16);
          const char* names[] = {"loss", "gradient"};
          for (size_t k = 0; k < 2; ++k) {
            const at::Tensor fused = ran.fused[k].to(at::kFloat).cpu(), unfused = ran.unfused[k].to(at::kFloat).cpu();
            const double worst = (fused - unfused).abs().max().item<double>();
            std::printf(
                "[cross-entropy-numerics] %s %4lld x %5lld reduction %d %-11s %-8s max abs diff %.3g (max |ref| %.3g)\n",
                bf16 ? "bf16" : "fp32", static_cast<long long>(rows), static_cast<long long>(classes), reduction,
                seeded ? "one kernel" : "two kernels", names[k], worst, unfused.abs().max().item<double>());
            // bf16: ATen's fp32 log probabilities and the kernel's differ in
            // their last bits, so now and then one rounds to the next bf16
            // value (1/256 of it): its row's loss moves by that, its
            // gradient by at most about 0.3% of the largest.
            const double atol = !bf16 ? 1e-7 : k ? 1e-2 * unfused.abs().max().item<double>() : 1e-6;
            testing::requireClose(fused, unfused, names[k], bf16 ? (k ? 1e-2 : 1e-3) : 1e-5, atol);
          }
        }
      }
    }
  }
  // bf16 logits read as their fp32 values, the gradient rounded once to bf16.
  for (const auto& [rows, classes] : std::vector<std::pair<int64_t, int64_t>>{{64, 50304}, {100, 1000}, {7, 3}}) {
    INFO("upcast bf16 " << rows << " x " << classes);
    const Ran ran = runUpcastCrossEntropy(rows, classes, 1, at::Device(at::kCUDA, 0));
    const at::Tensor loss = ran.fused[0].cpu(), grad = ran.fused[1].to(at::kFloat).cpu();
    const at::Tensor refGrad = ran.unfused[1].to(at::kFloat).cpu();
    std::printf("[cross-entropy-numerics] upcast %4lld x %5lld loss diff %.3g, gradient max abs diff %.3g (max |ref| %.3g)\n",
                static_cast<long long>(rows), static_cast<long long>(classes),
                (loss - ran.unfused[0].cpu()).abs().item<double>(), (grad - refGrad).abs().max().item<double>(),
                refGrad.abs().max().item<double>());
    // fp32 arithmetic on both sides (expf against ATen's exp), then one bf16 rounding.
    testing::requireClose(loss, ran.unfused[0].cpu(), "loss", 1e-5, 1e-6);
    testing::requireClose(grad, refGrad, "gradient", 1.0 / 128, 1e-6 * refGrad.abs().max().item<double>());
  }
}
#endif

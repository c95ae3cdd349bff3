// spmd::fused's schema, its meta kernel (shapes and dtypes for the verifier)
// and its CPU kernel: the program evaluated with ATen's own float kernels,
// each result rounded to its statement's dtype, which is what the unfused ops
// compute. The CUDA kernel is in backend/fused_kernels_cuda.cpp.
#include "spmd/ops/cuda_codegen.h"
#include "spmd/ops/fused_kernels.h"
#include "spmd/ops/meta.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/ops/spmd_ops.h"

#include <ATen/ATen.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <algorithm>
#include <stdexcept>

namespace spmd {
namespace {

PointwiseProgram programOf(c10::string_view text) {
  try {
    return parsePointwiseProgram(std::string_view(text.data(), text.size()));
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "spmd::fused: bad program: ", e.what());
  }
}

std::vector<KernelTensor> signatureOf(at::TensorList inputs) {
  std::vector<KernelTensor> sig;
  for (const at::Tensor& t : inputs) sig.push_back({t.scalar_type(), t.sizes().vec()});
  return sig;
}

std::vector<int64_t> iterationShape(const PointwiseProgram& program, at::TensorList inputs) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == program.numInputs, "spmd::fused: the program reads ",
              program.numInputs, " inputs, given ", inputs.size());
  TORCH_CHECK(!hasRowReductions(program) || !inputs.empty(), "spmd::fused: a row program without inputs");
  try {
    std::vector<int64_t> shape = broadcastShapes(signatureOf(inputs));
    checkPairs(program, shape);
    if (hasRowReductions(program)) {
      TORCH_CHECK(!shape.empty(), "spmd::fused: a row program over a 0-dim tensor");
      std::vector<std::vector<int64_t>> shapes;
      for (const at::Tensor& t : inputs) shapes.push_back(t.sizes().vec());
      rowLevelStatements(program, shapes, shape);  // checks the row(tK) results
    }
    return shape;
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "spmd::fused: ", e.what());
  }
}

// A bernoulli statement's mask over `shape`, 1 where kept (ops/pointwise_program.h):
// LibTorch's own Philox engine gives each run of four elements its words.
at::Tensor keepMask(const at::Tensor& seed, at::IntArrayRef shape, float p) {
  TORCH_CHECK(seed.scalar_type() == at::kLong && seed.dim() == 0, "spmd::fused: a bernoulli seed must be a 0-dim int64 tensor");
  at::Tensor mask = at::empty(shape, at::kFloat);
  float* out = mask.data_ptr<float>();
  const int64_t n = mask.numel();
  const auto key = static_cast<uint64_t>(seed.item<int64_t>());
  for (int64_t first = 0; first < n; first += 4) {
    at::Philox4_32 words(key, 0, static_cast<uint64_t>(first / 4));
    for (int64_t i = first; i < std::min(n, first + 4); ++i) out[i] = keepsElement(words(), p) ? 1.0f : 0.0f;
  }
  return mask;
}

// `shape`: the iteration space, over whose last dimension the row
// reductions run (an operand may broadcast to it).
at::Tensor evaluate(const PointwiseStatement& s, const std::vector<at::Tensor>& a, at::IntArrayRef shape) {
  using P = PointwiseOp;
  // A threshold, exponent or probability is a Scalar to ATen: a constant's
  // own value (read off the statement, which also works on the meta device).
  auto scalar = [&](size_t k) -> at::Scalar {
    if (s.operands[k].kind == PointwiseOperand::Kind::Constant) return static_cast<float>(s.operands[k].constant);
    return a[k].item();
  };
  switch (s.op) {
    case P::Add: return a[0] + a[1];
    case P::Sub: return a[0] - a[1];
    case P::Mul: return a[0] * a[1];
    case P::Div: return a[0] / a[1];
    case P::Neg: return -a[0];
    case P::Relu: return at::relu(a[0]);
    case P::ThresholdGrad: return at::threshold_backward(a[0], a[1], scalar(2));
    case P::Gelu: return at::gelu(a[0], "none");
    case P::GeluGrad: return at::gelu_backward(a[0], a[1], "none");
    case P::GeluTanh: return at::gelu(a[0], "tanh");
    case P::GeluTanhGrad: return at::gelu_backward(a[0], a[1], "tanh");
    case P::Tanh: return at::tanh(a[0]);
    case P::TanhGrad: return at::tanh_backward(a[0], a[1]);
    case P::Sigmoid: return at::sigmoid(a[0]);
    case P::SigmoidGrad: return at::sigmoid_backward(a[0], a[1]);
    case P::Silu: return at::silu(a[0]);
    case P::SiluGrad: return at::silu_backward(a[0], a[1]);
    case P::Lerp:
      return s.operands[2].kind == PointwiseOperand::Kind::Constant ? at::lerp(a[0], a[1], scalar(2))
                                                                     : at::lerp(a[0], a[1], a[2]);
    case P::Exp: return at::exp(a[0]);
    case P::Log: return at::log(a[0]);
    case P::Sqrt: return at::sqrt(a[0]);
    case P::Rsqrt: return at::rsqrt(a[0]);
    case P::Pow: return s.operands[1].kind == PointwiseOperand::Kind::Constant ? at::pow(a[0], scalar(1)) : at::pow(a[0], a[1]);
    case P::Cast: return a[0];
    case P::Pair: return at::stack({a[0].expand(shape).select(-1, 0), a[1].expand(shape).select(-1, 1)}, -1);
    case P::RowSum: return at::sum(a[0].expand(shape), {-1}, /*keepdim=*/true);
    case P::RowMax: return at::amax(a[0].expand(shape), {-1}, /*keepdim=*/true);
    case P::Bernoulli:
      // On the meta device only the layout counts: a dense mask of the shape.
      if (a[0].is_meta()) return at::empty(shape, a[2].options()) * a[2];
      return keepMask(a[0], shape, scalar(1).to<float>()) * a[2];
  }
  TORCH_CHECK(false, "spmd::fused: an operation without a CPU kernel");
}

// The program's statements evaluated with ATen's ops, each rounded to its
// dtype and kept in fp32, on the inputs' device (meta included).
std::vector<at::Tensor> evaluateProgram(const PointwiseProgram& program, at::TensorList inputs,
                                        at::IntArrayRef shape) {
  std::vector<at::Tensor> temps;
  for (const PointwiseStatement& s : program.statements) {
    std::vector<at::Tensor> operands;
    for (const PointwiseOperand& o : s.operands) {
      const bool seed = s.op == PointwiseOp::Bernoulli && operands.empty();  // read as its integer
      switch (o.kind) {
        case PointwiseOperand::Kind::Input: operands.push_back(seed ? inputs[o.index] : inputs[o.index].to(at::kFloat)); break;
        case PointwiseOperand::Kind::Temp: operands.push_back(temps[o.index]); break;
        case PointwiseOperand::Kind::Constant:
          operands.push_back(at::scalar_tensor(static_cast<float>(o.constant), inputs[0].options().dtype(at::kFloat)));
          break;
      }
    }
    at::Tensor t = evaluate(s, operands, shape);
    if (s.dtype != at::kFloat) t = t.to(s.dtype).to(at::kFloat);
    temps.push_back(t);
  }
  return temps;
}

std::vector<int64_t> contiguousStrides(at::IntArrayRef shape) {
  const c10::DimVector strides = c10::contiguous_strides(shape);
  return {strides.begin(), strides.end()};
}

// The strides of `value` where it is dense (no gaps, no overlap) and of the
// result's shape, else the contiguous ones.
std::vector<int64_t> denseStridesOf(const at::Tensor& value, at::IntArrayRef shape) {
  if (value.sizes() == shape && value.is_non_overlapping_and_dense()) return value.strides().vec();
  return contiguousStrides(shape);
}

std::vector<at::Tensor> fusedMeta(at::TensorList inputs, c10::string_view text) {
  const PointwiseProgram program = programOf(text);
  const std::vector<int64_t> shape = iterationShape(program, inputs);
  const std::vector<std::vector<int64_t>> strides = fusedResultStrides(program, inputs);
  std::vector<at::Tensor> out;
  for (size_t r = 0; r < program.results.size(); ++r) {
    out.push_back(at::empty_strided(resultShape(program, r, shape), strides[r],
                                    inputs[0].options().dtype(program.statements[program.results[r]].dtype)));
  }
  return out;
}

std::vector<at::Tensor> fusedCpu(at::TensorList inputs, c10::string_view text) {
  const PointwiseProgram program = programOf(text);
  const std::vector<int64_t> shape = iterationShape(program, inputs);
  const std::vector<at::Tensor> temps = evaluateProgram(program, inputs, shape);
  const std::vector<std::vector<int64_t>> strides = fusedResultStrides(program, inputs);
  std::vector<at::Tensor> out;
  for (size_t r = 0; r < program.results.size(); ++r) {
    const int k = program.results[r];
    const std::vector<int64_t> size = resultShape(program, r, shape);
    at::Tensor result = at::empty_strided(size, strides[r], inputs[0].options().dtype(program.statements[k].dtype));
    out.push_back(result.copy_(temps[k].expand(size)));
  }
  return out;
}

}  // namespace

// ATen's own elementwise ops give their result the layout TensorIterator
// picks from their operands (a permuted input's permutation, say), and the
// views after them may rely on it (ConvNeXt's permute -> mul -> permute ->
// view): so the fused result takes the layout the ops it replaces would
// have given it, found by running them on meta tensors of the inputs'
// strides. A row program's results are contiguous: its kernels write rows;
// so are a program's with pairs, whose kernel finds the pair's index in the
// element's place in that order.
// Contiguous operands need no meta run (TensorIterator keeps their order).
std::vector<std::vector<int64_t>> fusedResultStrides(const PointwiseProgram& program, at::TensorList inputs) {
  const std::vector<int64_t> shape = iterationShape(program, inputs);
  std::vector<std::vector<int64_t>> strides;
  const bool contiguous = std::all_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.is_contiguous(); });
  if (hasRowReductions(program) || hasPairs(program) || contiguous) {
    for (size_t r = 0; r < program.results.size(); ++r) {
      strides.push_back(contiguousStrides(resultShape(program, r, shape)));
    }
    return strides;
  }
  std::vector<at::Tensor> onMeta;
  for (const at::Tensor& t : inputs) {
    onMeta.push_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
  }
  // Some of the program's ops have no C++ meta kernel (relu on LibTorch 2.6:
  // channels-last operands of a convolution net's ReLU come here).
  MetaFallbackScope metaKernels;
  const std::vector<at::Tensor> temps = evaluateProgram(program, onMeta, shape);
  for (size_t r = 0; r < program.results.size(); ++r) {
    strides.push_back(denseStridesOf(temps[program.results[r]], resultShape(program, r, shape)));
  }
  return strides;
}

// Whether two strides of `sizes` lay it out alike (size-1 dimensions' strides
// do not matter).
bool sameLayout(const std::vector<int64_t>& sizes, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] != 1 && a[d] != b[d]) return false;
  }
  return true;
}

namespace {

// The dimensions of `shape` from the outermost to the innermost in memory
// for a dense tensor of these strides: as they stand where the layout is the
// contiguous one, else size-1 dimensions (whose place does not matter)
// first, then the others by falling stride.
std::vector<int64_t> memoryOrder(const std::vector<int64_t>& strides, const std::vector<int64_t>& shape) {
  std::vector<int64_t> order;
  for (size_t d = 0; d < shape.size(); ++d) order.push_back(static_cast<int64_t>(d));
  if (sameLayout(shape, strides, contiguousStrides(shape))) return order;
  auto key = [&](int64_t d) { return std::make_pair(shape[d] == 1 ? 0 : 1, -strides[d]); };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
  return order;
}

// `t` as a view of the iteration's rank (leading size-1 dimensions) with
// its dimensions in `order`.
at::Tensor inIterationOrder(const at::Tensor& t, const std::vector<int64_t>& order) {
  if (t.dim() == 0) return t;
  std::vector<int64_t> sizes(order.size() - t.dim(), 1);
  sizes.insert(sizes.end(), t.sizes().begin(), t.sizes().end());
  return t.view(sizes).permute(order);
}

}  // namespace

// The CUDA kernel walks the iteration space in the memory order of the first
// result's layout, so that it writes that layout densely; an input laid out
// alike is read as it stands, one laid out otherwise through its strides.
FusedKernelLayout fusedKernelLayout(const PointwiseProgram& program, at::TensorList inputs) {
  FusedKernelLayout layout;
  layout.shape = iterationShape(program, inputs);
  layout.resultStrides = fusedResultStrides(program, inputs);
  layout.order = memoryOrder(layout.resultStrides.at(0), layout.shape);
  for (const at::Tensor& t : inputs) {
    layout.views.push_back(inIterationOrder(t, layout.order));
    const at::Tensor& in = layout.views.back();
    layout.signature.push_back(
        {in.scalar_type(), in.sizes().vec(), in.is_contiguous() ? std::vector<int64_t>{} : in.strides().vec()});
  }
  return layout;
}

void ensureFusedKernelOpsRegistered() {}

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) { m.def("fused(Tensor[] inputs, str program) -> Tensor[]"); }

TORCH_LIBRARY_IMPL(spmd, Meta, m) { m.impl("fused", &spmd::fusedMeta); }

TORCH_LIBRARY_IMPL(spmd, CPU, m) { m.impl("fused", &spmd::fusedCpu); }

// spmd::attention and spmd::attention_backward (see ops/spmd_ops.h), and the
// fused forms spmd-lower puts in their place on CUDA.
//
// spmd::attention is the attention pattern the model wrote, run as it wrote
// it: matmul(q, k^T) * scale (or / scale, with `divide`) [+ mask], softmax
// over the last dimension (in `softmax_dtype` when given), the probabilities
// cast to v's dtype (as autocast casts them for the second matmul), matmul
// with v. Its backward runs LibTorch's autograd over those
// same ops, so that gradients equal an unfused step's bit for bit; spmd-lower
// replaces both by a fused kernel where the device has one.
//
// spmd::fused_attention(_backward) call ATen's _scaled_dot_product_{efficient,
// flash,cudnn}_attention(_backward), boxed and by argument name, so that they
// follow the linked LibTorch's schemas; they return only what the backward
// needs (out, logsumexp and the random state). Their "gemm" kernel (fp32)
// runs batched GEMMs and a generated softmax instead.
#include "spmd/ops/spmd_ops.h"

#include "spmd/ops/attention_codegen.h"
#include "spmd/ops/dispatch.h"
#include "spmd/ops/fused_kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <torch/version.h>

#include <map>
#include <numeric>
#include <tuple>

namespace spmd {
namespace {

// How the attention computes, as the model wrote it. Hand-written
// (`sdpa` false): `x * scale` or `x / scale` (they round differently), and
// softmax's dtype argument (autocast's fp32 softmax, or F.softmax(...,
// dtype=)). A call of F.scaled_dot_product_attention (`sdpa` true): ATen's
// own, with its dropout (its keep mask an input, so that forward and
// backward agree) and grouped-query heads.
struct AttentionForm {
  double scale = 1.0;
  bool causal = false;
  bool divide = false;
  c10::optional<at::ScalarType> softmaxDtype;
  bool sdpa = false;
  double dropoutP = 0.0;
  c10::optional<at::Tensor> keep;  // the dropout's keep mask (bool), when dropoutP > 0
  bool gqa = false;
};

// A warning handler that drops what it is given: ATen's math attention
// warns once that an explicit dropout mask is for testing, which is how
// this op keeps its forward and backward on one mask.
class DropWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

at::Tensor writtenMath(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const c10::optional<at::Tensor>& mask, const AttentionForm& form) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));
  scores = form.divide ? scores.div(form.scale) : scores.mul(form.scale);
  if (mask && mask->defined()) scores = scores.add(*mask);
  at::Tensor probs = at::softmax(scores, -1, form.softmaxDtype);
  return at::matmul(probs.to(v.scalar_type()), v);
}

// LibTorch's scaled dot-product attention: on the CPU the kernel eager
// PyTorch picks for the same call; with dropout its math on the given keep
// mask. A causal mask the call passed stays a mask (is_causal only where
// the call said so). The result is contiguous on every device, meta
// included, so that what autodiff recorded after it holds for the real
// tensors (the CPU's flash kernel returns another layout than the math).
at::Tensor sdpaMath(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const c10::optional<at::Tensor>& mask, const AttentionForm& form) {
  const bool hasMask = mask && mask->defined();
  const bool isCausal = form.causal && !hasMask;
  if (form.dropoutP > 0) {
    DropWarnings drop;
    c10::WarningUtils::WarningHandlerGuard quiet(&drop);
    return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, mask, form.dropoutP, isCausal, form.keep,
                                                              form.scale, form.gqa))
        .contiguous();
  }
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, isCausal, form.scale, form.gqa).contiguous();
}

at::Tensor attentionMath(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& mask, const AttentionForm& form) {
  return form.sdpa ? sdpaMath(q, k, v, mask, form) : writtenMath(q, k, v, mask, form);
}

AttentionForm formOf(double scale, bool causal, bool divide, c10::optional<at::ScalarType> softmaxDtype, bool sdpa,
                     double dropoutP, const c10::optional<at::Tensor>& keep, bool gqa) {
  return {scale, causal, divide, softmaxDtype, sdpa, dropoutP, keep, gqa};
}

at::Tensor attentionForward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const c10::optional<at::Tensor>& mask, double scale, bool causal, bool divide,
                            c10::optional<at::ScalarType> softmaxDtype, bool sdpa, double dropoutP,
                            const c10::optional<at::Tensor>& keep, bool gqa) {
  return attentionMath(q, k, v, mask, formOf(scale, causal, divide, softmaxDtype, sdpa, dropoutP, keep, gqa));
}

// The gradients of attentionMath, from LibTorch's autograd over its ops. The
// dispatcher may have excluded autograd's keys on the way here; they are
// let in again for the recomputation. The SDPA form's come out contiguous,
// on every device (see sdpaMath).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attentionBackward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const c10::optional<at::Tensor>& mask, double scale, bool causal, bool divide,
    c10::optional<at::ScalarType> softmaxDtype, bool sdpa, double dropoutP, const c10::optional<at::Tensor>& keep,
    bool gqa) {
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  keys.excluded_ = keys.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
  c10::impl::ForceDispatchKeyGuard withAutograd(keys);
  at::AutoGradMode gradMode(true);
  const at::Tensor qq = q.detach().requires_grad_(true);
  const at::Tensor kk = k.detach().requires_grad_(true);
  const at::Tensor vv = v.detach().requires_grad_(true);
  const AttentionForm form = formOf(scale, causal, divide, softmaxDtype, sdpa, dropoutP, keep, gqa);
  const at::Tensor out = attentionMath(qq, kk, vv, mask, form);
  const auto grads = torch::autograd::grad({out}, {qq, kk, vv}, {grad});
  if (!sdpa) return {grads[0], grads[1], grads[2]};
  return {grads[0].contiguous(), grads[1].contiguous(), grads[2].contiguous()};
}

const c10::OperatorHandle& spmdOp(const char* name) {
  static std::map<std::string, c10::OperatorHandle> ops;
  auto it = ops.find(name);
  if (it == ops.end()) it = ops.emplace(name, c10::Dispatcher::singleton().findSchemaOrThrow(name, "")).first;
  return it->second;
}

using AttentionSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const c10::optional<at::Tensor>&, double, bool, bool,
                                       c10::optional<at::ScalarType>, bool, double, const c10::optional<at::Tensor>&,
                                       bool);
using AttentionBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
    double, bool, bool, c10::optional<at::ScalarType>, bool, double, const c10::optional<at::Tensor>&, bool);

c10::optional<at::Tensor> optionalOf(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// Autograd's view of spmd::attention: one node whose backward is
// spmd::attention_backward, so that a recording of autograd (spmd-expand's)
// sees the pair and nothing of the math inside. The mask and the keep mask
// get no gradient (the attention pass takes no mask that needs one).
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const c10::optional<at::Tensor>& mask, double scale, bool causal,
                            bool divide, c10::optional<at::ScalarType> softmaxDtype, bool sdpa, double dropoutP,
                            const c10::optional<at::Tensor>& keep, bool gqa) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor out = spmdOp("spmd::attention")
                         .typed<AttentionSignature>()
                         .call(q, k, v, mask, scale, causal, divide, softmaxDtype, sdpa, dropoutP, keep, gqa);
    ctx->save_for_backward({q, k, v, mask.value_or(at::Tensor()), keep.value_or(at::Tensor())});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["divide"] = divide;
    ctx->saved_data["softmax_dtype"] = softmaxDtype;
    ctx->saved_data["sdpa"] = sdpa;
    ctx->saved_data["dropout_p"] = dropoutP;
    ctx->saved_data["enable_gqa"] = gqa;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    // Below autograd: the backward is not differentiated again.
    at::AutoDispatchBelowADInplaceOrView below;
    auto& data = ctx->saved_data;
    auto [dq, dk, dv] = spmdOp("spmd::attention_backward")
                            .typed<AttentionBackwardSignature>()
                            .call(grads[0], saved[0], saved[1], saved[2], optionalOf(saved[3]),
                                  data["scale"].toDouble(), data["causal"].toBool(), data["divide"].toBool(),
                                  data["softmax_dtype"].toOptional<at::ScalarType>(), data["sdpa"].toBool(),
                                  data["dropout_p"].toDouble(), optionalOf(saved[4]), data["enable_gqa"].toBool());
    torch::autograd::variable_list result(12);
    result[0] = dq, result[1] = dk, result[2] = dv;
    return result;
  }
};

at::Tensor attentionAutograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const c10::optional<at::Tensor>& mask, double scale, bool causal, bool divide,
                             c10::optional<at::ScalarType> softmaxDtype, bool sdpa, double dropoutP,
                             const c10::optional<at::Tensor>& keep, bool gqa) {
  return AttentionFunction::apply(q, k, v, mask, scale, causal, divide, softmaxDtype, sdpa, dropoutP, keep, gqa);
}

// ---- the fused kernels ----------------------------------------------------

std::string atenName(c10::string_view kernel, bool backward) {
  return "aten::_scaled_dot_product_" + std::string(kernel) + "_attention" + (backward ? "_backward" : "");
}

// The names ATen gives the random state of each kernel's forward results and
// backward arguments.
std::pair<size_t, size_t> rngResults(c10::string_view kernel) {
  if (kernel == "efficient") return {2, 3};  // (output, log_sumexp, philox_seed, philox_offset)
  return {6, 7};                             // flash, cudnn: (..., max_q, max_k, philox_seed/rng_state, offset/unused, ...)
}

#ifdef SPMD_WITH_CUDA
// How the gemm kernel splits its GEMMs: under causal blocking
// (attentionCausalBlockRows) query block i against the keys of blocks 0..i
// only, which skips the work above the diagonal blocks (3/8 of it for 4
// blocks); else one block of every query against every key.
struct GemmBlocks {
  int64_t blocks = 1, rows = 0, keys = 0;  // rows: queries a block; keys: all keys
  bool causal = false;

  GemmBlocks(const at::Tensor& q, const at::Tensor& k, bool isCausal) {
    const int64_t queries = q.size(-2);
    keys = k.size(-2);
    const int64_t blockRows = attentionCausalBlockRows(queries, keys, isCausal);
    causal = blockRows > 0;
    blocks = causal ? queries / blockRows : 1;
    rows = queries / blocks;
  }
  // Keys query block i reads; the first query of key block j's readers.
  int64_t keysOf(int64_t i) const { return causal ? (i + 1) * rows : keys; }
  int64_t firstReaderOf(int64_t j) const { return causal ? j * rows : 0; }
  int64_t keyBlockSize() const { return causal ? rows : keys; }
};

// [batch, heads, r, c] as the [batch * heads, r, c] batch of matrices bmm
// takes. A view: every tensor here is a slice of a contiguous one.
at::Tensor batched(const at::Tensor& t) { return t.view({t.size(0) * t.size(1), t.size(2), t.size(3)}); }

// out = a @ b, batched, written into `out` (a view) where it lies.
void gemmInto(at::Tensor out, const at::Tensor& a, const at::Tensor& b) { at::bmm_out(out, a, b); }

// Rows [from, to) and columns [colFrom, colTo) of a [batch, heads, rows, cols] tensor.
at::Tensor block(const at::Tensor& t, int64_t from, int64_t to, int64_t colFrom, int64_t colTo) {
  return t.slice(2, from, to).slice(3, colFrom, colTo);
}
#endif

// The "gemm" kernel (fp32): attention as it is written, its matmuls as
// batched GEMMs (TF32 where the run allows it; blocked under a causal mask,
// GemmBlocks) and its softmax generated (ops/attention_codegen.h). The
// probabilities go to the backward in the logsumexp slot; it needs no
// random state.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gemmAttention(const at::Tensor& query, const at::Tensor& key,
                                                                         const at::Tensor& value, double scale, bool causal) {
#ifdef SPMD_WITH_CUDA
  // attention-to-fused-kernel hands them over contiguous; a direct call may not.
  const at::Tensor q = query.contiguous(), k = key.contiguous(), v = value.contiguous();
  const GemmBlocks by(q, k, causal);
  const int64_t queries = q.size(2), d = q.size(3);
  at::Tensor probs = at::empty({q.size(0), q.size(1), queries, by.keys}, q.options());
  for (int64_t i = 0; i < by.blocks; ++i) {
    const int64_t r0 = i * by.rows, r1 = r0 + by.rows, keys = by.keysOf(i);
    gemmInto(batched(block(probs, r0, r1, 0, keys)), batched(block(q, r0, r1, 0, d)),
             batched(block(k, 0, keys, 0, d)).transpose(1, 2));
  }
  TORCH_CHECK(attentionSoftmaxKernels().forward, "spmd::fused_attention: the gemm kernel's softmax is not linked in "
              "(backend/generated_kernels.h: ensureCudaBackendRegistered)");
  attentionSoftmaxKernels().forward(probs, scale, causal);
  at::Tensor out = at::empty({q.size(0), q.size(1), queries, v.size(3)}, q.options());
  for (int64_t i = 0; i < by.blocks; ++i) {
    const int64_t r0 = i * by.rows, r1 = r0 + by.rows, keys = by.keysOf(i);
    gemmInto(batched(block(out, r0, r1, 0, v.size(3))), batched(block(probs, r0, r1, 0, keys)),
             batched(block(v, 0, keys, 0, v.size(3))));
  }
  const at::Tensor none = at::empty({}, q.options().dtype(at::kLong));
  return {out, probs, none, none};
#else
  (void)query, (void)key, (void)value, (void)scale, (void)causal;
  TORCH_CHECK(false, "spmd::fused_attention: this build has no CUDA kernels");
#endif
}

// The gemm backward's gradients come out as autograd over the math lays
// them out, which is what the graph after the attention was recorded
// against (a view there may depend on it): q's and v's contiguous, k's as
// the transpose of a contiguous [batch, heads, size, length].
std::tuple<at::Tensor, at::Tensor, at::Tensor> gemmAttentionBackward(const at::Tensor& grad, const at::Tensor& query,
                                                                     const at::Tensor& key, const at::Tensor& value,
                                                                     const at::Tensor& probs, double scale, bool causal) {
#ifdef SPMD_WITH_CUDA
  // The incoming gradient is usually a transposed view ([batch, length,
  // heads, size] memory): one copy serves the GEMMs that read it.
  const at::Tensor g = grad.contiguous(), q = query.contiguous(), k = key.contiguous(), v = value.contiguous();
  const GemmBlocks by(q, k, causal);
  const int64_t queries = q.size(2), d = q.size(3), dv = v.size(3);
  at::Tensor dscores = at::empty_like(probs);
  for (int64_t i = 0; i < by.blocks; ++i) {
    const int64_t r0 = i * by.rows, r1 = r0 + by.rows, keys = by.keysOf(i);
    gemmInto(batched(block(dscores, r0, r1, 0, keys)), batched(block(g, r0, r1, 0, dv)),
             batched(block(v, 0, keys, 0, dv)).transpose(1, 2));
  }
  TORCH_CHECK(attentionSoftmaxKernels().backward, "spmd::fused_attention_backward: the gemm kernel's softmax is not "
              "linked in (backend/generated_kernels.h: ensureCudaBackendRegistered)");
  attentionSoftmaxKernels().backward(dscores, probs, scale, causal);
  at::Tensor dq = at::empty_like(q), dkT = at::empty({k.size(0), k.size(1), d, by.keys}, k.options()),
             dvOut = at::empty_like(v);
  for (int64_t i = 0; i < by.blocks; ++i) {  // dq: query block i against its keys
    const int64_t r0 = i * by.rows, r1 = r0 + by.rows, keys = by.keysOf(i);
    gemmInto(batched(block(dq, r0, r1, 0, d)), batched(block(dscores, r0, r1, 0, keys)),
             batched(block(k, 0, keys, 0, d)));
  }
  for (int64_t j = 0; j < by.blocks; ++j) {  // dk, dv: key block j from the queries that read it
    const int64_t c0 = j * by.keyBlockSize(), c1 = c0 + by.keyBlockSize(), r0 = by.firstReaderOf(j);
    gemmInto(batched(block(dkT, 0, d, c0, c1)), batched(block(q, r0, queries, 0, d)).transpose(1, 2),
             batched(block(dscores, r0, queries, c0, c1)));
    gemmInto(batched(block(dvOut, c0, c1, 0, dv)), batched(block(probs, r0, queries, c0, c1)).transpose(1, 2),
             batched(block(g, r0, queries, 0, dv)));
  }
  return {dq, dkT.transpose(-2, -1), dvOut};
#else
  (void)grad, (void)query, (void)key, (void)value, (void)probs, (void)scale, (void)causal;
  TORCH_CHECK(false, "spmd::fused_attention_backward: this build has no CUDA kernels");
#endif
}

// The mask as the kernels take it (what ATen's SDPA does before calling
// them): additive in q's dtype (a boolean mask: 0 where attended, -inf
// elsewhere), every stride but the last's a multiple of 16 elements (a
// slice of a padded tensor where they are not), and 4-D: for the efficient
// kernel [batch, heads, queries, keys] by broadcasting; for cuDNN's with
// its broadcast dimensions of size 1, as SDPA hands it over (cuDNN reads
// them broadcast).
at::Tensor attentionBias(const at::Tensor& mask, const at::Tensor& q, int64_t keys, c10::string_view kernel) {
  at::Tensor bias = mask.scalar_type() == at::kBool
                        ? at::zeros(mask.sizes(), q.options()).masked_fill_(mask.logical_not(), -INFINITY)
                        : mask.to(q.scalar_type());
  const int64_t aligned = (keys + 15) / 16 * 16;
  bool isAligned = bias.size(-1) == keys && bias.stride(-1) == 1;
  for (int64_t d = 0; d + 1 < bias.dim(); ++d) isAligned = isAligned && bias.stride(d) % 16 == 0;
  if (bias.size(-1) == keys && !isAligned) {
    std::vector<int64_t> padded = bias.sizes().vec();
    padded.back() = aligned;
    bias = at::empty(padded, bias.options()).slice(-1, 0, keys).copy_(bias);
  }
  if (kernel == "cudnn") {
    while (bias.dim() < 4) bias = bias.unsqueeze(0);
    return bias;
  }
  return bias.expand({q.size(0), q.size(1), q.size(2), keys});
}

// Grouped-query attention: k and v with fewer heads than q, each read by
// q.size(1) / k.size(1) query heads. cuDNN's kernel reads them so itself in
// LibTorch 2.11 (its gradients come with k's and v's heads; checked on an
// H100 against SDPA's math, bench/RESULTS.md; earlier versions untried, so
// left as they were); the other kernels get them repeated.
int64_t groupsOf(const at::Tensor& q, const at::Tensor& k) { return q.size(1) / k.size(1); }
bool takesGroupedHeads(c10::string_view kernel) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
  return kernel == "cudnn";
#else
  (void)kernel;
  return false;
#endif
}
// How many times the op repeats k's and v's heads for `kernel`.
int64_t repeatsFor(const at::Tensor& q, const at::Tensor& k, c10::string_view kernel) {
  return takesGroupedHeads(kernel) ? 1 : groupsOf(q, k);
}
at::Tensor repeatHeads(const at::Tensor& t, int64_t groups) {
  return groups == 1 ? t : t.repeat_interleave(groups, 1);
}
// The gradient of repeatHeads: each kv head's from its query heads, summed.
at::Tensor sumHeads(const at::Tensor& grad, int64_t groups) {
  if (groups == 1) return grad;
  return grad.unflatten(1, {grad.size(1) / groups, groups}).sum(2);
}

// The strides ATen's cuDNN attention gives a result of `shape` laid out
// like `like` (its alloc_with_matching_layout): the dimensions filled in the
// order of like's strides, the smallest first. For a q/k/v split out of a
// packed projection that is the projection's row order, not [b, h, t, d].
std::vector<int64_t> matchingStrides(const at::Tensor& like, at::IntArrayRef shape) {
  std::vector<int64_t> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int64_t d) { return like.stride(d) == 0 ? INT64_MAX : like.stride(d); };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
  std::vector<int64_t> strides(shape.size());
  int64_t next = 1;
  for (int64_t d : order) {
    strides[d] = next;
    next *= shape[d];
  }
  return strides;
}

at::Tensor emptyMatching(const at::Tensor& like, at::IntArrayRef shape) {
  return at::empty_strided(shape, matchingStrides(like, shape), like.options());
}

// `result` in the layout emptyMatching gives (what the meta function says),
// copied there only where this LibTorch's kernel chose another.
at::Tensor matchingLayout(const at::Tensor& result, const at::Tensor& like) {
  const std::vector<int64_t> want = matchingStrides(like, result.sizes());
  bool same = true;
  for (int64_t d = 0; d < result.dim(); ++d) same = same && (result.size(d) == 1 || result.stride(d) == want[d]);
  if (same) return result;
  return at::empty_strided(result.sizes(), want, result.options()).copy_(result);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fusedAttention(
    const at::Tensor& q, const at::Tensor& key, const at::Tensor& value, const c10::optional<at::Tensor>& mask,
    double scale, bool causal, double dropoutP, c10::string_view kernel) {
  const bool hasMask = mask && mask->defined();
  const int64_t groups = repeatsFor(q, key, kernel);
  const at::Tensor k = repeatHeads(key, groups), v = repeatHeads(value, groups);
  if (kernel == "gemm") {
    TORCH_CHECK(!hasMask && dropoutP == 0, "spmd::fused_attention: the gemm kernel takes no mask and no dropout");
    return gemmAttention(q, k, v, scale, causal);
  }
  const c10::IValue bias = hasMask ? c10::IValue(attentionBias(*mask, q, k.size(2), kernel)) : c10::IValue();
  const std::vector<c10::IValue> r =
      callByArgumentName(atenName(kernel, false), {{"query", q},
                                           {"key", k},
                                           {"value", v},
                                           {"attn_bias", bias},
                                           {"attn_mask", bias},
                                           {"compute_log_sumexp", true},
                                           {"dropout_p", dropoutP},
                                           {"is_causal", causal},
                                           {"return_debug_mask", false},
                                           {"scale", scale}});
  const auto [seed, offset] = rngResults(kernel);
  auto tensorAt = [&](size_t i) { return i < r.size() && r[i].isTensor() ? r[i].toTensor() : at::Tensor(); };
  const at::Tensor out = kernel == "cudnn" ? matchingLayout(tensorAt(0), q) : tensorAt(0);
  return {out, tensorAt(1), tensorAt(seed), tensorAt(offset)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fusedAttentionBackward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
    const c10::optional<at::Tensor>& mask, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& seed,
    const at::Tensor& offset, double scale, bool causal, double dropoutP, c10::string_view kernel) {
  const int64_t groups = repeatsFor(q, key, kernel);
  const at::Tensor k = repeatHeads(key, groups), v = repeatHeads(value, groups);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> grads;
  if (kernel == "gemm") {
    grads = gemmAttentionBackward(grad, q, k, v, lse, scale, causal);
  } else {
    const bool hasMask = mask && mask->defined();
    const c10::IValue bias(hasMask ? attentionBias(*mask, q, k.size(2), kernel) : at::Tensor());
    const c10::IValue undefined(at::Tensor{});  // dense inputs: no cumulative sequence lengths
    const std::vector<c10::IValue> r = callByArgumentName(
        atenName(kernel, true),
        {{"grad_out", grad},           {"grad_out_", grad},          {"query", q},
         {"key", k},                   {"value", v},                 {"attn_bias", bias},
         {"out", out},                 {"logsumexp", lse},           {"philox_seed", seed},
         {"philox_offset", offset},    {"rng_state", seed},          {"unused", offset},
         {"cum_seq_q", undefined},     {"cum_seq_k", undefined},     {"max_q", q.size(-2)},
         {"max_k", k.size(-2)},        {"dropout_p", dropoutP},      {"is_causal", causal},
         {"scale", scale},             {"grad_input_mask", c10::List<bool>({true, true, true, false})}});
    grads = {r.at(0).toTensor(), r.at(1).toTensor(), r.at(2).toTensor()};
    if (kernel == "cudnn") {
      grads = {matchingLayout(std::get<0>(grads), q), matchingLayout(std::get<1>(grads), k),
               matchingLayout(std::get<2>(grads), v)};
    }
  }
  if (groupsOf(q, key) != 1 && groups == 1) {  // the kernel's own: contiguous, as the meta function says
    return {std::get<0>(grads), std::get<1>(grads).contiguous(), std::get<2>(grads).contiguous()};
  }
  return {std::get<0>(grads), sumHeads(std::get<1>(grads), groups), sumHeads(std::get<2>(grads), groups)};
}

// Shapes for the verifier (ATen's attention kernels have no meta kernels in
// C++): what each kernel returns for dense 4-D inputs; cuDNN's results in
// the layout of the tensor each is like (emptyMatching), which fusedAttention
// and its backward hold to.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fusedAttentionMeta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>&, double, bool,
    double, c10::string_view kernel) {
  TORCH_CHECK(q.dim() == 4, "spmd::fused_attention: query must be [batch, heads, length, head size]");
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2);
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor out = kernel == "cudnn" ? emptyMatching(q, {b, h, t, v.size(-1)}) : at::empty({b, h, t, v.size(-1)}, q.options());
  at::Tensor lse = kernel == "gemm"        ? at::empty({b, h, t, k.size(-2)}, f32)  // the probabilities
                   : kernel == "efficient" ? at::empty({b, h, (t + 31) / 32 * 32}, f32)
                                           : at::empty({b, h, t}, f32);
  const auto i64 = q.options().dtype(at::kLong);
  return {out, lse, at::empty({}, i64), at::empty({}, i64)};
}

// ATen's kernels return the gradients in q's, k's and v's layouts; gemm in
// those autograd over the math gives (gemmAttentionBackward). Grouped-query
// heads' gradients are sums, contiguous.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fusedAttentionBackwardMeta(
    const at::Tensor&, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const c10::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    double, bool, double, c10::string_view kernel) {
  const bool cudnn = kernel == "cudnn";
  if (groupsOf(q, k) != 1) {
    return {cudnn ? emptyMatching(q, q.sizes()) : at::empty_like(q), at::empty(k.sizes(), k.options()),
            at::empty(v.sizes(), v.options())};
  }
  if (kernel == "gemm") {
    const at::Tensor dkTransposed = at::empty({k.size(0), k.size(1), k.size(3), k.size(2)}, k.options());
    return {at::empty(q.sizes(), q.options()), dkTransposed.transpose(-2, -1), at::empty(v.sizes(), v.options())};
  }
  if (cudnn) return {emptyMatching(q, q.sizes()), emptyMatching(k, k.sizes()), emptyMatching(v, v.sizes())};
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

}  // namespace

void ensureAttentionOpsRegistered() {}

#ifdef SPMD_WITH_CUDA
namespace {
AttentionSoftmaxKernels& softmaxKernels() {
  static AttentionSoftmaxKernels kernels;
  return kernels;
}
}  // namespace

void setAttentionSoftmaxKernels(const AttentionSoftmaxKernels& kernels) { softmaxKernels() = kernels; }
const AttentionSoftmaxKernels& attentionSoftmaxKernels() { return softmaxKernels(); }
#endif

}  // namespace spmd

TORCH_LIBRARY_FRAGMENT(spmd, m) {
  m.def(
      "attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale, bool causal, bool divide, "
      "ScalarType? softmax_dtype, bool sdpa, float dropout_p, Tensor? keep, bool enable_gqa) -> Tensor");
  m.def(
      "attention_backward(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor? mask, float scale, "
      "bool causal, bool divide, ScalarType? softmax_dtype, bool sdpa, float dropout_p, Tensor? keep, "
      "bool enable_gqa) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)");
  m.def(
      "fused_attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale, bool causal, "
      "float dropout_p, str kernel) "
      "-> (Tensor out, Tensor logsumexp, Tensor seed, Tensor offset)");
  m.def(
      "fused_attention_backward(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor? mask, Tensor out, "
      "Tensor logsumexp, Tensor seed, Tensor offset, float scale, bool causal, float dropout_p, str kernel) "
      "-> (Tensor grad_query, Tensor grad_key, Tensor grad_value)");
}

TORCH_LIBRARY_IMPL(spmd, CompositeExplicitAutograd, m) {
  m.impl("attention", &spmd::attentionForward);
  m.impl("attention_backward", &spmd::attentionBackward);
}

TORCH_LIBRARY_IMPL(spmd, Autograd, m) { m.impl("attention", &spmd::attentionAutograd); }

TORCH_LIBRARY_IMPL(spmd, Meta, m) {
  m.impl("fused_attention", &spmd::fusedAttentionMeta);
  m.impl("fused_attention_backward", &spmd::fusedAttentionBackwardMeta);
}

TORCH_LIBRARY_IMPL(spmd, CUDA, m) {
  m.impl("fused_attention", &spmd::fusedAttention);
  m.impl("fused_attention_backward", &spmd::fusedAttentionBackward);
}

// fuse-attention (spmd-lower runs it for --device cuda): each spmd::attention
// and its spmd::attention_backward become spmd::fused_attention(_backward),
// which call ATen's fused kernel; the forward's logsumexp and random state
// go to the backward, which no longer recomputes the attention.
//
// The kernel (--attention-kernel, default auto): for bf16 and fp16, cuDNN's
// attention up to head size 128 and flash attention up to 256 (the fastest
// that take them; neither takes fp32: cuDNN returns NaN, flash refuses),
// else ATen's memory-efficient attention. For fp32, gemm: the attention's
// matmuls as batched GEMMs (TF32 under spmd-run --tf32) around a generated
// softmax (ops/attention_codegen.h), up to 2048 keys, on contiguous copies
// of q, k and v (aten::contiguous nodes) that the backward reads too; the
// backward reads the probabilities the forward kept instead of recomputing
// them. A kernel asked for that cannot take the attention's dtype gives way to the one
// auto picks (gemm to cudnn/flash for bf16, flash and cudnn to efficient for
// fp32); math leaves the attention unfused. Taken: 4-D q, k, v of one
// dtype, head size a multiple of 8, no mask or the causal one (is_causal).
// What is not taken keeps its math kernels, with a note saying why.
#include "spmd/ir/builder.h"
#include "spmd/ops/attention_codegen.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <c10/core/MemoryFormat.h>

#include <map>
#include <optional>

namespace spmd {
namespace {

std::string where(const Node& n) {
  return n.qualifiedName() + (n.meta.source.empty() ? "" : " at " + n.meta.source);
}

// Why the attention cannot run fused, or nullopt when it can.
std::optional<std::string> whyNotFused(const Graph& g, const Node& a) {
  const c10::ScalarType dtype = g.value(a.args[0].value).dtype;
  for (size_t i = 0; i < 3; ++i) {
    const Value& t = g.value(a.args[i].value);
    if (t.shape.size() != 4) return "q, k and v must be [batch, heads, length, head size]";
    if (t.dtype != dtype) return "q, k and v differ in dtype";
    if (t.shape.back() % 8 != 0) return "the head size is not a multiple of 8";
  }
  if (dtype != c10::ScalarType::Float && dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half) {
    return "the fused kernels take fp32, bf16 and fp16 only";
  }
  if (a.args[3].kind != Arg::Kind::None && !a.args[5].b) return "an additive mask other than the causal one";
  return std::nullopt;
}

// The backward node of attention `a`: it reads the same q, k, v with the same scale and causality.
const Node* backwardOf(const Graph& g, const Node& a) {
  for (const Node* u : g.users(a.args[0].value)) {
    if (u->op != "spmd::attention_backward") continue;
    bool same = true;
    for (size_t i = 0; i < 3; ++i) same = same && u->args[i + 1].kind == Arg::Kind::Value && u->args[i + 1].value == a.args[i].value;
    same = same && u->args[5].f == a.args[4].f && u->args[6].b == a.args[5].b && u->args[7].b == a.args[6].b &&
           u->args[8].kind == a.args[7].kind && u->args[8].i == a.args[7].i;
    if (same) return u;
  }
  return nullptr;
}

// Whether the "gemm" kernel takes attention `a`: fp32, and rows of keys that
// fit its softmax's registers.
bool gemmTakes(const Graph& g, const Node& a) {
  const Value& q = g.value(a.args[0].value);
  const Value& k = g.value(a.args[1].value);
  return q.dtype == c10::ScalarType::Float && k.shape[2] <= kAttentionSoftmaxMaxKeys;
}

// The kernel for attention `a` under --attention-kernel `wanted`.
// Without generated kernels (--no-generated-kernels) auto never picks gemm.
std::string kernelFor(const Graph& g, const Node& a, const std::string& wanted, bool generated) {
  const Value& q = g.value(a.args[0].value);
  const bool lowPrecision = q.dtype != c10::ScalarType::Float;
  if (wanted == "auto" || (wanted == "gemm" && lowPrecision)) {
    // Measured on an H200 (bench/RESULTS.md): gpt bf16, cudnn 28.6 ms a
    // step, flash 29.5, efficient 33.2. gpt fp32 under --tf32, the 12
    // attentions' forward and backward in spmd-run --profile: gemm 18.4 to
    // 19.7 ms a step over three runs, efficient 21.9.
    if (!lowPrecision) return generated && gemmTakes(g, a) ? "gemm" : "efficient";
    if (q.shape.back() <= 128) return "cudnn";
    return q.shape.back() <= 256 ? "flash" : "efficient";
  }
  if (wanted == "gemm" && !gemmTakes(g, a)) return "efficient";
  if (!lowPrecision && (wanted == "flash" || wanted == "cudnn")) return "efficient";
  return wanted;
}

// q, k and v for the gemm kernel: contiguous, once. Batched GEMMs need one
// batch stride over [batch, heads], which heads split out of a projection
// do not have (at::matmul would copy them in every GEMM, forward and
// backward); the copies are what both directions read.
std::vector<Arg> contiguousForGemm(GraphBuilder& b, const Graph& g, const std::vector<Arg>& qkv) {
  Arg contiguousFormat;
  contiguousFormat.kind = Arg::Kind::MemoryFormat;
  contiguousFormat.i = static_cast<int64_t>(c10::MemoryFormat::Contiguous);
  std::vector<Arg> out;
  for (const Arg& t : qkv) {
    out.push_back(Arg::tensor(
        b.call("aten::contiguous", {t, contiguousFormat}, g.value(t.value).name + ".contiguous")));
  }
  return out;
}

// The factor the fused kernels multiply the scores by: the attention's
// scale, or its reciprocal where the model divides (the kernels' result
// rounds differently from the math's either way). Their softmax is fp32
// whatever softmax_dtype says: at least as precise as the model's.
Arg multiplier(const Node& a) {
  const double scale = a.args[4].f;
  return Arg::ofFloat(a.args[6].b ? 1.0 / scale : scale);
}

void fuse(Graph& g, const Node& a, const Node* backward, const std::string& kernel) {
  GraphBuilder b(g);
  b.setInsertionPoint(a);
  b.setMeta(a.meta);
  const bool causal = a.args[5].b;
  const Arg scale = multiplier(a);
  std::vector<Arg> qkv = {a.args[0], a.args[1], a.args[2]};
  if (kernel == "gemm") qkv = contiguousForGemm(b, g, qkv);
  const std::string base = g.value(a.outputs[0]).name;
  std::vector<Arg> args = qkv;
  args.insert(args.end(), {Arg::none(), scale, Arg::ofBool(causal), strArg(kernel)});
  const std::vector<ValueId> fwd = b.callMulti("spmd::fused_attention", args, base + ".fused");
  g.replaceAllUsesWith(a.outputs[0], fwd[0]);
  g.erase(a);
  if (!backward) return;
  b.setInsertionPoint(*backward);
  b.setMeta(backward->meta);
  std::vector<Arg> bargs = {backward->args[0]};
  bargs.insert(bargs.end(), qkv.begin(), qkv.end());
  bargs.insert(bargs.end(), {Arg::none(), Arg::tensor(fwd[0]), Arg::tensor(fwd[1]), Arg::tensor(fwd[2]),
                             Arg::tensor(fwd[3]), scale, Arg::ofBool(causal), strArg(kernel)});
  const std::vector<ValueId> grads = b.callMulti("spmd::fused_attention_backward", bargs, base + ".grad");
  for (size_t i = 0; i < 3; ++i) {
    if (backward->outputs[i] != kNoValue) g.replaceAllUsesWith(backward->outputs[i], grads[i]);
  }
  g.erase(*backward);
}

class FuseAttentionPass final : public Pass {
 public:
  FuseAttentionPass(std::string kernel, bool generated) : kernel_(std::move(kernel)), generated_(generated) {}

  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    std::vector<const Node*> attentions;
    for (const Node& n : g.nodes()) {
      if (n.op == "spmd::attention") attentions.push_back(&n);
    }
    if (attentions.empty() || kernel_ == "math") return false;
    std::map<std::string, int> fused;
    for (const Node* a : attentions) {
      if (const std::optional<std::string> why = whyNotFused(g, *a)) {
        diagnostics.note(where(*a), "fuse-attention: not fused: " + *why);
        continue;
      }
      const std::string kernel = kernelFor(g, *a, kernel_, generated_);
      fuse(g, *a, backwardOf(g, *a), kernel);
      ++fused[kernel];
    }
    for (const auto& [kernel, count] : fused) {
      diagnostics.note("fuse-attention: " + std::to_string(count) + " attention(s) run " +
                       (kernel == "gemm" ? std::string("batched GEMMs around a generated softmax (gemm)")
                                         : "ATen's " + kernel + " attention kernel"));
    }
    return !fused.empty();
  }

 private:
  std::string kernel_;
  bool generated_;
};

}  // namespace

std::unique_ptr<Pass> createFuseAttentionPass(const PipelineOptions& options) {
  return std::make_unique<FuseAttentionPass>(options.lower.attentionKernel, options.lower.generateKernels);
}

}  // namespace spmd

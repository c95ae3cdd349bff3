// attention-to-fused-kernel (spmd-lower runs it for --device cuda): each spmd::attention
// and its spmd::attention_backward become spmd::fused_attention(_backward),
// which call ATen's fused kernel; the forward's logsumexp and random state
// go to the backward, which no longer recomputes the attention.
//
// The kernel (--attention-kernel, default auto): for bf16 and fp16, cuDNN's
// attention up to head size 128, with or without a mask (as SDPA picks it
// on Hopper), and flash attention up to 256 without one (the fastest that
// take them; neither takes fp32: cuDNN returns NaN, flash refuses), else
// ATen's memory-efficient attention. For fp32, gemm: the attention's
// matmuls as batched GEMMs (TF32 under spmd-run --tf32) around a generated
// softmax (ops/attention_codegen.h), up to 2048 keys, on contiguous copies
// of q, k and v (aten::contiguous nodes) that the backward reads too; the
// backward reads the probabilities the forward kept instead of recomputing
// them. A mask other than the causal one (boolean or additive, broadcast or
// not: padding and sliding-window masks) goes to the kernels as a bias:
// cuDNN's in bf16 and fp16 (as SDPA picks it on Hopper), the
// memory-efficient kernel otherwise; dropout takes flash (bf16, fp16) or
// memory-efficient attention, which draw their own mask from the run's
// generator and hand its state to the backward (the keep mask spmd-expand
// drew for the CPU is dropped). A boolean mask becomes that bias once in
// the graph (where(mask, 0, -inf) in q's dtype, shared by every attention
// and backward that reads the mask), not once a call inside the op: a
// model's one padding or sliding-window mask, read by every layer, was
// made additive 2 x layers times a step.
// Grouped-query attention's k and v go to cuDNN's kernel as they are
// (LibTorch 2.11 and later); for the other kernels they are repeated to
// q's heads inside the op, their gradients summed back. A kernel asked for
// that cannot take the attention gives way to the one auto picks; math
// leaves the attention unfused. Taken: 4-D q, k, v of one float dtype, head
// size a multiple of 8, a causal mask only where queries and keys are as
// many. What is not taken keeps its math kernels, with a note saying why.
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/attention_codegen.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <c10/core/MemoryFormat.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName spmd_attention_backward = OpName::known("spmd::attention_backward");
};
const Ops& ops() { return opTable<Ops>(); }

const Value& valueAt(const Graph& g, const Node& a, size_t i) { return g.value(a.args[i].value); }
bool hasMask(const Node& a) { return a.args[kAttentionMask].kind == Arg::Kind::Value; }
bool isCausal(const Node& a) { return a.args[kAttentionCausal].b; }
// A mask the kernels take as a bias: present and not the causal one (that is is_causal).
bool needsBias(const Node& a) { return hasMask(a) && !isCausal(a); }
double dropoutOf(const Node& a) { return a.args[kAttentionDropoutP].f; }

// Why the attention cannot run fused, or nullopt when it can.
std::optional<std::string> whyNotFused(const Graph& g, const Node& a) {
  const c10::ScalarType dtype = valueAt(g, a, kAttentionQuery).dtype;
  for (size_t i : {kAttentionQuery, kAttentionKey, kAttentionValue}) {
    const Value& t = valueAt(g, a, i);
    if (t.shape.size() != 4) return "q, k and v must be [batch, heads, length, head size]";
    if (t.dtype != dtype) return "q, k and v differ in dtype";
    if (t.shape.back() % 8 != 0) return "the head size is not a multiple of 8";
  }
  if (dtype != c10::ScalarType::Float && dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half) {
    return "the fused kernels take fp32, bf16 and fp16 only";
  }
  const auto& q = valueAt(g, a, kAttentionQuery).shape;
  const auto& k = valueAt(g, a, kAttentionKey).shape;
  if (q[0] != k[0]) return "q and k differ in batch size";
  if (q[1] % k[1] != 0) return "k's heads do not divide q's";
  if (isCausal(a) && q[2] != k[2]) {
    return "a causal mask with " + std::to_string(q[2]) + " queries and " + std::to_string(k[2]) +
           " keys (the kernels place it differently)";
  }
  if (needsBias(a) && valueAt(g, a, kAttentionMask).shape.size() > 4) return "a mask of more than 4 dimensions";
  return std::nullopt;
}

bool sameArg(const Arg& x, const Arg& y) {
  if (x.kind != y.kind) return false;
  switch (x.kind) {
    case Arg::Kind::Value: return x.value == y.value;
    case Arg::Kind::Float: return x.f == y.f;
    case Arg::Kind::Bool: return x.b == y.b;
    case Arg::Kind::None: return true;
    default: return x.i == y.i;
  }
}

// The backward node of attention `a`: it reads the same arguments.
const Node* backwardOf(const Graph& g, const Node& a) {
  for (const Node* u : g.users(a.args[kAttentionQuery].value)) {
    if (!u->is(ops().spmd_attention_backward)) continue;
    bool same = true;
    for (size_t i = 0; i < kAttentionArgs; ++i) same = same && sameArg(a.args[i], u->args[i + 1]);
    if (same) return u;
  }
  return nullptr;
}

// Whether `kernel` takes attention `a`. gemm: fp32 without mask or
// dropout, rows of keys that fit its softmax's registers; flash: bf16 and
// fp16 without a bias, head sizes up to 256; cudnn: bf16 and fp16 without
// dropout, head sizes up to 128, a bias or none; efficient: every
// attention whyNotFused lets by.
bool kernelTakes(const Graph& g, const Node& a, const std::string& kernel) {
  const Value& q = valueAt(g, a, kAttentionQuery);
  const bool fp32 = q.dtype == c10::ScalarType::Float;
  const int64_t headSize = q.shape.back();
  const bool dropout = dropoutOf(a) > 0;
  if (kernel == "gemm") {
    return fp32 && !needsBias(a) && !dropout && valueAt(g, a, kAttentionKey).shape[2] <= kAttentionSoftmaxMaxKeys;
  }
  if (kernel == "flash") return !fp32 && !needsBias(a) && headSize <= 256;
  if (kernel == "cudnn") return !fp32 && !dropout && headSize <= 128;
  return kernel == "efficient";
}

// The kernel for attention `a` under --attention-kernel `wanted`.
// Without generated kernels (--no-generated-kernels) auto never picks gemm.
std::string kernelFor(const Graph& g, const Node& a, const std::string& wanted, bool generated) {
  if (wanted != "auto" && kernelTakes(g, a, wanted)) return wanted;
  // Measured on an H200 (bench/RESULTS.md): gpt bf16, cudnn 28.6 ms a
  // step, flash 29.5, efficient 33.2. gpt fp32 under --tf32, the 12
  // attentions' forward and backward in spmd-run --profile: gemm 18.4 to
  // 19.7 ms a step over three runs, efficient 21.9.
  for (const char* kernel : {"gemm", "cudnn", "flash"}) {
    if ((generated || std::string(kernel) != "gemm") && kernelTakes(g, a, kernel)) return kernel;
  }
  return "efficient";
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
  const double scale = a.args[kAttentionScale].f;
  return Arg::ofFloat(a.args[kAttentionDivide].b ? 1.0 / scale : scale);
}

// The additive biases made of boolean masks, by mask and dtype: one each.
using Biases = std::map<std::pair<ValueId, c10::ScalarType>, ValueId>;

// The mask of attention `a` as its kernel takes it: an additive mask as it
// is, a boolean one as where(mask, 0, -inf) in q's dtype (the values the op
// would make of it), made once and placed after the mask's producer (or
// before `a`, the first reader the program-order sweep meets, for a graph
// input) so that every reader follows it.
Arg biasOf(Graph& g, const Node& a, Biases& biases) {
  if (!needsBias(a)) return Arg::none();
  const ValueId mask = a.args[kAttentionMask].value;
  const c10::ScalarType dtype = valueAt(g, a, kAttentionQuery).dtype;
  if (g.value(mask).dtype != c10::ScalarType::Bool) return a.args[kAttentionMask];
  if (auto it = biases.find({mask, dtype}); it != biases.end()) return Arg::tensor(it->second);
  GraphBuilder b(g);
  const Node* producer = g.producer(mask);
  if (producer) {
    b.setInsertionPointAfter(*producer);
    b.setMeta(producer->meta);
  } else {
    b.setInsertionPoint(a);
    b.setMeta(a.meta);
  }
  const std::string name = g.value(mask).name + ".bias";
  auto f32 = biases.find({mask, c10::ScalarType::Float});
  if (f32 == biases.end()) {
    const ValueId where =
        b.call("aten::where.Scalar", {Arg::tensor(mask), Arg::ofFloat(0.0), Arg::ofFloat(-INFINITY)}, name);
    f32 = biases.emplace(std::make_pair(mask, c10::ScalarType::Float), where).first;  // where's dtype: the default, f32
  }
  if (dtype == c10::ScalarType::Float) return Arg::tensor(f32->second);
  // After the f32 bias, wherever that was made.
  b.setInsertionPointAfter(*g.producer(f32->second));
  return Arg::tensor(biases[{mask, dtype}] = b.cast(f32->second, dtype, name));
}

void fuse(Graph& g, const Node& a, const Node* backward, const std::string& kernel, Biases& biases) {
  const Arg bias = biasOf(g, a, biases);
  GraphBuilder b(g);
  b.setInsertionPoint(a);
  b.setMeta(a.meta);
  const Arg causal = Arg::ofBool(isCausal(a));
  const Arg scale = multiplier(a);
  const Arg dropout = Arg::ofFloat(dropoutOf(a));
  std::vector<Arg> qkv = {a.args[kAttentionQuery], a.args[kAttentionKey], a.args[kAttentionValue]};
  if (kernel == "gemm") qkv = contiguousForGemm(b, g, qkv);
  const std::string base = g.value(a.outputs[0]).name;
  std::vector<Arg> args = qkv;
  args.insert(args.end(), {bias, scale, causal, dropout, strArg(kernel)});
  const std::vector<ValueId> fwd = b.callMulti("spmd::fused_attention", args, base + ".fused");
  g.replaceAllUsesWith(a.outputs[0], fwd[0]);
  g.erase(a);
  if (!backward) return;
  b.setInsertionPoint(*backward);
  b.setMeta(backward->meta);
  std::vector<Arg> bargs = {backward->args[0]};
  bargs.insert(bargs.end(), qkv.begin(), qkv.end());
  bargs.insert(bargs.end(), {bias, Arg::tensor(fwd[0]), Arg::tensor(fwd[1]), Arg::tensor(fwd[2]),
                             Arg::tensor(fwd[3]), scale, causal, dropout, strArg(kernel)});
  const std::vector<ValueId> grads = b.callMulti("spmd::fused_attention_backward", bargs, base + ".grad");
  for (size_t i = 0; i < 3; ++i) {
    if (backward->outputs[i] != kNoValue) g.replaceAllUsesWith(backward->outputs[i], grads[i]);
  }
  g.erase(*backward);
}

// Rooted at the forward; its backward goes with it.
class AttentionToFusedKernel final : public RewritePattern {
 public:
  AttentionToFusedKernel(std::string kernel, bool generated, std::map<std::string, int>& fused)
      : RewritePattern("attention-to-fused-kernel", {"spmd::attention"}),
        kernel_(std::move(kernel)),
        generated_(generated),
        fused_(fused) {}

  // Boolean masks made additive (each once, in every dtype asked for).
  int masksMadeAdditive() const {
    std::set<ValueId> masks;
    for (const auto& [key, bias] : biases_) masks.insert(key.first);
    return static_cast<int>(masks.size());
  }

  MatchResult matchAndRewrite(Graph& g, const Node& a) override {
    if (const std::optional<std::string> why = whyNotFused(g, a)) return MatchResult::failure(*why);
    const std::string kernel = kernelFor(g, a, kernel_, generated_);
    fuse(g, a, backwardOf(g, a), kernel, biases_);
    ++fused_[kernel];
    return MatchResult::success();
  }

 private:
  std::string kernel_;
  bool generated_;
  std::map<std::string, int>& fused_;  // attentions fused, by kernel
  Biases biases_;
};

class FuseAttentionPass final : public Pass {
 public:
  FuseAttentionPass(std::string kernel, bool generated) : kernel_(std::move(kernel)), generated_(generated) {}

  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    if (kernel_ == "math") return false;
    std::map<std::string, int> fused;
    AttentionToFusedKernel pattern(kernel_, generated_, fused);
    applyPatternsNotingFailures(g, {&pattern}, diagnostics, "attention-to-fused-kernel: not fused: ");
    for (const auto& [kernel, n] : fused) {
      count("attention(s) run " + (kernel == "gemm" ? std::string("batched GEMMs around a generated softmax (gemm)")
                                                     : "ATen's " + kernel + " attention kernel"),
            n);
    }
    if (const int masks = pattern.masksMadeAdditive()) {
      count("boolean mask(s) made additive once, for every attention that reads them", masks);
    }
    return !fused.empty();  // the keep masks spmd-expand drew for dropout are left to dce
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

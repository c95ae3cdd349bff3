// attention (spmd-expand): the attention a model writes, as one
// spmd::attention node that spmd-lower can put a fused kernel in place of
// on CUDA. Two forms are taken.
//
// A call of F.scaled_dot_product_attention (aten::scaled_dot_product_attention):
// every call whose dropout probability, is_causal, scale and enable_gqa are
// constants and whose mask needs no gradient. The node computes as ATen's
// SDPA does (ops/attention_ops.cpp), so that the step's numbers are
// LibTorch's; scale=None becomes 1/sqrt(head size), as ATen computes it. A
// boolean or additive mask stays the node's argument, marked causal where
// it is the causal one. Dropout gets its keep mask drawn here (aten::rand,
// aten::ge.Scalar), an input of the node, so that forward and backward drop
// the same probabilities on the CPU; attention-to-fused-kernel hands dropout to the
// fused kernels instead. A call not taken stays as it is, with a note.
//
// Attention written out by hand:
//
//   scores = matmul(q, k.transpose(-2, -1)) * scale   (mul, or / scale: div)
//   scores = scores + mask                           (optional; aten::add.Tensor)
//   probs  = softmax(scores, dim=-1[, dtype])
//   probs  = probs.to(v.dtype)                       (optional)
//   out    = matmul(probs, v)
//
// becomes spmd::attention(q, k, v, mask, scale, causal, divide,
// softmax_dtype, sdpa=False, ...), which computes exactly those ops and whose
// backward is LibTorch's autograd over them, so that the step's numbers do
// not change. The scale is a number, or a 0-dim tensor the importer made of
// one (aten::scalar_tensor, for `/ math.sqrt(d)`). Only chains whose
// intermediate values nothing else reads are taken, q, k and v of one rank
// with the same batch dimensions.
//
// In both forms `causal` records that the mask is the causal one
// (triu(full(-inf), 1), or tril(ones) as booleans), which fused kernels take
// as is_causal: computed so in the graph, or slices of a buffer that holds
// those values and that the step never writes (LLaMA's and GPT-2's
// registered masks; the values come from the weights file,
// options.buffers), or any mask the step computes from constants alone
// (Hugging Face's position comparisons, broadcast over the batch), which is
// evaluated here and compared. Runs before autocast and autodiff, on the
// forward graph.
#include "spmd/ir/boxing.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/op_traits.h"
#include "spmd/ops/spmd_ops.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <variant>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName transpose_int = OpName::known("aten::transpose.int");
  OpName slice_Tensor = OpName::known("aten::slice.Tensor");
  OpName scalar_tensor = OpName::known("aten::scalar_tensor");
  OpName matmul = OpName::known("aten::matmul");
  OpName scaled_dot_product_attention = OpName::known("aten::scaled_dot_product_attention");
  OpName to_dtype = OpName::known("aten::to.dtype");
  OpName softmax_int = OpName::known("aten::softmax.int");
  OpName add_Tensor = OpName::known("aten::add.Tensor");
  OpName mul_Scalar = OpName::known("aten::mul.Scalar");
  OpName div_Scalar = OpName::known("aten::div.Scalar");
  OpName mul_Tensor = OpName::known("aten::mul.Tensor");
  OpName div_Tensor = OpName::known("aten::div.Tensor");
  OpName tril = OpName::known("aten::tril");
  OpName triu = OpName::known("aten::triu");
  OpName ones = OpName::known("aten::ones");
  OpName full = OpName::known("aten::full");
};
const Ops& ops() { return opTable<Ops>(); }

struct Chain {
  const Node* scores;   // matmul(q, kT)
  const Node* scaled;   // mul or div by a number
  const Node* masked;   // add.Tensor, or nullptr
  const Node* softmax;
  const Node* cast;     // to.dtype(probs, v's dtype), or nullptr
  const Node* out;      // matmul(probs, v)
  ValueId q, k, v;
  ValueId mask = kNoValue;
  double scale = 1.0;
  bool divide = false;
  Arg softmaxDtype = Arg::none();
  bool causal = false;
};

// The node making `v` when it is `op` and `v` has no other reader.
const Node* soleProducer(const Graph& g, ValueId v, OpName op) {
  const Node* n = g.producer(v);
  if (!n || !n->is(op) || !g.hasOneReader(v)) return nullptr;
  return n;
}

bool isTensor(const Arg& a) { return a.kind == Arg::Kind::Value; }

std::optional<double> number(const Arg& a) {
  if (a.kind == Arg::Kind::Float) return a.f;
  if (a.kind == Arg::Kind::Int) return static_cast<double>(a.i);
  return std::nullopt;
}

// k from k.transpose(-2, -1) (either order, or the last two dimensions by number).
std::optional<ValueId> transposedKey(const Graph& g, ValueId kt) {
  const Node* n = g.producer(kt);
  if (!n || !n->is(ops().transpose_int) || !isTensor(n->args[0])) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(g.value(kt).shape.size());
  auto norm = [&](int64_t d) { return d < 0 ? d + rank : d; };
  const int64_t a = norm(n->args[1].i), b = norm(n->args[2].i);
  if (std::min(a, b) != rank - 2 || std::max(a, b) != rank - 1) return std::nullopt;
  return n->args[0].value;
}

// triu(full([T, S], -inf), 1), or as booleans tril(ones([T, S])),
// computed in the graph.
bool isComputedCausalMask(const Graph& g, ValueId mask) {
  const Node* n = g.producer(mask);
  if (!n || !isTensor(n->args[0])) return false;
  const Node* filled = g.producer(n->args[0].value);
  if (!filled) return false;
  const Ops& o = ops();
  if (n->is(o.tril) && n->args[1].i == 0 && g.value(mask).dtype == c10::ScalarType::Bool) {
    if (filled->is(o.ones)) return true;
    return filled->is(o.full) && number(filled->args[1]) == 1.0;
  }
  if (!n->is(o.triu) || n->args[1].i != 1 || !filled->is(o.full)) return false;
  const std::optional<double> fill = number(filled->args[1]);
  return fill && std::isinf(*fill) && *fill < 0;
}

bool isUpdated(const Graph& g, ValueId input) {
  for (const StateUpdate& u : g.updates()) {
    if (u.input == input) return true;
  }
  return false;
}

// slice.Tensor(...(slice.Tensor(buffer))) where the buffer is never written
// and its sliced values are triu(full(-inf), 1).
bool isBufferCausalMask(const Graph& g, ValueId mask, BufferValues* buffers) {
  std::vector<const Node*> slices;
  ValueId v = mask;
  while (const Node* n = g.producer(v)) {
    if (!n->is(ops().slice_Tensor) || !isTensor(n->args[0]) || n->args[1].kind != Arg::Kind::Int) {
      return false;
    }
    slices.push_back(n);
    v = n->args[0].value;
  }
  const GraphInput* input = g.inputOf(v);
  if (!buffers || !input || input->kind != InputKind::Buffer || isUpdated(g, v)) return false;
  const at::Tensor* value = buffers->find(g.value(v).name);
  if (!value) return false;
  at::Tensor sliced = *value;
  for (auto it = slices.rbegin(); it != slices.rend(); ++it) {
    const Node& n = **it;
    auto bound = [](const Arg& a, int64_t absent) { return a.kind == Arg::Kind::Int ? a.i : absent; };
    sliced = sliced.slice(n.args[1].i, bound(n.args[2], 0), bound(n.args[3], INT64_MAX), n.args[4].i);
  }
  if (sliced.dim() != 2) return false;
  if (sliced.scalar_type() == at::kBool) return at::equal(sliced, at::ones(sliced.sizes(), sliced.options()).tril());
  if (!sliced.is_floating_point()) return false;
  return at::equal(sliced, at::full(sliced.sizes(), -INFINITY, sliced.options()).triu(1));
}

// The value of `v` where the step computes it from constants alone (and
// buffers it never writes, whose values the weights file gives): its
// producers run on the CPU, at most kMaxConstantNodes of them, none random.
// nullopt where it reads the step's data or parameters.
constexpr size_t kMaxConstantNodes = 64;
std::optional<at::Tensor> constantValue(const Graph& g, ValueId v, BufferValues* buffers,
                                        std::map<ValueId, at::Tensor>& known) {
  if (auto it = known.find(v); it != known.end()) return it->second;
  if (const GraphInput* input = g.inputOf(v)) {
    if (!buffers || input->kind != InputKind::Buffer || isUpdated(g, v)) return std::nullopt;
    const at::Tensor* value = buffers->find(g.value(v).name);
    if (!value) return std::nullopt;
    return known[v] = *value;
  }
  const Node* n = g.producer(v);
  if (!n || known.size() >= kMaxConstantNodes || isRandom(n->op)) return std::nullopt;
  const std::optional<c10::OperatorHandle> op = findOperator(*n);
  if (!op) return std::nullopt;
  bool constant = true;
  forEachTensorArg(*n, [&](ValueId a) { constant = constant && constantValue(g, a, buffers, known).has_value(); });
  if (!constant) return std::nullopt;
  try {
    std::vector<c10::IValue> stack = boxArguments(*n, op->schema(), [&](ValueId a) { return known.at(a); });
    op->callBoxed(stack);
    for (size_t i = 0; i < n->outputs.size() && i < stack.size(); ++i) {
      if (n->outputs[i] != kNoValue && stack[i].isTensor()) known[n->outputs[i]] = stack[i].toTensor();
    }
  } catch (const std::exception&) {
    return std::nullopt;  // not computable here (a CUDA-only op, say): not known to be causal
  }
  if (auto it = known.find(v); it != known.end()) return it->second;
  return std::nullopt;
}

// Whether every [L, S] matrix of `mask` is the causal mask: as booleans
// tril(ones) (true: attended), additive 0 on and below the diagonal and
// -inf (or the dtype's lowest, as Hugging Face writes it) above.
bool holdsCausalMask(const at::Tensor& mask) {
  if (mask.dim() < 2) return false;
  const int64_t rows = mask.size(-2), cols = mask.size(-1);
  const at::Tensor below = at::ones({rows, cols}, mask.options().dtype(at::kBool)).tril();
  if (mask.scalar_type() == at::kBool) return at::equal(mask, below.expand(mask.sizes()));
  if (!mask.is_floating_point()) return false;
  const at::Tensor m = mask.to(at::kDouble);
  const double lowest = mask.scalar_type() == at::kDouble ? std::numeric_limits<double>::lowest()
                        : mask.scalar_type() == at::kFloat ? std::numeric_limits<float>::lowest()
                                                           : -INFINITY;
  const at::Tensor masked = m.le(lowest);
  return at::equal(masked, below.logical_not().expand(mask.sizes())) && m.masked_select(below).eq(0).all().item<bool>();
}

bool isCausalMask(const Graph& g, ValueId mask, BufferValues* buffers) {
  if (g.value(mask).shape.size() == 2 && (isComputedCausalMask(g, mask) || isBufferCausalMask(g, mask, buffers))) {
    return true;
  }
  std::map<ValueId, at::Tensor> known;
  const std::optional<at::Tensor> value = constantValue(g, mask, buffers, known);
  return value && holdsCausalMask(*value);
}

// The number a 0-dim tensor holds when the importer made it of a constant
// (aten::scalar_tensor).
std::optional<double> scalarTensorNumber(const Graph& g, const Arg& a) {
  if (!isTensor(a)) return std::nullopt;
  const Node* n = g.producer(a.value);
  if (!n || !n->is(ops().scalar_tensor)) return std::nullopt;
  return number(n->args[0]);
}

// scores * c or scores / c, c a number or a constant 0-dim tensor.
bool matchScale(const Graph& g, ValueId x, Chain& c) {
  const Ops& o = ops();
  for (OpName op : {o.mul_Scalar, o.div_Scalar, o.mul_Tensor, o.div_Tensor}) {
    const Node* n = soleProducer(g, x, op);
    if (!n || !isTensor(n->args[0])) continue;
    const bool tensorForm = op == o.mul_Tensor || op == o.div_Tensor;
    const std::optional<double> scale = tensorForm ? scalarTensorNumber(g, n->args[1]) : number(n->args[1]);
    if (!scale) return false;
    c.scaled = n;
    c.scale = *scale;
    c.divide = op == o.div_Scalar || op == o.div_Tensor;
    return true;
  }
  return false;
}

// probs.to(dtype) when dtype is v's: what the op does to the probabilities anyway.
const Node* castToValueDtype(const Graph& g, ValueId probs, ValueId v) {
  const Node* n = soleProducer(g, probs, ops().to_dtype);
  if (!n || !isTensor(n->args[0]) || n->args[1].kind != Arg::Kind::DType) return nullptr;
  if (static_cast<c10::ScalarType>(n->args[1].i) != g.value(v).dtype || n->args[3].b) return nullptr;
  return n;
}

bool sameBatch(const Graph& g, ValueId a, ValueId b) {
  const auto& x = g.value(a).shape;
  const auto& y = g.value(b).shape;
  return x.size() == y.size() && x.size() >= 3 && std::equal(x.begin(), x.end() - 2, y.begin());
}

// Whether `v` is computed from a parameter: a mask that is would need its
// gradient, which spmd::attention does not give.
bool dependsOnParameter(const Graph& g, ValueId v) {
  std::vector<ValueId> todo = {v};
  std::set<ValueId> seen;
  while (!todo.empty()) {
    const ValueId x = todo.back();
    todo.pop_back();
    if (!seen.insert(x).second) continue;
    if (const GraphInput* input = g.inputOf(x)) {
      if (input->kind == InputKind::Parameter) return true;
      continue;
    }
    if (const Node* n = g.producer(x)) forEachTensorArg(*n, [&](ValueId a) { todo.push_back(a); });
  }
  return false;
}

std::optional<Chain> matchChain(const Graph& g, const Node& out, BufferValues* buffers) {
  if (!out.is(ops().matmul) || !isTensor(out.args[0]) || !isTensor(out.args[1])) return std::nullopt;
  Chain c{};
  c.out = &out;
  c.v = out.args[1].value;
  ValueId probs = out.args[0].value;
  c.cast = castToValueDtype(g, probs, c.v);
  if (c.cast) probs = c.cast->args[0].value;
  c.softmax = soleProducer(g, probs, ops().softmax_int);
  if (!c.softmax || !isTensor(c.softmax->args[0])) return std::nullopt;
  c.softmaxDtype = c.softmax->args[2];
  const int64_t rank = static_cast<int64_t>(g.value(c.softmax->outputs[0]).shape.size());
  if (c.softmax->args[1].i != -1 && c.softmax->args[1].i != rank - 1) return std::nullopt;
  ValueId x = c.softmax->args[0].value;
  c.masked = soleProducer(g, x, ops().add_Tensor);
  if (c.masked) {
    if (!isTensor(c.masked->args[0]) || !isTensor(c.masked->args[1]) || number(c.masked->args[2]) != 1.0) {
      return std::nullopt;
    }
    c.mask = c.masked->args[1].value;
    x = c.masked->args[0].value;
  }
  if (!matchScale(g, x, c)) return std::nullopt;
  c.scores = soleProducer(g, c.scaled->args[0].value, ops().matmul);
  if (!c.scores || !isTensor(c.scores->args[0]) || !isTensor(c.scores->args[1])) return std::nullopt;
  c.q = c.scores->args[0].value;
  const std::optional<ValueId> k = transposedKey(g, c.scores->args[1].value);
  if (!k) return std::nullopt;
  c.k = *k;
  if (!sameBatch(g, c.q, c.k) || !sameBatch(g, c.k, c.v)) return std::nullopt;
  if (c.mask != kNoValue && dependsOnParameter(g, c.mask)) return std::nullopt;
  if (c.mask != kNoValue) c.causal = isCausalMask(g, c.mask, buffers);
  return c;
}

void replace(Graph& g, const Chain& c) {
  GraphBuilder b(g);
  b.setMeta(c.out->meta);  // the source line of the matmul that gives the result
  const Arg mask = c.mask == kNoValue ? Arg::none() : Arg::tensor(c.mask);
  b.replace(*c.out, "spmd::attention",
            {Arg::tensor(c.q), Arg::tensor(c.k), Arg::tensor(c.v), mask, Arg::ofFloat(c.scale), Arg::ofBool(c.causal),
             Arg::ofBool(c.divide), c.softmaxDtype, Arg::ofBool(false), Arg::ofFloat(0.0), Arg::none(),
             Arg::ofBool(false)});
  for (const Node* n : {c.cast, c.softmax, c.masked, c.scaled, c.scores}) {
    if (n) g.erase(*n);
  }
}

// ---- F.scaled_dot_product_attention -------------------------------------------

// aten::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
// is_causal, scale, enable_gqa), its arguments made constants.
struct SdpaCall {
  Arg mask = Arg::none();
  double dropoutP = 0.0;
  bool isCausal = false;
  double scale = 1.0;
  bool enableGqa = false;
};

// The call's arguments, or why spmd::attention cannot take them.
std::variant<SdpaCall, std::string> readSdpaCall(const Graph& g, const Node& n) {
  if (n.args.size() != 8 || !isTensor(n.args[0]) || !isTensor(n.args[1]) || !isTensor(n.args[2])) {
    return std::string("an aten::scaled_dot_product_attention of another schema");
  }
  SdpaCall call;
  call.mask = n.args[3];
  const std::optional<double> dropout = number(n.args[4]);
  if (!dropout) return std::string("dropout_p is computed in the step");
  call.dropoutP = *dropout;
  if (n.args[5].kind != Arg::Kind::Bool || n.args[7].kind != Arg::Kind::Bool) {
    return std::string("is_causal or enable_gqa is computed in the step");
  }
  call.isCausal = n.args[5].b;
  call.enableGqa = n.args[7].b;
  if (n.args[6].kind == Arg::Kind::None) {
    call.scale = 1.0 / std::sqrt(static_cast<double>(g.value(n.args[0].value).shape.back()));
  } else if (const std::optional<double> scale = number(n.args[6])) {
    call.scale = *scale;
  } else {
    return std::string("scale is computed in the step");
  }
  if (isTensor(call.mask) && dependsOnParameter(g, call.mask.value)) {
    return std::string("the mask is computed from parameters and needs its gradient");
  }
  if (call.dropoutP < 0 || call.dropoutP >= 1) return std::string("dropout_p is not in [0, 1)");
  return call;
}

// The keep mask of the call's dropout: rand(scores' shape) >= dropout_p,
// true with probability 1 - dropout_p.
Arg drawKeepMask(GraphBuilder& b, const Node& n, double dropoutP) {
  const auto& q = b.graph().value(n.args[0].value).shape;
  const auto& k = b.graph().value(n.args[1].value).shape;
  std::vector<int64_t> shape(q.begin(), q.end() - 1);
  shape.push_back(k[k.size() - 2]);
  Arg dtype;
  dtype.kind = Arg::Kind::DType;
  dtype.i = static_cast<int64_t>(c10::ScalarType::Float);
  Arg device;
  device.kind = Arg::Kind::Device;
  device.s = "cpu";  // spmd-lower moves every device argument to its --device
  const std::string base = b.graph().value(n.outputs[0]).name;
  const ValueId uniform = b.call("aten::rand", {intsArg(shape), dtype, Arg::none(), device, Arg::none()},
                                 base + ".dropout_uniform");
  return Arg::tensor(b.call("aten::ge.Scalar", {Arg::tensor(uniform), Arg::ofFloat(dropoutP)}, base + ".keep"));
}

void replaceSdpa(Graph& g, const Node& n, const SdpaCall& call, BufferValues* buffers) {
  GraphBuilder b(g);
  b.setInsertionPoint(n);
  b.setMeta(n.meta);
  const bool causal = call.isCausal || (isTensor(call.mask) && isCausalMask(g, call.mask.value, buffers));
  const Arg keep = call.dropoutP > 0 ? drawKeepMask(b, n, call.dropoutP) : Arg::none();
  b.replace(n, "spmd::attention",
            {n.args[0], n.args[1], n.args[2], call.mask, Arg::ofFloat(call.scale), Arg::ofBool(causal),
             Arg::ofBool(false), Arg::none(), Arg::ofBool(true), Arg::ofFloat(call.dropoutP), keep,
             Arg::ofBool(call.enableGqa)});
}

// F.scaled_dot_product_attention as one spmd::attention node, or a note
// saying why it stays SDPA's math.
class SdpaToAttention final : public RewritePattern {
 public:
  explicit SdpaToAttention(BufferValues* buffers)
      : RewritePattern("sdpa-to-attention", {"aten::scaled_dot_product_attention"}), buffers_(buffers) {}
  MatchResult matchAndRewrite(Graph& g, const Node& n) override {
    const std::variant<SdpaCall, std::string> call = readSdpaCall(g, n);
    if (const std::string* why = std::get_if<std::string>(&call)) return MatchResult::failure(*why);
    replaceSdpa(g, n, std::get<SdpaCall>(call), buffers_);
    return MatchResult::success();
  }

 private:
  BufferValues* buffers_;
};

// A model's own attention, matmul to matmul, as one spmd::attention node.
class MatmulChainToAttention final : public RewritePattern {
 public:
  explicit MatmulChainToAttention(BufferValues* buffers)
      : RewritePattern("matmul-chain-to-attention", {"aten::matmul"}), buffers_(buffers) {}
  MatchResult matchAndRewrite(Graph& g, const Node& n) override {
    const std::optional<Chain> chain = matchChain(g, n, buffers_);
    if (!chain) return MatchResult::skip();
    replace(g, *chain);
    return MatchResult::success();
  }

 private:
  BufferValues* buffers_;
};

class AttentionPass final : public Pass {
 public:
  explicit AttentionPass(BufferValues* buffers) : buffers_(buffers) {}

  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    SdpaToAttention sdpa(buffers_);
    MatmulChainToAttention chains(buffers_);
    const int replaced = applyPatternsNotingFailures(g, {&sdpa, &chains},
                                                     diagnostics, "match-attention: left as SDPA's math: ").total();
    return replaced > 0;  // the transposed key and the scale's 0-dim tensor are left to dce
  }

 private:
  BufferValues* buffers_;
};

}  // namespace

std::unique_ptr<Pass> createAttentionPass(const PipelineOptions& options) {
  return std::make_unique<AttentionPass>(options.buffers);
}

}  // namespace spmd

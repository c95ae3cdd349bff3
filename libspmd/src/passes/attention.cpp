// attention (spmd-expand): the attention a model writes out by hand,
//
//   scores = matmul(q, k.transpose(-2, -1)) * scale   (mul, or / scale: div)
//   scores = scores + mask                           (optional; aten::add.Tensor)
//   probs  = softmax(scores, dim=-1[, dtype])
//   probs  = probs.to(v.dtype)                       (optional)
//   out    = matmul(probs, v)
//
// becomes one spmd::attention(q, k, v, mask, scale, causal, divide,
// softmax_dtype) node, which computes exactly those ops
// (ops/attention_ops.cpp) and whose backward is LibTorch's autograd over
// them, so that the step's numbers do not change; what changes is that
// spmd-lower can put a fused kernel in its place on CUDA. The scale is a
// number, or a 0-dim tensor the importer made of one (aten::scalar_tensor,
// for `/ math.sqrt(d)`). `causal` records that the mask is triu(full(-inf),
// 1), which fused kernels take as is_causal: computed so in the graph, or
// slices of a buffer that holds those values and that the step never
// writes (LLaMA's and GPT-2's registered masks; the values come from the
// weights file, options.buffers). Only chains whose intermediate values
// nothing else reads are taken, q, k and v of one rank with the same batch
// dimensions. Runs before autocast and autodiff, on the forward graph.
#include "spmd/ir/builder.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>

#include <cmath>
#include <optional>

namespace spmd {
namespace {

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
const Node* soleProducer(const Graph& g, ValueId v, const char* op) {
  const Node* n = g.producer(v);
  if (!n || n->qualifiedName() != op || g.users(v).size() != 1) return nullptr;
  for (ValueId o : g.outputs()) {
    if (o == v) return nullptr;
  }
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
  if (!n || n->qualifiedName() != "aten::transpose.int" || !isTensor(n->args[0])) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(g.value(kt).shape.size());
  auto norm = [&](int64_t d) { return d < 0 ? d + rank : d; };
  const int64_t a = norm(n->args[1].i), b = norm(n->args[2].i);
  if (std::min(a, b) != rank - 2 || std::max(a, b) != rank - 1) return std::nullopt;
  return n->args[0].value;
}

// triu(full([T, S], -inf), 1), computed in the graph.
bool isComputedCausalMask(const Graph& g, ValueId mask) {
  const Node* triu = g.producer(mask);
  if (!triu || triu->qualifiedName() != "aten::triu" || !isTensor(triu->args[0]) || triu->args[1].i != 1) return false;
  const Node* full = g.producer(triu->args[0].value);
  if (!full || full->qualifiedName() != "aten::full") return false;
  const std::optional<double> fill = number(full->args[1]);
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
    if (n->qualifiedName() != "aten::slice.Tensor" || !isTensor(n->args[0]) || n->args[1].kind != Arg::Kind::Int) {
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
  if (sliced.dim() != 2 || !sliced.is_floating_point()) return false;
  return at::equal(sliced, at::full(sliced.sizes(), -INFINITY, sliced.options()).triu(1));
}

bool isCausalMask(const Graph& g, ValueId mask, BufferValues* buffers) {
  if (g.value(mask).shape.size() != 2) return false;
  return isComputedCausalMask(g, mask) || isBufferCausalMask(g, mask, buffers);
}

// The number a 0-dim tensor holds when the importer made it of a constant
// (aten::scalar_tensor).
std::optional<double> scalarTensorNumber(const Graph& g, const Arg& a) {
  if (!isTensor(a)) return std::nullopt;
  const Node* n = g.producer(a.value);
  if (!n || n->qualifiedName() != "aten::scalar_tensor") return std::nullopt;
  return number(n->args[0]);
}

// scores * c or scores / c, c a number or a constant 0-dim tensor.
bool matchScale(const Graph& g, ValueId x, Chain& c) {
  for (const char* op : {"aten::mul.Scalar", "aten::div.Scalar", "aten::mul.Tensor", "aten::div.Tensor"}) {
    const Node* n = soleProducer(g, x, op);
    if (!n || !isTensor(n->args[0])) continue;
    const std::string name = n->qualifiedName();
    const bool tensorForm = name == "aten::mul.Tensor" || name == "aten::div.Tensor";
    const std::optional<double> scale = tensorForm ? scalarTensorNumber(g, n->args[1]) : number(n->args[1]);
    if (!scale) return false;
    c.scaled = n;
    c.scale = *scale;
    c.divide = name == "aten::div.Scalar" || name == "aten::div.Tensor";
    return true;
  }
  return false;
}

// probs.to(dtype) when dtype is v's: what the op does to the probabilities anyway.
const Node* castToValueDtype(const Graph& g, ValueId probs, ValueId v) {
  const Node* n = soleProducer(g, probs, "aten::to.dtype");
  if (!n || !isTensor(n->args[0]) || n->args[1].kind != Arg::Kind::DType) return nullptr;
  if (static_cast<c10::ScalarType>(n->args[1].i) != g.value(v).dtype || n->args[3].b) return nullptr;
  return n;
}

bool sameBatch(const Graph& g, ValueId a, ValueId b) {
  const auto& x = g.value(a).shape;
  const auto& y = g.value(b).shape;
  return x.size() == y.size() && x.size() >= 3 && std::equal(x.begin(), x.end() - 2, y.begin());
}

std::optional<Chain> matchChain(const Graph& g, const Node& out, BufferValues* buffers) {
  if (out.qualifiedName() != "aten::matmul" || !isTensor(out.args[0]) || !isTensor(out.args[1])) return std::nullopt;
  Chain c{};
  c.out = &out;
  c.v = out.args[1].value;
  ValueId probs = out.args[0].value;
  c.cast = castToValueDtype(g, probs, c.v);
  if (c.cast) probs = c.cast->args[0].value;
  c.softmax = soleProducer(g, probs, "aten::softmax.int");
  if (!c.softmax || !isTensor(c.softmax->args[0])) return std::nullopt;
  c.softmaxDtype = c.softmax->args[2];
  const int64_t rank = static_cast<int64_t>(g.value(c.softmax->outputs[0]).shape.size());
  if (c.softmax->args[1].i != -1 && c.softmax->args[1].i != rank - 1) return std::nullopt;
  ValueId x = c.softmax->args[0].value;
  c.masked = soleProducer(g, x, "aten::add.Tensor");
  if (c.masked) {
    if (!isTensor(c.masked->args[0]) || !isTensor(c.masked->args[1]) || number(c.masked->args[2]) != 1.0) {
      return std::nullopt;
    }
    c.mask = c.masked->args[1].value;
    x = c.masked->args[0].value;
  }
  if (!matchScale(g, x, c)) return std::nullopt;
  c.scores = soleProducer(g, c.scaled->args[0].value, "aten::matmul");
  if (!c.scores || !isTensor(c.scores->args[0]) || !isTensor(c.scores->args[1])) return std::nullopt;
  c.q = c.scores->args[0].value;
  const std::optional<ValueId> k = transposedKey(g, c.scores->args[1].value);
  if (!k) return std::nullopt;
  c.k = *k;
  if (!sameBatch(g, c.q, c.k) || !sameBatch(g, c.k, c.v)) return std::nullopt;
  if (c.mask != kNoValue) c.causal = isCausalMask(g, c.mask, buffers);
  return c;
}

void replace(Graph& g, const Chain& c) {
  GraphBuilder b(g);
  b.setMeta(c.out->meta);  // the source line of the matmul that gives the result
  const Arg mask = c.mask == kNoValue ? Arg::none() : Arg::tensor(c.mask);
  b.replace(*c.out, "spmd::attention",
            {Arg::tensor(c.q), Arg::tensor(c.k), Arg::tensor(c.v), mask, Arg::ofFloat(c.scale), Arg::ofBool(c.causal),
             Arg::ofBool(c.divide), c.softmaxDtype});
  for (const Node* n : {c.cast, c.softmax, c.masked, c.scaled, c.scores}) {
    if (n) g.erase(*n);
  }
}

class AttentionPass final : public Pass {
 public:
  explicit AttentionPass(BufferValues* buffers) : buffers_(buffers) {}

  bool run(Graph& g, DiagnosticEngine&) override {
    bool changed = false;
    for (const Node* n : snapshot(g.nodes())) {
      if (n->op != "aten::matmul") continue;
      const std::optional<Chain> chain = matchChain(g, *n, buffers_);
      if (!chain) continue;
      replace(g, *chain);
      changed = true;
    }
    if (changed) eliminateDeadNodes(g);  // the transposed key and the scale's 0-dim tensor, when nothing else reads them
    return changed;
  }

 private:
  BufferValues* buffers_;
};

}  // namespace

std::unique_ptr<Pass> createAttentionPass(const PipelineOptions& options) {
  return std::make_unique<AttentionPass>(options.buffers);
}

}  // namespace spmd

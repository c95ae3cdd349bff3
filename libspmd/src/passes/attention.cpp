// attention (spmd-expand): the attention a model writes out by hand,
//
//   scores = matmul(q, k.transpose(-2, -1)) * scale   (aten::mul.Scalar)
//   scores = scores + mask                           (optional; aten::add.Tensor)
//   probs  = softmax(scores, dim=-1)
//   out    = matmul(probs, v)
//
// becomes one spmd::attention(q, k, v, mask, scale, causal) node, which
// computes exactly those ops (ops/attention_ops.cpp) and whose backward is
// LibTorch's autograd over them, so that the step's numbers do not change;
// what changes is that spmd-lower can put a fused kernel in its place on
// CUDA. `causal` records that the mask is triu(full(-inf), 1), which fused
// kernels take as is_causal. Only chains whose intermediate values nothing
// else reads are taken, q, k and v of one rank with the same batch
// dimensions. Runs before autocast and autodiff, on the forward graph.
#include "spmd/ir/builder.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <cmath>
#include <optional>

namespace spmd {
namespace {

struct Chain {
  const Node* scores;   // matmul(q, kT)
  const Node* scaled;   // mul.Scalar
  const Node* masked;   // add.Tensor, or nullptr
  const Node* softmax;
  const Node* out;      // matmul(probs, v)
  ValueId q, k, v;
  ValueId mask = kNoValue;
  double scale = 1.0;
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

// triu(full([T, S], -inf), 1): the causal mask.
bool isCausalMask(const Graph& g, ValueId mask) {
  const Node* triu = g.producer(mask);
  if (!triu || triu->qualifiedName() != "aten::triu" || !isTensor(triu->args[0]) || triu->args[1].i != 1) return false;
  const Node* full = g.producer(triu->args[0].value);
  if (!full || full->qualifiedName() != "aten::full") return false;
  const std::optional<double> fill = number(full->args[1]);
  return fill && std::isinf(*fill) && *fill < 0 && g.value(mask).shape.size() == 2;
}

bool sameBatch(const Graph& g, ValueId a, ValueId b) {
  const auto& x = g.value(a).shape;
  const auto& y = g.value(b).shape;
  return x.size() == y.size() && x.size() >= 3 && std::equal(x.begin(), x.end() - 2, y.begin());
}

std::optional<Chain> matchChain(const Graph& g, const Node& out) {
  if (out.qualifiedName() != "aten::matmul" || !isTensor(out.args[0]) || !isTensor(out.args[1])) return std::nullopt;
  Chain c{};
  c.out = &out;
  c.v = out.args[1].value;
  c.softmax = soleProducer(g, out.args[0].value, "aten::softmax.int");
  if (!c.softmax || !isTensor(c.softmax->args[0]) || c.softmax->args[2].kind != Arg::Kind::None) return std::nullopt;
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
  c.scaled = soleProducer(g, x, "aten::mul.Scalar");
  if (!c.scaled || !isTensor(c.scaled->args[0]) || !number(c.scaled->args[1])) return std::nullopt;
  c.scale = *number(c.scaled->args[1]);
  c.scores = soleProducer(g, c.scaled->args[0].value, "aten::matmul");
  if (!c.scores || !isTensor(c.scores->args[0]) || !isTensor(c.scores->args[1])) return std::nullopt;
  c.q = c.scores->args[0].value;
  const std::optional<ValueId> k = transposedKey(g, c.scores->args[1].value);
  if (!k) return std::nullopt;
  c.k = *k;
  if (!sameBatch(g, c.q, c.k) || !sameBatch(g, c.k, c.v)) return std::nullopt;
  if (c.mask != kNoValue) c.causal = isCausalMask(g, c.mask);
  return c;
}

void replace(Graph& g, const Chain& c) {
  GraphBuilder b(g);
  b.setMeta(c.out->meta);  // the source line of the matmul that gives the result
  const Arg mask = c.mask == kNoValue ? Arg::none() : Arg::tensor(c.mask);
  b.replace(*c.out, "spmd::attention",
            {Arg::tensor(c.q), Arg::tensor(c.k), Arg::tensor(c.v), mask, Arg::ofFloat(c.scale), Arg::ofBool(c.causal)});
  for (const Node* n : {c.softmax, c.masked, c.scaled, c.scores}) {
    if (n) g.erase(*n);
  }
}

class AttentionPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine&) override {
    bool changed = false;
    for (const Node* n : snapshot(g.nodes())) {
      if (n->op != "aten::matmul") continue;
      const std::optional<Chain> chain = matchChain(g, *n);
      if (!chain) continue;
      replace(g, *chain);
      changed = true;
    }
    if (changed) eliminateDeadNodes(g);  // the transposed key, when nothing else reads it
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createAttentionPass(const PipelineOptions&) { return std::make_unique<AttentionPass>(); }

}  // namespace spmd

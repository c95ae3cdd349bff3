// Forward rewrites into ops that have derivative rules (layer_norm, max_pool2d,
// the losses, attention), and whyNotDifferentiable, which knows both.
#include "spmd/passes/derivatives.h"

#include "derivatives_internal.h"

#include <cmath>
#include <string>
#include <vector>

namespace spmd {
namespace {

using derivatives_detail::boolAt;
using derivatives_detail::in;
using derivatives_detail::isNone;
using derivatives_detail::mT;
using derivatives_detail::out;
using derivatives_detail::scalarAt;

// ---- forward rewrites ------------------------------------------------------------

// The replacement's first result takes over the original's value, so every
// consumer stays valid; the saved results get fresh values.
void emitReplacing(GraphBuilder& b, const Node& original, const std::string& op, std::vector<Arg> args) {
  b.callMulti(op, std::move(args), b.value(original.outputs[0]).name + "_saved", {original.outputs[0]});
}

// scaled_dot_product_attention (LibTorch 2.x) as its math definition:
// softmax(q @ k^T * scale + bias) @ v, every op of which has a rule.
// Arguments: (query, key, value, attn_mask, dropout_p, is_causal[, scale[, enable_gqa]]).
std::string sdpaUnsupported(const Node& n) {
  if (n.args.size() < 6) return "unknown scaled_dot_product_attention signature";
  if (scalarAt(n, 4) != 0.0) return "dropout_p > 0 (random masks) is not supported";
  if (n.args.size() > 7 && boolAt(n, 7)) return "enable_gqa is not supported";
  return "";
}

void rewriteSdpa(GraphBuilder& b, const Node& n) {
  ValueId q = in(n, 0), k = in(n, 1), v = in(n, 2);
  const auto qShape = b.shape(q);
  const int64_t L = qShape[qShape.size() - 2], S = b.shape(k)[b.shape(k).size() - 2];
  const double scale = n.args.size() > 6 && !isNone(n, 6) ? scalarAt(n, 6) : 1.0 / std::sqrt(static_cast<double>(qShape.back()));
  ValueId scores = b.call("aten::matmul", {Arg::tensor(q), Arg::tensor(mT(b, k))});
  scores = b.mulScalar(scores, scale);
  if (boolAt(n, 5)) {
    ValueId full = b.call("aten::new_full", {Arg::tensor(scores), intsArg({L, S}), Arg::ofFloat(-INFINITY), Arg::none(),
                                             Arg::none(), Arg::none(), Arg::none()});
    scores = b.add(scores, b.call("aten::triu", {Arg::tensor(full), Arg::ofInt(1)}, "causal_mask"));
  }
  if (!isNone(n, 3)) {
    ValueId mask = in(n, 3);
    if (b.value(mask).dtype == c10::ScalarType::Bool) {
      ValueId hidden = b.call("aten::logical_not", {Arg::tensor(mask)});
      scores = b.call("aten::masked_fill.Scalar", {Arg::tensor(scores), Arg::tensor(hidden), Arg::ofFloat(-INFINITY)});
    } else {
      scores = b.add(scores, mask);
    }
  }
  ValueId probs = b.call("aten::softmax.int", {Arg::tensor(scores), Arg::ofInt(-1), Arg::none()});
  b.callMulti("aten::matmul", {Arg::tensor(probs), Arg::tensor(v)}, "", {out(n)});
}

}  // namespace

std::string whyNotDifferentiable(const Node& node) {
  const std::string op = node.qualifiedName();
  if (const DerivativeRule* rule = findDerivative(node)) return rule->unsupported ? rule->unsupported(node) : "";
  if (op == "aten::layer_norm" || op == "aten::max_pool2d") return "";
  if (op == "aten::scaled_dot_product_attention") return sdpaUnsupported(node);
  if (op == "aten::cross_entropy_loss" || op == "aten::nll_loss" || op == "aten::nll_loss_nd") {
    if (node.args.at(0).kind == Arg::Kind::Value && node.args.size() > 5 && op == "aten::cross_entropy_loss" &&
        scalarAt(node, 5) != 0.0) {
      return "label_smoothing is not supported";
    }
    return "";  // rank checked where the rewrite runs
  }
  return "no derivative rule";
}

bool rewriteForBackward(GraphBuilder& b, const Node& n) {
  const std::string op = n.qualifiedName();
  if (op == "aten::layer_norm") {  // (input, normalized_shape, weight, bias, eps, cudnn_enable)
    emitReplacing(b, n, "aten::native_layer_norm", {n.args[0], n.args[1], n.args[2], n.args[3], n.args[4]});
    return true;
  }
  if (op == "aten::max_pool2d") {  // (self, kernel_size, stride, padding, dilation, ceil_mode)
    emitReplacing(b, n, "aten::max_pool2d_with_indices", n.args);
    return true;
  }
  if (op == "aten::scaled_dot_product_attention" && sdpaUnsupported(n).empty()) {
    rewriteSdpa(b, n);
    return true;
  }
  const bool crossEntropy = op == "aten::cross_entropy_loss";
  const bool nll = op == "aten::nll_loss" || op == "aten::nll_loss_nd";
  if (crossEntropy || nll) {
    // (self, target, weight, reduction, ignore_index[, label_smoothing]); the
    // composite ops reach nll_loss_forward this way for [N, C] or [C] inputs.
    const size_t rank = b.shape(in(n, 0)).size();
    if (rank > 2 || (crossEntropy && scalarAt(n, 5) != 0.0)) return false;
    ValueId logits = in(n, 0);
    if (crossEntropy) {
      logits = b.call("aten::_log_softmax", {n.args[0], Arg::ofInt(rank == 1 ? 0 : 1), Arg::ofBool(false)}, "log_softmax");
    }
    emitReplacing(b, n, "aten::nll_loss_forward", {Arg::tensor(logits), n.args[1], n.args[2], n.args[3], n.args[4]});
    return true;
  }
  return false;
}

}  // namespace spmd

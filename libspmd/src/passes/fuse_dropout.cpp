// dropout-mask-in-kernel (spmd-lower runs it for --device cuda, with generated kernels,
// before fuse-rows and fuse-pointwise): dropout's mask is drawn inside the
// generated kernels that use it instead of being stored. Dropout with p > 0
// records LibTorch's decomposition, and its backward reads the same mask:
//
//   %e: bf16[N,C] = aten::empty_like(%x, ...)
//   %mask: bf16[N,C] = aten::bernoulli.p(%e, 0.9, None)
//   %noise: bf16[N,C] = aten::div.Scalar(%mask, 0.9)
//   %y: bf16[N,C] = aten::mul.Tensor(%x, %noise)            (forward)
//   %gx: bf16[N,C] = aten::mul.Tensor(%gy, %noise)          (backward)
//
// becomes
//
//   %mask_seed: i64[] = spmd::dropout_seed(%x)
//   %y: bf16[N,C] = spmd::dropout_mul(%x, %mask_seed, 0.9, torch.bfloat16, 0.9)
//   %gx: bf16[N,C] = spmd::dropout_mul(%gy, %mask_seed, 0.9, torch.bfloat16, 0.9)
//
// spmd::dropout_seed draws one 64-bit seed from the default generator (a
// random op: spmd-run seeds it per step, a CUDA graph replays it with new
// values); each spmd::dropout_mul recomputes the mask from it
// (ops/pointwise_program.h, `bernoulli`) and fuse-pointwise puts it into the
// kernel of the ops around it. The kept value, 1 / divisor, rounds to the
// mask's dtype as ATen's division of the mask rounds it, so each product
// equals the unfused one for the same mask. No buffer of the mask's size is
// written or kept from the forward to the backward; the masks are not the
// ones ATen's bernoulli would draw (README, "Dropout").
//
// A dropout of p = 0 (transformers' and torchvision's configurations leave
// aten::dropout(x, 0.0, True) in the graph) is its input, as ATen returns
// it: its readers read the input, and the op goes. Left in place, it stands
// between element-wise ops as a random op no pass may move or repeat.
//
// Taken: a mask only a div.Scalar reads, whose quotient only element-wise
// products of its own shape read (other value of the same shape). Other
// masks keep ATen's bernoulli, with a note: feature dropout (a mask that
// broadcasts), masks the step returns or reads otherwise.
#include "pointwise_groups.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/pointwise_program.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName div_Scalar = OpName::known("aten::div.Scalar");
  OpName mul_Tensor = OpName::known("aten::mul.Tensor");
  OpName empty_like = OpName::known("aten::empty_like");
};
const Ops& ops() { return opTable<Ops>(); }

// One dropout as the pass found it: the mask's node, its division, and the
// products that read the quotient (with the other operand of each).
struct Dropout {
  const Node* bernoulli = nullptr;
  const Node* divide = nullptr;
  std::vector<const Node*> products;
  std::vector<ValueId> factors;
  double keep = 0, divisor = 0;
};

class DropoutMatcher {
 public:
  explicit DropoutMatcher(const Graph& g) : g_(g) {}

  // The dropout whose mask `n` (a bernoulli.p) draws, or nullopt and why not.
  std::optional<Dropout> match(const Node& n, std::string& why) const {
    if (n.outputs.size() != 1) {
      why = "a node of more than one result";
      return std::nullopt;
    }
    const auto& a = n.args;
    if (a.size() < 2 || a[0].kind != Arg::Kind::Value || !isScalar(a[1]) ||
        (a.size() > 2 && a[2].kind != Arg::Kind::None)) {
      why = "a generator argument";
      return std::nullopt;
    }
    const ValueId mask = n.outputs[0];
    if (!isPointwiseDtype(g_.value(mask).dtype)) {
      why = "a mask of dtype other than f32, bf16 or f16";
      return std::nullopt;
    }
    Dropout d;
    d.bernoulli = &n;
    d.keep = scalarOf(a[1]);
    const Node* reader = g_.soleReader(mask);
    if (!reader || !reader->is(ops().div_Scalar) || reader->args.size() != 2 ||
        reader->args[0].kind != Arg::Kind::Value || !isScalar(reader->args[1])) {
      why = "the mask is read other than by one division by a number";
      return std::nullopt;
    }
    d.divide = reader;
    d.divisor = scalarOf(d.divide->args[1]);
    if (!takeProducts(d, why)) return std::nullopt;
    return d;
  }

 private:
  // Every reader of the quotient multiplies it by a value of its shape.
  bool takeProducts(Dropout& d, std::string& why) const {
    const ValueId noise = d.divide->outputs[0];
    const Value& q = g_.value(noise);
    if (g_.readBeyondNodes(noise) || g_.users(noise).empty()) {
      why = "the scaled mask is a result of the step, or unread";
      return false;
    }
    for (const Node* user : g_.users(noise)) {
      const auto& a = user->args;
      const bool product = user->is(ops().mul_Tensor) && a.size() == 2 &&
                           a[0].kind == Arg::Kind::Value && a[1].kind == Arg::Kind::Value &&
                           (a[0].value == noise) != (a[1].value == noise);
      const ValueId other = product ? (a[0].value == noise ? a[1].value : a[0].value) : kNoValue;
      if (!product || g_.value(other).shape != q.shape || !isPointwiseDtype(g_.value(other).dtype) ||
          g_.value(user->outputs[0]).dtype != c10::promoteTypes(g_.value(other).dtype, q.dtype)) {
        why = "the scaled mask is read other than by a product with a value of its shape";
        return false;
      }
      d.products.push_back(user);
      d.factors.push_back(other);
    }
    return true;
  }

  const Graph& g_;
};

// What the seed's node reads for its device: the tensor the mask was drawn
// like (empty_like's input where the mask's shape tensor is one).
ValueId deviceSource(const Graph& g, const Node& bernoulli) {
  const ValueId like = bernoulli.args[0].value;
  const Node* p = g.producer(like);
  if (p && p->is(ops().empty_like) && !p->args.empty() && p->args[0].kind == Arg::Kind::Value) {
    return p->args[0].value;
  }
  return like;
}

void rewrite(Graph& g, const Dropout& d) {
  const ValueId mask = d.bernoulli->outputs[0];
  const c10::ScalarType maskDtype = g.value(mask).dtype;
  const ValueId like = d.bernoulli->args[0].value;
  GraphBuilder b(g);
  b.setMeta(d.bernoulli->meta);
  b.setInsertionPoint(*d.bernoulli);
  const ValueId seed = b.call("spmd::dropout_seed", {Arg::tensor(deviceSource(g, *d.bernoulli))},
                              g.value(mask).name + "_seed");
  for (size_t k = 0; k < d.products.size(); ++k) {
    b.setMeta(d.products[k]->meta);
    b.replace(*d.products[k], "spmd::dropout_mul",
              {Arg::tensor(d.factors[k]), Arg::tensor(seed), Arg::ofFloat(d.keep), dtypeArg(maskDtype),
               Arg::ofFloat(d.divisor)});
  }
  g.erase(*d.divide);
  g.erase(*d.bernoulli);
  const Node* shapeSource = g.producer(like);
  if (shapeSource && shapeSource->is(ops().empty_like) && g.users(like).empty() &&
      !g.readBeyondNodes(like)) {
    g.erase(*shapeSource);
  }
}

// Rooted at the mask's bernoulli: a rewrite erases and replaces nodes after
// its mask, never another mask.
class DropoutMaskInKernel final : public RewritePattern {
 public:
  DropoutMaskInKernel() : RewritePattern("dropout-mask-in-kernel", {"aten::bernoulli.p"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& bernoulli) override {
    std::string why;
    const std::optional<Dropout> d = DropoutMatcher(g).match(bernoulli, why);
    if (!d) return why.empty() ? MatchResult::skip() : MatchResult::failure(why);
    rewrite(g, *d);
    return MatchResult::success();
  }
};

// aten::dropout(x, 0.0, train) and the feature and alpha forms: x itself.
class ZeroDropout final : public RewritePattern {
 public:
  ZeroDropout()
      : RewritePattern("zero-dropout", {"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                                        "aten::feature_alpha_dropout"}) {}
  MatchResult matchAndRewrite(Graph& g, const Node& dropout) override {
    const auto& a = dropout.args;
    const ValueId out = dropout.outputs[0];
    if (a.size() != 3 || a[0].kind != Arg::Kind::Value || !isScalar(a[1]) || scalarOf(a[1]) != 0.0 ||
        (g.users(out).empty() && !g.isGraphOutput(out))) {
      return MatchResult::skip();
    }
    g.replaceAllUsesWith(out, a[0].value);
    return MatchResult::success();
  }
};

class FuseDropoutPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    ZeroDropout zero;
    const int identities = applyPatternsGreedily(g, {&zero}, nullptr).total();
    if (identities) count("dropout(s) of p = 0 read as their input", identities);
    DropoutMaskInKernel pattern;
    const int taken = applyPatternsNotingFailures(g, {&pattern},
                                                  diagnostics, "dropout-mask-in-kernel: not fused: ").total();
    count("dropout mask(s) drawn inside generated kernels, none stored", taken);
    return taken > 0 || identities > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseDropoutPass(const PipelineOptions&) { return std::make_unique<FuseDropoutPass>(); }

}  // namespace spmd

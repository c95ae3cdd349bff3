// layer-norm-to-kernel (spmd-lower runs it for --device cuda, with generated
// kernels): aten::native_layer_norm and aten::native_layer_norm_backward
// become spmd::layer_norm and spmd::layer_norm_backward (ops/layer_norm_ops.cpp),
// generated kernels that take in the ops next to them that only move bytes:
//
//   %x = aten::add.Tensor(%a, %r, 1)                       (the skip connection, if no reader before)
//   %y, %mean, %rstd = aten::native_layer_norm(%x, [C], %w, %b, eps)
//   %y16 = aten::_to_copy(%y, torch.bfloat16, ...)       (autocast's cast, if y's only reader)
//     -> %y16, %mean, %rstd, %x = spmd::layer_norm(%a, %r, %w, %b, eps, torch.bfloat16)
//
//   %dy = aten::_to_copy(%dy16, torch.float32, ...)       (if dy's only reader is the backward)
//   %dx, %dw, %db = aten::native_layer_norm_backward(%dy, %x, [C], %mean, %rstd, %w, %b, [True, True, True])
//   %sum = aten::add.Tensor(%dx, %other, 1)                (if dx's only reader; %other made earlier)
//   %sum16 = aten::_to_copy(%sum, torch.bfloat16, ...)     (autocast's cast for the GEMM before, a reader)
//     -> %sum, %dw, %db, %sum16 = spmd::layer_norm_backward(%dy16, %x, %mean, %rstd, %w, %other, True)
//
// The weight's and the bias's gradients are summed in the backward's own
// kernels (no separate column reduction). Taken: fp32 input over its last
// dimension only, with a weight and a bias, the features a multiple of 4 and
// at most kLayerNormMaxFeatures; other LayerNorms stay ATen's, with a note.
// The values keep their names. The backward's bf16 copy of its result is
// taken in where a cast to bf16 reads it, whatever else reads it (the
// residual stream's fp32 gradient goes on to the LayerNorm before): the
// kernel writes both, and no kernel reads the fp32 result again to round it.
#include "cast_match.h"
#include "spmd/ir/builder.h"
#include "spmd/ir/rewrite.h"
#include "spmd/ops/layer_norm_codegen.h"
#include "spmd/passes/pass.h"
#include "spmd/support/diagnostic.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace spmd {
namespace {

bool isTensor(const Arg& a) { return a.kind == Arg::Kind::Value; }

bool sameSchedule(const Node& a, const Node& b) {
  return a.meta.role == b.meta.role && a.meta.iteration == b.meta.iteration;
}

// Why the LayerNorm over `input` with `normalizedShape`, `weight` and `bias`
// is not one this pass takes ("" when it is).
std::string unsupported(const Graph& g, const Arg& input, const Arg& normalizedShape, const Arg& weight,
                        const Arg& bias) {
  if (!isTensor(input) || !isTensor(weight) || !isTensor(bias)) return "no weight or no bias";
  const Value& x = g.value(input.value);
  if (x.dtype != c10::ScalarType::Float) return "the input is not fp32";
  if (normalizedShape.kind != Arg::Kind::Ints || normalizedShape.ints.size() != 1 || x.shape.empty() ||
      normalizedShape.ints[0] != x.shape.back()) {
    return "it normalizes more than the last dimension";
  }
  if (g.value(weight.value).dtype != c10::ScalarType::Float || g.value(bias.value).dtype != c10::ScalarType::Float) {
    return "the weight or the bias is not fp32";
  }
  return layerNormUnsupported(x.shape.back());
}

// Whether `other`, which an add sums with the backward's `dx`, can be added
// in the backward's kernel: an fp32 tensor of dx's shape made before it.
bool residualFits(const Graph& g, const Arg& other, ValueId dx, const Node& backward) {
  if (!isTensor(other) || other.value == dx) return false;
  const Value& o = g.value(other.value);
  const Node* made = g.producer(other.value);
  return o.dtype == c10::ScalarType::Float && o.shape == g.value(dx).shape &&
         (!made || g.indexOf(*made) < g.indexOf(backward));
}

struct Counts {
  int forward = 0, backward = 0, casts = 0, residualAdds = 0, residualGradients = 0;
};

// Whether `add` (aten::add.Tensor) makes the input of LayerNorm `n` so that
// n's kernel can add instead: alpha 1, both operands of the sum's shape (an
// f32 one first, then f32 or bf16), and no reader of the sum before `n`.
bool addFits(const Graph& g, const Node& add, const Node& n) {
  static const OpName kAdd = OpName::known("aten::add.Tensor");
  if (!add.is(kAdd) || add.args.size() != 3 || add.args[2].kind != Arg::Kind::Int ||
      add.args[2].i != 1 || !isTensor(add.args[0]) || !isTensor(add.args[1]) || !sameSchedule(add, n)) {
    return false;
  }
  const Value &sum = g.value(add.outputs[0]), &a = g.value(add.args[0].value), &b = g.value(add.args[1].value);
  if (a.shape != sum.shape || b.shape != sum.shape || a.dtype != c10::ScalarType::Float ||
      (b.dtype != c10::ScalarType::Float && b.dtype != c10::ScalarType::BFloat16)) {
    return false;
  }
  const size_t at = g.indexOf(n);
  for (const Node* user : g.users(add.outputs[0])) {
    if (g.indexOf(*user) < at) return false;
  }
  return true;
}

// native_layer_norm(input, normalized_shape, weight, bias, eps).
MatchResult fuseForward(Graph& g, const Node& n, Counts& counts) {
  const std::string why = unsupported(g, n.args[0], n.args[1], n.args[2], n.args[3]);
  if (!why.empty()) return MatchResult::failure(why);
  std::vector<ValueId> outputs = n.outputs;
  Arg input = n.args[0], residual;  // residual: None
  const Node* add = g.producer(input.value);
  if (add && addFits(g, *add, n)) {
    input = add->args[0];
    residual = add->args[1];
    outputs.push_back(add->outputs[0]);
    g.extract(*add);
    ++counts.residualAdds;
  }
  c10::ScalarType dtype = c10::ScalarType::Float;
  const Node* cast = outputs[0] == kNoValue ? nullptr : g.soleReader(outputs[0]);
  if (cast && isCastTo(*cast, c10::ScalarType::BFloat16) && sameSchedule(*cast, n)) {
    dtype = c10::ScalarType::BFloat16;
    outputs[0] = cast->outputs[0];
    g.extract(*cast);
    ++counts.casts;
  }
  GraphBuilder b(g);
  b.setMeta(n.meta);
  b.replace(n, "spmd::layer_norm", {input, residual, n.args[2], n.args[3], n.args[4], dtypeArg(dtype)}, outputs);
  return MatchResult::success();
}

// A reader of the backward's `dx` that casts it to bf16 in the backward's
// schedule (the first, if several), or null.
const Node* bf16CastReading(const Graph& g, ValueId dx, const Node& backward) {
  for (const Node* user : g.users(dx)) {
    if (isCastTo(*user, c10::ScalarType::BFloat16) && user->args[0].value == dx && sameSchedule(*user, backward)) {
      return user;
    }
  }
  return nullptr;
}

// native_layer_norm_backward(grad, input, normalized_shape, mean, rstd, weight, bias, output_mask).
MatchResult fuseBackward(Graph& g, const Node& n, Counts& counts) {
  static const OpName kAdd = OpName::known("aten::add.Tensor");
  const std::string why = unsupported(g, n.args[1], n.args[2], n.args[5], n.args[6]);
  if (!why.empty()) return MatchResult::failure(why);
  const Arg& mask = n.args[7];
  if (mask.kind != Arg::Kind::Bools || std::count(mask.bools.begin(), mask.bools.end(), true) != 3) {
    return MatchResult::failure("not every gradient is asked for");
  }
  Arg grad = n.args[0];
  const Node* gradCast = isTensor(grad) ? g.producer(grad.value) : nullptr;
  const bool castIn = gradCast && isCastTo(*gradCast, c10::ScalarType::Float) && g.soleReader(grad.value) == &n &&
                      g.value(gradCast->args[0].value).dtype == c10::ScalarType::BFloat16 && sameSchedule(*gradCast, n);
  if (castIn) grad = gradCast->args[0];

  std::vector<ValueId> outputs = n.outputs;
  Arg residual;  // None
  const Node* add = outputs[0] == kNoValue ? nullptr : g.soleReader(outputs[0]);
  if (add && add->is(kAdd) && add->args.size() == 3 && add->args[2].kind == Arg::Kind::Int &&
      add->args[2].i == 1 && sameSchedule(*add, n)) {
    const Arg& other = add->args[0].value == outputs[0] ? add->args[1] : add->args[0];
    if (residualFits(g, other, outputs[0], n)) {
      residual = other;
      outputs[0] = add->outputs[0];
      g.extract(*add);
      ++counts.residualGradients;
    }
  }
  const Node* copy = outputs[0] == kNoValue ? nullptr : bf16CastReading(g, outputs[0], n);
  if (copy) {
    outputs.resize(3, kNoValue);
    outputs.push_back(copy->outputs[0]);
    g.extract(*copy);
    ++counts.casts;
  }
  GraphBuilder b(g);
  b.setMeta(n.meta);
  b.replace(n, "spmd::layer_norm_backward",
            {grad, n.args[1], n.args[3], n.args[4], n.args[5], residual, Arg::ofBool(copy != nullptr)}, outputs);
  if (castIn) {
    g.erase(*gradCast);
    ++counts.casts;
  }
  return MatchResult::success();
}

// One of the two rewrites: its root op, taken with `arity` arguments.
class LayerNormPattern final : public RewritePattern {
 public:
  using Fuse = MatchResult (*)(Graph&, const Node&, Counts&);
  LayerNormPattern(const char* name, const char* root, size_t arity, Fuse fuse, Counts& counts)
      : RewritePattern(name, {root}), arity_(arity), fuse_(fuse), counts_(counts) {}
  MatchResult matchAndRewrite(Graph& g, const Node& n) override {
    return n.args.size() == arity_ ? fuse_(g, n, counts_) : MatchResult::skip();
  }

 private:
  size_t arity_;
  Fuse fuse_;
  Counts& counts_;
};

class FuseLayerNormPass final : public Pass {
 public:
  bool run(Graph& g, DiagnosticEngine& diagnostics) override {
    Counts counts;
    LayerNormPattern forward("layer-norm-to-kernel", "aten::native_layer_norm", 5, &fuseForward, counts);
    LayerNormPattern backward("layer-norm-backward-to-kernel", "aten::native_layer_norm_backward", 8, &fuseBackward,
                              counts);
    const RewriteCounts applied = applyPatternsNotingFailures(g, {&forward, &backward},
                                                              diagnostics, "layer-norm-to-kernel: not fused: ");
    counts.forward = applied.applied[0];
    counts.backward = applied.applied[1];
    if (counts.forward + counts.backward == 0) return false;
    count("LayerNorm(s) as generated kernels", counts.forward);
    count("backward(s) as generated kernels", counts.backward);
    count("cast(s) taken in", counts.casts);
    count("residual add(s) taken in", counts.residualAdds);
    count("residual gradient add(s) taken in", counts.residualGradients);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseLayerNormPass(const PipelineOptions&) { return std::make_unique<FuseLayerNormPass>(); }

}  // namespace spmd
